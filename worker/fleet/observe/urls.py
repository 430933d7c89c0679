"""URLs as they may be shown: a Redis URL (`redis://user:PASSWORD@host`, `?password=`) or a storage location
(`s3://bucket/prefix?secret_key=...`) carries secrets; everything that prints, logs or returns one to a client
shows `redacted(url)`."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

SECRET_PARAMS = re.compile(r"(pass|secret|token|key|credential|signature|sig|auth)", re.IGNORECASE)


def redacted(url: str) -> str:
    """The URL (Redis's, a storage location's) with its secrets replaced by ***: the password in `user:pass@` and
    the value of any query parameter named like one (password, secret_key, session_token, ...). The one helper for
    every URL that is printed, logged or sent to a client."""
    text = str(url)
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user, colon, _ = userinfo.partition(":")
            netloc = f"{user}:***@{host}" if colon else netloc
        query = "&".join(_redacted_param(item) for item in parts.query.split("&"))
        if (netloc, query) == (parts.netloc, parts.query):
            return text
        return (
            urlunsplit(parts._replace(netloc=netloc, query=query))
            if netloc
            else f"{parts.scheme}://{parts.path}?{query}" + (f"#{parts.fragment}" if parts.fragment else "")
        )
    except ValueError:  # not a URL at all: nothing of it shown past its scheme
        return text.split("://", 1)[0] + "://***" if "://" in text else "***"


def _redacted_param(item: str) -> str:
    name, equals, _ = item.partition("=")
    return f"{name}=***" if equals and SECRET_PARAMS.search(name) else item
