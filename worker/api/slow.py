"""Work that takes seconds runs on thread pools of its own, bounded, and never on the request threads: FastAPI
runs every plain `def` route on anyio's pool (40 threads), so 48 batch creations there, each reading and storing
its whole file, left every other request (a list, the page) waiting for one to end. Now a create waits its turn
for one of CREATE_THREADS threads with no thread held meanwhile (its coroutine awaits), and an upload's writes go
to STORAGE_THREADS threads of their own; the request threads stay free for the quick routes."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

CREATE_THREADS = 4  # batch creations at once (submit: read, validate and store the file; feed the first window)
STORAGE_THREADS = 8  # an upload's writes to the storage location, and aborting one


class SlowWork:
    def __init__(self, create_threads: int = CREATE_THREADS, storage_threads: int = STORAGE_THREADS):
        self._creates = ThreadPoolExecutor(create_threads, thread_name_prefix="miro-create")
        self._storage = ThreadPoolExecutor(storage_threads, thread_name_prefix="miro-storage")

    async def create(self, call: Callable[..., T], *args) -> T:
        """`call(*args)` on a creation thread, once one is free."""
        return await asyncio.get_running_loop().run_in_executor(self._creates, functools.partial(call, *args))

    async def storage(self, call: Callable[..., T], *args) -> T:
        """`call(*args)` on a storage thread, once one is free."""
        return await asyncio.get_running_loop().run_in_executor(self._storage, functools.partial(call, *args))

    def shutdown(self) -> None:
        self._creates.shutdown(wait=False, cancel_futures=True)
        self._storage.shutdown(wait=False, cancel_futures=True)
