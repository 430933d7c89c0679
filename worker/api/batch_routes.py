"""/v1/batches: create (validate and enqueue with miro's own submit), retrieve, list, cancel, and miro's merged
results as Parquet. The batch id is miro's, so `miro status`, `watch`, `cancel`, `retry` and `results` work on
batches made here, and retrieve, list and cancel on batches made by `miro-submit` or `miro run`."""

from __future__ import annotations

import os
import tempfile
from contextlib import nullcontext

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from miro.core.defaults import PRIORITIES, RESULTS_SERVER_SLICE_DIVISOR
from miro.core.errors import MiroError
from miro.worker.fleet.records import batches
from miro.worker.fleet.lifecycle import control
from miro.worker.fleet.intake import durations
from miro.worker.fleet.output import results
from miro.worker.fleet.intake.reuse import OtherModel, ReuseSource
from miro.worker.fleet.intake.refusals import InvalidDataset
from miro.worker.fleet.intake.submit import submit
from miro.worker.fleet.intake.submit_result import SubmitResult

from miro.worker.api import batch_records, batch_reuse, file_expiry
from miro.worker.api.batch_records import ApiBatch
from miro.worker.api.batch_shape import WAIT_FOR_WRITER_S, batch_object, with_result_files
from miro.worker.api.errors import ApiError, bad_request, not_found
from miro.worker.api.file_store import FileRecord
from miro.worker.api.shapes import ENDPOINTS, Batch, BatchCreate, BatchError, Page
from miro.worker.api.state import ServerState

router = APIRouter()
MAX_ERRORS = 1000  # line errors kept on a failed batch (its record stays small whatever the file)


def _check(body: BatchCreate) -> None:
    if body.endpoint not in ENDPOINTS:
        raise bad_request(
            f"miro runs batches for the endpoints {', '.join(ENDPOINTS[:-1])} and {ENDPOINTS[-1]}, "
            f"not '{body.endpoint}'.",
            param="endpoint",
        )
    try:
        durations.completion_window(body.completion_window)
    except MiroError as err:
        raise bad_request(str(err), param="completion_window") from None
    for key, value in (body.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise bad_request("Metadata keys are at most 64 characters and values at most 512.", param="metadata")
    priority = (body.metadata or {}).get("priority")
    if priority is not None and priority not in PRIORITIES:
        raise bad_request(
            f"metadata.priority must be one of {', '.join(PRIORITIES)}, not '{priority}'.", param="metadata.priority"
        )
    if body.reuse_batch_id is not None:
        batch_reuse.check_id(body.reuse_batch_id)


def _submit(
    state: ServerState, file: FileRecord, body: BatchCreate, reuse: ReuseSource | None
) -> tuple[SubmitResult | None, list[BatchError]]:
    """miro's submit on the uploaded file: (its result, []) or (None, why the file is refused); a 400 if its lines
    run on another model than `reuse`'s (batch_reuse.py)."""
    priority = (body.metadata or {}).get("priority")
    with state.store.local_copy(file.id) as path:
        try:
            result = submit(
                state.conn,
                path,
                name=file.filename,
                output=state.store.batch_output,
                endpoint=body.endpoint,
                priority=priority,
                completion_window=body.completion_window,
                reuse=reuse,
            )
        except InvalidDataset as invalid:
            shown = invalid.errors[:MAX_ERRORS]
            return None, [BatchError(code=e.code, message=e.message, line=e.line) for e in shown]
        except OtherModel as err:
            raise bad_request(str(err), param=batch_reuse.PARAM) from None
        except MiroError as err:
            return None, [BatchError(code="invalid_file", message=str(err))]
    return result, []


def _failed_batch(state: ServerState, file: FileRecord) -> str:
    """A batch record that failed validation, as OpenAI keeps one (status failed, the errors), nothing enqueued."""
    batch_id = batches.create_batch(
        state.conn,
        name=file.filename,
        model="",
        input_file=state.store.path(file.id),
        output=state.store.batch_output,
        total=0,
        queue="",
        completion_window=None,
    )
    batches.set_status(state.conn, batch_id, "failed")
    return batch_id


@router.post("/v1/batches")
async def create_batch(body: BatchCreate, request: Request) -> Batch:
    """Checked here; made on one of the server's creation threads (slow.py), which may take seconds for a big file
    while the request threads serve everyone else."""
    state = request.app.state.miro
    _check(body)
    given = body.output_expires_after
    output_expires_after_s = file_expiry.seconds(given.anchor, given.seconds, "output_expires_after") if given else None
    return await state.work.create(_create, state, body, output_expires_after_s)


def _create(state: ServerState, body: BatchCreate, output_expires_after_s: int | None) -> Batch:
    file = state.store.get(body.input_file_id)
    if file.purpose != "batch":
        raise bad_request(f"File {file.id} has purpose '{file.purpose}', not 'batch'.", param="input_file_id")
    reusing = body.reuse_batch_id is not None
    with batch_reuse.reuse_source(state.conn, body.reuse_batch_id) if reusing else nullcontext() as reuse:
        result, errors = _submit(state, file, body, reuse)
    batch_id = result.batch_id if result is not None else _failed_batch(state, file)
    api = ApiBatch(
        batch_id=batch_id,
        input_file_id=file.id,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        metadata=body.metadata,
        errors=errors,
        output_expires_after_s=output_expires_after_s,
        reuse_batch_id=body.reuse_batch_id,
        reused=(result.reused if result is not None else 0) if reusing else None,
    )
    batch_records.save(state.conn, api)
    return batch_object(batches.get_batch(state.conn, batch_id), api)


def _record(state: ServerState, batch_id: str) -> batches.BatchRecord:
    """The batch's record, whatever made it; 404 in OpenAI's shape if there is none."""
    if not batches.BATCH_ID_RE.fullmatch(batch_id):
        raise not_found("batch", batch_id)
    try:
        return batches.get_batch(state.conn, batch_id)
    except MiroError:
        raise not_found("batch", batch_id) from None


def _batch(state: ServerState, record: batches.BatchRecord, write_files: bool = True) -> Batch:
    """OpenAI's Batch for the record; with `write_files`, its result files are written first if it has just ended
    (the background loop does it too, so a list leaves that to it)."""
    api = batch_records.of(state.conn, record)
    if write_files:
        api = with_result_files(state.conn, state.store, record, api, wait_s=WAIT_FOR_WRITER_S)
    return batch_object(record, api)


@router.get("/v1/batches/{batch_id}")
def retrieve_batch(batch_id: str, request: Request) -> Batch:
    state = request.app.state.miro
    return _batch(state, _record(state, batch_id))


@router.get("/v1/batches")
def list_batches(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> Page[Batch]:
    state = request.app.state.miro
    ids, has_more = batch_records.page_ids(state.conn, after, limit)
    found = batches.records(state.conn, ids)
    ids = [record.id for record in found]  # a record deleted since the index was read is left out
    data = [_batch(state, record, write_files=False) for record in found]
    return Page[Batch](data=data, first_id=ids[0] if ids else None, last_id=ids[-1] if ids else None, has_more=has_more)


@router.post("/v1/batches/{batch_id}/cancel")
def cancel_batch(batch_id: str, request: Request) -> Batch:
    state = request.app.state.miro
    _record(state, batch_id)
    try:
        control.cancel(state.conn, batch_id)  # workers abort what they hold; the batch becomes cancelled then
    except MiroError as err:
        raise ApiError(400, str(err)) from None
    return _batch(state, _record(state, batch_id))


@router.get("/v1/batches/{batch_id}/results.parquet")
def results_parquet(batch_id: str, request: Request) -> FileResponse:
    """miro's merged results (one row per custom id and choice, in input order) of any batch on this Redis, written
    to a temporary file a slice of lines at a time (results.BatchResults) and sent from there."""
    state = request.app.state.miro
    _record(state, batch_id)
    handle, path = tempfile.mkstemp(suffix=".parquet")
    os.close(handle)
    try:
        results.write_results(results.BatchResults(state.conn, batch_id, divisor=RESULTS_SERVER_SLICE_DIVISOR), path)
    except BaseException:
        os.remove(path)
        raise
    return FileResponse(
        path,
        media_type="application/vnd.apache.parquet",
        filename=f"{batch_id}.parquet",
        background=BackgroundTask(os.remove, path),
    )
