"""Which model a batch runs on, and which workers take its jobs.

A batch runs on one model, and its jobs go to that model's queue, `miro:{model name}`; a worker listens to
the queues of the names it serves (its model's name and any `--served-model-name`), so in a fleet with
several models no request lands on the wrong one. A batch's priority picks one of three queues per name:
`miro:{model}/high`, `miro:{model}` (normal) and `miro:{model}/low`; a worker listens to every high queue
first, then the normal ones, then the low ones, and RQ takes from the first queue with a job. A model's name
is its alias (`smollm2-135m`) or, for a path, the file's name without `.gguf` (`./models/tiny.gguf` -> `tiny`),
so workers on machines that keep the file in different folders still agree. A model's name never holds a "/"
(it is a file's name), so no model, not even one named `high` or `x:low`, has a normal queue that reads as
another's priority queue. Queues of earlier versions were `miro:{model}:high` and `:low`: a worker moves their
jobs to the new names when it starts (migrate_legacy_queues), and retry and --resume use the new names.
"""

from __future__ import annotations

from pathlib import Path

import redis

from miro.core.defaults import PRIORITIES
from miro.core.errors import MiroError
from miro.core.loading.registry import ALIASES, DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL

from miro.worker.fleet.records import keys, scripts

QUEUE_PREFIX = "miro:"
PRIORITY_SEPARATOR = "/"  # between a queue and its priority: a character no model name holds
LEGACY_SEPARATOR = ":"  # before PRIORITY_SEPARATOR: a model named "high" collided with priority queues


def default_model(task: str) -> str:
    """The model a batch of `task` ("generate" or "embed") runs on when neither --model nor its lines name one."""
    return DEFAULT_EMBEDDING_MODEL if task == "embed" else DEFAULT_MODEL


def model_name(model: str) -> str:
    """The name a model is known by in the fleet: its alias, or its file's name without .gguf."""
    if model in ALIASES:
        return model
    name = Path(model).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def queue_for(model: str) -> str:
    return QUEUE_PREFIX + model_name(model)


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise MiroError(f"The priority '{priority}' is not one of {', '.join(PRIORITIES)}.")
    return priority


def priority_queue(queue: str, priority: str) -> str:
    """The queue a batch of `priority` goes to: `queue` itself for normal, `queue/high` or `queue/low` otherwise."""
    return queue if priority == "normal" else f"{queue}{PRIORITY_SEPARATOR}{priority}"


def queue_priority(queue: str) -> str:
    """The priority a queue's jobs have, from its name."""
    return next((p for p in PRIORITIES if p != "normal" and queue.endswith(f"{PRIORITY_SEPARATOR}{p}")), "normal")


def upgraded_queue(queue: str, priority: str) -> str:
    """A batch's recorded queue under today's names: an earlier version's `Q:high` of a high batch is `Q/high`."""
    legacy = f"{LEGACY_SEPARATOR}{priority}"
    if priority != "normal" and queue.endswith(legacy):
        return priority_queue(queue[: -len(legacy)], priority)
    return queue


def upgrade_recorded_queue(conn: redis.Redis, batch_id: str, queue: str, priority: str) -> str:
    """The queue of a batch about to get jobs again (retry, --resume) under today's names, recorded so."""
    upgraded = upgraded_queue(queue, priority)
    if upgraded != queue:
        conn.hset(keys.batch(batch_id), "queue", upgraded)
    return upgraded


def migrate_legacy_queues(conn: redis.Redis, queues: list[str]) -> int:
    """Move the jobs an earlier version queued on `Q:high` / `Q:low` for each normal queue Q given onto `Q/high` /
    `Q/low` (only those whose batch records that queue and priority: a model named `Q:high` keeps its own), and
    update their batch records; returns how many jobs moved."""
    from rq import Queue
    from rq.job import Job

    moved = 0
    for queue in queues:
        if queue_priority(queue) != "normal":
            continue
        for priority in PRIORITIES:
            if priority == "normal":
                continue
            legacy, new = f"{queue}{LEGACY_SEPARATOR}{priority}", priority_queue(queue, priority)
            old_key, new_key = Queue(legacy, connection=conn).key, Queue(new, connection=conn).key
            if conn.exists(old_key):
                moved += int(
                    scripts.MIGRATE_QUEUE(
                        conn,
                        [old_key, new_key, Queue.redis_queues_keys],
                        [legacy, new, priority, keys.batch(""), Job.redis_job_namespace_prefix],
                    )
                )
    return moved


def engine_priority(priority: str) -> int:
    """The engine's priority number for a batch priority (as vLLM's: lower is served first; normal is 0)."""
    return PRIORITIES.index(priority) - PRIORITIES.index("normal")


def worker_queues(queues: list[str]) -> list[str]:
    """What a worker given `queues` listens to, most urgent first: each name given without a priority at every
    priority (high queues, then normal, then low), a name given with one as it is."""
    expanded = [priority_queue(q, p) if queue_priority(q) == "normal" else q for q in queues for p in PRIORITIES]
    return sorted(dict.fromkeys(expanded), key=lambda q: PRIORITIES.index(queue_priority(q)))


def register_served_names(conn: redis.Redis, names: list[str], model: str) -> None:
    """A worker says which extra names it serves its model under (persisted: see keys.served_models)."""
    if names:
        conn.hset(keys.served_models(), mapping={name: model_name(model) for name in names})


def served_names(conn: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in conn.hgetall(keys.served_models()).items()}


def is_known(conn: redis.Redis | None, model: str) -> bool:
    """An alias, a .gguf file on this machine, or a name some worker said it serves."""
    if model in ALIASES or Path(model).expanduser().is_file():
        return True
    return conn is not None and conn.hexists(keys.served_models(), model)


def _unknown(model: str, where: str, remedy: str) -> MiroError:
    return MiroError(
        f"{where}model '{model}' is unknown: it is not an alias ({', '.join(ALIASES)}), not a .gguf file here, and "
        f"no worker serves it (`miro worker --served-model-name {model}` names a model so); {remedy}"
    )


def choose_model(
    conn: redis.Redis | None,
    model_option: str | None,
    named: dict[str, int],
    task: str = "generate",
    more: bool = False,
) -> str:
    """The batch's model: --model if given (the lines' own `model` fields then only say what they asked for),
    otherwise the one model the lines name (OpenAI bodies' `model`), otherwise the default model of its task.

    `named` maps each model the lines name to the first line naming it; `more`: the lines name others too. `conn` is None for a dry run without
    Redis, which cannot know what the fleet serves: names it cannot place are accepted then.
    """
    if model_option is not None:
        if not is_known(conn, model_option) and conn is not None:
            raise _unknown(model_option, "The ", "check the name, or start such a worker first.")
        return model_option
    if not named:
        return default_model(task)
    if len(named) > 1 or more:
        listed = ", ".join(f"'{m}' (line {line})" for m, line in sorted(named.items(), key=lambda kv: kv[1]))
        count = f"more than {len(named)}" if more else str(len(named))
        raise MiroError(
            f"The lines name {count} models ({listed}{', ...' if more else ''}), and a batch runs on "
            f"one: split the file by model, or pass --model to run every line on one model."
        )
    [(model, line)] = named.items()
    if not is_known(conn, model) and conn is not None:
        raise _unknown(
            model,
            f"Line {line}: ",
            "pass --model to choose the model that runs these lines (their "
            "rows keep the name they asked for as requested_model).",
        )
    return model
