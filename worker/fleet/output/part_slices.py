"""A batch's part files read a slice of lines at a time, so that `miro results` and `miro run` merge and write a
batch's results holding one slice in memory, not the batch (results.BatchResults).

`PartFiles` reads the `line` column of every part file once (4 bytes a row) and what its footer says of its
`extra` column; `slice_bounds` cuts the lines into ranges of about `slice_rows` rows; `rows_of` reads a range's
rows from the part files whose lines overlap it (workers take requests roughly in line order, so most part
files fall in one range), with the rows no part file holds (invalid lines, expired requests) whose line it is.
The rows with no line (part files from before the column; an expired batch's never-run requests) come last.

The merge of a slice is the merge of the batch because every row of a request has the request's line: custom
ids are unique in a batch (submit refuses a duplicate, and an invalid line's id clashes with no other), so the
rows that merge into one are in one slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from miro.worker.fleet.output.rows import SCHEMA
from miro.worker.fleet.output.sink import open_output

NO_LINE = pc.field("line").is_null()


@dataclass(frozen=True)
class Part:
    path: str
    lines: tuple[int, int] | None  # its least and greatest line; None when no row has one
    unlined: bool  # some row has no line


def part_paths(filesystem, folder: str) -> list[str]:
    """The batch's complete part files (temporary files are skipped), in name order."""
    infos = filesystem.get_file_info(pa.fs.FileSelector(folder, allow_not_found=True))
    return sorted(i.path for i in infos if i.base_name.startswith("part-") and i.base_name.endswith(".parquet"))


def _has_values(metadata: pq.FileMetaData, name: str) -> bool:
    """Whether the footer allows a non-null value in column `name` (no statistics: it may have one)."""
    if name not in metadata.schema.names:
        return False
    index = metadata.schema.names.index(name)
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count or stats.null_count < metadata.row_group(group).num_rows:
            return True
    return False


class PartFiles:
    """A batch's part files as they are now, each with the range of its lines."""

    def __init__(self, output: str, batch_id: str):
        self.filesystem, base = open_output(output)
        self.parts: list[Part] = []
        self.has_extra = False  # some row has its line's own fields
        lines = []
        for path in part_paths(self.filesystem, f"{base}/{batch_id}"):
            with self.filesystem.open_input_file(path) as f:
                file = pq.ParquetFile(f)
                self.has_extra = self.has_extra or _has_values(file.metadata, "extra")
                column = file.read(columns=["line"]).column(0) if "line" in file.schema_arrow.names else None
            known = np.asarray([], np.int32) if column is None else column.drop_null().to_numpy()
            ranged = (int(known.min()), int(known.max())) if known.size else None
            self.parts.append(Part(path, ranged, column is None or column.null_count > 0))
            lines.append(known)
        self.lines = np.concatenate(lines) if lines else np.asarray([], np.int32)

    def read(self, paths: list[str], columns: list[str] | None, where: pc.Expression | None = None) -> pa.Table:
        schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(name) for name in columns])
        if not paths:
            return schema.empty_table()
        # SCHEMA fills the columns that an older part file lacks with nulls, as read_parts does
        return ds.dataset(paths, schema=SCHEMA, format="parquet", filesystem=self.filesystem).to_table(
            columns=columns, filter=where
        )

    def custom_ids(self) -> pa.Table:
        """Every row's custom id (an expired batch's requests that have a row)."""
        return self.read([p.path for p in self.parts], ["custom_id"])

    def vector_size(self) -> int | None:
        """The length of the first embedding vector in the part files, if any has one."""
        for part in self.parts:
            lengths = pc.list_value_length(self.read([part.path], ["embedding"])["embedding"])
            lengths = lengths.drop_null()
            if len(lengths):
                return lengths[0].as_py()
        return None


def slice_bounds(lines: np.ndarray, slice_rows: int) -> list[tuple[int, int]]:
    """[first, past) line ranges covering `lines` in order, each holding about `slice_rows` of them (more when
    one line has more rows: a line is never cut)."""
    if not lines.size:
        return []
    ordered = np.sort(lines)
    starts = np.unique(ordered[:: max(1, slice_rows)]).tolist()
    return list(zip(starts, starts[1:] + [int(ordered[-1]) + 1]))


class TableRows:
    """Rows in memory (a pa.Table with a `line` column) as rows_of's `unread`."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.lines = pc.drop_null(table["line"]).to_numpy()

    def rows(self, first: int, past: int, columns: list[str] | None) -> pa.Table:
        table = self.table if columns is None else self.table.select(columns)
        return table.filter((pc.field("line") >= first) & (pc.field("line") < past))

    def unlined(self, columns: list[str] | None) -> pa.Table:
        table = self.table if columns is None else self.table.select(columns)
        return table.filter(NO_LINE)


def rows_of(parts: PartFiles, unread, slice_rows: int, columns: list[str] | None) -> Iterator[pa.Table]:
    """The batch's rows a slice of lines at a time, in line order (part files' and `unread`'s, only `columns`),
    then those with no line; no empty slice. `unread`: the rows no part file holds, a pa.Table or anything with
    `lines` (a numpy array of their lines), `rows(first, past, columns)` and `unlined(columns)` (results.Unread,
    which reads an expired batch's never-run requests from storage a slice at a time)."""
    if isinstance(unread, pa.Table):
        unread = TableRows(unread)
    for first, past in slice_bounds(np.concatenate([parts.lines, unread.lines]), slice_rows):
        paths = [p.path for p in parts.parts if p.lines and p.lines[0] < past and p.lines[1] >= first]
        in_slice = (pc.field("line") >= first) & (pc.field("line") < past)
        yield pa.concat_tables([parts.read(paths, columns, in_slice), unread.rows(first, past, columns)])
    unlined = pa.concat_tables(
        [parts.read([p.path for p in parts.parts if p.unlined], columns, NO_LINE), unread.unlined(columns)]
    )
    if unlined.num_rows:
        yield unlined
