"""`miro status` and `miro watch`: read-only views of batches and workers (figures from miro.worker.fleet.observe.monitor)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import TYPE_CHECKING

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


from miro.cli.common import MiroCommand, redis_url_option

if TYPE_CHECKING:
    from miro.worker.fleet.records.batches import BatchRecord
    from miro.worker.fleet.observe.monitor import BatchView, Snapshot
    from miro.worker.fleet.records.workers import WorkerRecord

STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "dim",
    "cancelling": "magenta",
    "in_progress": "cyan",
    "validating": "yellow",
    "finalizing": "cyan",
    "expiring": "magenta",
    "expired": "dim",
}


# -- formatting -----------------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """12s, 3m 05s, 2h 03m, 4d 01h; '-' for unknown."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def rate(per_s: float | None, unit: str = "tok/s", digits: int = 0) -> str:
    return "-" if per_s is None else f"{per_s:,.{digits}f} {unit}"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def progress(batch: BatchRecord) -> str:
    """done/total, as '12/40'."""
    return f"{batch.done:,}/{batch.total:,}"


def failed_and_cancelled(batch: BatchRecord) -> str:
    """'3 failed', or '3 failed, 40 cancelled' (or expired): a cancelled or expired batch's done count includes
    what never ran."""
    stopped = "expired" if batch.expired else "cancelled"
    return f"{batch.failed:,} failed" + (f", {batch.cancelled:,} {stopped}" if batch.cancelled else "")


def kv(worker: WorkerRecord) -> str:
    return f"{worker.stats.kv_blocks_used:,}/{worker.stats.kv_blocks_total:,} ({worker.stats.kv_usage:.0%})"


def size(n_bytes: int | None) -> str:
    """1.2 GiB, 340 MiB, 0 B; '-' for unknown."""
    if n_bytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def weights(worker: WorkerRecord) -> str:
    """'llama native 0 B': the architecture, how its weights are held, and the memory they hold of their own."""
    if worker.weight_format is None:  # a worker from before these fields
        return "-"
    return f"{worker.architecture or '?'} {worker.weight_format} {size(worker.weight_memory)}"


def new_table(title: str, columns: tuple[str, ...], right: tuple[str, ...], shrink: tuple[str, ...]) -> Table:
    """A plain table. On a narrow terminal the `shrink` columns give way first, so ids and figures stay whole."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", no_wrap=column not in shrink)
    return table


# -- miro status ----------------------------------------------------------------------------------


def batches_table(views: list[BatchView]) -> Table:
    any_cancelled = any(b.batch.cancelled for b in views)
    any_priority = any(b.batch.priority != "normal" for b in views)  # a column only if any is set
    table = new_table(
        "Batches",
        (
            "batch",
            "name",
            "status",
            *(["priority"] if any_priority else []),
            "done",
            "failed",
            *(["cancelled"] if any_cancelled else []),
            "tokens",
            "age",
        ),
        right=("done", "failed", "cancelled", "tokens"),
        shrink=("name",),
    )
    for b in views:
        priority = [b.batch.priority] if any_priority else []
        cancelled = [f"{b.batch.cancelled:,}"] if any_cancelled else []
        table.add_row(
            b.batch.id,
            b.batch.name,
            status_text(b.batch.status),
            *priority,
            progress(b.batch),
            f"{b.batch.failed:,}",
            *cancelled,
            f"{b.batch.tokens:,}",
            duration(b.age_s),
        )
    return table


def workers_table(records: list[WorkerRecord], title: str = "Workers") -> Table:
    table = new_table(
        title,
        ("worker", "host", "state", "KV blocks", "run/wait", "tok/s", "done/failed", "weights", "cpu tier"),
        right=("KV blocks", "run/wait", "tok/s", "done/failed"),
        shrink=("host", "weights"),
    )
    for w in records:
        table.add_row(
            w.name,
            w.host,
            w.state,
            kv(w),
            f"{w.stats.running}/{w.stats.waiting}",
            f"{w.tokens_per_s:,.0f}",
            f"{w.jobs_done:,}/{w.jobs_failed:,}",
            weights(w),
            w.cpu_tier or "-",
        )  # the tier's name as the worker wrote it: no engine import here
    return table


def when(stamp: float, now: float) -> str:
    return f"{datetime.fromtimestamp(stamp).astimezone().isoformat(timespec='seconds')} ({duration(now - stamp)} ago)"


def batch_details(b: BatchView, now: float) -> Table:
    from miro.worker.fleet.records.batches import STATUSES

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    grid.add_row("batch", Text.assemble(b.batch.id, "  ", status_text(b.batch.status)))
    for label, value in (
        ("name", b.batch.name),
        ("model", b.batch.model),
        ("priority", b.batch.priority),
        ("queue", b.batch.queue),
        ("input", b.batch.input_file),
    ):
        grid.add_row(label, value)
    grid.add_row("output", f"{b.batch.output}/{b.batch.id}/")
    stopped = "expired" if b.batch.expired else "cancelled"
    grid.add_row(
        "requests",
        f"{progress(b.batch)} done: {b.batch.completed:,} completed, {b.batch.failed:,} failed, "
        f"{b.batch.cancelled:,} {stopped}, {b.batch.remaining:,} remaining",
    )
    if b.batch.chunks:
        never = f", {b.batch.unfed_cancelled:,} never queued" if b.batch.feed_closed else ""
        grid.add_row("stored", f"{b.batch.spooled:,} requests, {b.batch.fed_requests:,} of them queued so far{never}")
    grid.add_row(
        "tokens",
        f"{b.batch.prompt_tokens:,} prompt ({b.batch.cached_tokens:,} cached) + "
        f"{b.batch.completion_tokens:,} completion",
    )
    if b.batch.expires_at is not None:
        grid.add_row(
            "window",
            f"{b.batch.completion_window}: expires "
            f"{datetime.fromtimestamp(b.batch.expires_at).astimezone().isoformat(timespec='seconds')}",
        )
    if b.elapsed_s is not None:
        grid.add_row(
            "speed", f"{rate(b.tokens_per_s)}, {rate(b.requests_per_s, 'requests/s', 1)} over {duration(b.elapsed_s)}"
        )
    if b.batch.status == "in_progress":
        grid.add_row("ETA", duration(b.eta_s))
    grid.add_row("created", when(b.batch.created_at, now))
    # the status stamps in time order; finalizing_at and completed_at are equal, so lifecycle order breaks ties
    stamps = sorted(
        (b.batch.at(status), i, status)
        for i, status in enumerate(STATUSES)
        if status != "validating" and b.batch.at(status) is not None
    )
    for stamp, _, status in stamps:
        grid.add_row(status, when(stamp, now))
    return grid


def render_status(snapshot, now: float | None = None) -> Group:
    """The human view of a status snapshot: one batch and its workers, or every batch and live worker."""
    from miro.worker.fleet.observe.monitor import BatchSnapshot

    now = time.time() if now is None else now
    if isinstance(snapshot, BatchSnapshot):
        return Group(batch_details(snapshot.batch, now), workers_table(snapshot.workers, "Its workers"))
    return Group(batches_table(snapshot.batches), workers_table(snapshot.workers, "Live workers"))


@click.command("status", cls=MiroCommand)
@click.argument("batch_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Without BATCH: show the newest LIMIT batches (0: all).",
)
@redis_url_option()
def status_command(batch_id, as_json, limit, redis_url):
    """Show BATCH (counters, times, speed, ETA, its workers), or every batch and live worker."""
    from miro.worker.fleet.observe import monitor
    from miro.worker.fleet.records.connection import connect

    conn = connect(redis_url)
    if batch_id:
        snapshot = monitor.batch_snapshot(conn, batch_id)
    else:
        snapshot = monitor.fleet_snapshot(conn)
        shown = snapshot.batches[: limit or None]
        if len(shown) < len(snapshot.batches) and not as_json:
            click.echo(f"The newest {len(shown)} of {len(snapshot.batches)} batches (--limit 0 shows all).", err=True)
        snapshot.batches = shown
    if as_json:
        click.echo(json.dumps(snapshot.to_dict(), indent=2))
    else:
        console = Console()
        if not console.is_terminal:  # piped: no screen to fit, so never shorten an id or a figure
            console = Console(width=200)
        console.print(render_status(snapshot))


# -- miro watch -----------------------------------------------------------------------------------


def bar_line(completed: int, total: int, label: str) -> Table:
    """An indented 40-character bar with a label after it."""
    grid = Table.grid(padding=(0, 1))
    grid.add_row(" ", ProgressBar(total=max(total, 1), completed=completed, width=40), label)
    return grid


def render_watch(snapshot: Snapshot) -> Group:
    """One frame of `miro watch`: two lines per batch (figures, then a bar), two per worker (figures, KV bar)."""
    lines: list = [Text("Batches", style="bold")]
    for b in snapshot.batches:
        figures = Text.assemble(
            b.batch.id,
            "  ",
            status_text(b.batch.status),
            f"  {progress(b.batch)} done, {failed_and_cancelled(b.batch)}",
        )
        speed = f"{b.batch.done / max(b.batch.total, 1):.0%}  {rate(b.tokens_per_s)}"
        if b.batch.status == "in_progress":
            speed += f"  ETA {duration(b.eta_s)}"
        lines += [figures, bar_line(b.batch.done, b.batch.total, speed)]
    lines.append(Text("Workers", style="bold"))
    for w in snapshot.workers:
        lines += [
            Text(f"{w.name}  {w.state}  {w.stats.running} running  {w.stats.waiting} waiting  {rate(w.tokens_per_s)}"),
            bar_line(w.stats.kv_blocks_used, w.stats.kv_blocks_total, f"KV {kv(w)}"),
        ]
    if not snapshot.workers:
        lines.append(Text("  none", style="dim"))
    return Group(*lines)


PLAIN_EVERY_S = 30.0  # piped `miro watch`: a line at least this often even when nothing moved


def plain_progress(snapshot: Snapshot) -> tuple[tuple, str]:
    """One line of `miro watch` for a log: each batch's progress, speed and ETA, and the workers' count.
    Also the counts alone, to tell whether anything moved since the last line."""
    counts = tuple((b.batch.id, b.batch.status, b.batch.done, b.batch.failed) for b in snapshot.batches)
    parts = []
    for b in snapshot.batches:
        batch = b.batch
        part = (
            f"{batch.id} {batch.status}: {progress(batch)} done ({batch.done / max(batch.total, 1):.0%}), "
            f"{failed_and_cancelled(batch)}, {rate(b.tokens_per_s)}"
        )
        if b.batch.status == "in_progress":
            part += f", ETA {duration(b.eta_s)}"
        parts.append(part)
    workers = snapshot.workers
    running = sum(w.stats.running for w in workers)
    parts.append(f"{len(workers)} worker{'s' if len(workers) != 1 else ''}, {running} requests running")
    return counts, time.strftime("%H:%M:%S ") + "; ".join(parts or ["no batch is active"])


def summary_line(snapshot: Snapshot, batch_id: str | None) -> str:
    if batch_id is None and not snapshot.batches:
        return "No batch is active."
    parts = []
    for b in snapshot.batches:
        counts = f"{b.batch.completed:,} completed, {failed_and_cancelled(b.batch)}"
        parts.append(
            f"{b.batch.id} {b.batch.status}: {progress(b.batch)} done ({counts}), {b.batch.tokens:,} tokens "
            f"in {duration(b.elapsed_s)}"
        )
    return "; ".join(parts) + "."


def watch(conn, batch_id: str | None = None, interval: float = 1.0, console: Console | None = None) -> str:
    """Redraw the batch (or every active batch) until none is active; print and return a summary line."""
    from miro.worker.fleet.observe import monitor

    console = console or Console()
    windows: dict[str, monitor.RateWindow] = {}
    snapshot = monitor.watch_snapshot(conn, batch_id, windows)
    if console.is_terminal:
        with Live(render_watch(snapshot), console=console, auto_refresh=False) as live:
            while not snapshot.finished:
                time.sleep(interval)
                snapshot = monitor.watch_snapshot(conn, batch_id, windows)
                live.update(render_watch(snapshot), refresh=True)
    else:  # piped (tee, nohup, a CI log): a plain line whenever the counts move, and at least every PLAIN_EVERY_S
        printed, last = None, 0.0
        while True:
            counts, line = plain_progress(snapshot)
            if counts != printed or time.monotonic() - last >= PLAIN_EVERY_S:
                console.print(line, highlight=False, soft_wrap=True)
                printed, last = counts, time.monotonic()
            if snapshot.finished:
                break
            time.sleep(interval)
            snapshot = monitor.watch_snapshot(conn, batch_id, windows)
    line = summary_line(snapshot, batch_id)
    console.print(line, highlight=False, soft_wrap=True)
    return line


@click.command("watch", cls=MiroCommand)
@click.argument("batch_id", required=False)
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds between refreshes."
)
@redis_url_option()
def watch_command(batch_id, interval, redis_url):
    """Follow BATCH (or every active batch) live until it finishes: progress, tokens/s, ETA, workers' KV use."""
    from miro.worker.fleet.records.connection import connect

    conn = connect(redis_url)
    watch(conn, batch_id, interval)
