"""WorkerConfig: every option of a BatchWorker in one record (what it runs and how it writes, stops and reports),
beside the engine's own EngineConfig. `miro worker`'s options and the MIRO_* variables a worker started by
`rq worker -w` reads are generated from these fields (core/options.py), as the engine's are from EngineConfig."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from miro.core import defaults, options
from miro.core.errors import MiroError
from miro.core.loading.registry import DEFAULT_MODEL
from miro.core.options import option


@dataclass(frozen=True)
class WorkerConfig:
    model: str = option(DEFAULT_MODEL, flag="--model -m", help="Model alias or path to a .gguf file.")
    served_model_names: tuple[str, ...] = option(
        (),
        kind=tuple,
        flag="--served-model-name",
        help="Also run requests that ask for this model name (e.g. gpt-4o-mini); repeatable.",
    )
    shutdown_grace_s: float = option(
        defaults.SHUTDOWN_GRACE_S,
        kind=float,
        min=0,
        flag="--shutdown-grace",
        help="Seconds jobs in flight may take to finish after SIGTERM before the rest are requeued.",
    )
    flush_rows: int = option(
        defaults.FLUSH_ROWS, kind=int, min=1, help="Write a Parquet part file once this many rows are waiting..."
    )
    flush_seconds: float = option(
        defaults.FLUSH_SECONDS, kind=float, min=0, help="...or once the oldest waiting row is this old."
    )
    heartbeat_slack_s: int = option(
        defaults.HEARTBEAT_SLACK_S,
        kind=int,
        min=1,
        flag="--heartbeat-slack",
        help="A job whose heartbeat is this many seconds late is abandoned and queued again.",
    )
    metrics_port: int | None = option(
        None, kind=int, min=0, max=65535, help="Serve Prometheus metrics on this port (http://HOST:PORT/metrics)."
    )
    metrics_host: str = option(
        "127.0.0.1",
        help="Address the metrics server binds (no authentication: 0.0.0.0 lets any machine that "
        "reaches this one read it).",
    )
    redis_wait_s: float = option(
        defaults.WAIT_FOR_REDIS_S,
        kind=float,
        min=0,
        flag="--wait-for-redis",
        help="Seconds to keep trying to reach Redis at start-up (fleets often start workers first), and when it "
        "goes away while the worker runs (a restart): past them the worker ends.",
    )

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def of(cls, given: dict, environ: Mapping[str, str] | None = None) -> WorkerConfig:
        """The defaults, then the MIRO_* environment, then `given` (a None value leaves the option to the others);
        an unknown name is refused in one sentence."""
        unknown = sorted(set(given) - cls.names())
        if unknown:
            raise MiroError(f"the worker has no option {unknown[0]!r} (it takes {', '.join(sorted(cls.names()))}).")
        chosen = options.from_env(cls, environ) | {k: v for k, v in given.items() if v is not None}
        if "served_model_names" in chosen:  # repeated, or separated by commas as in the environment
            chosen["served_model_names"] = tuple(
                name.strip() for names in chosen["served_model_names"] for name in names.split(",") if name.strip()
            )
        return replace(cls(), **chosen)
