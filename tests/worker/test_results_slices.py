"""`miro results` and `miro run` write a batch's results a slice of lines at a time (results.BatchResults): with
slices of a few rows the files are those of one slice, and those of the whole table in memory (collect), on real
part files and a real Redis."""

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from miro.core import defaults
from miro.worker.fleet.records import batches, connection, keys
from miro.worker.fleet.output import results
from miro.worker.fleet.output.sink import ParquetSink

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
CUT = json.dumps({"max_tokens": 4, "structured_outputs": {"json": {"type": "object"}}})


def gen_row(custom_id, line, *, choice=0, output="hi", error=None, at=0, extra=None, finish="stop", sampling=None):
    return dict(
        batch_id="",
        custom_id=custom_id,
        line=line,
        choice_index=choice,
        kind="chat",
        job_id=f"job-{custom_id}",
        model="m",
        prompt="p",
        output=None if error else output,
        finish_reason=None if error else finish,
        prompt_tokens=5,
        cached_tokens=0,
        completion_tokens=None if error else 2,
        output_token_ids=None if error else [7, 8],
        error=error,
        worker="w1",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=at),
        latency_s=0.5,
        sampling=sampling or json.dumps({"max_tokens": 4}),
        extra=None if extra is None else json.dumps(extra),
    )


def embed_row(custom_id, line, *, index=0, size=4, error=None, at=0):
    return dict(
        batch_id="",
        custom_id=custom_id,
        line=line,
        choice_index=0,
        input_index=None if error else index,
        kind="embedding",
        job_id=f"job-{custom_id}",
        model="e",
        prompt="text",
        embedding=None if error else [float(line + index)] * size,
        encoding_format="float",
        prompt_tokens=3,
        error=error,
        worker="w1",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=at),
        latency_s=0.1,
        sampling="{}",
    )


def new_batch(conn, out, task="generate", total=0) -> str:
    return batches.create_batch(
        conn, name="t", model="m", input_file="in.jsonl", output=str(out), total=total, queue="miro:m", task=task
    )


def write_parts(out, batch_id, parts: list[list[dict]]) -> None:
    """Each list of rows as one part file, in order, as a worker's sink writes them."""
    sink = ParquetSink(str(out), "w1", flush_rows=10**6, flush_seconds=3600)
    for rows in parts:
        for r in rows:
            sink.add({**r, "batch_id": batch_id})
        sink.flush()


def write_three_ways(conn, batch_id, tmp_path, monkeypatch, fmt="parquet", tiny=2) -> dict[str, str]:
    """The results written in slices of `tiny` rows, in one slice, and from collect's whole table: name -> path."""
    paths = {}
    for name, slice_rows in (("tiny", tiny), ("one", 10**9)):
        monkeypatch.setattr(defaults, "RESULTS_SLICE_ROWS", slice_rows)
        paths[name] = str(tmp_path / f"{name}.{fmt}")
        results.write_results(results.BatchResults(conn, batch_id), paths[name], fmt)
    paths["collect"] = str(tmp_path / f"collect.{fmt}")
    results.write_results(results.collect(conn, batch_id)[0], paths["collect"], fmt)
    return paths


def assert_same_parquet(paths: dict[str, str]) -> pa.Table:
    tables = {name: pq.read_table(path) for name, path in paths.items()}
    for name, table in tables.items():
        assert table.schema == tables["collect"].schema, name
        assert table.equals(tables["collect"]), name
    return tables["collect"]


def assert_same_lines(paths: dict[str, str]) -> None:
    for suffix in ("", ".errors"):
        texts = {name: open(path.replace(".jsonl", f"{suffix}.jsonl")).read() for name, path in paths.items()}
        assert texts["tiny"] == texts["one"] == texts["collect"]


def generation_batch(conn, out) -> str:
    """Parts out of line order, a request's choices across parts, a success and a failure of one request in
    two parts, a request run twice, an invalid line, rows from before the line column, and line fields whose
    types only the whole batch settles."""
    batch_id = new_batch(conn, out)
    write_parts(
        out,
        batch_id,
        [
            [
                gen_row("q7", 7, extra={"n": 7, "tag": "late"}),
                gen_row("q8", 8, choice=0, output="a", extra={"n": 8.5}),
                gen_row("q9", 9, error="boom", at=5, extra={"n": 9}),
            ],
            [
                gen_row("q1", 1, extra={"n": 1, "tag": 3}),
                gen_row("q2", 2, output="old", at=1),
                gen_row("q3", 3, finish="length", sampling=CUT, extra={"deep": {"a": [1]}}),
            ],
            [
                gen_row("q8", 8, choice=2, output="c", extra={"n": 8.5}),
                gen_row("q2", 2, output="new", at=2),
                gen_row("q9", 9, output="fixed", at=1, extra={"n": 9}),  # a success beats the later failure
                gen_row("q8", 8, choice=1, output="b", extra={"n": 8.5}),
            ],
            [
                gen_row("q5", 5, finish="length", sampling=CUT, extra={"deep": {"b": "x"}, "late_field": None}),
                gen_row("old-b", None),
                gen_row("old-a", None),
            ],
        ],
    )
    batches.record_failed_line(conn, batch_id, custom_id="line-4", line=4, error="line 4: not valid JSON")
    conn.hset(keys.batch(batch_id), "status", "completed")
    return batch_id


def test_tiny_slices_write_the_parquet_of_one_slice_and_of_the_whole_table(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    batch_id = generation_batch(conn, tmp_path / "out")
    monkeypatch.setattr(defaults, "RESULTS_SLICE_ROWS", 2)
    assert len(list(results.BatchResults(conn, batch_id).slices())) >= 5  # it did slice
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch))
    assert [(r["custom_id"], r["choice_index"], r["output"], r["error"]) for r in table.to_pylist()] == [
        ("q1", 0, "hi", None),
        ("q2", 0, "new", None),
        ("q3", 0, "hi", None),
        ("line-4", 0, None, "line 4: not valid JSON"),
        ("q5", 0, "hi", None),
        ("q7", 0, "hi", None),
        ("q8", 0, "a", None),
        ("q8", 1, "b", None),
        ("q8", 2, "c", None),
        ("q9", 0, "fixed", None),
        ("old-a", 0, "hi", None),
        ("old-b", 0, "hi", None),
    ]
    assert table.column_names[-4:] == ["n", "tag", "deep", "late_field"]
    assert table.schema.field("n").type == pa.float64() and table.schema.field("tag").type == pa.string()
    assert table["tag"].to_pylist()[:6] == ["3", None, None, None, None, '"late"']  # a number and a string: JSON
    assert table.schema.field("deep").type == pa.struct([("a", pa.list_(pa.int64())), ("b", pa.string())])
    assert table.schema.field("late_field").type == pa.null()


def test_tiny_slices_write_the_openai_lines_of_one_slice_and_count_as_it_does(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    batch_id = generation_batch(conn, tmp_path / "out")
    paths = write_three_ways(conn, batch_id, tmp_path, monkeypatch, "jsonl")
    assert_same_lines(paths)
    lines = [json.loads(x) for x in open(paths["tiny"])]
    assert [x["custom_id"] for x in lines] == ["q1", "q2", "q3", "q5", "q7", "q8", "q9", "old-a", "old-b"]
    assert [c["message"]["content"] for c in lines[5]["response"]["body"]["choices"]] == ["a", "b", "c"]
    monkeypatch.setattr(defaults, "RESULTS_SLICE_ROWS", 1)
    written = results.write_results(results.BatchResults(conn, batch_id), str(tmp_path / "again.jsonl"), "jsonl")
    assert (written.rows, written.errors) == (9, 1) and written.note.startswith("Note: 2 structured outputs")
    written = results.write_results(results.BatchResults(conn, batch_id), str(tmp_path / "again.parquet"))
    assert written.rows == 12 and written.note.startswith("Note: 2 structured outputs")


def test_an_embedding_batch_fixes_its_vector_size_across_slices(redis_url, tmp_path, monkeypatch):
    """The first part file has only a failure (no vector to take the size from); a request's inputs span parts."""
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = new_batch(conn, out, task="embed")
    write_parts(
        out,
        batch_id,
        [
            [embed_row("e1", 1, error="too long")],
            [embed_row("e2", 2, index=0), embed_row("e4", 4), embed_row("e3", 3, index=1)],
            [embed_row("e2", 2, index=1), embed_row("e3", 3, index=0), embed_row("e1", 1, at=3)],
        ],
    )
    conn.hset(keys.batch(batch_id), "status", "completed")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch))
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 4)
    assert [(r["custom_id"], r["input_index"]) for r in table.to_pylist()] == [
        ("e1", 0),
        ("e2", 0),
        ("e2", 1),
        ("e3", 0),
        ("e3", 1),
        ("e4", 0),
    ]
    assert_same_lines(write_three_ways(conn, batch_id, tmp_path, monkeypatch, "jsonl"))


@pytest.mark.parametrize("sizes", [(4, 4, 2), (2, 4, 4)], ids=["last-differs", "first-differs"])
def test_an_embedding_batch_of_two_vector_sizes_keeps_lists(redis_url, tmp_path, monkeypatch, sizes):
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = new_batch(conn, out, task="embed")
    write_parts(out, batch_id, [[embed_row(f"e{i}", i, size=size)] for i, size in enumerate(sizes, 1)])
    conn.hset(keys.batch(batch_id), "status", "completed")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch, tiny=1))
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    assert [len(v) for v in table["embedding"].to_pylist()] == list(sizes)
    assert not list(tmp_path.glob(".tmp-*"))  # the first try's file is gone


def test_an_embedding_batch_that_all_failed_keeps_lists(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = new_batch(conn, out, task="embed")
    write_parts(out, batch_id, [[embed_row("e1", 1, error="x")], [embed_row("e2", 2, error="y")]])
    conn.hset(keys.batch(batch_id), "status", "completed")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch, tiny=1))
    assert table.schema.field("embedding").type == pa.list_(pa.float32()) and table.num_rows == 2


def test_an_expired_batchs_never_run_requests_come_last_in_every_slicing(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = new_batch(conn, out, total=5)
    write_parts(out, batch_id, [[gen_row("a", 1), gen_row("c", 3)], [gen_row("b", 2)]])
    conn.hset(keys.batch_jobs(batch_id), mapping={c: f"job-{c}" for c in "abcde"})
    conn.hset(keys.batch(batch_id), "status", "expired")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch, tiny=1))
    assert [(r["custom_id"], r["error_code"]) for r in table.to_pylist()] == [
        ("a", None),
        ("b", None),
        ("c", None),
        ("d", "batch_expired"),
        ("e", "batch_expired"),
    ]
    assert_same_lines(write_three_ways(conn, batch_id, tmp_path, monkeypatch, "jsonl", tiny=1))


def test_a_part_file_from_before_the_line_column_is_read_last(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = new_batch(conn, out)
    write_parts(out, batch_id, [[gen_row("b", 2), gen_row("a", 1)]])
    old = pa.Table.from_pylist(
        [{k: v for k, v in gen_row("zz-old", None).items() if k not in ("line", "extra")} | {"batch_id": batch_id}]
    )
    pq.write_table(old, out / batch_id / "part-old-000001.parquet")
    conn.hset(keys.batch(batch_id), "status", "completed")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch, tiny=1))
    assert table["custom_id"].to_pylist() == ["a", "b", "zz-old"]


def test_a_batch_with_no_rows_writes_an_empty_file_of_its_columns(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    batch_id = new_batch(conn, tmp_path / "out")
    conn.hset(keys.batch(batch_id), "status", "completed")
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch))
    assert table.num_rows == 0 and "output" in table.column_names and "embedding" not in table.column_names


def test_the_partial_file_carries_the_runs_counts_in_its_metadata(redis_url, tmp_path, monkeypatch):
    conn = connection.connect(redis_url)
    batch_id = generation_batch(conn, tmp_path / "out")
    monkeypatch.setattr(defaults, "RESULTS_SLICE_ROWS", 3)
    path = str(tmp_path / "r.partial.parquet")
    results.write_results(results.BatchResults(conn, batch_id), path, metadata={b"miro.partial": b"true"})
    assert pq.read_schema(path).metadata[b"miro.partial"] == b"true"
    assert pq.read_table(path).num_rows == 12


def _stored_batch(conn, out, status: str, ids: list[str], chunk_size: int = 3) -> str:
    """A batch whose requests are stored in chunks (spool.py), one a line from 1, as submit stores them."""
    from miro.worker.fleet.records.payload import Request
    from miro.worker.fleet.intake.spool import SpoolWriter

    batch_id = new_batch(conn, out, total=len(ids))
    writer = SpoolWriter(str(out), batch_id, chunk_size)
    for line, cid in enumerate(ids, 1):
        writer.add(
            Request(
                custom_id=cid,
                line=line,
                kind="chat",
                prompt=None,
                messages=[{"role": "user", "content": "x"}],
                sampling={},
                requested_model=None,
                form="simple",
                url=None,
            )
        )
    conn.hset(keys.batch(batch_id), mapping={"chunks": writer.close(), "spooled": len(ids), "status": status})
    return batch_id


def test_an_expired_batchs_stored_requests_that_never_ran_come_at_their_lines_slice_by_slice(
    redis_url, tmp_path, monkeypatch
):
    """results.Unread reads the never-run requests from the stored chunks as each slice needs them: in every slicing
    the files equal collect's, each at its line; a request whose row has another line (a resume of an edited file)
    is not taken for one that never ran."""
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    ids = [f"r{i}" for i in range(1, 11)]
    batch_id = _stored_batch(conn, out, "expired", ids)
    write_parts(out, batch_id, [[gen_row("r2", 2), gen_row("r9", 9)], [gen_row("r5", 5), gen_row("r7", 70)]])
    table = assert_same_parquet(write_three_ways(conn, batch_id, tmp_path, monkeypatch, tiny=2))
    assert [(r["custom_id"], r["line"], r["error_code"]) for r in table.to_pylist()] == [
        (f"r{i}", i if i != 7 else 70, None if i in (2, 5, 7, 9) else "batch_expired")
        for i in (1, 2, 3, 4, 5, 6, 8, 9, 10, 7)
    ]
    assert_same_lines(write_three_ways(conn, batch_id, tmp_path, monkeypatch, "jsonl", tiny=2))


def test_a_cancelled_batchs_never_run_requests_only_when_asked(redis_url, tmp_path, monkeypatch):
    """Anthropic's results give a cancelled batch's never-run requests (`canceled`): BatchResults(cancelled=True)
    has a batch_cancelled row for each; OpenAI's files and miro results do not."""
    conn = connection.connect(redis_url)
    out = tmp_path / "out"
    batch_id = _stored_batch(conn, out, "cancelled", ["a", "b", "c", "d"])
    write_parts(out, batch_id, [[gen_row("b", 2)]])
    monkeypatch.setattr(defaults, "RESULTS_SLICE_ROWS", 1)
    plain = pa.concat_tables(results.BatchResults(conn, batch_id).slices())
    assert plain["custom_id"].to_pylist() == ["b"]
    asked = pa.concat_tables(results.BatchResults(conn, batch_id, cancelled=True).slices())
    assert [(r["custom_id"], r["error_code"]) for r in asked.to_pylist()] == [
        ("a", "batch_cancelled"),
        ("b", None),
        ("c", "batch_cancelled"),
        ("d", "batch_cancelled"),
    ]
    assert [len(rows) for rows in results.request_rows(asked)] == [1, 1, 1, 1]
