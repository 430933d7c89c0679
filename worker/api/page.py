"""The live page at /: plain HTML and JavaScript (page.html) that polls /v1/fleet every second. It holds no data
itself, so it needs no API key; the page asks for one when /v1/fleet answers 401."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()


@router.get("/", include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse(resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8"))
