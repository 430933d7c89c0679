"""What the server holds for every request: its configuration, one Redis connection, the file store and the
threads of the slow routes."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from miro.worker.api.file_store import FileStore
from miro.worker.api.limits import UPLOAD_BYTES
from miro.worker.api.slow import SlowWork


@dataclass(frozen=True)
class ServerConfig:
    redis_url: str
    storage: str  # a folder or an object-store URL (s3://bucket/prefix) the whole fleet reaches
    api_keys: tuple[str, ...] = ()  # none: anyone who reaches the server (cli/serve.py binds loopback then)
    allowed_hosts: tuple[str, ...] = ()  # with no key: Host names served besides loopback's (hosts.py)
    max_upload_bytes: int = UPLOAD_BYTES  # an uploaded file (limits.py)


@dataclass
class ServerState:
    config: ServerConfig
    conn: redis.Redis
    store: FileStore
    work: SlowWork = field(default_factory=SlowWork)  # the slow routes' own threads (slow.py)
