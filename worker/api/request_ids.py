"""OpenAI's `x-request-id`: every request gets an id (`req_` and 32 hex digits), sent back as the response's
`x-request-id` header (the openai SDK reads it into APIError.request_id and `_request_id`) and as `request-id`
(Anthropic's name, which the anthropic SDK reads), and kept in `request.state.request_id` for the error bodies and
the log."""

from __future__ import annotations

import secrets

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
HEADERS = (HEADER, "request-id")  # OpenAI's, Anthropic's


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


def of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


class RequestIds:
    """ASGI middleware: an id for each HTTP request, on its response. (A response to an unexpected error is made
    outside the middleware, by the app's 500 handler, which sets the header itself.)"""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name in HEADERS:
                    if name not in headers:
                        headers.append(name, request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)
