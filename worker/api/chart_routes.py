"""Beyond OpenAI's API: what the page's charts and a batch's own page show. GET /v1/fleet/series (the fleet's
tokens/s and requests/s over time, and each worker's KV use and tokens/s) and GET /v1/fleet/batches/{id} (one
batch's counts, timeline, elapsed time, ETA, rates over time, first errors and a few outputs), both read from the
time series the workers append to Redis (worker/fleet/observe/series.py) and, for errors and outputs, the batch's part
files (worker/fleet/output/peek.py)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from miro.core import defaults
from miro.worker.fleet.records import batches, workers
from miro.worker.fleet.observe import monitor, series
from miro.worker.fleet.output.peek import PeekCache, PeekedRow

from miro.worker.api import batch_records
from miro.worker.api.batch_shape import with_result_files
from miro.worker.api.errors import not_found

router = APIRouter()
# one server process, one of each: each part file and each series point of a watched batch is read once
_peeks = PeekCache()
_stored_points = series.StoredPoints()


class RateSample(BaseModel):
    t: float
    requests_per_s: float
    tokens_per_s: float


class WorkerSample(BaseModel):
    t: float
    kv_usage: float
    running: int
    waiting: int
    tokens_per_s: float


class WorkerSeries(BaseModel):
    name: str
    points: list[WorkerSample]


class FleetSeries(BaseModel):
    step_s: float
    window_s: float
    fleet: list[RateSample]
    workers: list[WorkerSeries]


class Stamp(BaseModel):
    status: str  # "created", or a status the batch took
    at: float


class Peeked(BaseModel):
    line: int
    custom_id: str
    text: str  # an error's message, or the output (its first characters)
    finish_reason: str | None = None


class BatchDetail(BaseModel):
    id: str
    name: str
    status: str
    model: str
    total: int
    completed: int
    failed: int
    cancelled: int
    finished: int
    prompt_tokens: int
    completion_tokens: int
    timeline: list[Stamp]  # in time order, from "created"
    expires_at: float | None
    elapsed_s: float | None
    eta_s: float | None
    tokens_per_s: float | None
    requests_per_s: float | None
    series: list[RateSample]
    errors: list[Peeked]  # the first by line
    outputs: list[Peeked]
    output_file_id: str | None = None
    error_file_id: str | None = None


def _rate_samples(points: list[series.RatePoint]) -> list[RateSample]:
    return [
        RateSample(t=p.t, requests_per_s=p.requests_per_s, tokens_per_s=p.tokens_per_s) for p in series.thinned(points)
    ]


def _peeked(rows: list[PeekedRow]) -> list[Peeked]:
    return [Peeked(line=r.line, custom_id=r.custom_id, text=r.text, finish_reason=r.finish_reason) for r in rows]


@router.get("/v1/fleet/series")
def fleet_series(
    request: Request, window_s: float = Query(defaults.SERIES_WINDOW_S, gt=0, le=defaults.SERIES_TTL_S)
) -> FleetSeries:
    conn = request.app.state.miro.conn
    by_worker = series.worker_series(conn, time.time() - window_s)
    return FleetSeries(
        step_s=defaults.SERIES_STEP_S,
        window_s=window_s,
        fleet=_rate_samples(series.fleet_rates(by_worker)),
        workers=[
            WorkerSeries(
                name=name,
                points=[
                    WorkerSample(
                        t=p.t, kv_usage=p.kv_usage, running=p.running, waiting=p.waiting, tokens_per_s=p.tokens_per_s
                    )
                    for p in series.thinned(points)
                ],
            )
            for name, points in sorted(by_worker.items())
        ],
    )


@router.get("/v1/fleet/batches/{batch_id}")
def batch_detail(request: Request, batch_id: str) -> BatchDetail:
    state = request.app.state.miro
    if not batches.BATCH_ID_RE.fullmatch(batch_id) or not state.conn.exists(batches.BatchRecord.key(batch_id)):
        raise not_found("batch", batch_id)
    now = time.time()
    record = batches.get_batch(state.conn, batch_id)
    view = monitor.batch_view(record, now, None, workers.list_workers(state.conn))
    api = batch_records.load(state.conn, batch_id)
    if api is not None:
        api = with_result_files(state.conn, state.store, record, api)
    peek = _peeks.peek(state.conn, record)
    stamps = sorted(record.stamps.items(), key=lambda item: item[1])
    return BatchDetail(
        id=record.id,
        name=record.name,
        status=record.status,
        model=record.model,
        total=record.total,
        completed=record.completed,
        failed=record.failed,
        cancelled=record.cancelled,
        finished=record.finished,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        timeline=[Stamp(status="created", at=record.created_at), *(Stamp(status=s, at=t) for s, t in stamps)],
        expires_at=record.expires_at,
        elapsed_s=view.elapsed_s,
        eta_s=view.eta_s,
        tokens_per_s=view.tokens_per_s,
        requests_per_s=view.requests_per_s,
        series=_rate_samples(series.batch_rates(series.batch_points(state.conn, record, now, _stored_points))),
        errors=_peeked(peek.errors),
        outputs=_peeked(peek.outputs),
        output_file_id=api.output_file_id if api else None,
        error_file_id=api.error_file_id if api else None,
    )
