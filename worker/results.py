"""Merge a batch's part files into one table (one row per custom id and choice) and write it out.

A request that ran twice (a worker died after writing its row but before RQ
heard of it) has two rows; the merge keeps one, preferring a success over an
error and then the latest. Output: Parquet, or the OpenAI Batch API's output
JSONL with failed requests in a separate errors file.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from miro.core.errors import MiroError

from .sink import SCHEMA, open_output


def read_parts(output: str, batch_id: str) -> pa.Table:
    """Every complete part file of the batch (temporary files are skipped), as one table."""
    filesystem, base = open_output(output)
    folder = f"{base}/{batch_id}"
    infos = filesystem.get_file_info(pa.fs.FileSelector(folder, allow_not_found=True))
    parts = sorted(i.path for i in infos if i.base_name.startswith("part-") and i.base_name.endswith(".parquet"))
    tables = [pq.read_table(path, filesystem=filesystem, schema=SCHEMA) for path in parts]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def merge(table: pa.Table) -> pa.Table:
    """One row per (custom_id, choice_index): successes before errors, then the latest finished; in the
    order of the input file's lines (as vLLM returns outputs in the order of its prompts), choices in order."""
    if table.num_rows == 0:
        return table
    failed = pc.invert(pc.is_null(table["error"])).cast(pa.int8())
    ranked = table.append_column("_failed", failed)
    ranked = ranked.sort_by([("custom_id", "ascending"), ("choice_index", "ascending"), ("_failed", "ascending"),
                             ("finished_at", "descending")])
    keys = list(zip(ranked["custom_id"].to_pylist(), ranked["choice_index"].to_pylist()))
    first = [i for i, key in enumerate(keys) if i == 0 or key != keys[i - 1]]
    kept = ranked.take(first).drop_columns(["_failed"])
    # rows written before the line column existed have none: they follow, by custom id
    return kept.sort_by([("line", "ascending"), ("custom_id", "ascending"), ("choice_index", "ascending")])


def invalid_line_rows(batch_id: str, records: dict[str, dict]) -> pa.Table:
    """Lines that failed validation (`--skip-invalid`), as failed rows of the batch."""
    rows = [{"batch_id": batch_id, "custom_id": cid, "line": rec.get("line"), "choice_index": 0, "error": rec["error"]}
            for cid, rec in records.items()]
    return pa.Table.from_pylist(rows, SCHEMA) if rows else SCHEMA.empty_table()


def collect(conn, batch_id: str) -> tuple[pa.Table, dict]:
    """The merged rows of a batch (part files plus invalid lines) and its record."""
    from . import batches

    batch = batches.get_batch(conn, batch_id)
    parts = read_parts(batch["output"], batch_id)
    invalid = invalid_line_rows(batch_id, batches.failed_lines(conn, batch_id))
    return spread_extra(merge(pa.concat_tables([parts, invalid]))), batch


def spread_extra(table: pa.Table) -> pa.Table:
    """The `extra` column (each simple line's own fields, JSON) as one column per field, in the order the
    fields first appear; null where a line lacks one. A field whose values pyarrow cannot hold in one type
    (a number here, text there) becomes a column of their JSON text."""
    values = [json.loads(v) if v else {} for v in table["extra"].to_pylist()]
    names = list(dict.fromkeys(name for row in values for name in row))
    table = table.drop_columns(["extra"])
    for name in names:
        column = [row.get(name) for row in values]
        try:
            array = pa.array(column)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            array = pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in column])
        table = table.append_column(name, array)
    return table


def write_parquet(table: pa.Table, path: str) -> None:
    try:
        pq.write_table(table, path, compression="zstd")
    except OSError as err:
        raise MiroError(f"cannot write the results to {path}: {err}.") from None


def _chat_logprobs(entries: list[dict] | None) -> dict | None:
    """OpenAI's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    if entries is None:
        return None

    def token(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["bytes"])}

    return {"content": [{**token(e), "top_logprobs": [token(t) for t in e["top_logprobs"]]} for e in entries]}


def _completion_logprobs(entries: list[dict] | None) -> dict | None:
    """OpenAI's legacy completions `logprobs`: parallel lists, top alternatives as {token: logprob}, and each
    token's character offset in the completion text."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def _response_body(rows: list[dict]) -> dict:
    first = rows[0]
    created = int(first["finished_at"].timestamp()) if first["finished_at"] else 0
    if first["kind"] == "chat":
        choices = [{"index": r["choice_index"], "message": {"role": "assistant", "content": r["output"]},
                    "logprobs": _chat_logprobs(r["logprobs"]), "finish_reason": r["finish_reason"]} for r in rows]
        obj = "chat.completion"
    else:
        choices = [{"index": r["choice_index"], "text": r["output"], "logprobs": _completion_logprobs(r["logprobs"]),
                    "finish_reason": r["finish_reason"]} for r in rows]
        obj = "text_completion"
    completion_tokens = sum(r["completion_tokens"] or 0 for r in rows)
    return {
        "id": f"{'chatcmpl' if first['kind'] == 'chat' else 'cmpl'}-{first['job_id']}",
        "object": obj,
        "created": created,
        "model": first["model"],
        "choices": choices,
        "usage": {"prompt_tokens": first["prompt_tokens"] or 0, "completion_tokens": completion_tokens,
                  "total_tokens": (first["prompt_tokens"] or 0) + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": first["cached_tokens"] or 0}},
    }


def write_openai_jsonl(table: pa.Table, path: str, errors_path: str) -> tuple[int, int]:
    """OpenAI Batch output lines to `path`, failed requests to `errors_path`; returns (ok, failed) counts."""
    by_request: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        by_request.setdefault(row["custom_id"], []).append(row)
    ok = failed = 0
    try:
        with open(path, "w", encoding="utf-8") as out, open(errors_path, "w", encoding="utf-8") as errors:
            for custom_id, rows in by_request.items():
                rows.sort(key=lambda r: r["choice_index"])
                # an invalid line never became a job: its id names its line instead
                request_id = rows[0]["job_id"] or f"line-{rows[0]['line']}-invalid"
                line = {"id": f"batch_req_{request_id}", "custom_id": custom_id}
                error = next((r["error"] for r in rows if r["error"]), None)
                if error:
                    line.update(response=None, error={"code": "request_failed", "message": error})
                    errors.write(json.dumps(line, ensure_ascii=False) + "\n")
                    failed += 1
                else:
                    line.update(response={"status_code": 200, "request_id": rows[0]["job_id"],
                                          "body": _response_body(rows)}, error=None)
                    out.write(json.dumps(line, ensure_ascii=False) + "\n")
                    ok += 1
    except OSError as err:
        raise MiroError(f"cannot write the results: {err.strerror} ({err.filename}).") from None
    return ok, failed
