"""Which requests of a batch were counted: in Redis while the batch runs, in storage once it has ended.

While a batch runs, `miro:batch:{id}:counted` is the set of the custom ids counted so far: Lua COUNT adds a request
to it as it counts it (a request that runs twice counts once), and `--resume` reads it to tell what ran. A set costs
about 70 bytes a request, which an ended batch would keep in Redis for BATCH_TTL_S (700 MB for 30 days after one
10M-request batch). So when an ended batch is released (release.py) the set moves to storage, beside its part files:
`{output}/{batch_id}/_counted.jsonl`, one JSON string a custom id (written a SSCAN page at a time, under a temporary
name and renamed), and Lua `STORE_COUNTED` deletes it and marks the batch `counted_stored` in one step, only if the
batch has still ended, nobody has pinned it (below) and the set still holds what was written.

Once stored, every request of the batch counts as counted: a batch ends only when each of its requests is accounted
for, so a late duplicate (a job whose worker's heartbeat lapsed, run again elsewhere) is a repeat. Lua COUNT and
CANCEL_PENDING count nothing for a `counted_stored` batch, and `were_counted` says True for every custom id.

What runs a batch again (`--resume`, `miro retry`) calls `restore` first: Lua `PIN_COUNTED` marks the batch
`counted_pinned` (so that a release at the same moment keeps the set in Redis) and says whether it was stored; if so,
the file is read back into the set, a page at a time, and only then `counted_stored` is cleared. A restorer that dies
half-way leaves the mark, and the next one adds the same ids again. The pin goes when the batch ends again (COUNT);
a resume that found nothing to run leaves it, and the set stays in Redis until the batch's TTL, as before.
"""

from __future__ import annotations

import json
import logging

import redis

from miro.core.errors import MiroError

from miro.worker.fleet.records import batches, keys, scripts
from miro.worker.fleet.output.sink import atomic_output, open_output

FILE = "_counted.jsonl"
PAGE = 10_000  # custom ids per SSCAN page and per SADD
log = logging.getLogger("miro.counted")


def _location(output: str, batch_id: str):
    filesystem, base = open_output(output)
    return filesystem, f"{base}/{batch_id}/{FILE}"


def _encode(member: bytes) -> bytes:
    # surrogateescape: any bytes Redis holds come back as they were
    return json.dumps(member.decode("utf-8", "surrogateescape")).encode() + b"\n"


def _decode(line: bytes) -> bytes:
    return json.loads(line).encode("utf-8", "surrogateescape")


def store(conn: redis.Redis, batch: batches.BatchRecord) -> bool:
    """Move an ended batch's counted set to storage; True if it did (False: it runs, it is pinned, the set is gone
    or changed meanwhile, or storage failed, which is logged: the set then stays until the batch's TTL)."""
    counted_key, batch_key = keys.batch_counted(batch.id), keys.batch(batch.id)
    if batch.status not in batches.TERMINAL or conn.hget(batch_key, "counted_pinned") is not None:
        return False
    size = conn.scard(counted_key)
    if not size:
        return False
    try:
        filesystem, path = _location(batch.output, batch.id)
        written = 0
        with atomic_output(filesystem, path) as stream:
            cursor = 0
            while True:
                cursor, members = conn.sscan(counted_key, cursor, count=PAGE)
                stream.write(b"".join(_encode(m) for m in members))
                written += len(members)
                if cursor == 0:
                    break
    except OSError as err:
        log.warning(
            "batch %s: its counted requests stay in Redis, as its storage cannot be written (%s)", batch.id, err
        )
        return False
    if written != size:  # SSCAN gives each member at least once: a member given twice, or the set changed
        return False
    return bool(scripts.STORE_COUNTED(conn, [batch_key, counted_key], [size, *sorted(batches.TERMINAL)]))


def restore(conn: redis.Redis, batch: batches.BatchRecord) -> int:
    """Pin the batch's counted set in Redis and bring it back from storage if it was moved there (what runs the
    batch again calls it first); returns how many custom ids were read back."""
    if not int(scripts.PIN_COUNTED(conn, [keys.batch(batch.id)], [])):
        return 0
    filesystem, path = _location(batch.output, batch.id)
    counted_key, restored, carry = keys.batch_counted(batch.id), 0, b""
    try:
        with filesystem.open_input_stream(path) as stream:
            while block := stream.read(1 << 20):
                lines = (carry + block).split(b"\n")
                carry = lines.pop()
                members = [_decode(line) for line in lines if line]
                for start in range(0, len(members), PAGE):
                    conn.sadd(counted_key, *members[start : start + PAGE])
                restored += len(members)
    except OSError as err:
        raise MiroError(
            f"Batch {batch.id}'s counted requests were moved to {path}, which cannot be read "
            f"({getattr(err, 'strerror', None) or err}); it cannot run again without them."
        ) from None
    if carry:
        conn.sadd(counted_key, _decode(carry))
        restored += 1
    if (ttl := conn.ttl(keys.batch(batch.id))) > 0:  # an ended batch's keys expire together (release.py)
        conn.expire(counted_key, ttl)
    conn.hdel(keys.batch(batch.id), "counted_stored")
    return restored


def were_counted(conn: redis.Redis, batch_id: str, custom_ids: list[str]) -> list[bool]:
    """Whether each request was counted (all were, once the batch's set is in storage)."""
    if not custom_ids:
        return []
    reader = conn.pipeline(transaction=False)
    reader.hget(keys.batch(batch_id), "counted_stored")
    reader.smismember(keys.batch_counted(batch_id), custom_ids)
    stored, flags = reader.execute()
    return [True] * len(custom_ids) if stored is not None else [bool(f) for f in flags]


def queue_were_counted(pipe, batch_id: str, custom_ids: list[str]) -> None:
    """were_counted's two reads queued on a pipeline; `from_replies` reads their replies."""
    pipe.hget(keys.batch(batch_id), "counted_stored")
    pipe.smismember(keys.batch_counted(batch_id), custom_ids)


def from_replies(stored, flags) -> list[bool]:
    return [True] * len(flags) if stored is not None else [bool(f) for f in flags]
