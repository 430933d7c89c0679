"""Merge a batch's part files into one table (one row per custom id and choice, or input) and write it out.

A request that ran twice (a worker died after writing its row but before RQ
heard of it) has two rows; the merge keeps one, preferring a success over an
error and then the latest. An expired batch's requests that never ran get a row each, error code batch_expired. The table keeps its batch's task's columns (rows.TASK_COLUMNS): an embedding batch's
`embedding` column is fixed_size_list<float32>[size] when every vector has one size (lines that ask for different
`dimensions` leave it list<float32>). Output: Parquet, or the OpenAI Batch API's output JSONL with failed
requests in a separate errors file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from miro.core.errors import MiroError

from . import batches, keys, spool, storage
from .batches import BatchRecord
from .rows import SCHEMA, TASK_COLUMNS, expired_rows, invalid_line_rows, openai_line
from .sink import open_output, write_table_atomically


def read_parts(output: str, batch_id: str) -> pa.Table:
    """Every complete part file of the batch (temporary files are skipped), as one table."""
    filesystem, base = open_output(output)
    folder = f"{base}/{batch_id}"
    infos = filesystem.get_file_info(pa.fs.FileSelector(folder, allow_not_found=True))
    parts = sorted(i.path for i in infos if i.base_name.startswith("part-") and i.base_name.endswith(".parquet"))
    tables = [pq.read_table(path, filesystem=filesystem, schema=SCHEMA) for path in parts]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def merge(table: pa.Table) -> pa.Table:
    """One row per (custom_id, choice_index, input_index): successes before errors, then the latest finished; in
    the order of the input file's lines (as vLLM returns outputs in the order of its prompts), choices and inputs
    in order. A request's error row (no input index) stands for its first input, so a success replaces it."""
    if table.num_rows == 0:
        return table
    failed = pc.invert(pc.is_null(table["error"])).cast(pa.int8())
    ranked = table.append_column("_failed", failed).append_column("_input", pc.fill_null(table["input_index"], 0))
    ranked = ranked.sort_by([("custom_id", "ascending"), ("choice_index", "ascending"), ("_input", "ascending"),
                             ("_failed", "ascending"), ("finished_at", "descending")])
    keys = list(zip(ranked["custom_id"].to_pylist(), ranked["choice_index"].to_pylist(), ranked["_input"].to_pylist()))
    first = [i for i, key in enumerate(keys) if i == 0 or key != keys[i - 1]]
    kept = ranked.take(first).drop_columns(["_failed"])
    # rows written before the line column existed have none: they follow, by custom id
    kept = kept.sort_by([("line", "ascending"), ("custom_id", "ascending"), ("choice_index", "ascending"),
                         ("_input", "ascending")])
    return kept.drop_columns(["_input"])


def task_table(table: pa.Table, task: str) -> pa.Table:
    """The merged table with the columns of the batch's task only; an embedding batch's vectors of one size as
    fixed_size_list<float32>[size]."""
    other = next(columns for name, columns in TASK_COLUMNS.items() if name != task)
    table = table.drop_columns([name for name in other if name in table.column_names])
    if task != "embed":
        return table
    sizes = pc.unique(pc.list_value_length(table["embedding"]).drop_null()).to_pylist()
    if len(sizes) != 1:  # no vector (every line failed), or lines asked for different dimensions
        return table
    index = table.column_names.index("embedding")
    return table.set_column(index, "embedding", table["embedding"].cast(pa.list_(pa.float32(), sizes[0])))


def collect(conn, batch_id: str) -> tuple[pa.Table, BatchRecord]:
    """The merged rows of a batch (part files plus invalid lines, and for an expired batch a batch_expired row per
    request that never ran) and its record."""
    batch = batches.get_batch(conn, batch_id)
    parts = read_parts(batch.output, batch_id)
    invalid = invalid_line_rows(batch_id, batches.failed_lines(conn, batch_id))
    expired = _expired(conn, batch, parts) if batch.status == "expired" else SCHEMA.empty_table()
    return spread_extra(task_table(merge(pa.concat_tables([parts, invalid, expired])), batch.task)), batch


def _expired(conn, batch: BatchRecord, parts: pa.Table) -> pa.Table:
    """The requests of an expired batch with no row: those its window cut off."""
    ran = set(pc.unique(parts["custom_id"]).to_pylist())
    jobs = {cid.decode(): jid.decode() for cid, jid in conn.hgetall(keys.batch_jobs(batch.id)).items()}
    never_fed = {r.custom_id: batches.job_id(batch.id, r.custom_id) for r in spool.never_fed(batch)}
    return expired_rows(batch.id, {cid: jid for cid, jid in jobs.items() if cid not in ran} | never_fed)


def cut_constraints_note(table: pa.Table) -> str | None:
    """A sentence on the structured-output requests that max_tokens cut short (they may not parse), if any."""
    if table.num_rows == 0 or "finish_reason" not in table.column_names:
        return None
    constrained = pc.match_substring(pc.fill_null(table["sampling"], ""), '"structured_outputs":')
    cut = pc.sum(pc.and_(constrained, pc.equal(pc.fill_null(table["finish_reason"], ""), "length"))).as_py() or 0
    if not cut:
        return None
    return (f"Note: {cut:,} structured outputs stopped at max_tokens (finish_reason \"length\") and may not parse; "
            f"their parsed column is null.")


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
    """To a local path or a URI (storage.py), under a temporary name and renamed: never half a file at `path`."""
    filesystem, where = open_output(path)
    try:
        write_table_atomically(filesystem, where, table)
    except OSError as err:
        raise MiroError(f"cannot write the results to {path}: {err}.") from None


def openai_lines(table: pa.Table) -> Iterator[dict]:
    """The merged table as OpenAI Batch output lines, one per request (its choices together), in table order."""
    by_request: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        by_request.setdefault(row["custom_id"], []).append(row)
    for rows in by_request.values():
        yield openai_line(rows)


def write_openai_jsonl(table: pa.Table, path: str, errors_path: str) -> tuple[int, int]:
    """OpenAI Batch output lines to `path`, failed requests to `errors_path`; returns (ok, failed) counts."""
    ok = failed = 0
    try:
        with storage.open_text(path) as out, storage.open_text(errors_path) as errors:
            for line in openai_lines(table):
                (errors if line["error"] else out).write(json.dumps(line, ensure_ascii=False) + "\n")
                failed, ok = (failed + 1, ok) if line["error"] else (failed, ok + 1)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        raise MiroError(f"cannot write the results: {err.strerror or err}{where}.") from None
    return ok, failed


@dataclass
class Written:
    """What write_results wrote, and the sentence that says so."""

    path: str
    rows: int  # Parquet rows, or (jsonl) response lines
    errors_path: str | None = None  # jsonl: the failed requests' lines
    errors: int = 0
    note: str | None = None  # cut_constraints_note's, if any

    def sentence(self) -> str:
        if self.errors_path is None:
            return f"Wrote {self.rows:,} rows to {self.path}"
        return f"Wrote {self.rows:,} responses to {self.path} and {self.errors:,} errors to {self.errors_path}"


def write_results(table: pa.Table, path: str, fmt: str = "parquet", errors_path: str | None = None) -> Written:
    """The merged table as Parquet, or (fmt "jsonl") as OpenAI Batch output lines with the failed requests in
    `errors_path` (default: PATH with .errors.jsonl)."""
    if fmt == "parquet":
        write_parquet(table, path)
        written = Written(path, table.num_rows)
    else:
        errors_path = errors_path or storage.with_suffix(path, ".jsonl", ".errors.jsonl")
        ok, failed = write_openai_jsonl(table, path, errors_path)
        written = Written(path, ok, errors_path, failed)
    written.note = cut_constraints_note(table)
    return written
