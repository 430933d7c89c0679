"""Worker records in Redis: the `miro:worker:{name}` hash each BatchWorker refreshes about once a second.

The hash has a TTL of a few seconds, so a worker that dies (kill -9, lost machine) stops showing soon after
its last refresh; one that stops cleanly deletes it. Fields (all written as strings, read back typed):

- who: ``name``, ``model``, ``host``, ``pid``, ``queues`` (comma separated), ``state`` (``idle``, ``busy``,
  ``stopping``), ``started_at``, ``updated_at`` (epoch seconds), ``batches`` (ids with requests in flight,
  comma separated)
- the model: ``architecture`` (the GGUF's, e.g. ``llama``), ``weight_format`` (``f32``: matrices dequantized
  once; ``native``: kept as stored in the memory-mapped file), ``weight_memory`` (bytes the weights hold of
  their own; a memory-mapped native tensor holds none), ``cpu_tier`` (the CPU tier its kernels run,
  core/kernels/cpu.py: ``avx512-vnni``, ``avx512``, ``avx-vnni``, ``avx2`` or ``portable``)
- the KV cache and the batch (Engine.stats(), an EngineStats): ``kv_blocks_used``, ``kv_blocks_total``,
  ``kv_usage`` (0-1), ``running``, ``waiting``, ``preemptions``, ``prefix_cache_hit_rate``, ``prefix_cache_queries``,
  ``prefix_cache_hits``, ``prompt_tokens_total``, ``generation_tokens_total``, ``prompt_tokens_per_s``,
  ``generation_tokens_per_s``, ``tokens_per_s`` (the two summed, written for other readers; rates over the last 10 s)
- jobs: ``in_flight`` (requests taken from the queue, not counted yet), ``seats`` (how many it runs at once), ``queued`` (jobs waiting in the worker's queues),
  ``jobs_done``, ``jobs_failed``, ``jobs_cancelled`` (requests counted so, since the worker started)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from miro.core.engine.stats import EngineStats
from miro.worker.fleet.records import hashes, keys
from miro.worker.fleet.observe import series

REFRESH_S = 1.0  # how often a worker rewrites its hash
TTL_S = 5  # how long the hash outlives the worker's last refresh


@dataclass
class WorkerRecord:
    """The `miro:worker:{name}` hash (the module docstring says what each field means)."""

    name: str = ""
    model: str = ""
    host: str = ""
    pid: int = 0
    queues: list[str] = field(default_factory=list)
    state: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    batches: list[str] = field(default_factory=list)
    # None in a record of a worker from before these fields
    architecture: str | None = None
    weight_format: str | None = None
    weight_memory: int | None = None
    cpu_tier: str | None = None
    stats: EngineStats = field(default_factory=EngineStats)
    in_flight: int = 0
    seats: int = 0  # requests it runs at once (the engine's max_num_seqs): what the feeder keeps queued for
    queued: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0

    @staticmethod
    def key(name: str) -> str:
        return keys.worker(name)

    @classmethod
    def from_hash(cls, raw) -> WorkerRecord:
        values = hashes.decoded(raw)
        return cls(**hashes.field_values(cls, values), stats=EngineStats(**hashes.field_values(EngineStats, values)))

    def to_hash(self) -> dict[str, str | int | float]:
        return {**hashes.hash_values(self), **hashes.hash_values(self.stats), "tokens_per_s": self.tokens_per_s}

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON (`miro status --json`, /v1/workers): one flat object, as the hash is."""
        own = {k: v for k, v in asdict(self).items() if k != "stats"}
        return {**own, **asdict(self.stats), "tokens_per_s": self.tokens_per_s}

    @property
    def tokens_per_s(self) -> float:
        return self.stats.tokens_per_s


_series_writers: dict[str, series.SeriesWriter] = {}  # by worker name: the step each last appended a point for


def publish(conn: redis.Redis, record: WorkerRecord, ttl_s: int = TTL_S) -> None:
    """Write the worker's hash and give it `ttl_s` to live; once a step (series.py), append its points for the
    page's charts."""
    with conn.pipeline(transaction=True) as pipe:
        pipe.hset(record.key(record.name), mapping=record.to_hash())
        pipe.expire(record.key(record.name), ttl_s)
        pipe.zadd(keys.workers(), {record.name: record.updated_at or time.time()})
        pipe.execute()
    writer = _series_writers.setdefault(record.name, series.SeriesWriter())
    writer.append(conn, record.name, series_point(record), record.batches)


def series_point(record: WorkerRecord) -> series.WorkerPoint:
    """What the page's charts keep of the record (series.py)."""
    return series.WorkerPoint(
        t=record.updated_at or time.time(),
        kv_usage=record.stats.kv_usage,
        running=record.stats.running,
        waiting=record.stats.waiting,
        tokens_per_s=record.tokens_per_s,
        requests=record.jobs_done + record.jobs_failed,
    )


def remove(conn: redis.Redis, name: str) -> None:
    with conn.pipeline(transaction=True) as pipe:
        pipe.delete(WorkerRecord.key(name))
        pipe.zrem(keys.workers(), name)
        pipe.execute()


FORGET_AFTER_S = 60  # a name in miro:workers whose hash is gone and that has not refreshed for this long is dropped


def list_workers(conn: redis.Redis) -> list[WorkerRecord]:
    """Every live worker's record, sorted by name: the hashes of the names in miro:workers (a read of a few keys,
    where a SCAN would walk every key of a large batch's jobs). A name whose hash has expired (its worker died)
    is dropped once it is FORGET_AFTER_S old, so a worker stalled for a while (a long first step) comes back."""
    named = conn.zrange(keys.workers(), 0, -1, withscores=True)
    pipe = conn.pipeline(transaction=False)
    for name, _ in named:
        pipe.hgetall(WorkerRecord.key(name.decode() if isinstance(name, bytes) else name))
    raws = pipe.execute()
    gone = [name for (name, last), raw in zip(named, raws) if not raw and last < time.time() - FORGET_AFTER_S]
    if gone:
        conn.zrem(keys.workers(), *gone)
    return sorted((WorkerRecord.from_hash(raw) for raw in raws if raw), key=lambda r: r.name)


def get_worker(conn: redis.Redis, name: str) -> WorkerRecord | None:
    raw = conn.hgetall(WorkerRecord.key(name))
    return WorkerRecord.from_hash(raw) if raw else None
