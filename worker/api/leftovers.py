"""What a server killed mid-request leaves in its storage location, removed by its background duties once nothing
has touched it for LEFTOVER_GRACE_S (so nothing still being written goes):

- an upload cut off by the kill: `{storage}/files/.tmp-*`, the bytes it was writing under a temporary name;
- a batch creation cut off between storing the requests and writing the batch record: `{storage}/batches/{id}/
  _requests/`, stored requests of a batch id Redis has no record of (also those of a batch whose record expired,
  BATCH_TTL_S after it ended: nobody can run them any more). The batch's folder goes too once empty.

An upload in progress writes a MiB at a time and a creation its chunks one after another, each write renewing the
modification time the grace is counted from. One sweep runs at start and then every LEFTOVER_SWEEP_S: it lists
two folders, not every file.
"""

from __future__ import annotations

import logging
import time

from pyarrow import fs as pafs

from miro.worker.fleet.records import batches

from miro.worker.api.file_store import FileStore

log = logging.getLogger("miro.serve")

LEFTOVER_GRACE_S = 3600.0  # untouched this long, a temporary upload or orphaned stored requests are removed
LEFTOVER_SWEEP_S = 600.0  # how often the background duties look for them
TEMPORARY_PREFIX = ".tmp-"  # FileWriter's and atomic_output's temporary names


def _age_s(info: pafs.FileInfo, now: float) -> float | None:
    return None if info.mtime_ns is None else now - info.mtime_ns / 1e9


def _listing(filesystem: pafs.FileSystem, folder: str, recursive: bool = False) -> list[pafs.FileInfo]:
    try:
        return filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True, recursive=recursive))
    except (FileNotFoundError, NotADirectoryError):
        return []


def temporary_uploads(store: FileStore, now: float, grace_s: float) -> int:
    """Delete the temporary upload files untouched for `grace_s`; returns how many."""
    removed = 0
    for info in _listing(store.filesystem, store.folder):
        age = _age_s(info, now)
        if (
            info.type == pafs.FileType.File
            and info.base_name.startswith(TEMPORARY_PREFIX)
            and age is not None
            and age >= grace_s
        ):
            try:
                store.filesystem.delete_file(info.path)
            except FileNotFoundError:  # gone meanwhile
                continue
            removed += 1
    return removed


def orphaned_requests(store: FileStore, now: float, grace_s: float) -> list[str]:
    """Delete the stored requests of batches with no record, untouched for `grace_s`; returns those batches' ids."""
    filesystem, base = store.filesystem, store.batch_folder
    ids = [
        info.base_name
        for info in _listing(filesystem, base)
        if info.type == pafs.FileType.Directory and batches.BATCH_ID_RE.fullmatch(info.base_name)
    ]
    if not ids:
        return []
    pipe = store.conn.pipeline(transaction=False)
    for batch_id in ids:
        pipe.exists(batches.BatchRecord.key(batch_id))
    removed = []
    for batch_id, recorded in zip(ids, pipe.execute()):
        if recorded:
            continue
        requests = f"{base}/{batch_id}/_requests"
        inside = _listing(filesystem, requests, recursive=True)
        ages = [_age_s(info, now) for info in inside if info.type == pafs.FileType.File]
        if not ages or None in ages or min(ages) < grace_s:
            continue
        if store.conn.exists(batches.BatchRecord.key(batch_id)):  # recorded meanwhile
            continue
        filesystem.delete_dir(requests)
        if not _listing(filesystem, f"{base}/{batch_id}"):
            try:
                filesystem.delete_dir(f"{base}/{batch_id}")
            except OSError:  # something was written there meanwhile
                pass
        removed.append(batch_id)
    return removed


def sweep(store: FileStore, now: float | None = None, grace_s: float = LEFTOVER_GRACE_S) -> None:
    now = time.time() if now is None else now
    uploads = temporary_uploads(store, now, grace_s)
    orphans = orphaned_requests(store, now, grace_s)
    if uploads or orphans:
        named = f" ({', '.join(orphans[:5])}{', ...' if len(orphans) > 5 else ''})" if orphans else ""
        log.warning(
            "removed what a stopped server left: %d cut-off uploads, the stored requests of %d batches with "
            "no record%s",
            uploads,
            len(orphans),
            named,
        )
