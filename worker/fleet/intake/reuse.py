"""`--reuse PREVIOUS.parquet`: a rerun costs only what changed.

Submit asks `Reuser.take` of every valid request before storing it. A request is taken when it is deterministic
(fingerprint.deterministic) and PREVIOUS holds a successful row of its `request_hash` (fingerprint.py: the request,
the model file's sha256, the engine settings and miro's output version), for each of its choices (or inputs); one
without `max_tokens` only if every earlier choice stopped by itself, as a cut one may have met another run's
context or KV limit. A taken request is not stored and never becomes a job: its earlier rows, with this batch's
custom id, line, job id, model name and own fields (and `reused_from`, the batch that ran them), are written as
part files of the new batch (`part-reused-*.parquet`), and `count` counts it completed once the batch record
exists. Everything downstream (results, resume, status) sees rows, as if a worker had written them.

Memory: the index of PREVIOUS holds 46 bytes a request (its 32-byte hash, where its request's rows start, how many);
rows are fetched a Parquet row group at a time when REUSED_PER_PART requests wait, and written as one part file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from miro.core.errors import MiroError

from miro.worker.fleet.intake.routing import model_name
from miro.worker.fleet.observe.urls import redacted
from miro.worker.fleet.output.fingerprint import OutputStamp, deterministic
from miro.worker.fleet.output.rows import SCHEMA
from miro.worker.fleet.output.sink import open_output, write_table_atomically
from miro.worker.fleet.records import batches
from miro.worker.fleet.records.payload import Request

REUSED_PER_PART = 20_000  # reused requests written per part file
_INDEX_COLUMNS = ["request_hash", "custom_id", "error", "finish_reason"]


@dataclass
class PreviousResults:
    """An earlier result file's successful rows, by request hash: each hash's first request (its rows are adjacent
    in merged results: they share its line), where its rows start, how many there are, whether all stopped."""

    path: str
    file: pq.ParquetFile
    hashes: np.ndarray  # sorted, dtype S33 (_key)
    starts: np.ndarray  # row of PREVIOUS where the hash's request's rows start
    counts: np.ndarray
    stopped: np.ndarray  # every row of it finished by itself (finish_reason "stop", or an embedding's null)
    group_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # first row of each row group

    @classmethod
    def open(cls, path: str) -> PreviousResults:
        filesystem, where = open_output(path)
        try:
            file = pq.ParquetFile(filesystem.open_input_file(where))
        except FileNotFoundError:
            raise MiroError(f"The results to reuse, {redacted(path)}, do not exist.") from None
        except (pa.ArrowException, OSError) as err:
            raise MiroError(f"{redacted(path)} cannot be read as Parquet results to reuse ({err}).") from None
        names = file.schema_arrow.names
        if "request_hash" not in names:
            raise MiroError(
                f"{redacted(path)} has no request_hash column: it was written by a miro from before "
                "reuse, or is not miro's results; nothing in it can be reused."
            )
        columns = [name for name in _INDEX_COLUMNS if name in names]
        hashes, starts, counts, stopped = [], [], [], []
        row = 0
        previous: tuple[bytes, str] | None = None
        for batch in file.iter_batches(batch_size=65_536, columns=columns):
            values = {name: batch.column(name).to_pylist() for name in columns}
            reasons = values.get("finish_reason") or [None] * batch.num_rows
            for h, cid, error, reason in zip(values["request_hash"], values["custom_id"], values["error"], reasons):
                key = (h, cid)
                if h is not None and error is None:
                    if key == previous:
                        counts[-1] += 1
                        stopped[-1] &= reason in ("stop", None)
                    else:
                        hashes.append(_key(h))
                        starts.append(row)
                        counts.append(1)
                        stopped.append(reason in ("stop", None))
                previous = key if h is not None and error is None else None
                row += 1
        order = np.argsort(np.asarray(hashes, dtype="S33"), kind="stable") if hashes else np.zeros(0, np.int64)
        sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
        return cls(
            path,
            file,
            np.asarray(hashes, dtype="S33")[order],
            np.asarray(starts, np.int64)[order],
            np.asarray(counts, np.int32)[order],
            np.asarray(stopped, bool)[order],
            np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        )

    def find(self, request_hash: str) -> tuple[int, int, bool] | None:
        """(first row, rows, all stopped) of the earlier request with this hash, or None."""
        key = _key(request_hash)
        at = int(np.searchsorted(self.hashes, key))
        if at < len(self.hashes) and self.hashes[at] == key:
            return int(self.starts[at]), int(self.counts[at]), bool(self.stopped[at])
        return None

    def rows(self, positions: np.ndarray) -> pa.Table:
        """The rows at these positions of PREVIOUS, in that order, reading each row group they fall in once."""
        groups = np.searchsorted(self.group_starts, positions, side="right") - 1
        pieces, order = [], []
        for group in np.unique(groups):
            chosen = np.nonzero(groups == group)[0]
            table = self.file.read_row_group(int(group))
            pieces.append(table.take(pa.array(positions[chosen] - self.group_starts[group])))
            order.append(chosen)
        taken = pa.concat_tables(pieces, promote_options="permissive")
        return taken.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


@dataclass(frozen=True)
class ReuseSource:
    """What `--reuse` was given: the earlier results, and the stamp this run's rows will carry."""

    previous: PreviousResults
    stamp: OutputStamp

    @classmethod
    def open(cls, path: str, stamp: OutputStamp) -> ReuseSource:
        if not stamp.batch_invariant:
            raise MiroError(
                "--reuse needs batch-invariant outputs: with --no-batch-invariant a request's output "
                "depends on what runs beside it, so an earlier row is not its answer."
            )
        return cls(PreviousResults.open(path), stamp)


def _expected_rows(request: Request) -> int:
    if request.kind == "embedding":
        return len(request.inputs)
    return request.sampling.get("n") or 1


@dataclass
class _Pending:
    request: Request
    start: int
    count: int


class Reuser:
    """Takes the reusable requests of a batch being submitted and writes their rows as the batch's part files."""

    def __init__(self, source: ReuseSource, output: str, batch_id: str, model: str):
        self.source = source
        self.batch_id = batch_id
        self.model = model  # the batch's model: each row's requested_model unless its line named one
        self.model_name = model_name(model)  # what a worker of it writes as `model`
        self.filesystem, base = open_output(output)
        self.folder = f"{base}/{batch_id}"
        self.parts: list[str] = []
        self.reused = 0  # requests taken
        self._pending: list[_Pending] = []

    def take(self, request: Request) -> bool:
        """True if the request's earlier rows stand for it (it is not to run)."""
        if not deterministic(request):
            return False
        found = self.source.previous.find(self.source.stamp.request_hash(request))
        if found is None:
            return False
        start, count, stopped = found
        if count != _expected_rows(request):
            return False
        if request.kind != "embedding" and request.sampling.get("max_tokens") is None and not stopped:
            return False
        self._pending.append(_Pending(request, start, count))
        self.reused += 1
        if len(self._pending) >= REUSED_PER_PART:
            self._write()
        return True

    def close(self) -> None:
        if self._pending:
            self._write()

    def discard(self) -> None:
        """Delete the part files written (a submission that was refused leaves nothing behind)."""
        for path in self.parts:
            try:
                self.filesystem.delete_file(path)
            except OSError:
                pass

    def _write(self) -> None:
        pending, self._pending = self._pending, []
        positions = np.concatenate([np.arange(p.start, p.start + p.count) for p in pending])
        earlier = self.source.previous.rows(positions)
        rows = [p.count for p in pending]
        own = {
            "batch_id": [self.batch_id] * len(positions),
            "custom_id": _repeat([p.request.custom_id for p in pending], rows),
            "line": _repeat([p.request.line for p in pending], rows),
            "job_id": _repeat([batches.job_id(self.batch_id, p.request.custom_id) for p in pending], rows),
            "model": [self.model_name] * len(positions),
            "requested_model": _repeat([p.request.requested_model or self.model for p in pending], rows),
            "extra": _repeat(
                [json.dumps(p.request.extra, ensure_ascii=False) if p.request.extra else None for p in pending], rows
            ),
            # the batch that ran the row: an earlier reuse's own source, else the earlier batch
            "reused_from": pc.coalesce(earlier.column("reused_from"), earlier.column("batch_id")).to_pylist()
            if "reused_from" in earlier.column_names
            else earlier.column("batch_id").to_pylist(),
        }
        if "choice_index" not in earlier.column_names:  # an embedding batch's merged results drop it; rows hold 0
            own["choice_index"] = [0] * len(positions)
        arrays = []
        for schema_field in SCHEMA:
            name = schema_field.name
            if name in own:
                arrays.append(pa.array(own[name], schema_field.type))
            elif name in earlier.column_names:
                arrays.append(_as_type(earlier.column(name), schema_field.type))
            else:
                arrays.append(pa.nulls(len(positions), schema_field.type))
        table = pa.Table.from_arrays(arrays, schema=SCHEMA)
        path = f"{self.folder}/part-reused-{len(self.parts) + 1:06d}.parquet"
        write_table_atomically(self.filesystem, path, table)
        self.parts.append(path)

    def counts(self) -> Iterator[tuple[str, int, int, int]]:
        """(custom id, prompt, cached and completion tokens) of each reused request, read back from its part files
        a file at a time, as a worker would count it."""
        for path in self.parts:
            table = pq.read_table(
                self.filesystem.open_input_file(path),
                columns=["custom_id", "kind", "prompt_tokens", "cached_tokens", "completion_tokens"],
            )
            custom_ids = table.column("custom_id").to_pylist()
            kinds = table.column("kind").to_pylist()
            prompt = pc.fill_null(table.column("prompt_tokens"), 0).to_pylist()
            cached = pc.fill_null(table.column("cached_tokens"), 0).to_pylist()
            completion = pc.fill_null(table.column("completion_tokens"), 0).to_pylist()
            at = 0
            while at < len(custom_ids):
                end = at
                while end < len(custom_ids) and custom_ids[end] == custom_ids[at]:
                    end += 1
                if kinds[at] == "embedding":  # an input per row
                    yield custom_ids[at], sum(prompt[at:end]), 0, 0
                else:  # a choice per row, the prompt once
                    yield custom_ids[at], prompt[at], cached[at], sum(completion[at:end])
                at = end

    def count(self, conn) -> None:
        """Count every reused request completed, with its tokens: a thousand requests to one COUNT (which counts a
        custom id once), their tokens summed."""
        group: list[tuple[str, int, int, int]] = []
        for entry in self.counts():
            group.append(entry)
            if len(group) == COUNT_GROUP:
                _count_group(conn, self.batch_id, group)
                group = []
        if group:
            _count_group(conn, self.batch_id, group)


COUNT_GROUP = 1000  # reused requests per COUNT


def _count_group(conn, batch_id: str, group: list[tuple[str, int, int, int]]) -> None:
    """One COUNT of new requests (a batch being submitted: none of them was counted before, so the tokens of all
    of them are added)."""
    batches.count_completed(
        conn,
        batch_id,
        [entry[0] for entry in group],
        prompt_tokens=sum(e[1] for e in group),
        cached_tokens=sum(e[2] for e in group),
        completion_tokens=sum(e[3] for e in group),
    )


def _key(request_hash: str) -> bytes:
    """A hash as index key: its 32 bytes and a 1, as numpy's bytes type drops trailing zero bytes (1 hash in 256
    ends with one, and would then never match)."""
    return bytes.fromhex(request_hash) + b"\x01"


def _repeat(values: list, counts: list[int]) -> list:
    if all(c == 1 for c in counts):
        return values
    return [value for value, count in zip(values, counts) for _ in range(count)]


def _as_type(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """An earlier results column as the part files' type (merged results hold vectors as fixed_size_list)."""
    return column if column.type == kind else column.cast(kind)
