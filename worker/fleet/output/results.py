"""Merge a batch's part files into one table (one row per custom id and choice, or input) and write it out.

A request that ran twice (a worker died after writing its row but before RQ
heard of it) has two rows; the merge keeps one, preferring a success over an
error and then the latest. An expired batch's requests that never ran get a row each, error code batch_expired. The table keeps its batch's task's columns (rows.TASK_COLUMNS): an embedding batch's
`embedding` column is fixed_size_list<float32>[size] when every vector has one size (lines that ask for different
`dimensions` leave it list<float32>). Output: Parquet, or the OpenAI Batch API's output JSONL with failed
requests in a separate errors file.

`miro results` and `miro run` write a batch's results a slice of lines at a time (`BatchResults`, part_slices.py):
each slice is merged and shaped as the whole table would be, the embedding column's type and the lines' own
fields' columns being decided before the first slice is written. `collect` gives the whole table at once.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from miro.core import defaults
from miro.core.errors import MiroError

from miro.worker.fleet.records import batches, keys
from miro.worker.fleet.intake import spool
from miro.worker.fleet.output import storage
from miro.worker.fleet.records.batches import BatchRecord
from miro.worker.fleet.output.extra_columns import ExtraColumns, inferred_array
from miro.worker.fleet.records.payload import Request
from miro.worker.fleet.output.part_slices import PartFiles, TableRows, part_paths, rows_of
from miro.worker.fleet.output.rows import SCHEMA, TASK_COLUMNS, expired_rows, invalid_line_rows, openai_line
from miro.worker.fleet.intake.seen_ids import hash_ids
from miro.worker.fleet.output.sink import atomic_output, open_output


def read_parts(output: str, batch_id: str) -> pa.Table:
    """Every complete part file of the batch (temporary files are skipped), as one table."""
    filesystem, base = open_output(output)
    parts = part_paths(filesystem, f"{base}/{batch_id}")
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
    ranked = ranked.sort_by(
        [
            ("custom_id", "ascending"),
            ("choice_index", "ascending"),
            ("_input", "ascending"),
            ("_failed", "ascending"),
            ("finished_at", "descending"),
        ]
    )
    # the first row of each (custom_id, choice_index, _input): where the key differs from the row before's
    repeated = np.ones(ranked.num_rows - 1, bool)
    for name in ("custom_id", "choice_index", "_input"):
        repeated &= _same_as_before(ranked[name])
    first = np.nonzero(np.concatenate([[True], ~repeated]))[0]
    kept = ranked.take(first).drop_columns(["_failed"])
    # rows written before the line column existed have none: they follow, by custom id
    kept = kept.sort_by(
        [("line", "ascending"), ("custom_id", "ascending"), ("choice_index", "ascending"), ("_input", "ascending")]
    )
    return kept.drop_columns(["_input"])


def _same_as_before(column: pa.ChunkedArray) -> np.ndarray:
    """For each value but the first: whether it equals the one before it (two nulls are equal)."""
    later, earlier = column[1:], column[:-1]
    equal = pc.fill_null(pc.equal(later, earlier), False)
    both_null = pc.and_(pc.is_null(later), pc.is_null(earlier))
    return pc.or_(equal, both_null).to_numpy(zero_copy_only=False)


def task_columns(table: pa.Table, task: str) -> pa.Table:
    """The merged table with the columns of the batch's task only."""
    other = next(columns for name, columns in TASK_COLUMNS.items() if name != task)
    return table.drop_columns([name for name in other if name in table.column_names])


def vector_sizes(table: pa.Table) -> set[int]:
    """The lengths of an embedding batch's vectors."""
    return set(pc.unique(pc.list_value_length(table["embedding"]).drop_null()).to_pylist())


def fixed_vectors(table: pa.Table, size: int) -> pa.Table:
    """The embedding column as fixed_size_list<float32>[size]."""
    index = table.column_names.index("embedding")
    return table.set_column(index, "embedding", table["embedding"].cast(pa.list_(pa.float32(), size)))


def task_table(table: pa.Table, task: str) -> pa.Table:
    """The merged table with the columns of the batch's task only; an embedding batch's vectors of one size as
    fixed_size_list<float32>[size]."""
    table = task_columns(table, task)
    if task != "embed":
        return table
    sizes = vector_sizes(table)
    if len(sizes) != 1:  # no vector (every line failed), or lines asked for different dimensions
        return table
    return fixed_vectors(table, sizes.pop())


def collect(conn, batch_id: str) -> tuple[pa.Table, BatchRecord]:
    """The merged rows of a batch (part files plus invalid lines, and for an expired batch a batch_expired row per
    request that never ran) and its record, as one table (for tests and small batches: the server and the CLI write
    a slice at a time, BatchResults)."""
    batch = batches.get_batch(conn, batch_id)
    parts = read_parts(batch.output, batch_id)
    unread = Unread(conn, batch, PartFiles(batch.output, batch_id)).table()
    return spread_extra(task_table(merge(pa.concat_tables([parts, unread])), batch.task)), batch


def _sorted_hashes(custom_ids: list[str]) -> np.ndarray:
    return np.unique(hash_ids(custom_ids)) if custom_ids else np.asarray([], np.uint64)


def _among(sorted_hashes: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Which of `hashes` are in `sorted_hashes` (sorted, unique)."""
    if not sorted_hashes.size or not hashes.size:
        return np.zeros(hashes.shape[0], dtype=bool)
    at = np.minimum(np.searchsorted(sorted_hashes, hashes), sorted_hashes.size - 1)
    return sorted_hashes[at] == hashes


class Unread:
    """The batch's rows that no part file holds, a slice of lines at a time (part_slices.rows_of's `unread`): its
    invalid lines (a table: Redis holds them anyway), and for an expired batch a batch_expired row per request that
    never ran (with `cancelled`, a cancelled batch's get batch_cancelled rows: Anthropic's results say `canceled`
    for each). Those are read from the stored chunks (spool.py) as each slice needs them, so what is kept for the
    whole batch is 8 bytes a request: the 64-bit hashes of the custom ids with a row (seen_ids.hash_ids; two ids
    with one hash, about n^2 / 2^65, would leave one out) and of the stored ones, and the lines of those that never
    ran. What the jobs hash holds beside the stored requests (a batch from before requests were stored, a --resume
    of an edited file) and never ran has no line: those rows come last."""

    def __init__(self, conn, batch: BatchRecord, parts: PartFiles, cancelled: bool = False):
        self.batch = batch
        self.invalid = TableRows(invalid_line_rows(batch.id, batches.failed_lines(conn, batch.id)))
        self.code = (
            "batch_expired"
            if batch.status == "expired"
            else "batch_cancelled"
            if cancelled and batch.status == "cancelled"
            else None
        )
        self._chunks: list[tuple[int, int] | None] = []  # each stored chunk's least and greatest never-run line
        self._cached: tuple[int, list[Request]] | None = None  # the chunk last read
        self._unlined: dict[str, str] = {}  # custom id -> job id of the never-run requests with no line
        never = []
        if self.code is not None:
            self._ran = np.unique(
                np.concatenate(
                    [np.asarray([], np.uint64)]
                    + [
                        _sorted_hashes(parts.read([p.path], ["custom_id"])["custom_id"].to_pylist())
                        for p in parts.parts
                    ]
                )
            )
            stored = []
            for index in range(batch.chunks):
                requests = spool.read_chunk(batch.output, batch.id, index)
                hashes = hash_ids([r.custom_id for r in requests])
                lines = np.asarray([r.line for r in requests], np.int64)[~_among(self._ran, hashes)]
                self._chunks.append((int(lines.min()), int(lines.max())) if lines.size else None)
                never.append(lines)
                stored.append(hashes)
            stored = np.unique(np.concatenate(stored)) if stored else np.asarray([], np.uint64)
            for cid, jid in conn.hscan_iter(keys.batch_jobs(batch.id), count=1000):
                h = hash_ids([cid.decode()])
                if not _among(self._ran, h)[0] and not _among(stored, h)[0]:
                    self._unlined[cid.decode()] = jid.decode()
        self.lines = np.concatenate([self.invalid.lines.astype(np.int64), *never])

    def _chunk(self, index: int) -> list[Request]:
        if self._cached is None or self._cached[0] != index:
            self._cached = index, spool.read_chunk(self.batch.output, self.batch.id, index)
        return self._cached[1]

    def rows(self, first: int, past: int, columns: list[str] | None) -> pa.Table:
        """The rows of lines first .. past - 1."""
        never = {}
        for index, bounds in enumerate(self._chunks):
            if bounds is None or bounds[1] < first or bounds[0] >= past:
                continue
            requests = [r for r in self._chunk(index) if first <= r.line < past]
            ran = _among(self._ran, hash_ids([r.custom_id for r in requests]))
            never.update((r.custom_id, r.line) for r, was in zip(requests, ran) if not was)
        cut = expired_rows(
            self.batch.id,
            {cid: batches.job_id(self.batch.id, cid) for cid in never},
            never,
            self.code or "batch_expired",
        )
        return pa.concat_tables(
            [self.invalid.rows(first, past, columns), cut if columns is None else cut.select(columns)]
        )

    def unlined(self, columns: list[str] | None) -> pa.Table:
        cut = expired_rows(self.batch.id, self._unlined, None, self.code or "batch_expired")
        return pa.concat_tables([self.invalid.unlined(columns), cut if columns is None else cut.select(columns)])

    def table(self) -> pa.Table:
        """Every row at once."""
        everything = [self.rows(int(self.lines.min()), int(self.lines.max()) + 1, None)] if self.lines.size else []
        return pa.concat_tables([*everything, self.unlined(None)])


def cut_constraints(table: pa.Table) -> int:
    """How many of the merged rows are structured outputs that max_tokens cut short."""
    if table.num_rows == 0 or "finish_reason" not in table.column_names:
        return 0
    constrained = pc.match_substring(pc.fill_null(table["sampling"], ""), '"structured_outputs":')
    return pc.sum(pc.and_(constrained, pc.equal(pc.fill_null(table["finish_reason"], ""), "length"))).as_py() or 0


def cut_constraints_note(table: pa.Table) -> str | None:
    """A sentence on the structured-output requests that max_tokens cut short (they may not parse), if any."""
    return _cut_note(cut_constraints(table))


def _cut_note(cut: int) -> str | None:
    if not cut:
        return None
    return (
        f'Note: {cut:,} structured outputs stopped at max_tokens (finish_reason "length") and may not parse; '
        f"their parsed column is null."
    )


def _extra_values(table: pa.Table) -> list[dict]:
    return [json.loads(v) if v else {} for v in table["extra"].to_pylist()]


def spread_extra(table: pa.Table, columns: ExtraColumns | None = None) -> pa.Table:
    """The `extra` column (each simple line's own fields, JSON) as one column per field, in the order the
    fields first appear; null where a line lacks one. A field whose values pyarrow cannot hold in one type
    (a number here, text there) becomes a column of their JSON text. `columns`: the fields and types of the whole
    batch (this table being one slice of it); without, this table's."""
    values = _extra_values(table)
    table = table.drop_columns(["extra"])
    names = columns.names if columns is not None else list(dict.fromkeys(name for row in values for name in row))
    for name in names:
        column = [row.get(name) for row in values]
        table = table.append_column(name, inferred_array(column) if columns is None else columns.array(name, column))
    return table


class MixedVectorSizes(Exception):
    """An embedding batch's vectors are not all of the size its first slice was written with."""


class BatchResults:
    """A batch's merged results a slice of lines at a time (`slices`), each slice shaped as `collect`'s table is.
    Made once per write: it lists the part files, reads their lines and surveys the lines' own fields."""

    # what merge sorts on, and the lines' own fields: all that the survey of the fields reads
    _SURVEYED = ["custom_id", "line", "choice_index", "input_index", "error", "finished_at", "extra"]

    def __init__(self, conn, batch_id: str, cancelled: bool = False, divisor: int = 1):
        """`cancelled`: a cancelled batch's requests that never ran get a batch_cancelled row each (Unread).
        `divisor`: slices this many times smaller than RESULTS_SLICE_ROWS (the server's)."""
        self.batch = batches.get_batch(conn, batch_id)
        self._parts = PartFiles(self.batch.output, batch_id)
        self._unread = Unread(conn, self.batch, self._parts, cancelled)
        self._slice_rows = defaults.RESULTS_SLICE_ROWS // divisor
        if self.batch.task == "embed":
            self._slice_rows = self._slice_rows // defaults.RESULTS_EMBED_SLICE_DIVISOR
        self._slice_rows = max(1, self._slice_rows)
        self._extra = ExtraColumns()
        if self._parts.has_extra:
            for merged in self._merged(self._SURVEYED):
                self._extra.add(_extra_values(merged))

    def _merged(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        for rows in rows_of(self._parts, self._unread, self._slice_rows, columns):
            yield merge(rows)

    def vector_size(self) -> int | None:
        """An embedding batch's vector size as the part files' first vector has it (None: no vectors, or not an
        embedding batch): a Parquet file's embedding column is fixed_size_list of it unless a slice says otherwise."""
        return self._parts.vector_size() if self.batch.task == "embed" else None

    def slices(self, vector_size: int | None = None) -> Iterator[pa.Table]:
        """The shaped slices in order, at least one (empty if the batch has no rows). With `vector_size`, the
        embedding column as fixed_size_list of that size; MixedVectorSizes if the batch's vectors are not all of it."""
        saw_vector = wrote = False
        for merged in self._merged():
            table = task_columns(merged, self.batch.task)
            if vector_size is not None:
                sizes = vector_sizes(table)
                if sizes - {vector_size}:
                    raise MixedVectorSizes
                saw_vector = saw_vector or bool(sizes)
                table = fixed_vectors(table, vector_size)
            wrote = True
            yield spread_extra(table, self._extra)
            pa.default_memory_pool().release_unused()  # what the slice took goes back: a server runs on
        if not wrote:
            yield spread_extra(task_columns(SCHEMA.empty_table(), self.batch.task), self._extra)
        elif vector_size is not None and not saw_vector:
            raise MixedVectorSizes


class _WholeTable:
    """A merged table in memory (collect's) as a batch of one slice."""

    def __init__(self, table: pa.Table):
        self.table = table

    def vector_size(self) -> None:
        return None  # task_table has decided

    def slices(self, vector_size: int | None = None) -> Iterator[pa.Table]:
        yield self.table


def write_parquet(table: pa.Table, path: str) -> None:
    """To a local path or a URI (storage.py), under a temporary name and renamed: never half a file at `path`."""
    _write_parquet(_WholeTable(table), path)


def _write_parquet(results: BatchResults | _WholeTable, path: str, metadata: dict | None = None) -> tuple[int, int]:
    """The slices as one Parquet file (`metadata` added to its schema's); returns (rows, cut_constraints)."""
    filesystem, where = open_output(path)
    try:
        try:
            return _write_slices(results.slices(results.vector_size()), filesystem, where, metadata)
        except MixedVectorSizes:  # lines asked for different dimensions: list<float32> after all
            return _write_slices(results.slices(None), filesystem, where, metadata)
    except OSError as err:
        raise MiroError(f"cannot write the results to {path}: {err}.") from None


def _write_slices(slices: Iterator[pa.Table], filesystem, where: str, metadata: dict | None) -> tuple[int, int]:
    first = next(slices)
    schema = first.schema.with_metadata({**(first.schema.metadata or {}), **metadata}) if metadata else first.schema
    rows = cut = 0
    dictionary = _dictionary_columns(first)
    with (
        atomic_output(filesystem, where) as stream,
        pq.ParquetWriter(stream, schema, compression="zstd", use_dictionary=dictionary) as writer,
    ):
        for table in itertools.chain([first], slices):
            if table.num_rows:
                writer.write_table(table)
            rows, cut = rows + table.num_rows, cut + cut_constraints(table)
    return rows, cut


def _dictionary_columns(first: pa.Table) -> list[str]:
    """The leaf columns to dictionary-encode: all but the flat ones with more distinct values than half the first
    slice's rows. A slice's row group is small enough that such a column's dictionary fits pyarrow's page limit,
    where one big row group's would outgrow it and fall back to plain values, which zstd packs far better
    (custom ids, prompts, outputs: the file was 1.8 times as large with every column's dictionary)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(first.schema.empty_table(), buffer)
    leaves = pq.ParquetFile(pa.BufferReader(buffer.getvalue())).schema
    varied = {
        name
        for name, field in zip(first.column_names, first.schema)
        if not pa.types.is_nested(field.type)
        and not pa.types.is_null(field.type)
        and pc.count_distinct(first[name]).as_py() * 2 > first.num_rows
    }
    return [leaves.column(i).path for i in range(len(leaves)) if leaves.column(i).path.split(".")[0] not in varied]


PYLIST_ROWS = 1024  # rows of a table made Python dicts at a time (a dict of a row is some KB)


def request_rows(table: pa.Table) -> Iterator[list[dict]]:
    """The merged table's rows as dicts, a request's together (its choices, or inputs), in table order; a piece of
    PYLIST_ROWS rows made dicts at a time (the merge keeps a request's rows adjacent: they share custom id and line),
    so a slice of 50,000 rows is never all Python objects at once."""
    pending: list[dict] = []
    for start in range(0, table.num_rows, PYLIST_ROWS):
        for row in table.slice(start, PYLIST_ROWS).to_pylist():
            if pending and row["custom_id"] != pending[0]["custom_id"]:
                yield pending
                pending = []
            pending.append(row)
    if pending:
        yield pending


def openai_lines(table: pa.Table) -> Iterator[dict]:
    """The merged table as OpenAI Batch output lines, one per request (its choices together), in table order."""
    for rows in request_rows(table):
        yield openai_line(rows)


def write_openai_jsonl(tables: pa.Table | Iterable[pa.Table], path: str, errors_path: str) -> tuple[int, int]:
    """OpenAI Batch output lines to `path`, failed requests to `errors_path`; returns (ok, failed) counts. `tables`:
    the merged table, or its slices in order (a request's rows all in one)."""
    ok = failed = 0
    try:
        with storage.open_text(path) as out, storage.open_text(errors_path) as errors:
            for table in [tables] if isinstance(tables, pa.Table) else tables:
                for line in openai_lines(table):
                    (errors if line["error"] else out).write(json.dumps(line, ensure_ascii=False) + "\n")
                    failed, ok = (failed + 1, ok) if line["error"] else (failed, ok + 1)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        raise MiroError(f"cannot write the results: {err.strerror or err}{where}.") from None
    return ok, failed


def _counting_cut(slices: Iterable[pa.Table], cut: list[int]) -> Iterator[pa.Table]:
    """The slices, adding their cut_constraints to cut[0] as they pass."""
    for table in slices:
        cut[0] += cut_constraints(table)
        yield table


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


def write_results(
    results: pa.Table | BatchResults,
    path: str,
    fmt: str = "parquet",
    errors_path: str | None = None,
    metadata: dict | None = None,
) -> Written:
    """A batch's merged results (BatchResults, a slice at a time, or collect's table) as Parquet (`metadata` added
    to its schema's), or (fmt "jsonl") as OpenAI Batch output lines with the failed requests in `errors_path`
    (default: PATH with .errors.jsonl)."""
    source = results if isinstance(results, BatchResults) else _WholeTable(results)
    if fmt == "parquet":
        rows, cut = _write_parquet(source, path, metadata)
        written = Written(path, rows)
    else:
        errors_path = errors_path or storage.with_suffix(path, ".jsonl", ".errors.jsonl")
        counted = [0]
        ok, failed = write_openai_jsonl(_counting_cut(source.slices(), counted), path, errors_path)
        written, cut = Written(path, ok, errors_path, failed), counted[0]
    written.note = _cut_note(cut)
    return written
