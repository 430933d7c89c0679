"""`miro run`'s progress (cli/progress.py) on a real Redis: what it prints when stderr is not a terminal."""

from __future__ import annotations

import io

import redis
from cancelled_batch import cancelled_after_three
from rich.console import Console

from miro.cli.progress import BatchProgress


def test_a_cancelled_batch_shows_what_ran_and_what_was_cancelled(redis_url):
    batch_id = cancelled_after_three(redis_url)
    out = io.StringIO()
    with BatchProgress(redis.Redis.from_url(redis_url), batch_id, interval_s=60, console=Console(file=out, width=200)):
        pass
    [line] = out.getvalue().splitlines()
    assert line.endswith(f"{batch_id}: 3/10 done, 1 failed, 7 cancelled"), line
