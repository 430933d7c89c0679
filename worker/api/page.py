"""The pages: the live page at / (page.html: every batch and worker, and the fleet's charts) and a batch's own
page at /batches/{id} (batch_page.html: its counts, timeline, charts, first errors and a few outputs), with the
script and style sheet they share (page.js and page.css, at /page/). Plain HTML, JavaScript and SVG, no build step and nothing fetched
from elsewhere; they poll the API (/v1/fleet, /v1/fleet/series, /v1/fleet/batches/{id}). They hold no data
themselves, so they need no API key; a page asks for one when the API answers 401."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

router = APIRouter()


def _text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@router.get("/", include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse(_text("page.html"))


@router.get("/batches/{batch_id}", include_in_schema=False)
def batch_page(batch_id: str) -> HTMLResponse:
    return HTMLResponse(_text("batch_page.html"))  # the page reads the id from its address


@router.get("/page/page.js", include_in_schema=False)
def script() -> Response:
    return Response(_text("page.js"), media_type="text/javascript")


@router.get("/page/page.css", include_in_schema=False)
def style_sheet() -> Response:
    return Response(_text("page.css"), media_type="text/css")
