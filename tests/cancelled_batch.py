"""A batch record of 10 requests cancelled after 3 ran (2 completed, 1 failed): 7 never ran. Made with the
batch functions the workers and `miro cancel` use, on a real Redis."""

from __future__ import annotations

import redis

from miro.worker.fleet.records import batches


def cancelled_after_three(redis_url: str) -> str:
    conn = redis.Redis.from_url(redis_url)
    batch_id = batches.create_batch(
        conn, name="cut.jsonl", model="m", input_file="cut.jsonl", output="o", total=10, queue="miro:m"
    )
    batches.set_status(conn, batch_id, "in_progress")
    for i in range(2):
        batches.count_finished(conn, batch_id, f"r{i}", prompt_tokens=3, completion_tokens=4)
    batches.count_failed(conn, batch_id, "r2")
    batches.set_status(conn, batch_id, "cancelling")
    batches.count_cancelled(conn, batch_id, [f"r{i}" for i in range(3, 10)])
    assert batches.get_batch(conn, batch_id).status == "cancelled"
    return batch_id
