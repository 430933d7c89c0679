"""`miro cancel` and `miro retry`: stop a batch, or run its failed requests again."""

from __future__ import annotations

import click

from miro.cli.common import MiroCommand, log_to_stderr, redis_url_option


@click.command("cancel", cls=MiroCommand)
@click.argument("batch_id")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for workers to abort the requests they hold (0: do not wait).",
)
@redis_url_option()
def cancel_command(batch_id, wait_s, redis_url):
    """Cancel BATCH: its queued jobs are removed, workers abort those in flight, rows already written stay."""
    from miro.worker.fleet.records.connection import connect
    from miro.worker.fleet.lifecycle.control import cancel

    result = cancel(connect(redis_url), batch_id, wait_s=wait_s)
    if result.already:
        log_to_stderr(f"Batch {batch_id} was already cancelled.")
    elif result.status == "cancelled":
        log_to_stderr(f"Cancelled {batch_id}: {result.removed:,} queued jobs removed.")
    else:
        log_to_stderr(
            f"Cancelling {batch_id}: {result.removed:,} queued jobs removed; {result.running:,} requests "
            f"are still held by workers, which abort them within seconds (or, for a worker that died, once "
            f"RQ finds its jobs abandoned). `miro status {batch_id}` shows when it is cancelled."
        )
    click.echo(result.status)


@click.command("retry", cls=MiroCommand)
@click.argument("batch_id")
@redis_url_option()
def retry_command(batch_id, redis_url):
    """Queue BATCH's failed requests again; a request's new row replaces its error row in the results."""
    from miro.worker.fleet.records.connection import connect
    from miro.worker.fleet.lifecycle.control import retry

    result = retry(connect(redis_url), batch_id)
    invalid = (
        f" {result.invalid:,} failed requests are invalid lines, which cannot run: fix them and submit the "
        f"file again with --resume {batch_id}."
        if result.invalid
        else ""
    )
    log_to_stderr(f"Queued {result.enqueued:,} failed requests of {batch_id} again." + invalid)
    click.echo(result.enqueued)
