"""What every `miro` command shares: error reporting, the Redis URL option, the engine options."""

from __future__ import annotations

import sys

import click
import redis

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.loading.registry import DEFAULT_MODEL

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


def redis_url_option(help_text: str = "Redis URL (env MIRO_REDIS_URL).", default: str | None = DEFAULT_REDIS_URL):
    return click.option(
        "--redis-url", envvar="MIRO_REDIS_URL", default=default, show_default=default is not None, help=help_text
    )


def _run_reporting_errors(invoke, ctx):
    """Run a click invoke; MiroError, Redis failing mid-command (and Ctrl-C) become one line on stderr and a
    non-zero exit."""
    try:
        return invoke(ctx)
    except MiroError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(1)
    except redis.RedisError as err:  # it answered when the command connected, then stopped (or refused a command)
        from miro.worker.fleet.observe.urls import redacted

        url = ctx.params.get("redis_url")
        where = f" at {redacted(url)}" if url else ""
        click.echo(f"Error: Lost Redis{where} ({str(err).rstrip('.') or type(err).__name__}).", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)


class MiroGroup(click.Group):
    """A click group that turns MiroError (and Ctrl-C) into one line on stderr and a non-zero exit."""

    def invoke(self, ctx):
        return _run_reporting_errors(super().invoke, ctx)


class MiroCommand(click.Command):
    """The same error handling for a command run on its own (a console script such as miro-submit)."""

    def invoke(self, ctx):
        return _run_reporting_errors(super().invoke, ctx)


def log_to_stderr(message: str) -> None:
    click.echo(message, err=True)


SHOWN_ERRORS = 20  # invalid lines printed one by one (cli/validation_progress.py); the rest are counted


model_option = click.option(
    "--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model alias or path to a .gguf file."
)

priority_option = click.option(
    "--priority",
    type=click.Choice(defaults.PRIORITIES),
    default=None,
    help="Workers take the jobs of high batches before normal ones, and those before low ones; a high request "
    f"preempts lower ones running in a worker's engine.  [default: {defaults.PRIORITY}; a resumed batch "
    "keeps its own]",
)

completion_window_option = click.option(
    "--completion-window",
    default=defaults.COMPLETION_WINDOW,
    show_default=True,
    help="How long the batch may take (24h as OpenAI's, or 30m, 2h, 90s, 2d): past it, requests not yet run "
    "expire (batch_expired errors) and the batch becomes expired; what finished is kept.",
)


def embedding_line_options(command):
    """--task and --truncate: how a dataset's lines are embedded (`miro run`, `miro submit`)."""
    from miro.worker.fleet.intake.inputs import TASKS

    options = [
        click.option(
            "--task",
            type=click.Choice(TASKS),
            default=None,
            help="embed: a simple line's 'prompt' is embedded, not completed (lines with 'input' and "
            "/v1/embeddings lines always embed).  [default: what the first line does]",
        ),
        click.option(
            "--truncate",
            is_flag=True,
            help="Cut embedding inputs longer than the model's context to fit, in lines without "
            "truncate_prompt_tokens; without it such an input is its line's error.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def pooling_defaults(truncate: bool) -> dict:
    """The PoolingParams options of embedding lines that set none: --truncate cuts to the model's context."""
    return {"truncate_prompt_tokens": -1} if truncate else {}


def config_options(config_class, only: tuple[str, ...] | None = None):
    """A decorator adding one click option per field of a config dataclass (core/options.py: its flag, help, values
    and MIRO_{NAME} environment variable), or only the fields named in `only`."""
    from dataclasses import MISSING, fields

    from miro.core.options import env_name

    def decorate(command):
        for f in reversed([f for f in fields(config_class) if only is None or f.name in only]):
            meta = f.metadata
            if meta["choices"]:
                kind = click.Choice(meta["choices"])
            elif meta["kind"] is int:
                kind = click.IntRange(min=meta["min"], max=meta["max"])
            elif meta["kind"] is float:
                kind = click.FloatRange(min=meta["min"], max=meta["max"])
            else:
                kind = None if meta["kind"] is bool else str
            flag = meta["flag"] or f"--{f.name.replace('_', '-')}"
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            many = meta["kind"] is tuple
            command = click.option(
                *flag.split(" "),
                f.name,
                type=kind,
                default=None if many else default,
                multiple=many,
                envvar=env_name(f),
                show_default=default is not None and not many,
                show_envvar=True,
                help=meta["help"],
            )(command)
        return command

    return decorate


def engine_options(command):
    """The engine's options (one per EngineConfig field, generated from it) and --threads, for every command that
    loads a model."""
    from miro.core.engine.engine_config import EngineConfig

    threads = click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        envvar="MIRO_THREADS",
        show_envvar=True,
        help="CPU threads for BLAS and numba (default: all cores; with several workers on one "
        "machine, keep workers x threads <= cores).",
    )
    return config_options(EngineConfig)(threads(command))


def engine_kwargs(threads: int | None = None, **options) -> dict:
    """Engine.from_model's keyword arguments from engine_options' values; --threads is applied to this process
    here and now."""
    if threads is not None:
        limit_threads(threads)
    return options


def limit_threads(threads: int) -> None:
    """Cap OpenBLAS's and numba's thread pools (they collapse when they fight other processes for cores).

    The environment variables cover BLAS libraries loaded later (scipy's own OpenBLAS, which numba
    imports on first use); threadpool_limits covers those already loaded.
    """
    import os

    import numba
    from threadpoolctl import threadpool_limits

    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    threadpool_limits(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def constraint_options(command):
    """--json-schema, --regex, --choice and --grammar: the structured output a command's requests follow."""
    options = [
        click.option(
            "--json-schema",
            "json_schema",
            type=click.Path(dir_okay=False),
            default=None,
            help="The output is JSON following the JSON schema in this file.",
        ),
        click.option("--regex", default=None, help="The output matches this regular expression."),
        click.option("--choice", multiple=True, help="The output is exactly one of these strings (repeatable)."),
        click.option(
            "--grammar",
            type=click.Path(dir_okay=False),
            default=None,
            help="The output follows the Lark grammar in this file.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def constraint_of(
    json_schema: str | None, regex: str | None, choice: tuple[str, ...], grammar: str | None
) -> dict | None:
    """The constraint options as SamplingParams' structured_outputs (None without one); MiroError in one
    sentence for two at once or a file that cannot be read."""
    import json

    given = {
        name: value
        for name, value in (("json", json_schema), ("regex", regex), ("choice", list(choice)), ("grammar", grammar))
        if value
    }
    if len(given) > 1:
        raise MiroError("give one of --json-schema, --regex, --choice and --grammar, not several.")
    if not given:
        return None
    ((kind, value),) = given.items()
    if kind in ("json", "grammar"):
        option = "--json-schema" if kind == "json" else "--grammar"
        try:
            value = open(value, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as err:
            raise MiroError(f"{option} {value}: cannot read the file ({getattr(err, 'strerror', None) or err}).")
        if kind == "json":
            try:
                value = json.loads(value)
            except ValueError as err:
                raise MiroError(f"--json-schema {json_schema}: not valid JSON ({err}).") from None
    return {kind: value}


def dataset_options(command):
    """How a dataset's rows make requests (`miro run`, `miro submit`): its format, and which columns hold the
    prompt, messages or embedding input, a template over columns, the custom id (intake/columns.py)."""
    from miro.worker.fleet.intake.tables import FORMATS

    options = [
        click.option(
            "--input-format",
            type=click.Choice(FORMATS),
            default=None,
            help="The dataset's format.  [default: by its extension: .parquet, .csv, .arrow, a saved "
            "Hugging Face dataset's folder; else jsonl]",
        ),
        click.option(
            "--prompt-column",
            default=None,
            metavar="COLUMN",
            help="The column holding each row's prompt (a completion; a user message with --chat).",
        ),
        click.option(
            "--messages-column",
            default=None,
            metavar="COLUMN",
            help="The column holding each row's chat messages (a list of {role, content}).",
        ),
        click.option(
            "--input-column",
            default=None,
            metavar="COLUMN",
            help="The column holding each row's embedding input (a text, or a list of texts).",
        ),
        click.option(
            "--template",
            default=None,
            help='Each row\'s prompt made of its columns, e.g. "Summarise: {text}" (a user message with '
            "--chat).  [default: columns named prompt, messages or input]",
        ),
        click.option(
            "--id-column",
            default=None,
            metavar="COLUMN",
            help="The column holding each row's custom id.  [default: a column named id or custom_id, "
            "else line-N for row N]",
        ),
        click.option(
            "--chat",
            is_flag=True,
            help="Give the prompt column or the template to the model's chat template as a user message.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def input_columns(
    prompt_column: str | None,
    messages_column: str | None,
    input_column: str | None,
    template: str | None,
    id_column: str | None,
    chat: bool,
):
    """dataset_options' column values as intake/columns.py's InputColumns (MiroError for two inputs at once)."""
    from miro.worker.fleet.intake.columns import InputColumns

    return InputColumns(
        prompt=prompt_column, messages=messages_column, input=input_column, template=template, id=id_column, chat=chat
    )


def reuse_option(help_text: str):
    return click.option("--reuse", "reuse_path", default=None, metavar="PREVIOUS.parquet", help=help_text)
