"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code", "request_id"}}, with the HTTP status to
send. `request_id` is the request's `x-request-id` (request_ids.py), which the openai SDK reads into
APIError.request_id; in the body too, so a logged error body names the request. The Anthropic routes
(/v1/messages/...) answer in Anthropic's shape instead: {"type": "error", "error": {"type", "message"},
"request_id"}."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None

    def response(self, request_id: str | None = None, anthropic: bool = False) -> JSONResponse:
        if anthropic:
            kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
            body = {"type": "error", "error": {"type": kind, "message": self.message}, "request_id": request_id}
        else:
            body = {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                    "request_id": request_id,
                }
            }
        headers = {"x-request-id": request_id, "request-id": request_id} if request_id else None
        return JSONResponse(body, status_code=self.status, headers=headers)


ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No {kind} with id '{object_id}' on this server.", code="not_found")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)
