"""ParquetSink part files and the results merge, on a real local folder."""

import json
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq

import pyarrow as pa
import pytest

from miro.worker.fleet.output.results import merge, read_parts, write_openai_jsonl
from miro.worker.fleet.output.rows import SCHEMA, invalid_line_rows
from miro.worker.fleet.output.sink import ParquetSink

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def row(custom_id, *, batch="batch_a", choice=0, output="hi", error=None, at=0, kind="chat", job="job-1", line=None):
    return dict(
        batch_id=batch,
        custom_id=custom_id,
        line=line,
        choice_index=choice,
        kind=kind,
        job_id=job,
        model="m",
        prompt="p",
        output=None if error else output,
        finish_reason=None if error else "stop",
        prompt_tokens=5,
        cached_tokens=3,
        completion_tokens=None if error else 2,
        output_token_ids=None if error else [7, 8],
        error=error,
        worker="w1",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=at),
        latency_s=0.5,
        sampling=json.dumps({"max_tokens": 4}),
    )


def test_sink_writes_whole_zstd_parts_per_batch(tmp_path):
    sink = ParquetSink(str(tmp_path), "w1", flush_rows=3, flush_seconds=3600)
    sink.add(row("a"))
    sink.add(row("b"))
    assert not sink.due()
    sink.add(row("c", batch="batch_b"))
    assert sink.due()
    written = sink.flush()
    assert [r["custom_id"] for r in written] == ["a", "b", "c"] and sink.pending == 0
    parts_a = list((tmp_path / "batch_a").iterdir())
    assert len(parts_a) == 1 and parts_a[0].name.startswith("part-w1-") and parts_a[0].suffix == ".parquet"
    meta = pq.ParquetFile(parts_a[0]).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(parts_a[0]).schema.equals(SCHEMA)
    assert not list(tmp_path.rglob(".tmp-*"))


def test_sink_flushes_on_time(tmp_path):
    sink = ParquetSink(str(tmp_path), "w1", flush_rows=100, flush_seconds=0.0)
    assert not sink.due()
    sink.add(row("a"))
    assert sink.due()


def test_merge_keeps_one_row_per_request_preferring_success(tmp_path):
    sink = ParquetSink(str(tmp_path), "w1")
    sink.add(row("a", output="old", at=1))
    sink.add(row("a", output="new", at=2))  # ran twice: keep the latest
    sink.add(row("b", error="boom", at=3))
    sink.add(row("b", output="fixed", at=1))  # a success beats a later failure
    sink.add(row("c", error="bad line"))
    sink.add(row("d", choice=1, output="second"))
    sink.add(row("d", choice=0, output="first"))
    sink.flush()
    (tmp_path / "batch_a" / ".tmp-123-part-x.parquet").write_bytes(b"half a file")  # ignored
    merged = merge(read_parts(str(tmp_path), "batch_a"))
    got = {(r["custom_id"], r["choice_index"]): (r["output"], r["error"]) for r in merged.to_pylist()}
    assert got == {
        ("a", 0): ("new", None),
        ("b", 0): ("fixed", None),
        ("c", 0): (None, "bad line"),
        ("d", 0): ("first", None),
        ("d", 1): ("second", None),
    }


def test_openai_jsonl_output(tmp_path):
    sink = ParquetSink(str(tmp_path), "w1")
    sink.add(row("chat-1", output="Paris"))
    sink.add(row("text-1", kind="completion", output=" world", job="job-2"))
    sink.add(row("bad-1", error="prompt too long", job="job-3"))
    sink.flush()
    ok, failed = write_openai_jsonl(
        merge(read_parts(str(tmp_path), "batch_a")), tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    )
    assert (ok, failed) == (2, 1)
    lines = {json.loads(line)["custom_id"]: json.loads(line) for line in open(tmp_path / "out.jsonl")}
    chat = lines["chat-1"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
    assert chat["body"]["choices"][0]["message"] == {"role": "assistant", "content": "Paris"}
    assert chat["body"]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    assert lines["text-1"]["response"]["body"]["choices"][0]["text"] == " world"
    assert lines["chat-1"]["error"] is None
    error = json.loads(open(tmp_path / "errors.jsonl").read())
    assert error["custom_id"] == "bad-1" and error["response"] is None
    assert error["error"]["message"] == "prompt too long"


def test_no_parts_is_an_empty_table(tmp_path):
    assert read_parts(str(tmp_path), "batch_none").num_rows == 0


def test_rows_come_back_in_input_line_order_not_custom_id_text_order(tmp_path):
    """q1, q2, ..., q10 as the file has them (not q1, q10, q2); choices in order; an invalid line in its
    place; rows from before the line column (no line) after them."""
    sink = ParquetSink(str(tmp_path), "w1")
    for number in (10, 2, 1):  # finished in another order than the file's
        sink.add(row(f"q{number}", line=number, job=f"job-{number}"))
    sink.add(row("q3", line=3, choice=1, output="second", job="job-3"))
    sink.add(row("q3", line=3, choice=0, output="first", job="job-3"))
    sink.add(row("old", line=None, job="job-old"))
    sink.flush()
    invalid = invalid_line_rows(
        "batch_a", {"line-4-invalid": {"custom_id": "line-4-invalid", "line": 4, "error": "line 4: not valid JSON"}}
    )
    merged = merge(pa.concat_tables([read_parts(str(tmp_path), "batch_a"), invalid]))
    assert [(r["custom_id"], r["choice_index"]) for r in merged.to_pylist()] == [
        ("q1", 0),
        ("q2", 0),
        ("q3", 0),
        ("q3", 1),
        ("line-4-invalid", 0),
        ("q10", 0),
        ("old", 0),
    ]
    ok, failed = write_openai_jsonl(merged, tmp_path / "out.jsonl", tmp_path / "errors.jsonl")
    assert [json.loads(x)["custom_id"] for x in open(tmp_path / "out.jsonl")] == ["q1", "q2", "q3", "q10", "old"]
    [error] = [json.loads(x) for x in open(tmp_path / "errors.jsonl")]
    assert error["id"] == "batch_req_line-4-invalid" and error["custom_id"] == "line-4-invalid"


def test_logprobs_reach_the_parquet_column_and_both_openai_shapes(tmp_path, tiny_model):
    """A request that asked for logprobs: each generated token with its text, bytes, logprob and top-2, in
    the Parquet column and as OpenAI's chat (`content`) and legacy completions (parallel lists) objects."""
    from miro.core import Engine, SamplingParams
    from miro.worker.fleet.output.rows import result_rows
    from miro.worker.fleet.records.payload import JobPayload

    engine = Engine.from_model(tiny_model, num_kv_blocks=16)
    params = SamplingParams(max_tokens=4, logprobs=2, temperature=0, ignore_eos=True)
    engine.generate(["hello " * 20], params, use_tqdm=False)
    [output] = engine.generate(["hello " * 20], params, use_tqdm=False)  # its prompt's full blocks are cached now
    assert output.num_cached_tokens >= 16
    sink = ParquetSink(str(tmp_path), "w1")
    for kind, custom_id in (("chat", "c"), ("completion", "t")):
        payload = JobPayload(
            batch_id="batch_a", custom_id=custom_id, kind=kind, model="tiny", sampling={"logprobs": 2}, prompt="hello"
        )
        for r in result_rows(
            payload,
            output,
            job_id=f"job-{custom_id}",
            worker="w1",
            model="tiny",
            prompt="hello",
            started=0.0,
            finished=1.0,
        ):
            sink.add(r)
    sink.add(row("plain", job="job-plain"))  # no logprobs asked: null
    sink.flush()
    merged = merge(read_parts(str(tmp_path), "batch_a")).to_pylist()
    column = {r["custom_id"]: r["logprobs"] for r in merged}
    assert column["plain"] is None
    entries = column["c"]
    assert [e["token_id"] for e in entries] == list(output.outputs[0].token_ids)
    for e, sampled in zip(entries, output.outputs[0].logprobs):
        assert e["logprob"] == sampled.logprob <= 0 and e["bytes"] == engine.tokenizer.token_bytes(e["token_id"])
        assert [t["token_id"] for t in e["top_logprobs"]] == [t.token_id for t in sampled.top_logprobs]
        assert len(sampled.top_logprobs) == 2 and e["token"] == sampled.token
    write_openai_jsonl(merge(read_parts(str(tmp_path), "batch_a")), tmp_path / "out.jsonl", tmp_path / "errors.jsonl")
    lines = {
        json.loads(x)["custom_id"]: json.loads(x)["response"]["body"]["choices"][0]
        for x in open(tmp_path / "out.jsonl")
    }
    chat = lines["c"]["logprobs"]["content"]
    assert [c["token"] for c in chat] == [e["token"] for e in entries]
    assert [len(c["top_logprobs"]) for c in chat] == [2] * 4 and chat[0]["bytes"] == list(entries[0]["bytes"])
    legacy = lines["t"]["logprobs"]
    assert legacy["tokens"] == [e["token"] for e in entries]
    assert legacy["token_logprobs"] == [e["logprob"] for e in entries]
    assert legacy["text_offset"][0] == 0 and len(legacy["top_logprobs"][0]) <= 2
    assert lines["plain"]["logprobs"] is None
    usage = {x["custom_id"]: x["response"]["body"]["usage"] for x in map(json.loads, open(tmp_path / "out.jsonl"))}
    assert usage["c"]["prompt_tokens_details"] == {"cached_tokens": output.num_cached_tokens}


def test_a_lines_own_fields_become_columns_of_the_results(tmp_path):
    from miro.worker.fleet.output.results import spread_extra

    sink = ParquetSink(str(tmp_path), "w1")
    sink.add({**row("q1", line=1), "extra": json.dumps({"category": "math", "score": 3})})
    sink.add({**row("q2", line=2), "extra": json.dumps({"category": "poetry", "score": "high"})})
    sink.add(row("q3", line=3))  # a line with none of its own
    sink.flush()
    table = spread_extra(merge(read_parts(str(tmp_path), "batch_a")))
    assert "extra" not in table.column_names and table.column_names[-2:] == ["category", "score"]
    assert table["category"].to_pylist() == ["math", "poetry", None]
    assert table["score"].to_pylist() == ["3", '"high"', None]  # a number and a string: kept as their JSON


def test_the_sink_refuses_a_key_the_rows_do_not_have(tmp_path):
    sink = ParquetSink(str(tmp_path), "w1")
    with pytest.raises(ValueError, match="rows have no column finsh_reason"):
        sink.add({**row("a"), "finsh_reason": "stop"})
    assert sink.pending == 0
