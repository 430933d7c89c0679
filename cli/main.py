"""The `miro` command line. Errors a user can cause end in one sentence and exit code 1."""

from __future__ import annotations

import os
import sys

import click

from miro.core import defaults
from miro.core.loading.registry import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL

from miro.cli.common import (
    MiroCommand,
    MiroGroup,
    completion_window_option,
    constraint_of,
    constraint_options,
    dataset_options,
    embedding_line_options,
    engine_kwargs,
    engine_options,
    input_columns,
    log_to_stderr,
    model_option,
    pooling_defaults,
    priority_option,
    redis_url_option,
    reuse_option,
)


@click.group(cls=MiroGroup)
@click.version_option(package_name="miro")
def cli():
    """miro: offline batch LLM inference on a Redis/RQ worker fleet."""


@cli.command()
@click.argument("prompt")
@model_option
@click.option("--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--max-tokens", default=defaults.GENERATE_MAX_TOKENS, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 turns top-k off.")
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence token.")
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="First say on stderr what was loaded: the model, its weight format, the CPU tier, the KV cache.",
)
@constraint_options
@engine_options
def generate(
    prompt,
    model,
    chat,
    system,
    max_tokens,
    temperature,
    top_p,
    top_k,
    seed,
    stop,
    ignore_eos,
    verbose,
    json_schema,
    regex,
    choice,
    grammar,
    **engine,
):
    """Generate a completion for PROMPT and print it as it is produced."""
    from miro.core import Engine, SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=list(stop),
        ignore_eos=ignore_eos,
        structured_outputs=constraint_of(json_schema, regex, choice, grammar),
    )
    engine = Engine.from_model(model, log=log_to_stderr, **engine_kwargs(**engine))
    if verbose:
        log_to_stderr(
            f"Loaded {model} ({engine.config.architecture}), {engine.weight_choice}; "
            f"{engine.cpu_description}; KV cache {engine.kv_cache_tokens:,} "
            f"tokens ({engine.kv_cache_dtype})"
        )
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    for piece in engine.stream(prompt, params):
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()


@cli.group()
def models():
    """Pull and list models in the local cache ($MIRO_HOME/models)."""


@models.command("pull")
@click.argument("name", default=DEFAULT_MODEL)
def models_pull(name):
    """Download model NAME (default: the default model) into the cache."""
    from miro.core.loading.registry import pull

    path = pull(name, log=log_to_stderr)
    click.echo(str(path))


@models.command("list")
def models_list():
    """List known model aliases and cached files."""
    from miro.core.loading.registry import list_models

    for row in list_models():
        state = "pulled" if row["pulled"] else "not pulled"
        click.echo(f"{row['name']:<16} {state:<11} {row['description']}  {row['path']}")


@models.command("inspect", cls=MiroCommand)
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def models_inspect(model, as_json):
    """What MODEL (a .gguf path or a pulled alias) holds and whether miro runs it, from its metadata alone:
    architecture, parameters, tensor types, context and RoPE scaling, chat template, the weight format miro
    would take, or the one sentence why miro refuses it. Exit code 1 when miro does not run it."""
    import json

    from miro.core.errors import MiroError
    from miro.core.loading.model_info import describe, inspect_model
    from miro.core.loading.registry import ALIASES, cached_path, is_pulled

    if model in ALIASES:
        if not is_pulled(model):
            raise MiroError(f"model '{model}' is not pulled yet: `miro models pull {model}` first.")
        model = str(cached_path(model))
    elif not os.path.isfile(model):
        raise MiroError(f"model '{model}' is neither a known alias ({', '.join(ALIASES)}) nor an existing .gguf file.")
    info = inspect_model(model)
    if as_json:
        click.echo(json.dumps(info.as_dict(), indent=1))
    else:
        for line in describe(info):
            click.echo(line)
    if not info.runs:
        sys.exit(1)


@cli.command("submit", cls=MiroCommand)
@click.argument("dataset", type=click.Path(dir_okay=True, path_type=str))
@redis_url_option("Redis to enqueue on (env MIRO_REDIS_URL).")
@click.option(
    "--queue",
    "queue_name",
    default=None,
    help="RQ queue to enqueue on.  [default: miro:MODEL, the queue workers of that model serve]",
)
@click.option("--name", default=None, help="A name for the batch (default: the dataset's file name).")
@click.option(
    "--output",
    default=defaults.OUTPUT,
    show_default=True,
    help="Folder or URI (s3://, gs://, ...) the workers write the Parquet part files under.",
)
@click.option(
    "--model",
    "-m",
    default=None,
    help="Model alias, .gguf path or name a worker serves (--served-model-name) that runs every line, "
    f"whatever model the lines name.  [default: the model the lines name, else {DEFAULT_MODEL} "
    f"({DEFAULT_EMBEDDING_MODEL} for embeddings)]",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1), default=None, help="Default max_tokens for lines without one."
)
@click.option("--temperature", type=float, default=None, help="Default temperature for lines without one.")
@click.option("--top-p", type=float, default=None, help="Default top_p for lines without one.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Default seed for lines without one.")
@click.option(
    "--skip-invalid", is_flag=True, help="Enqueue the valid lines; record each invalid one as a failed request."
)
@click.option("--dry-run", is_flag=True, help="Validate and report; touch nothing in Redis.")
@click.option(
    "--resume",
    metavar="BATCH",
    default=None,
    help="Add to batch BATCH the requests of the file that have no finished or running job.",
)
@click.option(
    "--job-timeout",
    default=str(defaults.JOB_TIMEOUT_S),
    show_default=True,
    help="Seconds a request may take once started (or 30m, 2h, 1d; -1 for no limit).",
)
@click.option(
    "--requests-per-job",
    type=click.IntRange(min=1),
    default=None,
    help="Requests per RQ job: RQ's bookkeeping of a job is shared by its requests, each still counted "
    f"once; 1 makes a job of each request.  [default: {defaults.REQUESTS_PER_JOB}]",
)
@reuse_option(
    "An earlier result (Parquet) of a batch on the same --model: every row of it whose request is "
    "deterministic and identical is taken instead of running it again; the engine settings compared are "
    "those a worker started here with the MIRO_* environment would load."
)
@dataset_options
@priority_option
@completion_window_option
@embedding_line_options
@constraint_options
def submit(
    dataset,
    redis_url,
    queue_name,
    name,
    output,
    model,
    max_tokens,
    temperature,
    top_p,
    seed,
    skip_invalid,
    dry_run,
    resume,
    job_timeout,
    requests_per_job,
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
):
    """Validate DATASET (JSONL, Parquet, CSV or a saved Hugging Face dataset), store its requests and queue them, a
    group of them per RQ job, as workers drain the queue; prints the batch id."""
    from miro.worker.fleet.observe.urls import redacted
    from miro.worker.fleet.records.connection import connect
    from miro.worker.fleet.intake.submit import submit as submit_dataset

    from miro.cli.validation_progress import ValidationProgress

    defaults = {
        k: v
        for k, v in (
            ("max_tokens", max_tokens),
            ("temperature", temperature),
            ("top_p", top_p),
            ("seed", seed),
            ("structured_outputs", constraint_of(json_schema, regex, choice, grammar)),
        )
        if v is not None
    }
    columns = input_columns(prompt_column, messages_column, input_column, template, id_column, chat)
    reuse = None
    if reuse_path is not None and not dry_run:
        from miro.core.errors import MiroError
        from miro.worker.fleet.intake.reuse import ReuseSource
        from miro.worker.fleet.output.fingerprint import expected_stamp
        from miro.worker.process.worker_support import engine_options_from_env

        if model is None:
            raise MiroError("--reuse needs --model: the rows are reused only for the same model file.")
        reuse = ReuseSource.open(reuse_path, expected_stamp(model, engine_options_from_env()))
    conn = None if dry_run else connect(redis_url)
    with ValidationProgress(os.path.basename(dataset)) as progress:  # invalid lines are shown as they are found
        result = submit_dataset(
            conn,
            dataset,
            queue_name=queue_name,
            name=name,
            output=output,
            model=model,
            defaults=defaults,
            skip_invalid=skip_invalid,
            dry_run=dry_run,
            resume=resume,
            job_timeout=job_timeout,
            priority=priority,
            task=task,
            requests_per_job=requests_per_job,
            pooling_defaults=pooling_defaults(truncate),
            completion_window=completion_window,
            log=log_to_stderr,
            on_line_error=progress.on_line_error,
            on_progress=progress.on_progress,
            columns=columns,
            input_format=input_format,
            reuse=reuse,
        )
    if dry_run:
        log_to_stderr(f"Dry run: {result.valid:,} valid lines, {len(result.invalid):,} invalid; nothing was enqueued.")
        return
    where = f"queue '{result.queue}' on {redacted(redis_url)}"
    if result.resumed:
        log_to_stderr(
            f"Resumed {result.batch_id}: enqueued {result.enqueued:,} requests; {result.already_finished:,} "
            f"already finished, {result.in_flight:,} still queued or running"
            + (f", {result.expired:,} had expired and were enqueued again" if result.expired else "")
            + (f", {result.unfed:,} stored requests a cancel or expiry had left are fed again" if result.unfed else "")
            + f" ({where})."
        )
    else:
        stored = result.stored - result.enqueued
        if reuse is not None:
            log_to_stderr(f"Reused the earlier rows of {result.reused:,} of {result.valid:,} requests.")
        log_to_stderr(
            f"Enqueued {result.enqueued:,} requests on {where} in {result.enqueue_s:.2f} s"
            + (
                f"; the other {stored:,} requests are stored with the results and are queued as the workers take them."
                if stored
                else "."
            )
        )
    if result.invalid:
        log_to_stderr(f"Recorded {result.recorded_invalid:,} invalid lines as failed requests of the batch.")
    click.echo(result.batch_id)


def submit_main() -> None:
    """The miro-submit console script: `miro submit` on its own."""
    submit.main(prog_name="miro-submit")


@cli.command("results", cls=MiroCommand)
@click.argument("batch_id")
@click.option(
    "--output",
    "-o",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Where to write the merged results: a path, or a URL such as s3://bucket/key.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl"]),
    default="parquet",
    show_default=True,
    help="parquet: one row per request and choice (or embedding input); jsonl: OpenAI Batch output lines.",
)
@click.option(
    "--errors",
    "errors_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --format jsonl: where failed requests go [default: OUTPUT with .errors.jsonl].",
)
@redis_url_option()
def results(batch_id, out_path, fmt, errors_path, redis_url):
    """Merge BATCH's part files into one file: one row per custom id and choice, in input order, failed requests included."""
    from miro.worker.fleet.records.connection import connect
    from miro.worker.fleet.output.results import BatchResults, write_results

    merged = BatchResults(connect(redis_url), batch_id)  # written a slice of lines at a time
    batch = merged.batch
    written = write_results(merged, out_path, fmt, errors_path)
    log_to_stderr(
        f"{written.sentence()}: {batch_id} is {batch.status}, {batch.completed:,} completed and "
        f"{batch.failed:,} failed of {batch.total:,}."
    )
    if written.note:
        log_to_stderr(written.note)


from miro.cli.redis_server import redis_command  # noqa: E402

cli.add_command(redis_command)


from miro.cli.control import cancel_command, retry_command  # noqa: E402

cli.add_command(cancel_command)
cli.add_command(retry_command)


from miro.cli.monitor import status_command, watch_command  # noqa: E402

cli.add_command(status_command)
cli.add_command(watch_command)


from miro.cli.run import run_command  # noqa: E402

cli.add_command(run_command)


from miro.cli.serve import serve_command  # noqa: E402

cli.add_command(serve_command)


from miro.cli.embed import embed_command  # noqa: E402

cli.add_command(embed_command)


from miro.cli.warmup import warmup_command  # noqa: E402

cli.add_command(warmup_command)


from miro.cli.worker import worker_command  # noqa: E402

cli.add_command(worker_command)
