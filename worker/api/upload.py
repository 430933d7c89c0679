"""A multipart/form-data upload (POST /v1/files: fields `purpose` and `file`) streamed into a FileWriter as it
arrives: the body is read chunk by chunk and written out whenever a MiB has gathered, so an upload of any
size takes about a MiB of memory. Writes run on the server's storage threads (slow.py); the event loop never waits
on storage, and the request threads are not used."""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request

from miro.worker.api.errors import ApiError, bad_request
from miro.worker.api.file_store import FileStore, FileWriter
from miro.worker.api.limits import FORM_BYTES, shown
from miro.worker.api.slow import SlowWork

FLUSH_BYTES = 1 << 20
MAX_FIELD_BYTES = 4096  # a form field that is not the file (purpose); all of them and the part headers: FORM_BYTES


@dataclass
class Upload:
    """What the form held: the stored file (id, size, name) and the other fields."""

    file_id: str | None = None
    size: int = 0
    filename: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


class _Form:
    """python-multipart callbacks: headers name each part; the file's bytes gather in `pending`."""

    def __init__(self, store: FileStore):
        self.store = store
        self.upload = Upload()
        self.writer: FileWriter | None = None
        self.pending = bytearray()
        self._header, self._value, self._disposition = b"", b"", b""
        self._name: str | None = None
        self._in_file = False
        self._field = bytearray()
        self._form_bytes = 0  # of part headers and fields, not the file

    def _count(self, size: int) -> None:
        self._form_bytes += size
        if self._form_bytes > FORM_BYTES:
            raise ApiError(
                413,
                f"The form's fields and part headers besides the file are over {shown(FORM_BYTES)}.",
                code="request_too_large",
            )

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self._disposition, self._in_file, self._field = b"", False, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start)
        self._header += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count(end - start)
        self._value += data[start:end]

    def on_header_end(self) -> None:
        if self._header.lower() == b"content-disposition":
            self._disposition = self._value
        self._header, self._value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file" and b"filename" in options:
            if self.writer is not None:
                raise bad_request("Give one file per upload.", param="file")
            self.upload.file_id, self.writer = self.store.new_writer()
            self.upload.filename = options[b"filename"].decode("utf-8", "replace")
            self._in_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.pending += data[start:end]
        else:
            self._count(end - start)
            self._field += data[start:end]
            if len(self._field) > MAX_FIELD_BYTES:
                raise ApiError(
                    413,
                    f"The form field '{self._name[:100]}' is over {MAX_FIELD_BYTES} bytes.",
                    param=self._name[:100],
                    code="request_too_large",
                )

    def on_part_end(self) -> None:
        if not self._in_file and self._name:
            self.upload.fields[self._name] = self._field.decode("utf-8", "replace")


async def receive(request: Request, store: FileStore, work: SlowWork) -> Upload:
    """Stream the request's multipart body into storage; the file is in place when this returns, and nothing
    of it remains if it raises."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in options:
        raise bad_request("Upload the file as multipart/form-data with the fields 'purpose' and 'file'.")
    form = _Form(store)
    parser = MultipartParser(options[b"boundary"], form.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            if len(form.pending) >= FLUSH_BYTES:
                await _flush(form, work)
        parser.finalize()
        await _flush(form, work)
        if form.writer is None:
            raise bad_request("The upload has no file: give it in the form field 'file'.", param="file")
        await work.storage(form.writer.commit)
    except BaseException as err:
        if form.writer is not None:
            await work.storage(form.writer.abort)
        if isinstance(err, MultipartParseError):
            raise bad_request(f"The upload is not valid multipart/form-data ({str(err).rstrip('.')}).") from None
        if isinstance(err, ClientDisconnect):
            raise bad_request("The upload was cut off before its end.") from None
        raise
    form.upload.size = form.writer.size
    return form.upload


async def _flush(form: _Form, work: SlowWork) -> None:
    if form.pending and form.writer is not None:
        data, form.pending = bytes(form.pending), bytearray()
        await work.storage(form.writer.write, data)
