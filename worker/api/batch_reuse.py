"""`reuse_batch_id`, miro's extension of POST /v1/batches: the new batch takes the rows of an earlier batch on this
Redis whose request is deterministic and identical (intake/reuse.py) instead of running them, as
`miro submit --reuse PREVIOUS.parquet --model M` does.

The earlier batch is named by id, not by an uploaded results file, because the server keeps no Parquet file of a
batch's results: it keeps the part files its workers wrote (`{storage}/batches/{id}/`) and merges them when asked
(results.BatchResults, a slice of lines at a time). Those merged results are written to a temporary Parquet file,
which ReuseSource indexes (46 bytes a request) and reads a row group at a time, and deleted once the new batch is
submitted. The stamp the rows are compared by is that of the earlier batch's model, which must be a file here (an
alias already pulled, or a .gguf path: the server never downloads one for a request), with the engine settings a
worker started with the server's MIRO_* environment would load; the new batch runs on that model, and its lines
must name it (reuse.OtherModel)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import redis

from miro.core.defaults import RESULTS_SERVER_SLICE_DIVISOR
from miro.core.engine.engine_config import EngineConfig
from miro.core.errors import MiroError
from miro.core.loading.registry import ALIASES, is_pulled
from miro.worker.fleet.intake.reuse import ReuseSource
from miro.worker.fleet.output import results
from miro.worker.fleet.output.fingerprint import expected_stamp
from miro.worker.fleet.records import batches

from miro.worker.api.batch_shape import ENDED
from miro.worker.api.errors import ApiError, bad_request

PARAM = "reuse_batch_id"


def check_id(batch_id: str) -> None:
    """A value that is no batch id is refused before any work."""
    if not batches.BATCH_ID_RE.fullmatch(batch_id):
        raise bad_request(
            f"reuse_batch_id '{batch_id[:80]}' is not a batch id (they look like batch_ followed by 24 hex digits).",
            param=PARAM,
        )


@contextmanager
def reuse_source(conn: redis.Redis, batch_id: str) -> Iterator[ReuseSource]:
    """The earlier batch's results as a ReuseSource for its model; a 4xx in one sentence when it cannot be one.
    Its temporary file is deleted on leaving."""
    record = _ended_batch(conn, batch_id)
    stamp = _stamp(record)
    handle, path = tempfile.mkstemp(prefix="miro-reuse-", suffix=".parquet")
    os.close(handle)
    try:
        try:
            results.write_results(results.BatchResults(conn, batch_id, divisor=RESULTS_SERVER_SLICE_DIVISOR), path)
            source = ReuseSource.open(path, stamp, model=record.model)
        except (MiroError, OSError, pa.ArrowException) as err:  # part files that are no results tables, say
            # one line of it, without the temporary file's name (the client never saw it)
            why = " ".join(str(err).replace(path, "its merged results").split())[:300].rstrip(".")
            raise bad_request(f"The results of batch {batch_id} cannot be reused: {why}.", param=PARAM) from None
        yield source
    finally:
        with suppress(FileNotFoundError):
            os.remove(path)


def _ended_batch(conn: redis.Redis, batch_id: str) -> batches.BatchRecord:
    try:
        record = batches.get_batch(conn, batch_id)
    except MiroError:
        raise ApiError(404, f"No batch with id '{batch_id}' on this server.", code="not_found", param=PARAM) from None
    if record.status == "failed":
        raise bad_request(f"Batch {batch_id} failed validation: it has no results to reuse.", param=PARAM)
    if record.status not in ENDED:
        raise bad_request(
            f"Batch {batch_id} is {record.status}: its results can be reused once it has ended "
            "(completed, cancelled or expired).",
            param=PARAM,
        )
    return record


def _stamp(record: batches.BatchRecord):
    """The stamp of rows the earlier batch's model would make here (fingerprint.expected_stamp)."""
    model = record.model
    if model in ALIASES and not is_pulled(model):
        raise bad_request(
            f"Batch {record.id} ran on '{model}', which is not pulled on this server, so its rows cannot be "
            f"compared (run `miro models pull {model}` where the server runs).",
            param=PARAM,
        )
    if model not in ALIASES and not Path(model).expanduser().is_file():
        raise bad_request(
            f"Batch {record.id} ran on '{model}', which is no model file on this server, so its rows cannot be "
            "compared by the file's sha256.",
            param=PARAM,
        )
    try:
        return expected_stamp(model, EngineConfig.from_env())  # what a worker started here loads (worker_support)
    except (MiroError, OSError, ValueError) as err:
        raise bad_request(
            f"Batch {record.id} ran on '{model}', whose file cannot be read here ({str(err).rstrip('.')}).",
            param=PARAM,
        ) from None
