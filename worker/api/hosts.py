"""Keyless mode's guard against other web pages. Without an API key the server listens on loopback only, but a
browser on the same machine reaches loopback too: a page on another site can send a cross-site form there
(multipart POST /v1/files), or rebind its own name's DNS to 127.0.0.1 and read every answer. So, with no key,
a request is served only when

- its Host is a loopback name (localhost, an address in 127.0.0.0/8, [::1]; any port) or one of the names the
  operator allowed (`miro serve --allowed-host NAME`); else 421 (a rebinding page sends its own name);
- its Origin, if it sends one, is the server's own (http or https on the Host it addressed); else 403 (a
  cross-site form or fetch sends the page's origin).

Clients that are no browser (the SDKs, curl) send a loopback Host and no Origin, so nothing changes for them;
the live page is same-origin. With an API key none of this applies: a page elsewhere does not hold the key.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from miro.worker.api.errors import ApiError

DEFAULT_PORTS = {"http": "80", "https": "443"}


def host_name(host: str) -> str | None:
    """The name in a Host header ("[::1]:8000" -> "::1", "LocalHost." -> "localhost"); None if it is none."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        return name if bracket and (not rest or (rest[0] == ":" and rest[1:].isdigit())) else None
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return None
    return name.rstrip(".") or None


def is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _without_default_port(scheme: str, host: str) -> str:
    port = DEFAULT_PORTS.get(scheme)
    return host[: -len(port) - 1] if port and host.endswith(f":{port}") and not host.endswith("]") else host


def same_origin(origin: str, host: str) -> bool:
    """Whether an Origin header names the server the request addressed (its Host)."""
    try:
        parts = urlsplit(origin.strip().lower())
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc or parts.path not in ("", "/"):
        return False
    host = host.strip().lower()
    return _without_default_port(parts.scheme, parts.netloc) == _without_default_port(parts.scheme, host)


def refusal(host: str | None, origin: str | None, allowed: tuple[str, ...]) -> ApiError | None:
    """Why a keyless server refuses a request with these headers; None if it serves it."""
    name = host_name(host) if host else None
    if name is None or not (is_loopback(name) or name in allowed):
        shown = f"'{host}'" if host else "no Host"
        return ApiError(
            421,
            f"This server has no API key, so it answers only requests addressed to localhost, "
            f"127.0.0.1 or [::1], not {shown[:200]} (allow a name with --allowed-host).",
            type="invalid_request_error",
            code="host_not_allowed",
        )
    if origin is not None and not same_origin(origin, host):
        return ApiError(
            403,
            f"This server has no API key, so it refuses requests from other web pages (Origin '{origin[:200]}').",
            type="invalid_request_error",
            code="origin_not_allowed",
        )
    return None


class KeylessGuard:
    """ASGI middleware: the checks above on every HTTP request, before anything of it is read."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...] = ()):
        self.app = app
        self.allowed = tuple(host_name(name) or name for name in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            err = refusal(headers.get("host"), headers.get("origin"), self.allowed)
            if err is not None:
                request_id = scope.get("state", {}).get("request_id")
                response = err.response(request_id, anthropic=scope["path"].startswith("/v1/messages"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
