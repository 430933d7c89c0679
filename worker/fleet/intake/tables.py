"""Datasets that are tables: Parquet, CSV, and Hugging Face `datasets` saved to disk (Arrow stream files), read by
pyarrow a batch of rows at a time, so that memory holds a batch (and a Parquet row group), never the file.

`input_format` picks the reader from the extension (or `--input-format`); `read_rows` yields each batch's rows as
Python dicts, numbered from 1 in file order; `table_columns` gives the column names before any row is read, for
columns.InputColumns.check. JSON Lines stay with dataset.py's line reader, which names each bad line and holds one
line at a time (pyarrow's JSON reader refuses the whole file at its first bad line and infers one type per column).

Values reach the validation as a JSONL line's would: a timestamp, date, time, duration or decimal as its text (the
results keep a row's own columns through JSON), a float of an integer field (max_tokens, seed, ...) that holds a
whole number as that integer (pandas writes an integer column with nulls as floats). CSV has no types: every cell
is text, the cells of miro's fields (max_tokens, temperature, stop, messages, ...) read as JSON values, an empty
cell as null (not given).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from miro.core.errors import MiroError

from miro.worker.fleet.intake.line_forms import SimpleLine

FORMATS = ("jsonl", "parquet", "csv", "arrow")
_EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow"}
BATCH_ROWS = 4096  # rows made Python dicts at a time
CSV_BLOCK_BYTES = 1 << 20
# a simple line's integer fields: a float column's whole numbers are read as integers there
_INTEGER_FIELDS = frozenset(
    {"max_tokens", "min_tokens", "top_k", "seed", "n", "logprobs", "dimensions", "truncate_prompt_tokens"}
)


def input_format(path: str | Path, given: str | None = None) -> str:
    """The dataset's format: `given` (--input-format), else by extension; a folder is a saved HF dataset."""
    if given is not None:
        if given not in FORMATS:
            raise MiroError(f"The input format '{given}' is not one of {', '.join(FORMATS)}.")
        return given
    path = Path(path)
    if path.is_dir():
        return "arrow"
    return _EXTENSIONS.get(path.suffix.lower(), "jsonl")


@dataclass
class Progress:
    """How far a table has been read, in bytes of the file (estimated from rows where the reader says nothing)."""

    read: int = 0
    total: int = 0


def _unreadable(path: Path, what: str, err: Exception) -> MiroError:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return MiroError(f"Dataset file '{path}' cannot be read as {what} ({reason.rstrip('.')}).")


def arrow_files(path: Path) -> list[Path]:
    """The Arrow files of a dataset saved by HF `datasets` (`save_to_disk`: state.json lists them), or the one
    .arrow file given."""
    if path.is_file():
        return [path]
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise MiroError(
            f"'{path}' holds a DatasetDict of splits ({', '.join(splits) or 'none'}): give one split's "
            f"folder, e.g. {path / (splits[0] if splits else 'train')}."
        )
    state = path / "state.json"
    if not state.is_file():
        raise MiroError(
            f"The folder '{path}' is no dataset saved by Hugging Face datasets (it has no state.json); "
            "give a .jsonl, .parquet, .csv or .arrow file, or such a folder."
        )
    try:
        files = [path / entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MiroError(f"The dataset folder '{path}' has a state.json that does not list its files ({err}).") from None
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise MiroError(f"The dataset folder '{path}' lacks its file {missing[0]}.")
    return files


def _open_arrow(file: Path):
    """An Arrow IPC stream (what datasets writes) or file, read from a memory map."""
    source = pa.memory_map(str(file))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source)


def _csv_reader(path: Path, text_columns: list[str] | None):
    from pyarrow import csv

    read = csv.ReadOptions(block_size=CSV_BLOCK_BYTES)
    parse = csv.ParseOptions(newlines_in_values=True)  # prompts hold newlines
    convert = csv.ConvertOptions(
        strings_can_be_null=True,
        null_values=[""],
        quoted_strings_can_be_null=False,
        column_types={name: pa.string() for name in text_columns or ()},
    )
    return csv.open_csv(str(path), read_options=read, parse_options=parse, convert_options=convert)


def table_columns(path: str | Path, fmt: str) -> list[str]:
    """The column names of a table dataset, read from its header (Parquet footer, CSV first line, Arrow schema)."""
    path = Path(path)
    _check_exists(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(str(path)).schema_arrow.names
        if fmt == "csv":
            return _csv_reader(path, None).schema.names
        return _open_arrow(arrow_files(path)[0]).schema.names
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, {"parquet": "Parquet", "csv": "CSV", "arrow": "Arrow"}[fmt], err) from None


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise MiroError(f"Dataset file '{path}' does not exist.")


def _batches(path: Path, fmt: str, progress: Progress) -> Iterator[pa.RecordBatch]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # pages read as the batches need them, not a row group's column chunks whole up front
        file = pq.ParquetFile(str(path), buffer_size=1 << 20, pre_buffer=False)
        rows = max(1, file.metadata.num_rows)
        progress.total, done = os.path.getsize(path), 0
        for batch in file.iter_batches(batch_size=BATCH_ROWS):
            done += batch.num_rows
            progress.read = progress.total * done // rows
            yield batch
    elif fmt == "csv":
        progress.total = os.path.getsize(path)
        reader = _csv_reader(path, table_columns(path, "csv"))
        for batch in reader:
            progress.read = min(progress.total, progress.read + batch.nbytes)
            yield batch
    else:
        files = arrow_files(path)
        progress.total = sum(os.path.getsize(f) for f in files)
        for file in files:
            for batch in _open_arrow(file):
                progress.read = min(progress.total, progress.read + batch.nbytes)
                yield batch


_AS_TEXT = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_duration, pa.types.is_decimal)


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with each column JSON cannot hold as it is (timestamps, dates, decimals, ...) as its text."""
    columns = []
    changed = False
    for column in batch.columns:
        if any(test(column.type) for test in _AS_TEXT):
            column, changed = column.cast(pa.string()), True
        elif pa.types.is_float16(column.type):
            column, changed = column.cast(pa.float32()), True
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names) if changed else batch


def _binary_columns(schema: pa.Schema) -> list[str]:
    return [
        f.name
        for f in schema
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or pa.types.is_fixed_size_binary(f.type)
    ]


def _whole_numbers(row: dict[str, Any]) -> None:
    """A float of an integer field that is a whole number as that integer (a pandas integer column with nulls)."""
    for name in _INTEGER_FIELDS.intersection(row):
        value = row[name]
        if isinstance(value, float) and value.is_integer():
            row[name] = int(value)


def _csv_values(row: dict[str, Any]) -> None:
    """A CSV row's cells of miro's fields as the JSON values they spell (42, 0.7, true, ["a"]), text otherwise."""
    for name in _CSV_JSON_FIELDS.intersection(row):
        value = row[name]
        if isinstance(value, str):
            try:
                row[name] = json.loads(value)
            except ValueError:
                pass  # the validation names the field and what it should be


_CSV_JSON_FIELDS = frozenset(SimpleLine.model_fields) - {"id", "custom_id", "prompt", "input"}


def _row_bytes(batch: pa.RecordBatch) -> list[int]:
    """About how many bytes each row holds: its text and binary cells' lengths, and its nested cells' (messages,
    lists) as JSON where the column is large enough for one of them to matter."""
    import pyarrow.compute as pc

    sizes = [0] * batch.num_rows
    for column in batch.columns:
        kind = column.type
        if (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
        ):
            lengths = pc.fill_null(pc.binary_length(column), 0).to_pylist()
        elif pa.types.is_nested(kind) and column.nbytes > MAX_ROW_BYTES:
            lengths = [len(json.dumps(value, default=str)) for value in column.to_pylist()]
        else:
            continue
        sizes = [a + b for a, b in zip(sizes, lengths)]
    return sizes


MAX_ROW_BYTES = 1_000_000  # a row's cells at most, as a JSONL line's bytes (dataset.scan_dataset's max_line_bytes)


def read_rows(path: str | Path, fmt: str, progress: Progress) -> Iterator[tuple[int, dict[str, Any] | int]]:
    """(row number from 1, the row as a dict) in file order, a batch of BATCH_ROWS in memory at a time; a row whose
    cells hold over MAX_ROW_BYTES comes as (number, its size) instead, as an over-long line is refused."""
    path = Path(path)
    _check_exists(path)
    number = 0
    what = {"parquet": "Parquet", "csv": "CSV", "arrow": "Arrow"}[fmt]
    try:
        batches = _batches(path, fmt, progress)
        for batch in batches:
            if number == 0 and (binary := _binary_columns(batch.schema)):
                raise MiroError(
                    f"The dataset's column {binary[0]!r} holds bytes, which the results cannot keep as "
                    "a column: drop it or store it as text."
                )
            sizes = _row_bytes(batch)
            for row, size in zip(_plain(batch).to_pylist(), sizes):
                number += 1
                if size > MAX_ROW_BYTES:
                    yield number, size
                    continue
                if fmt == "csv":
                    _csv_values(row)
                else:
                    _whole_numbers(row)
                yield number, row
    except (pa.ArrowException, OSError) as err:
        where = f" after row {number:,}" if number else ""
        raise MiroError(
            f"Dataset file '{path}' cannot be read as {what}{where} "
            f"({str(err).strip().splitlines()[0].rstrip('.') if str(err).strip() else type(err).__name__})."
        ) from None


def estimated_rows(path: str | Path, fmt: str) -> int:
    """About how many rows a table has, to size the duplicate-id check: Parquet's footer says; a CSV's lines are
    estimated as a JSONL file's (seen_ids.estimated_lines); an Arrow file's rows from its size and first batch."""
    from miro.worker.fleet.intake import seen_ids

    path = Path(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(str(path)).metadata.num_rows
        if fmt == "csv":
            return seen_ids.estimated_lines(path)
        files = arrow_files(path)
        first = next(iter(_open_arrow(files[0])), None)
        if first is None or not first.num_rows:
            return 0
        return int(sum(os.path.getsize(f) for f in files) * first.num_rows / max(1, first.nbytes))
    except (pa.ArrowException, OSError, MiroError):
        return 0  # the scan says what is wrong with the file
