"""/v1/batches: create (validate and enqueue with miro's own submit), retrieve, list, cancel, and miro's merged
results as Parquet. The batch id is miro's, so `miro status`, `watch`, `cancel`, `retry` and `results` work on
batches made here."""

from __future__ import annotations

import os
import tempfile

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from miro.core.defaults import PRIORITIES
from miro.core.errors import MiroError
from miro.worker.fleet import batches, control, results
from miro.worker.fleet.submit import InvalidDataset, submit

from . import batch_records
from .batch_records import ApiBatch
from .batch_shape import batch_object, with_result_files
from .errors import ApiError, bad_request, not_found
from .file_store import FileRecord
from .shapes import ENDPOINTS, Batch, BatchCreate, BatchError, Page
from .state import ServerState

router = APIRouter()
MAX_ERRORS = 1000  # line errors kept on a failed batch (its record stays small whatever the file)


def _check(body: BatchCreate) -> None:
    if body.endpoint not in ENDPOINTS:
        raise bad_request(f"miro runs batches for the endpoints {', '.join(ENDPOINTS[:-1])} and {ENDPOINTS[-1]}, "
                          f"not '{body.endpoint}'.",
                          param="endpoint")
    if body.completion_window != "24h":
        raise bad_request("The completion window must be '24h'.", param="completion_window")
    for key, value in (body.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise bad_request("Metadata keys are at most 64 characters and values at most 512.", param="metadata")
    priority = (body.metadata or {}).get("priority")
    if priority is not None and priority not in PRIORITIES:
        raise bad_request(f"metadata.priority must be one of {', '.join(PRIORITIES)}, not '{priority}'.",
                          param="metadata.priority")


def _submit(state: ServerState, file: FileRecord, body: BatchCreate) -> tuple[str | None, list[BatchError]]:
    """miro's submit on the uploaded file: (batch id, []) or (None, why the file is refused)."""
    priority = (body.metadata or {}).get("priority")
    with state.store.local_copy(file.id) as path:
        try:
            result = submit(state.conn, path, name=file.filename, output=state.store.batch_output,
                            endpoint=body.endpoint, priority=priority)
        except InvalidDataset as invalid:
            shown = invalid.errors[:MAX_ERRORS]
            return None, [BatchError(code=e.code, message=e.message, line=e.line) for e in shown]
        except MiroError as err:
            return None, [BatchError(code="invalid_file", message=str(err))]
    return result.batch_id, []


def _failed_batch(state: ServerState, file: FileRecord) -> str:
    """A batch record that failed validation, as OpenAI keeps one (status failed, the errors), nothing enqueued."""
    batch_id = batches.create_batch(state.conn, name=file.filename, model="", input_file=state.store.path(file.id),
                                    output=state.store.batch_output, total=0, queue="")
    batches.set_status(state.conn, batch_id, "failed")
    return batch_id


@router.post("/v1/batches")
def create_batch(body: BatchCreate, request: Request) -> Batch:
    state = request.app.state.miro
    _check(body)
    file = state.store.get(body.input_file_id)
    if file.purpose != "batch":
        raise bad_request(f"File {file.id} has purpose '{file.purpose}', not 'batch'.", param="input_file_id")
    batch_id, errors = _submit(state, file, body)
    if batch_id is None:
        batch_id = _failed_batch(state, file)
    api = ApiBatch(batch_id=batch_id, input_file_id=file.id, endpoint=body.endpoint,
                   completion_window=body.completion_window, metadata=body.metadata, errors=errors)
    record = batches.get_batch(state.conn, batch_id)
    batch_records.save(state.conn, api, record.created_at)
    return batch_object(record, api)


def _batch(state: ServerState, batch_id: str) -> Batch:
    api = batch_records.load(state.conn, batch_id)
    if api is None:
        raise not_found("batch", batch_id)
    record = batches.get_batch(state.conn, batch_id)
    return batch_object(record, with_result_files(state.conn, state.store, record, api))


@router.get("/v1/batches/{batch_id}")
def retrieve_batch(batch_id: str, request: Request) -> Batch:
    return _batch(request.app.state.miro, batch_id)


@router.get("/v1/batches")
def list_batches(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> Page[Batch]:
    state = request.app.state.miro
    ids, has_more = batch_records.page_ids(state.conn, after, limit)
    data = [_batch(state, batch_id) for batch_id in ids]
    return Page[Batch](data=data, first_id=ids[0] if ids else None, last_id=ids[-1] if ids else None,
                       has_more=has_more)


@router.post("/v1/batches/{batch_id}/cancel")
def cancel_batch(batch_id: str, request: Request) -> Batch:
    state = request.app.state.miro
    if batch_records.load(state.conn, batch_id) is None:
        raise not_found("batch", batch_id)
    try:
        control.cancel(state.conn, batch_id)  # workers abort what they hold; the batch becomes cancelled then
    except MiroError as err:
        raise ApiError(400, str(err)) from None
    return _batch(state, batch_id)


@router.get("/v1/batches/{batch_id}/results.parquet")
def results_parquet(batch_id: str, request: Request) -> FileResponse:
    """miro's merged results (one row per custom id and choice, in input order) of any batch on this Redis."""
    state = request.app.state.miro
    if not batches.BATCH_ID_RE.fullmatch(batch_id):
        raise not_found("batch", batch_id)
    try:
        batches.get_batch(state.conn, batch_id)
    except MiroError:
        raise not_found("batch", batch_id) from None
    table, _ = results.collect(state.conn, batch_id)
    handle, path = tempfile.mkstemp(suffix=".parquet")
    os.close(handle)
    results.write_parquet(table, path)
    return FileResponse(path, media_type="application/vnd.apache.parquet", filename=f"{batch_id}.parquet",
                        background=BackgroundTask(os.remove, path))
