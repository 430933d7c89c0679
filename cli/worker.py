"""`miro worker`: a BatchWorker on the given queues, its options WorkerConfig's and EngineConfig's fields."""

from __future__ import annotations

from dataclasses import asdict

import click

from miro.cli.common import MiroCommand, config_options, engine_kwargs, engine_options, log_to_stderr, redis_url_option
from miro.worker.process.worker_config import WorkerConfig


@click.command("worker", cls=MiroCommand)
@redis_url_option()
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="Queue(s) to serve, in order.  [default: miro:NAME for the model's name and each served name]",
)
@click.option("--name", default=None, help="Worker name (default: a random one).")
@config_options(WorkerConfig)
@click.option("--burst", is_flag=True, help="Quit when the queues are empty and nothing is in flight.")
@click.option(
    "--worker-ttl",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds the worker's heartbeat lives (RQ's default 420); shorter finds dead workers sooner.",
)
@click.option(
    "--maintenance-interval",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds between RQ maintenance runs that requeue abandoned jobs (RQ's default 600).",
)
@click.option(
    "--job-monitoring-interval",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds between heartbeats of the jobs in flight (RQ's default 30).",
)
@click.option(
    "--logging-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="DEBUG adds RQ's line for every job taken and finished.",
)
@engine_options
def worker_command(
    redis_url, queues, name, burst, worker_ttl, maintenance_interval, job_monitoring_interval, logging_level, **options
):
    """Run a BatchWorker: the model stays loaded and many jobs share each engine step."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    import redis

    from miro.core.errors import MiroError
    from miro.worker import BatchWorker
    from miro.worker.fleet.observe.urls import redacted
    from miro.worker.fleet.records.connection import connect
    from miro.worker.fleet.intake.routing import queue_for

    config = WorkerConfig.of({k: options.pop(k) for k in list(options) if k in WorkerConfig.names()})
    conn = connect(redis_url, wait_s=config.redis_wait_s, log=log_to_stderr)
    queues = queues or [queue_for(n) for n in dict.fromkeys([config.model, *config.served_model_names])]
    rq_queues = [Queue(q, connection=conn, serializer=JSONSerializer) for q in queues]
    rq_settings = {
        k: v
        for k, v in (
            ("worker_ttl", worker_ttl),
            ("maintenance_interval", maintenance_interval),
            ("job_monitoring_interval", job_monitoring_interval),
        )
        if v is not None
    }
    worker = BatchWorker(
        rq_queues,
        connection=conn,
        serializer=JSONSerializer,
        name=name,
        engine_options=engine_kwargs(**options),
        **asdict(config),
        **rq_settings,
    )
    try:
        worker.work(burst=burst, logging_level=logging_level.upper())
    except redis.RedisError as err:
        raise MiroError(
            f"Lost Redis at {redacted(redis_url)} ({str(err).rstrip('.')}); the jobs this worker held "
            f"are queued again once their heartbeat lapses (part files already written stay)."
        ) from None
