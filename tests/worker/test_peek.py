"""A batch's first errors and a few outputs for its page (worker/fleet/output/peek.py), from real part files and a real
Redis: errors by line with their custom ids, invalid lines among them, each part file read once, and an error
that a later run of the request replaced dropped."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import redis

from miro.worker.fleet.records import batches
from miro.worker.fleet.output.peek import BatchPeek, PeekedRow
from miro.worker.fleet.output.sink import ParquetSink

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def row(custom_id, line, *, output=None, error=None):
    return dict(
        batch_id="batch_p",
        custom_id=custom_id,
        line=line,
        choice_index=0,
        kind="chat",
        job_id=f"j-{custom_id}",
        output=output,
        error=error,
        finish_reason=None if error else "stop",
        started_at=T0,
        finished_at=T0,
        sampling=json.dumps({}),
    )


def write_part(tmp_path, rows):
    sink = ParquetSink(str(tmp_path), "w1")
    for r in rows:
        sink.add(r)
    sink.flush()


def test_errors_by_line_outputs_and_each_part_read_once(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    write_part(
        tmp_path,
        [
            row("a", 9, error="boom at 9"),
            row("b", 2, output="two"),
            row("c", 7, error="boom at 7"),
            *(row(f"ok{i}", 20 + i, output=f"out {i}") for i in range(8)),
        ],
    )
    batches.record_failed_line(conn, "batch_p", custom_id="line-3", line=3, error="line 3: not valid JSON.")
    peek = BatchPeek(str(tmp_path), "batch_p", max_errors=3, max_outputs=3).update(conn)
    assert peek.errors == [
        PeekedRow(3, "line-3", "line 3: not valid JSON."),
        PeekedRow(7, "c", "boom at 7"),
        PeekedRow(9, "a", "boom at 9"),
    ]
    assert [(o.custom_id, o.text, o.finish_reason) for o in peek.outputs] == [
        ("b", "two", "stop"),
        ("ok0", "out 0", "stop"),
        ("ok1", "out 1", "stop"),
    ]
    assert len(peek.read_parts) == 1
    # a later part: the retried request c now succeeded, and a new error on line 1 comes first
    write_part(tmp_path, [row("c", 7, output="fixed"), row("d", 1, error="boom at 1")])
    peek.update(conn)
    assert [(e.line, e.custom_id) for e in peek.errors] == [(1, "d"), (3, "line-3"), (9, "a")]
    assert len(peek.read_parts) == 2 and len(peek.outputs) == 3
    peek.update(conn)  # nothing new: no part read again, nothing doubled
    assert [e.custom_id for e in peek.errors] == ["d", "line-3", "a"] and len(peek.read_parts) == 2
