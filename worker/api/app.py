"""The app: one Redis connection and file store for every request, API keys checked on every route but the page
(/openapi.json too; no /docs), with no key only loopback Host names and same-origin pages (hosts.py), each route's
body limit (limits.py), every error in OpenAI's shape (a Redis that went away is a 503; a command Redis refused a
500 or 409, never a traceback), an `x-request-id` on every response, and the background duties (background.py)
while it serves."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from miro.worker.fleet.observe.urls import redacted
from miro.worker.fleet.records import connection

from miro.worker.api import batch_routes, chart_routes, file_routes, fleet_routes, message_routes, page, request_ids
from miro.worker.api.background import Background
from miro.worker.api.errors import ApiError
from miro.worker.api.file_store import FileStore
from miro.worker.api.hosts import KeylessGuard
from miro.worker.api.limits import BodyLimits
from miro.worker.api.state import ServerConfig, ServerState

log = logging.getLogger("miro.serve")


def _require_key(request: Request) -> None:
    keys = request.app.state.miro.config.api_keys
    if not keys:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" and request.headers.get("x-api-key"):  # as Anthropic's clients may send it
        scheme, given = "bearer", request.headers["x-api-key"]
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "Missing API key: send it as 'Authorization: Bearer KEY'.", code="missing_api_key")
    if not any(hmac.compare_digest(given.encode(), key.encode()) for key in keys):
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")


def _respond(request: Request, err: ApiError):
    """The error in the shape of the API asked: Anthropic's under /v1/messages, OpenAI's elsewhere."""
    return err.response(request_ids.of(request), anthropic=request.url.path.startswith("/v1/messages"))


def _add_error_handlers(app: FastAPI, redis_url: str) -> None:
    async def api_error(request: Request, err: ApiError):
        return _respond(request, err)

    async def redis_error(request: Request, err: redis.RedisError):
        why = str(err).rstrip(".") or type(err).__name__
        if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):  # BusyLoadingError, AuthenticationError too
            message = f"Redis at {redacted(redis_url)} cannot be reached ({why}); try again once it is back."
            return _respond(request, ApiError(503, message, type="server_error", code="redis_unavailable"))
        why = why.rpartition(" of pipeline caused error: ")[2][:300]  # the error, not the command and its values
        log.error(
            "Redis refused a command on %s %s (request %s): %s",
            request.method,
            request.url.path,
            request_ids.of(request),
            why,
        )
        if why.startswith("WRONGTYPE"):  # a key holds something other than what miro keeps there
            return _respond(
                request,
                ApiError(
                    409, f"What Redis holds for this request is not what miro keeps there ({why}).", code="conflict"
                ),
            )
        return _respond(
            request,
            ApiError(500, f"Redis refused a command of this request ({why}).", type="server_error", code="redis_error"),
        )

    async def invalid_request(request: Request, err: RequestValidationError):
        first = err.errors()[0]
        param = ".".join(str(part) for part in first["loc"] if part != "body") or None
        message = f"{param}: {first['msg']}." if param else f"{first['msg']}."
        return _respond(request, ApiError(400, message, param=param))

    async def http_error(request: Request, err: HTTPException):
        code = {404: "not_found", 413: "request_too_large"}.get(err.status_code)
        return _respond(request, ApiError(err.status_code, str(err.detail), code=code))

    async def unexpected(request: Request, err: Exception):
        log.exception(
            "unexpected error on %s %s (request %s)", request.method, request.url.path, request_ids.of(request)
        )
        return _respond(request, ApiError(500, f"The server failed: {type(err).__name__}.", type="server_error"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(redis.RedisError, redis_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def create_app(config: ServerConfig, conn: redis.Redis | None = None) -> FastAPI:
    """The app for `config`; connects to Redis (MiroError in one sentence if it does not answer) unless given
    `conn`, and opens the storage location (MiroError if it cannot)."""
    conn = conn if conn is not None else connection.connect(config.redis_url)
    state = ServerState(config=config, conn=conn, store=FileStore(conn, config.storage))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        background = Background(state)
        background.start()
        yield
        background.stop()
        state.work.shutdown()

    app = FastAPI(
        title="miro",
        summary="The OpenAI Batch API on a miro fleet",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.miro = state
    app.add_middleware(BodyLimits, upload_bytes=config.max_upload_bytes)
    if not config.api_keys:
        app.add_middleware(KeylessGuard, allowed_hosts=config.allowed_hosts)
    app.add_middleware(request_ids.RequestIds)  # the outermost: every answer, a refusal too, has its id
    _add_error_handlers(app, config.redis_url)
    secured = [Depends(_require_key)]
    app.include_router(file_routes.router, dependencies=secured)
    app.include_router(batch_routes.router, dependencies=secured)
    app.include_router(fleet_routes.router, dependencies=secured)
    app.include_router(message_routes.router, dependencies=secured)
    app.include_router(chart_routes.router, dependencies=secured)
    app.include_router(page.router)

    @app.get("/openapi.json", include_in_schema=False, dependencies=secured)
    def openapi() -> dict:
        return app.openapi()

    return app
