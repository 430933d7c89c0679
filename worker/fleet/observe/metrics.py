"""Prometheus metrics of a BatchWorker (`miro worker --metrics-port N`), named after vLLM's with `miro:` for
`vllm:`: the same figures as the worker's Redis hash, read from the record it last wrote (no extra work on
the engine's thread). Labels: model_name and worker.
"""

from __future__ import annotations

from operator import attrgetter

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from miro.core.errors import MiroError
from miro.worker.fleet.records import batches, workers
from miro.worker.fleet.records.workers import WorkerRecord

# (kind, metric name, help, attribute of the worker's record: WorkerRecord, "stats." for its EngineStats)
METRICS = [
    ("gauge", "miro:num_requests_running", "Requests in the engine's running batch.", "stats.running"),
    (
        "gauge",
        "miro:num_requests_waiting",
        "Requests admitted to the engine and waiting for KV cache room.",
        "stats.waiting",
    ),
    ("gauge", "miro:kv_cache_usage_perc", "KV cache usage: 1 means every block is in use.", "stats.kv_usage"),
    ("gauge", "miro:kv_cache_blocks_used", "KV cache blocks in use.", "stats.kv_blocks_used"),
    ("gauge", "miro:kv_cache_blocks_total", "KV cache blocks in the pool.", "stats.kv_blocks_total"),
    (
        "counter",
        "miro:prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache.",
        "stats.prefix_cache_queries",
    ),
    ("counter", "miro:prefix_cache_hits", "Prompt tokens found in the prefix cache.", "stats.prefix_cache_hits"),
    (
        "counter",
        "miro:num_preemptions",
        "Requests preempted for KV cache room (recomputed later).",
        "stats.preemptions",
    ),
    ("counter", "miro:prompt_tokens", "Prompt tokens prefilled.", "stats.prompt_tokens_total"),
    ("counter", "miro:generation_tokens", "Tokens generated.", "stats.generation_tokens_total"),
    ("counter", "miro:request_success", "Requests finished and written.", "jobs_done"),
    ("counter", "miro:request_failure", "Requests that failed.", "jobs_failed"),
    ("counter", "miro:request_cancelled", "Requests dropped because their batch was cancelled.", "jobs_cancelled"),
    (
        "gauge",
        "miro:num_requests_in_flight",
        "Requests this worker has taken from the queue and not counted yet.",
        "in_flight",
    ),
    ("gauge", "miro:queue_depth", "Jobs waiting in the queues this worker serves.", "queued"),
]


def worker_families(records: list[WorkerRecord]):
    """The METRICS families with one sample per worker record (labels model_name and worker)."""
    for kind, name, help_text, attribute in METRICS:
        family_type = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
        family = family_type(name, help_text, labels=["model_name", "worker"])
        value_of = attrgetter(attribute)
        for record in records:
            family.add_metric([record.model, record.name], value_of(record))
        yield family


class WorkerCollector(Collector):
    def __init__(self, worker):
        self.worker = worker

    def collect(self):
        record = self.worker.record  # replaced whole by the worker's loop, never changed in place
        if record is None:  # the model is still loading
            return
        yield from worker_families([record])


class FleetCollector(Collector):
    """Every live worker's figures (read from their Redis hashes) and the batches per status: `miro serve`'s
    /metrics. A Redis error propagates to the caller."""

    def __init__(self, conn):
        self.conn = conn

    def collect(self):
        yield from worker_families([w for w in workers.list_workers(self.conn) if w.model and w.name])
        family = GaugeMetricFamily("miro:batches", "Batches on this Redis, by status.", labels=["status"])
        records = batches.list_batches(self.conn)
        for status in batches.STATUSES:
            family.add_metric([status], sum(b.status == status for b in records))
        yield family


def serve_metrics(worker, port: int, host: str = "127.0.0.1") -> None:
    """Serve the worker's metrics on http://host:port/metrics from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise MiroError(f"Cannot serve metrics on {host}:{port}: {err.strerror or err}.") from None
