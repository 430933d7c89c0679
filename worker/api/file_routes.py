"""/v1/files: upload (streamed into storage), retrieve, list, delete and content."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from miro.worker.api import file_expiry, upload
from miro.worker.api.errors import ApiError, bad_request
from miro.worker.api.file_store import FileRecord
from miro.worker.api.shapes import FileDeleted, FileObject, Page

router = APIRouter()

PURPOSES = ("batch",)  # what may be uploaded; the server itself makes files of purpose batch_output


def _object(record: FileRecord) -> FileObject:
    return FileObject(
        id=record.id,
        bytes=record.bytes,
        created_at=record.created_at,
        filename=record.filename,
        purpose=record.purpose,
        status=record.status,
        expires_at=record.expires_at,
    )


@router.post("/v1/files")
async def create_file(request: Request) -> FileObject:
    state = request.app.state.miro
    store = state.store
    received = await upload.receive(request, store, state.work)
    purpose = received.fields.get("purpose")
    try:
        if purpose not in PURPOSES:
            raise bad_request(f"miro takes files of purpose 'batch', not {purpose!r}.", param="purpose")
        expires_after_s = file_expiry.from_form(received.fields)
    except ApiError:
        await state.work.storage(store.delete_bytes, received.file_id)
        raise
    record = await state.work.storage(
        store.add, received.file_id, received.size, received.filename or "upload.jsonl", purpose, expires_after_s
    )
    return _object(record)


@router.get("/v1/files/{file_id}")
def retrieve_file(file_id: str, request: Request) -> FileObject:
    return _object(request.app.state.miro.store.get(file_id))


@router.get("/v1/files")
def list_files(
    request: Request,
    after: str | None = None,
    limit: int = Query(10000, ge=1, le=10000),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    purpose: str | None = None,
) -> Page[FileObject]:
    store = request.app.state.miro.store
    ids = store.ids(newest_first=order == "desc")
    if after is not None:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
    records = [r for r in store.records(ids) if purpose is None or r.purpose == purpose]
    page = records[:limit]
    return Page[FileObject](
        data=[_object(r) for r in page],
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(records) > limit,
    )


@router.delete("/v1/files/{file_id}")
def delete_file(file_id: str, request: Request) -> FileDeleted:
    request.app.state.miro.store.delete(file_id)
    return FileDeleted(id=file_id)


@router.get("/v1/files/{file_id}/content")
def file_content(file_id: str, request: Request) -> StreamingResponse:
    store = request.app.state.miro.store
    store.get(file_id)
    try:
        chunks = store.chunks(file_id)
    except FileNotFoundError:
        raise ApiError(
            404, f"The bytes of file {file_id} are missing from the storage location.", code="not_found"
        ) from None
    return StreamingResponse(chunks, media_type="application/octet-stream")
