"""Worker records in Redis: the `miro:worker:{name}` hash each BatchWorker refreshes about once a second.

The hash has a TTL of a few seconds, so a worker that dies (kill -9, lost machine) stops showing soon after
its last refresh; one that stops cleanly deletes it. Fields (all written as strings, read back typed):

- who: ``name``, ``model``, ``host``, ``pid``, ``queues`` (comma separated), ``state`` (``idle``, ``busy``,
  ``stopping``), ``started_at``, ``updated_at`` (epoch seconds), ``batches`` (ids with requests in flight,
  comma separated)
- the model: ``architecture`` (the GGUF's, e.g. ``llama``), ``weight_format`` (``f32``: matrices dequantized
  once; ``native``: kept as stored in the memory-mapped file), ``weight_memory`` (bytes the weights hold of
  their own; a memory-mapped native tensor holds none), ``cpu_tier`` (the CPU tier its kernels run,
  core/layers/cpu.py: ``avx512-vnni``, ``avx512``, ``avx-vnni``, ``avx2`` or ``portable``)
- the KV cache and the batch (Engine.stats): ``kv_blocks_used``, ``kv_blocks_total``, ``kv_usage`` (0-1),
  ``running``, ``waiting``, ``preemptions``, ``prefix_cache_hit_rate``, ``prefix_cache_queries``,
  ``prefix_cache_hits``, ``prompt_tokens_total``, ``generation_tokens_total``, ``prompt_tokens_per_s``,
  ``generation_tokens_per_s``, ``tokens_per_s`` (the two summed; rates over the last 10 s)
- jobs: ``in_flight`` (taken from the queue, not finished), ``queued`` (jobs waiting in the worker's queues),
  ``jobs_done``, ``jobs_failed``, ``jobs_cancelled`` (since the worker started)
"""

from __future__ import annotations

from typing import Any

import redis

from miro.worker import keys

REFRESH_S = 1.0  # how often a worker rewrites its hash
TTL_S = 5  # how long the hash outlives the worker's last refresh

INT_FIELDS = frozenset({
    "pid", "kv_blocks_used", "kv_blocks_total", "running", "waiting", "preemptions", "prefix_cache_queries",
    "prefix_cache_hits", "prompt_tokens_total", "generation_tokens_total", "in_flight", "queued", "jobs_done",
    "jobs_failed", "jobs_cancelled", "weight_memory",
})
FLOAT_FIELDS = frozenset({
    "kv_usage", "prefix_cache_hit_rate", "prompt_tokens_per_s", "generation_tokens_per_s", "tokens_per_s",
    "started_at", "updated_at",
})
LIST_FIELDS = frozenset({"queues", "batches"})


def publish(conn: redis.Redis, name: str, record: dict[str, Any], ttl_s: int = TTL_S) -> None:
    """Write the worker's hash and give it `ttl_s` to live."""
    mapping = {k: ",".join(v) if k in LIST_FIELDS else v for k, v in record.items()}
    with conn.pipeline(transaction=True) as pipe:
        pipe.hset(keys.worker(name), mapping=mapping)
        pipe.expire(keys.worker(name), ttl_s)
        pipe.execute()


def remove(conn: redis.Redis, name: str) -> None:
    conn.delete(keys.worker(name))


def _typed(raw: dict[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key, value = k.decode(), v.decode()
        if key in INT_FIELDS:
            out[key] = int(value)
        elif key in FLOAT_FIELDS:
            out[key] = float(value)
        elif key in LIST_FIELDS:
            out[key] = [item for item in value.split(",") if item]
        else:
            out[key] = value
    return out


def list_workers(conn: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker's record (typed), sorted by name."""
    names = sorted(conn.scan_iter(match=keys.worker("*"), count=1000))
    pipe = conn.pipeline(transaction=False)
    for key in names:
        pipe.hgetall(key)
    records = [_typed(raw) for raw in pipe.execute() if raw]  # a worker may have expired since the scan
    return sorted(records, key=lambda r: r.get("name", ""))


def get_worker(conn: redis.Redis, name: str) -> dict[str, Any] | None:
    raw = conn.hgetall(keys.worker(name))
    return _typed(raw) if raw else None
