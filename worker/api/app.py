"""The app: one Redis connection and file store for every request, API keys checked on every route but the page,
every error in OpenAI's shape (a Redis that went away is a 503, never a traceback), an `x-request-id` on every
response, and the background duties (background.py) while it serves."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from miro.worker.fleet import batches

from . import batch_routes, chart_routes, file_routes, fleet_routes, message_routes, page, request_ids
from .background import Background
from .errors import ApiError
from .file_store import FileStore
from .state import ServerConfig, ServerState

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
        message = (f"Redis at {batches.redacted(redis_url)} cannot be reached ({str(err).rstrip('.') or type(err).__name__}); "
                   "try again once it is back.")
        return _respond(request, ApiError(503, message, type="server_error", code="redis_unavailable"))

    async def invalid_request(request: Request, err: RequestValidationError):
        first = err.errors()[0]
        param = ".".join(str(part) for part in first["loc"] if part != "body") or None
        message = f"{param}: {first['msg']}." if param else f"{first['msg']}."
        return _respond(request, ApiError(400, message, param=param))

    async def http_error(request: Request, err: HTTPException):
        code = "not_found" if err.status_code == 404 else None
        return _respond(request, ApiError(err.status_code, str(err.detail), code=code))

    async def unexpected(request: Request, err: Exception):
        log.exception("unexpected error on %s %s (request %s)", request.method, request.url.path,
                      request_ids.of(request))
        return _respond(request, ApiError(500, f"The server failed: {type(err).__name__}.", type="server_error"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(redis.RedisError, redis_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def create_app(config: ServerConfig, conn: redis.Redis | None = None) -> FastAPI:
    """The app for `config`; connects to Redis (MiroError in one sentence if it does not answer) unless given
    `conn`, and opens the storage location (MiroError if it cannot)."""
    conn = conn if conn is not None else batches.connect(config.redis_url)
    state = ServerState(config=config, conn=conn, store=FileStore(conn, config.storage))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        background = Background(state)
        background.start()
        yield
        background.stop()

    app = FastAPI(title="miro", summary="The OpenAI Batch API on a miro fleet", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.miro = state
    app.add_middleware(request_ids.RequestIds)
    _add_error_handlers(app, config.redis_url)
    secured = [Depends(_require_key)]
    app.include_router(file_routes.router, dependencies=secured)
    app.include_router(batch_routes.router, dependencies=secured)
    app.include_router(fleet_routes.router, dependencies=secured)
    app.include_router(message_routes.router, dependencies=secured)
    app.include_router(chart_routes.router, dependencies=secured)
    app.include_router(page.router)
    return app
