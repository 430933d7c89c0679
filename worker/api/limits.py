"""How big a request body may be, per route, enforced as the body arrives (nothing past the limit is read):

- POST /v1/files: the uploaded file up to `--max-upload-mib` (UPLOAD_BYTES by default) and, besides it, at most
  FORM_BYTES of form fields and part headers (upload.py counts those);
- POST /v1/messages/batches: MESSAGE_BATCH_BYTES (the requests come in the JSON body; a bigger batch is a file
  uploaded to /v1/files and given to /v1/batches);
- every other route: JSON_BYTES.

A body over its limit is a 413 in one sentence: at once when its Content-Length says so, else as soon as the
bytes read pass the limit (a chunked body).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from miro.worker.api.errors import ApiError

MIB = 1 << 20
UPLOAD_BYTES = 512 * MIB  # an uploaded file (OpenAI's own limit for a file)
FORM_BYTES = 64 << 10  # the form's fields and part headers besides the file's bytes
MESSAGE_BATCH_BYTES = 8 * MIB  # a Message Batches create
JSON_BYTES = 1 * MIB  # any other body


def shown(size: int) -> str:
    return f"{size // MIB} MiB" if size % MIB == 0 else f"{size // 1024} KiB"


def body_limit(method: str, path: str, upload_bytes: int) -> tuple[int, str]:
    """(the most bytes of body the route takes, a sentence saying so once a body is over it)."""
    path = path.rstrip("/")
    if method == "POST" and path == "/v1/files":
        return upload_bytes + FORM_BYTES, f"The upload is over this server's limit of {shown(upload_bytes)} a file."
    if method == "POST" and path == "/v1/messages/batches":
        return MESSAGE_BATCH_BYTES, (
            f"The request body is over the {shown(MESSAGE_BATCH_BYTES)} a message batch may "
            "take; upload a bigger batch as a file to /v1/files and create it with "
            "/v1/batches."
        )
    return JSON_BYTES, f"The request body is over the {shown(JSON_BYTES)} that {method} {path} takes."


class TooLarge(HTTPException):
    def __init__(self, message: str):
        super().__init__(413, message)


class BodyLimits:
    """ASGI middleware: each route's body limit, checked against Content-Length before anything is read and
    against the bytes as they are read (TooLarge, raised to whatever is reading, which answers 413)."""

    def __init__(self, app: ASGIApp, upload_bytes: int = UPLOAD_BYTES):
        self.app, self.upload_bytes = app, upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = body_limit(scope["method"], scope["path"], self.upload_bytes)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            err = ApiError(413, message, code="request_too_large")
            request_id = scope.get("state", {}).get("request_id")
            await err.response(request_id, anthropic=scope["path"].startswith("/v1/messages"))(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message_in = await receive()
            if message_in["type"] == "http.request":
                received += len(message_in.get("body", b""))
                if received > limit:
                    raise TooLarge(message)
            return message_in

        await self.app(scope, limited, send)
