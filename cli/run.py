"""`miro run`: the whole job on this machine (submit, one worker, the merged results), and a run that can be
interrupted and resumed.

A run keeps its state in a folder, OUTPUT.miro-run/ next to the output unless --state-dir says otherwise
(run_state.py); interruption.py handles the signals, run_results.py writes what the run ends with.

The first Ctrl-C (or SIGTERM) stops the worker taking requests and gives those in flight --shutdown-grace
seconds to finish; a second one puts them back on the queue at once. Either way the requests that finished
are written to OUTPUT's partial file (results.partial.parquet for results.parquet), the folder stays, and
`--resume` runs only what is missing. OUTPUT itself is written only once every request has finished (also
when the last ones finish during the grace: then the run ends as if never interrupted); then the partial file
and the folder go.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
import redis

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.loading.registry import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL
from miro.worker.fleet.observe.urls import redacted
from miro.worker.fleet.records import batches, connection
from miro.worker.fleet.lifecycle import control
from miro.worker.fleet.intake import durations, routing

from miro.cli.common import (
    MiroCommand,
    completion_window_option,
    constraint_of,
    constraint_options,
    dataset_options,
    embedding_line_options,
    engine_kwargs,
    engine_options,
    input_columns,
    log_to_stderr,
    pooling_defaults,
    priority_option,
    redis_url_option,
    reuse_option,
)
from miro.cli.interruption import Interruption
from miro.cli.run_results import Pace, write_run_results
from miro.cli.run_state import RunState

if TYPE_CHECKING:
    from miro.worker.fleet.intake.columns import InputColumns


@click.command("run", cls=MiroCommand)
@click.argument("dataset", type=click.Path(dir_okay=True))
@click.option(
    "--output",
    "-o",
    "out_path",
    default="results.parquet",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The merged results (Parquet), written once every request ran: a path, or a URL such as s3://bucket/key.",
)
@redis_url_option("Use this Redis instead of an embedded one (env MIRO_REDIS_URL).", default=None)
@click.option(
    "--model",
    "-m",
    default=None,
    help=f"Model alias or path to a .gguf file.  [default: {DEFAULT_MODEL}; {DEFAULT_EMBEDDING_MODEL} for "
    "an embedding dataset]",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl"]),
    default="parquet",
    show_default=True,
    help="parquet: one row per request and choice (or embedding input); jsonl: OpenAI Batch output "
    "lines, failed requests in OUTPUT with .errors.jsonl.",
)
@click.option("--name", default=None, help="A name for the batch (shown by miro status).")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Default max_tokens for lines without one.  [default: to a natural stop within the context]",
)
@click.option("--temperature", type=float, default=None, help="Default temperature for lines without one.")
@click.option("--top-p", type=float, default=None, help="Default top_p for lines without one.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Default seed for lines without one.")
@click.option("--skip-invalid", is_flag=True, help="Run the valid lines; invalid ones become failed rows.")
@click.option("--dry-run", is_flag=True, help="Validate the dataset and report; start nothing, load no model.")
@click.option("--resume", is_flag=True, help="Finish an interrupted run: only the requests it did not finish run.")
@click.option(
    "--state-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the run keeps what it needs to be resumed.  [default: OUTPUT.miro-run]",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=defaults.RUN_SHUTDOWN_GRACE_S,
    show_default=True,
    help="Seconds the requests in flight may take to finish after Ctrl-C before they are put back.",
)
@click.option(
    "--flush-seconds",
    type=click.FloatRange(min=0),
    default=defaults.FLUSH_SECONDS,
    show_default=True,
    help="Finished rows are saved to part files at least this often (the progress bar moves as they are); "
    "a run killed outright loses at most this much work.",
)
@reuse_option(
    "An earlier result of this command: every row of it whose request is deterministic (temperature 0, "
    "or a seed) and identical (same model file, options and miro output version) is taken instead of "
    "running it again."
)
@dataset_options
@priority_option
@completion_window_option
@embedding_line_options
@constraint_options
@engine_options
def run_command(
    dataset,
    out_path,
    redis_url,
    model,
    fmt,
    name,
    max_tokens,
    temperature,
    top_p,
    seed,
    skip_invalid,
    dry_run,
    resume,
    state_dir,
    shutdown_grace,
    flush_seconds,
    reuse_path,
    input_format,
    prompt_column,
    messages_column,
    input_column,
    template,
    id_column,
    chat,
    priority,
    completion_window,
    task,
    truncate,
    json_schema,
    regex,
    choice,
    grammar,
    **engine,
):
    """The whole job on this machine: submit DATASET, run a worker until done, write the merged results.

    Ctrl-C writes what finished to OUTPUT's .partial.parquet file; the same command with --resume finishes it.
    """
    from miro.core.loading.registry import resolve_model
    from miro.worker.fleet.output import storage

    constraint = constraint_of(json_schema, regex, choice, grammar)
    defaults = {
        k: v
        for k, v in (
            ("max_tokens", max_tokens),
            ("temperature", temperature),
            ("top_p", top_p),
            ("seed", seed),
            ("structured_outputs", constraint),
        )
        if v is not None
    }
    columns = input_columns(prompt_column, messages_column, input_column, template, id_column, chat)
    lines = LineOptions(defaults, task, pooling_defaults(truncate), columns, input_format)
    durations.completion_window(completion_window)  # refused before anything starts
    options = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "skip_invalid": skip_invalid,
        "name": name,
        "format": fmt,
        "structured_outputs": constraint,
        "task": task,
        "truncate": truncate,
        "reuse": reuse_path,
        "input_format": input_format,
        **({"columns": asdict(columns)} if columns.given or columns.chat else {}),
    }
    checked = _validate(dataset, lines, skip_invalid)
    model = options["model"] = model or routing.default_model(checked.task)
    if dry_run:
        log_to_stderr(f"Dry run: {checked.valid:,} valid lines, {len(checked.invalid):,} invalid; nothing was run.")
        return
    if not storage.is_uri(out_path) and not Path(out_path).absolute().parent.is_dir():
        raise MiroError(f"The folder of the output {out_path} does not exist.")
    resolve_model(model, log_to_stderr)  # a wrong --model fails here (and the default one is pulled on first use)
    reuse = _reuse_source(reuse_path, model, engine) if reuse_path and not resume else None
    # next to a local output; in the current folder for one on an object store
    state = RunState(state_dir or f"{storage.name(out_path) if storage.is_uri(out_path) else out_path}.miro-run")
    record = state.claim(resume, dataset, options, redacted(redis_url) if redis_url else "embedded", out_path)
    interruption = Interruption(shutdown_grace)
    try:
        with interruption, _redis(state, redis_url) as conn:
            batch_id, queue_name = _submit(
                conn, state, record, dataset, lines, resume, priority, completion_window, reuse
            )
            try:
                pace = None
                if not interruption.signal and batches.get_batch(conn, batch_id).status != "completed":
                    worker = _worker(conn, queue_name, model, shutdown_grace, flush_seconds, engine)
                    pace = Pace.start(conn, batch_id)
                    _work(conn, batch_id, worker, interruption)
                finished = write_run_results(conn, batch_id, out_path, state, record, interruption, pace)
            except (MiroError, redis.RedisError) as err:
                raise MiroError(
                    f"{str(err).rstrip('.')}; what finished is kept in {state.shown}, so run the same "
                    "command with --resume to go on."
                ) from None
        if finished:
            state.remove()
    except BaseException:
        if not state.has_batch():  # nothing was enqueued: nothing to resume
            state.remove()
        raise
    finally:
        state.release()
    if not finished:
        sys.exit(interruption.exit_code if interruption.signal else 1)


@dataclass(frozen=True)
class LineOptions:
    """How the dataset's lines are read: sampling defaults, the task, the pooling defaults (submit's arguments)."""

    defaults: dict
    task: str | None
    pooling_defaults: dict
    columns: InputColumns | None = None  # which columns of a table (or keys of a line) make the request
    input_format: str | None = None  # --input-format; None: by the extension

    def submit_kwargs(self) -> dict:
        return {
            "defaults": self.defaults,
            "task": self.task,
            "pooling_defaults": self.pooling_defaults,
            "columns": self.columns,
            "input_format": self.input_format,
        }


def _reuse_source(path: str, model: str, engine: dict):
    """--reuse: the earlier results and the stamp this run's rows will carry (the model file's sha256 and the
    settings its engine will load with), from the model's header alone."""
    from miro.worker.fleet.intake.reuse import ReuseSource
    from miro.worker.fleet.output.fingerprint import expected_stamp

    options = {k: v for k, v in engine.items() if k != "threads"}
    return ReuseSource.open(path, expected_stamp(model, options))


def _validate(dataset: str, lines: LineOptions, skip_invalid: bool):
    """Every line checked before anything starts; the errors are printed as `miro submit` prints them."""
    from miro.worker.fleet.intake.submit import submit as submit_dataset

    from miro.cli.validation_progress import ValidationProgress

    with ValidationProgress(os.path.basename(dataset)) as progress:  # invalid lines are shown as they are found
        return submit_dataset(
            None,
            dataset,
            skip_invalid=skip_invalid,
            dry_run=True,
            **lines.submit_kwargs(),
            on_line_error=progress.on_line_error,
            on_progress=progress.on_progress,
        )


@contextmanager
def _redis(state: RunState, redis_url: str | None):
    """The run's Redis: the one at redis_url, or an embedded one on the state folder's data, stopped on the way
    out whatever happens."""
    if redis_url:
        yield connection.connect(redis_url)
        return
    from miro.worker.fleet.records.embedded_redis import EmbeddedRedis

    with EmbeddedRedis(state.redis_dir) as conn:
        yield conn


def _submit(
    conn,
    state: RunState,
    record: dict,
    dataset: str,
    lines: LineOptions,
    resume: bool,
    priority: str | None,
    completion_window: str,
    reuse=None,
) -> tuple[str, str]:
    """Enqueue the dataset as a new batch, or (resume) only its requests with no finished or running job (the
    batch keeps its priority and completion window); returns the batch id and its queue."""
    from miro.worker.fleet.intake.submit import submit as submit_dataset

    options = record["options"]
    if not resume:
        submitted = submit_dataset(
            conn,
            dataset,
            output=str(state.parts_dir),
            model=options["model"],
            name=options.get("name"),
            skip_invalid=options["skip_invalid"],
            queue_name=f"miro-run-{os.getpid()}",
            priority=priority,
            completion_window=completion_window,
            reuse=reuse,
            **lines.submit_kwargs(),
        )
        state.save({**record, "batch_id": submitted.batch_id})
        if reuse is not None:
            log_to_stderr(
                f"Reused {submitted.reused:,} of {submitted.valid:,} requests from "
                f"{record['options']['reuse']}; {submitted.valid - submitted.reused:,} to run."
            )
        return submitted.batch_id, submitted.queue

    batch_id = record["batch_id"]
    try:
        batch = batches.get_batch(conn, batch_id)
    except MiroError:
        raise MiroError(
            f"The Redis of the interrupted run no longer holds its batch {batch_id}; delete "
            f"{state.shown} to start over."
        ) from None
    control.requeue_abandoned(conn, batch.queue)  # a run killed outright left them taken
    submit_dataset(
        conn,
        dataset,
        output=str(state.parts_dir),
        model=options["model"],
        skip_invalid=options["skip_invalid"],
        resume=batch_id,
        **lines.submit_kwargs(),
    )
    batch = batches.get_batch(conn, batch_id)
    log_to_stderr(f"Resuming {batch_id} from {state.shown}: {batch.done:,} of {batch.total:,} requests already done.")
    return batch_id, batch.queue


def _worker(conn, queue_name: str, model: str, shutdown_grace: float, flush_seconds: float, engine: dict):
    """A BatchWorker for the run's queue, stopped by the run's Interruption rather than its own signal handlers."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    from miro.worker import BatchWorker

    queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
    worker = BatchWorker(
        [queue],
        connection=conn,
        serializer=JSONSerializer,
        model=model,
        engine_options=engine_kwargs(**engine),
        shutdown_grace_s=shutdown_grace,
        flush_seconds=flush_seconds,
    )
    worker.handle_signals = False
    return worker


def _work(conn, batch_id: str, worker, interruption: Interruption) -> None:
    """Run the worker until the queue is empty, or until the user interrupts it."""
    from miro.cli.progress import BatchProgress

    interruption.worker = worker
    if interruption.signal:  # it came while the worker was being made
        return
    with BatchProgress(conn, batch_id) as progress:
        interruption.say = progress.print  # above the bar, not through it
        try:
            worker.work(burst=True, logging_level="WARNING")
        finally:
            interruption.say = log_to_stderr
