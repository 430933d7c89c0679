"""What the OpenAI Batch API adds to a miro batch made through `miro serve`: the `miro:api-batch:{id}` hash
(input file id, endpoint, completion window, metadata, validation errors, output and error file ids) and the
`miro:api-batches` index that batches.list pages through, newest first."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from miro.worker.fleet import keys

from .shapes import BatchError


@dataclass
class ApiBatch:
    batch_id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    errors: list[BatchError] = field(default_factory=list)  # why validation failed
    output_file_id: str | None = None
    error_file_id: str | None = None
    files_for: str | None = None  # the end stamp of the run the output and error files were made for


def save(conn: redis.Redis, record: ApiBatch, created_at: float) -> None:
    mapping = {"batch_id": record.batch_id, "input_file_id": record.input_file_id, "endpoint": record.endpoint,
               "completion_window": record.completion_window, "metadata": json.dumps(record.metadata),
               "errors": json.dumps([e.model_dump() for e in record.errors])}
    pipe = conn.pipeline(transaction=True)
    pipe.hset(keys.api_batch(record.batch_id), mapping=mapping)
    pipe.zadd(keys.api_batches(), {record.batch_id: created_at})
    pipe.execute()


def load(conn: redis.Redis, batch_id: str) -> ApiBatch | None:
    raw = {k.decode(): v.decode() for k, v in conn.hgetall(keys.api_batch(batch_id)).items()}
    if not raw:
        return None
    return ApiBatch(batch_id=raw["batch_id"], input_file_id=raw["input_file_id"], endpoint=raw["endpoint"],
                    completion_window=raw["completion_window"], metadata=json.loads(raw["metadata"]),
                    errors=[BatchError(**e) for e in json.loads(raw["errors"])],
                    output_file_id=raw.get("output_file_id") or None, error_file_id=raw.get("error_file_id") or None,
                    files_for=raw.get("files_for"))


def claim_files(conn: redis.Redis, batch_id: str, run_end: str) -> bool:
    """True for the one caller that is to write the output and error files of the run that ended at `run_end`
    (a batch retried after it completed ends again, and gets new files)."""
    return bool(conn.hsetnx(keys.api_batch(batch_id), f"claim:{run_end}", "1"))


def release_claim(conn: redis.Redis, batch_id: str, run_end: str) -> None:
    conn.hdel(keys.api_batch(batch_id), f"claim:{run_end}")


def set_files(conn: redis.Redis, batch_id: str, run_end: str, output_file_id: str | None,
              error_file_id: str | None) -> None:
    conn.hset(keys.api_batch(batch_id), mapping={"output_file_id": output_file_id or "",
                                                 "error_file_id": error_file_id or "", "files_for": run_end})


def page_ids(conn: redis.Redis, after: str | None, limit: int) -> tuple[list[str], bool]:
    """Up to `limit` batch ids, newest first, after the id `after`; and whether more follow."""
    start = 0
    if after is not None:
        rank = conn.zrevrank(keys.api_batches(), after)
        if rank is None:
            return [], False
        start = rank + 1
    ids = [i.decode() for i in conn.zrevrange(keys.api_batches(), start, start + limit)]
    return ids[:limit], len(ids) > limit
