"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code", "request_id"}}, with the HTTP status to
send. `request_id` is the request's `x-request-id` (request_ids.py), which the openai SDK reads into
APIError.request_id; in the body too, so a logged error body names the request."""

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

    def response(self, request_id: str | None = None) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          "request_id": request_id}}
        return JSONResponse(body, status_code=self.status, headers={"x-request-id": request_id} if request_id else None)


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No {kind} with id '{object_id}' on this server.", code="not_found")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)
