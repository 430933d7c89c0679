"""What the OpenAI Batch API adds to a miro batch: the `miro:api-batch:{id}` hash (input file id, endpoint, completion
window, metadata, validation errors, the expiry of its result files, the batch it reused rows of and how many, the
output and error file ids).

A batch made through `miro serve` has every field; one made by `miro-submit` or `miro run` has none until the server
writes its result files, and `of` fills the rest from miro's own record. batches.list pages through every batch on
the Redis (`miro:batches`), newest first."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis

from miro.worker.fleet.records import keys, scripts
from miro.worker.fleet.records.batches import BatchRecord

from miro.worker.api.shapes import BatchError

TASK_ENDPOINTS = {"generate": "/v1/chat/completions", "embed": "/v1/embeddings"}  # records that name no endpoint


@dataclass
class ApiBatch:
    batch_id: str
    input_file_id: str  # "" for a batch made without the API: its input file is no file of the server's
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    errors: list[BatchError] = field(default_factory=list)  # why validation failed
    output_expires_after_s: int | None = None  # the result files expire this long after they are written
    reuse_batch_id: str | None = None  # the earlier batch given as reuse_batch_id
    reused: int | None = None  # requests whose rows were taken from it (None: no reuse_batch_id)
    output_file_id: str | None = None
    error_file_id: str | None = None
    files_for: str | None = None  # the end stamp of the run the output and error files were made for


def save(conn: redis.Redis, record: ApiBatch) -> None:
    mapping = {
        "batch_id": record.batch_id,
        "input_file_id": record.input_file_id,
        "endpoint": record.endpoint,
        "completion_window": record.completion_window,
        "metadata": json.dumps(record.metadata),
        "errors": json.dumps([e.model_dump() for e in record.errors]),
        "output_expires_after_s": "" if record.output_expires_after_s is None else record.output_expires_after_s,
        "reuse_batch_id": record.reuse_batch_id or "",
        "reused": "" if record.reused is None else record.reused,
    }
    conn.hset(keys.api_batch(record.batch_id), mapping=mapping)


def _decoded(conn: redis.Redis, batch_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in conn.hgetall(keys.api_batch(batch_id)).items()}


def _files(raw: dict[str, str]) -> dict:
    return {
        "output_file_id": raw.get("output_file_id") or None,
        "error_file_id": raw.get("error_file_id") or None,
        "files_for": raw.get("files_for"),
    }


def load(conn: redis.Redis, batch_id: str) -> ApiBatch | None:
    """The API's record of a batch made through it; None for any other."""
    raw = _decoded(conn, batch_id)
    if "batch_id" not in raw:
        return None
    expires_after, reused = raw.get("output_expires_after_s"), raw.get("reused")
    return ApiBatch(
        batch_id=raw["batch_id"],
        input_file_id=raw["input_file_id"],
        endpoint=raw["endpoint"],
        completion_window=raw["completion_window"],
        metadata=json.loads(raw["metadata"]),
        errors=[BatchError(**e) for e in json.loads(raw["errors"])],
        output_expires_after_s=int(expires_after) if expires_after else None,
        reuse_batch_id=raw.get("reuse_batch_id") or None,
        reused=int(reused) if reused else None,
        **_files(raw),
    )


def of(conn: redis.Redis, record: BatchRecord) -> ApiBatch:
    """The API's side of any batch: its own record if it was made through the API, otherwise what miro's record
    says (its endpoint, its window, its name as metadata) with the result files the server has written for it."""
    made_here = load(conn, record.id)
    if made_here is not None:
        return made_here
    endpoint = record.endpoint.split(",")[0] or TASK_ENDPOINTS.get(record.task, "/v1/chat/completions")
    return ApiBatch(
        batch_id=record.id,
        input_file_id="",
        endpoint=endpoint,
        completion_window=record.completion_window or "24h",
        metadata={"name": record.name[:512]} if record.name else None,
        **_files(_decoded(conn, record.id)),
    )


CLAIM_HOLDS_S = 600  # a writer that died (its server killed mid-write) leaves its claim to another after this


def claim_files(conn: redis.Redis, batch_id: str, run_end: str) -> bool:
    """True for the one caller that is to write the output and error files of the run that ended at `run_end`
    (a batch retried after it completed ends again, and gets new files)."""
    return bool(
        scripts.CLAIM(conn, [keys.api_batch(batch_id)], [f"claim:{run_end}", f"{time.time():.3f}", CLAIM_HOLDS_S])
    )


def release_claim(conn: redis.Redis, batch_id: str, run_end: str) -> None:
    conn.hdel(keys.api_batch(batch_id), f"claim:{run_end}")


def set_files(
    conn: redis.Redis, batch_id: str, run_end: str, output_file_id: str | None, error_file_id: str | None
) -> None:
    conn.hset(
        keys.api_batch(batch_id),
        mapping={"output_file_id": output_file_id or "", "error_file_id": error_file_id or "", "files_for": run_end},
    )


def page_ids(conn: redis.Redis, after: str | None, limit: int) -> tuple[list[str], bool]:
    """Up to `limit` ids of the batches on the Redis, whatever made them, newest first, after the id `after`; and
    whether more follow."""
    start = 0
    if after is not None:
        rank = conn.zrevrank(keys.batches(), after)
        if rank is None:
            return [], False
        start = rank + 1
    ids = [i.decode() for i in conn.zrevrange(keys.batches(), start, start + limit)]
    return ids[:limit], len(ids) > limit
