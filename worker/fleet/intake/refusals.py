"""How submit refuses a dataset, or a Redis problem, in one sentence before anything is enqueued: a file with
invalid lines (InvalidDataset), no valid line or unreadable; --reuse rows of another model than the lines run on;
Redis unreachable or failing."""

from __future__ import annotations

import redis

from miro.core.errors import MiroError
from miro.worker.fleet.records import connection
from miro.worker.fleet.intake import routing
from miro.worker.fleet.intake.inputs import LineError
from miro.worker.fleet.intake.read_pass import Read
from miro.worker.fleet.intake.reuse import OtherModel


class InvalidDataset(MiroError):
    """Some lines are invalid and --skip-invalid was not given: nothing was enqueued."""

    def __init__(self, errors: list[LineError], lines: int):
        self.errors = errors
        self.lines = lines
        n = len(errors)
        super().__init__(
            f"{n:,} of {lines:,} lines {'is' if n == 1 else 'are'} invalid, so nothing was enqueued "
            f"(fix {'it' if n == 1 else 'them'}, or pass --skip-invalid to enqueue the valid lines)."
        )


def refuse_unusable(read: Read, skip_invalid: bool) -> None:
    scan = read.scan
    if scan.file_error:
        raise MiroError(f"{scan.file_error.rstrip('.')}; nothing was enqueued.")
    if read.errors and not skip_invalid:
        raise InvalidDataset(read.errors, scan.lines)
    if not scan.valid:
        raise MiroError(f"None of the {scan.lines:,} lines is valid, so nothing was enqueued.")


def refuse_other_model(read: Read, model: str) -> None:
    """Lines given no --model run on the model they name (or their task's default): refused unless that is `model`,
    the one the reused rows were made with."""
    chosen = routing.choose_model(None, None, read.named, read.scan.task, read.more_models)
    if chosen != model:
        named = (
            f"line {read.named[chosen]} names '{chosen}'" if chosen in read.named else f"the lines run on '{chosen}'"
        )
        raise OtherModel(
            f"The results to reuse were made with '{model}', but {named}: a batch reuses only rows of the model "
            "it runs on, so its lines must name that model; nothing was enqueued."
        )


def redis_call(conn: redis.Redis, call):
    """Run a Redis call before anything is enqueued; a Redis problem becomes one sentence."""
    try:
        return call()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise MiroError(f"Cannot reach Redis at {connection.url_of(conn)}: {str(e).rstrip('.')}.") from None
    except redis.RedisError as e:
        raise MiroError(f"Redis failed before anything was enqueued ({str(e).rstrip('.')}).") from None
