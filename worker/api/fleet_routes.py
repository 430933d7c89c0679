"""Beyond OpenAI's API: the fleet. GET /v1/workers (each live worker's figures, from its Redis hash), /v1/fleet
(what the live page shows: batches with progress, rate and ETA, and the workers) and /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel

from miro.worker.fleet.observe import monitor
from miro.worker.fleet.records import workers
from miro.worker.fleet.observe.metrics import FleetCollector
from miro.worker.fleet.records.workers import WorkerRecord

from miro.worker.api import batch_records
from miro.worker.api.batch_records import ApiBatch
from miro.worker.api.batch_shape import with_result_files

router = APIRouter()
PAGE_BATCHES = 50  # the newest batches the page shows


class Worker(BaseModel):
    name: str
    host: str | None = None
    state: str | None = None
    model: str | None = None
    weight_format: str | None = None
    cpu_tier: str | None = None  # the CPU tier its kernels run (core/kernels/cpu.py), as its hash names it
    queues: list[str] = []
    batches: list[str] = []
    kv_usage: float = 0.0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    running: int = 0
    waiting: int = 0
    tokens_per_s: float = 0.0
    in_flight: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    updated_at: float | None = None


class WorkerList(BaseModel):
    object: str = "list"
    data: list[Worker]


class BatchProgress(BaseModel):
    id: str
    name: str
    status: str
    total: int
    done: int  # completed + failed + cancelled
    finished: int  # completed + failed: what ran (the page's progress; a cancelled request never ran)
    completed: int
    failed: int
    cancelled: int
    tokens_per_s: float | None
    eta_s: float | None
    created_at: float
    output_file_id: str | None = None  # batches made through the API, once they ended
    error_file_id: str | None = None


class Fleet(BaseModel):
    batches: list[BatchProgress]
    workers: list[Worker]


def _workers(records: list[WorkerRecord]) -> list[Worker]:
    shown = [r.to_dict() for r in records if r.name]
    return [Worker.model_validate({k: v for k, v in r.items() if k in Worker.model_fields}) for r in shown]


def _progress(view: monitor.BatchView, api: ApiBatch | None) -> BatchProgress:
    batch = view.batch
    return BatchProgress(
        id=batch.id,
        name=batch.name,
        status=batch.status,
        total=batch.total,
        done=batch.done,
        finished=batch.finished,
        completed=batch.completed,
        failed=batch.failed,
        cancelled=batch.cancelled,
        tokens_per_s=view.tokens_per_s,
        eta_s=view.eta_s,
        created_at=batch.created_at,
        output_file_id=api.output_file_id if api else None,
        error_file_id=api.error_file_id if api else None,
    )


@router.get("/v1/workers")
def list_workers(request: Request) -> WorkerList:
    return WorkerList(data=_workers(workers.list_workers(request.app.state.miro.conn)))


@router.get("/v1/fleet")
def fleet(request: Request) -> Fleet:
    state = request.app.state.miro
    snapshot = monitor.fleet_snapshot(state.conn)
    shown = []
    for view in snapshot.batches[:PAGE_BATCHES]:
        api = batch_records.load(state.conn, view.batch.id)
        if api is not None:
            api = with_result_files(state.conn, state.store, view.batch, api)
        shown.append(_progress(view, api))
    return Fleet(batches=shown, workers=_workers(snapshot.workers))


@router.get("/metrics")
def metrics(request: Request) -> Response:
    registry = CollectorRegistry()
    registry.register(FleetCollector(request.app.state.miro.conn))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
