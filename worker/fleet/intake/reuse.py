"""`--reuse PREVIOUS.parquet`: a rerun costs only what changed.

Submit asks `Reuser.take` of every valid request before storing it. A request is taken when it is deterministic
(fingerprint.deterministic) and PREVIOUS holds a successful row of its `request_hash` (fingerprint.py: the request,
the model file's sha256, the engine settings and miro's output version), for each of its choices (or inputs); one
without `max_tokens` only if every earlier choice stopped by itself, as a cut one may have met another run's
context or KV limit. A taken request is not stored and never becomes a job: its earlier rows, with this batch's
custom id, line, job id, model name and own fields (and `reused_from`, the batch that ran them), are written as
part files of the new batch (`part-reused-*.parquet`), and `count` counts it completed once the batch record
exists. Everything downstream (results, resume, status) sees rows, as if a worker had written them.

Memory: the index of PREVIOUS holds 46 bytes a request (its 32-byte hash, where its request's rows start, how many),
built from 3 bytes a row read a batch of rows at a time (never a row as Python objects); rows are fetched a Parquet
row group at a time (the last one kept) when REUSED_PER_PART requests wait, and written, their own columns made by
pyarrow, as one part file.
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
INDEX_BATCH_ROWS = 65_536  # rows of PREVIOUS read at a time to index it
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
    _last_group: tuple[int, pa.Table] | None = field(default=None, repr=False, compare=False)  # the one read last

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
        for name in ("custom_id", "error"):
            if name not in names:
                raise MiroError(f"{redacted(path)} has no {name} column: it is not miro's results to reuse.")
        columns = [name for name in _INDEX_COLUMNS if name in names]
        for name in columns:
            kind = file.schema_arrow.field(name).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
                raise MiroError(
                    f"{redacted(path)} cannot be read as results to reuse: its {name} column holds {kind}, not text."
                )
        # a request's rows are a run of adjacent successful rows of one hash and custom id: per row, whether it is
        # successful, whether it goes on the run of the row before, whether it stopped by itself (1 byte each)
        successful, continued, stops, hashes = [], [], [], []
        last = None  # (hash, custom id) of the batch before's last row, if successful
        try:
            for batch in file.iter_batches(batch_size=INDEX_BATCH_ROWS, columns=columns):
                ok, same, stop, last = _row_flags(batch, last)
                successful.append(ok)
                continued.append(same)
                stops.append(stop)
                first_rows = np.nonzero(ok & ~same)[0]
                hashes += [_key(h) for h in batch.column("request_hash").take(first_rows).to_pylist()]
        except (pa.ArrowException, OSError) as err:
            raise MiroError(f"{redacted(path)} cannot be read as Parquet results to reuse ({err}).") from None
        successful, continued, stops = (
            np.concatenate(a) if a else np.zeros(0, bool) for a in (successful, continued, stops)
        )
        starts = np.nonzero(successful & ~continued)[0]
        breaks = np.append(np.nonzero(~continued)[0], continued.size)  # where a run ends: the next row not going on
        ends = breaks[np.searchsorted(breaks, starts, side="right")]
        not_stopped = np.concatenate([[0], np.cumsum(~stops)])
        stopped = not_stopped[ends] == not_stopped[starts]
        keys = np.asarray(hashes, dtype="S33")
        order = np.argsort(keys, kind="stable")
        sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
        return cls(
            path,
            file,
            keys[order],
            starts.astype(np.int64)[order],
            (ends - starts).astype(np.int32)[order],
            stopped[order],
            np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        )

    def find(self, request_hash: str) -> tuple[int, int, bool] | None:
        """(first row, rows, all stopped) of the earlier request with this hash, or None."""
        key = _key(request_hash)
        at = int(self.hashes.searchsorted(key))
        if at < len(self.hashes) and self.hashes[at] == key:
            return int(self.starts[at]), int(self.counts[at]), bool(self.stopped[at])
        return None

    def rows(self, positions: np.ndarray) -> pa.Table:
        """The rows at these positions of PREVIOUS, in that order, reading each row group they fall in once (the
        last one read is kept: the next positions, in a rerun of the same file, start in it)."""
        groups = np.searchsorted(self.group_starts, positions, side="right") - 1
        pieces, order = [], []
        for group in np.unique(groups):
            chosen = np.nonzero(groups == group)[0]
            pieces.append(self._row_group(int(group)).take(pa.array(positions[chosen] - self.group_starts[group])))
            order.append(chosen)
        taken = pa.concat_tables(pieces, promote_options="permissive")
        if np.all(positions[1:] >= positions[:-1]):  # the pieces are already in the positions' order
            return taken
        return taken.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def _row_group(self, group: int) -> pa.Table:
        if self._last_group is None or self._last_group[0] != group:
            self._last_group = group, self.file.read_row_group(group)
        return self._last_group[1]


@dataclass(frozen=True)
class ReuseSource:
    """What `--reuse` was given: the earlier results, and the stamp this run's rows will carry. `model`: the model
    the stamp is of, for a submission given no --model (`miro serve`'s reuse_batch_id: the earlier batch's model),
    which its lines must then name (OtherModel)."""

    previous: PreviousResults
    stamp: OutputStamp
    model: str | None = None

    @classmethod
    def open(cls, path: str, stamp: OutputStamp, model: str | None = None) -> ReuseSource:
        if not stamp.batch_invariant:
            raise MiroError(
                "--reuse needs batch-invariant outputs: with --no-batch-invariant a request's output "
                "depends on what runs beside it, so an earlier row is not its answer."
            )
        return cls(PreviousResults.open(path), stamp, model)


class OtherModel(MiroError):
    """A submission given no --model whose lines run on another model than its ReuseSource's: nothing was
    enqueued."""


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
        starts = np.fromiter((p.start for p in pending), np.int64, len(pending))
        rows = np.fromiter((p.count for p in pending), np.int64, len(pending))
        total = int(rows.sum())
        # each request's rows start .. start + count - 1, one after another
        positions = np.arange(total) + np.repeat(starts - (np.cumsum(rows) - rows), rows)
        earlier = self.source.previous.rows(positions)
        of_request = None if total == len(pending) else pa.array(np.repeat(np.arange(len(pending)), rows))

        def per_request(values: list, kind: pa.DataType) -> pa.Array:
            array = pa.array(values, kind)
            return array if of_request is None else array.take(of_request)

        own = {
            "batch_id": pa.repeat(pa.scalar(self.batch_id, pa.string()), total),
            "custom_id": per_request([p.request.custom_id for p in pending], pa.string()),
            "line": per_request([p.request.line for p in pending], pa.int32()),
            "job_id": per_request([batches.job_id(self.batch_id, p.request.custom_id) for p in pending], pa.string()),
            "model": pa.repeat(pa.scalar(self.model_name, pa.string()), total),
            "requested_model": per_request([p.request.requested_model or self.model for p in pending], pa.string()),
            "extra": per_request(
                [json.dumps(p.request.extra, ensure_ascii=False) if p.request.extra else None for p in pending],
                pa.string(),
            ),
            # the batch that ran the row: an earlier reuse's own source, else the earlier batch
            "reused_from": pc.coalesce(earlier.column("reused_from"), earlier.column("batch_id"))
            if "reused_from" in earlier.column_names
            else earlier.column("batch_id"),
        }
        if "choice_index" not in earlier.column_names:  # an embedding batch's merged results drop it; rows hold 0
            own["choice_index"] = pa.repeat(pa.scalar(0, pa.int32()), total)
        arrays = []
        for schema_field in SCHEMA:
            name = schema_field.name
            if name in own:
                arrays.append(_as_type(own[name], schema_field.type))
            elif name in earlier.column_names:
                arrays.append(_as_type(earlier.column(name), schema_field.type))
            else:
                arrays.append(pa.nulls(total, schema_field.type))
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
            if not table.num_rows:
                continue
            custom_ids = table.column("custom_id")
            # a request's rows are adjacent and share its custom id: where one starts
            first = np.concatenate(
                [[0], np.nonzero(_filled(pc.not_equal(custom_ids[1:], custom_ids[:-1]), True))[0] + 1]
            )
            prompt, cached, completion = (
                pc.fill_null(table.column(name), 0).to_numpy().astype(np.int64)
                for name in ("prompt_tokens", "cached_tokens", "completion_tokens")
            )
            embedding = _filled(pc.equal(table.column("kind").take(first), "embedding"), False)
            # an embedding's rows are its inputs (their prompts summed); a generation's its choices (the prompt once)
            prompts = np.where(embedding, np.add.reduceat(prompt, first), prompt[first])
            cached_first = np.where(embedding, 0, cached[first])
            completions = np.where(embedding, 0, np.add.reduceat(completion, first))
            yield from zip(
                custom_ids.take(first).to_pylist(), prompts.tolist(), cached_first.tolist(), completions.tolist()
            )

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


_HASH_TEXT = "^[0-9a-fA-F]{64}$"  # a sha256 as hex: a request_hash that is not one was never written by miro


def _row_flags(batch: pa.RecordBatch, last: tuple | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None]:
    """Per row of a batch of PREVIOUS: successful (a hash and no error), continued (successful, as the row before is,
    with the same hash and custom id: the same request's next row), stopped by itself (finish_reason "stop" or
    null); and the batch's last row's (hash, custom id) if it is successful, which the next batch's first row may
    continue (`last`: the batch before's)."""
    n = batch.num_rows
    batch = pa.RecordBatch.from_arrays(  # a column of nulls only (pyarrow's null type) read as text
        [c.cast(pa.string()) if pa.types.is_null(c.type) else c for c in batch.columns], names=batch.schema.names
    )
    hashes, custom_ids = batch.column("request_hash"), batch.column("custom_id")
    ok = pc.and_(pc.fill_null(pc.match_substring_regex(hashes, _HASH_TEXT), False), pc.is_null(batch.column("error")))
    ok = ok.to_numpy(zero_copy_only=False)
    if "finish_reason" in batch.schema.names:
        stop = pc.fill_null(pc.equal(batch.column("finish_reason"), "stop"), True).to_numpy(zero_copy_only=False)
    else:
        stop = np.ones(n, bool)
    same = np.zeros(n, bool)
    if n > 1:
        later, earlier = slice(1, None), slice(0, n - 1)
        same_hash = pc.fill_null(pc.equal(hashes[later], hashes[earlier]), False)
        same_id = pc.or_(
            pc.fill_null(pc.equal(custom_ids[later], custom_ids[earlier]), False),
            pc.and_(pc.is_null(custom_ids[later]), pc.is_null(custom_ids[earlier])),
        )
        same[1:] = pc.and_(same_hash, same_id).to_numpy(zero_copy_only=False) & ok[1:] & ok[:-1]
    if n and last is not None and ok[0]:
        same[0] = (hashes[0].as_py(), custom_ids[0].as_py()) == last
    last = (hashes[n - 1].as_py(), custom_ids[n - 1].as_py()) if n and ok[-1] else None
    return ok, same, stop, last


def _key(request_hash: str) -> bytes:
    """A hash as index key: its 32 bytes and a 1, as numpy's bytes type drops trailing zero bytes (1 hash in 256
    ends with one, and would then never match)."""
    return bytes.fromhex(request_hash) + b"\x01"


def _filled(flags, value: bool) -> np.ndarray:
    """A boolean arrow array as numpy, its nulls `value`."""
    return pc.fill_null(flags, value).to_numpy(zero_copy_only=False)


def _as_type(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """An earlier results column as the part files' type (merged results hold vectors as fixed_size_list)."""
    return column if column.type == kind else column.cast(kind)
