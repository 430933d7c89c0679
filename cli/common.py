"""What every `miro` command shares: error reporting, the Redis URL option, the engine options."""

from __future__ import annotations

import sys

import click
import redis

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.registry import DEFAULT_MODEL

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


def redis_url_option(help_text: str = "Redis URL (env MIRO_REDIS_URL).", default: str | None = DEFAULT_REDIS_URL):
    return click.option("--redis-url", envvar="MIRO_REDIS_URL", default=default, show_default=default is not None,
                        help=help_text)


def _run_reporting_errors(invoke, ctx):
    """Run a click invoke; MiroError, Redis failing mid-command (and Ctrl-C) become one line on stderr and a
    non-zero exit."""
    try:
        return invoke(ctx)
    except MiroError as err:
        click.echo(f"Error: {err}", err=True)
        sys.exit(1)
    except redis.RedisError as err:  # it answered when the command connected, then stopped (or refused a command)
        from miro.worker.fleet.batches import redacted

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
    "--priority", type=click.Choice(defaults.PRIORITIES), default=None,
    help="Workers take the jobs of high batches before normal ones, and those before low ones; a high request "
         f"preempts lower ones running in a worker's engine.  [default: {defaults.PRIORITY}; a resumed batch "
         "keeps its own]")

completion_window_option = click.option(
    "--completion-window", default=defaults.COMPLETION_WINDOW, show_default=True,
    help="How long the batch may take (24h as OpenAI's, or 30m, 2h, 90s, 2d): past it, requests not yet run "
         "expire (batch_expired errors) and the batch becomes expired; what finished is kept.")


def embedding_line_options(command):
    """--task and --truncate: how a dataset's lines are embedded (`miro run`, `miro submit`)."""
    from miro.worker.fleet.inputs import TASKS

    options = [
        click.option("--task", type=click.Choice(TASKS), default=None,
                     help="embed: a simple line's 'prompt' is embedded, not completed (lines with 'input' and "
                          "/v1/embeddings lines always embed).  [default: what the first line does]"),
        click.option("--truncate", is_flag=True,
                     help="Cut embedding inputs longer than the model's context to fit, in lines without "
                          "truncate_prompt_tokens; without it such an input is its line's error."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def pooling_defaults(truncate: bool) -> dict:
    """The PoolingParams options of embedding lines that set none: --truncate cuts to the model's context."""
    return {"truncate_prompt_tokens": -1} if truncate else {}


def engine_options(command):
    """The engine's cache and batching options, shared by every command that loads a model."""
    options = [
        click.option("--kv-cache-memory", default=defaults.KV_CACHE_MEMORY, show_default=True,
                     help="KV cache size in bytes (e.g. 2GiB, 512MB)."),
        click.option("--num-kv-blocks", type=click.IntRange(min=1), default=None,
                     help="KV cache size in blocks (overrides --kv-cache-memory)."),
        click.option("--block-size", type=click.IntRange(min=16), default=defaults.BLOCK_SIZE, show_default=True,
                     help="Tokens per KV-cache block, a multiple of 16."),
        click.option("--kv-cache-dtype", type=click.Choice(defaults.KV_CACHE_DTYPES), default=defaults.KV_CACHE_DTYPE,
                     show_default=True,
                     help="How K and V are stored: float16 halves the memory attention reads and doubles the "
                          "tokens the cache holds; float32 keeps f32 weights' logits closest to float32 references."),
        click.option("--max-num-seqs", type=click.IntRange(min=1), default=defaults.MAX_NUM_SEQS,
                     help=f"Sequences decoded together (default: one per {defaults.TOKENS_PER_SEAT} tokens of KV "
                          f"cache, {defaults.MAX_NUM_SEQS_RANGE[0]} to {defaults.MAX_NUM_SEQS_RANGE[1]})."),
        click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=defaults.MAX_NUM_BATCHED_TOKENS,
                     show_default=True),
        click.option("--max-model-len", type=click.IntRange(min=1), default=None,
                     help="Context length limit (default: the model's)."),
        click.option("--no-prefix-caching", is_flag=True, help="Turn automatic prefix caching off."),
        click.option("--admission-order", type=click.Choice(defaults.ADMISSION_ORDERS), default=defaults.ADMISSION_ORDER,
                     show_default=True,
                     help="Which waiting request of a priority starts next: the oldest, or the one with the longest "
                          "prompt prefix already in the prefix cache."),
        click.option("--batch-invariant/--no-batch-invariant", default=defaults.BATCH_INVARIANT, show_default=True,
                     help="A request's output bitwise independent of what runs beside it (native weights are by "
                          "construction, f32 ones take miro's invariant GEMM; --no-batch-invariant: OpenBLAS)."),
        click.option("--weights", type=click.Choice(defaults.WEIGHT_CHOICES), default=defaults.WEIGHTS, show_default=True,
                     help="f32: matrices dequantized once (fastest, 4-8x the file's size in memory); native: kept "
                          "as stored in the memory-mapped file; bf16 / i16: that copy in bfloat16 (AVX512_BF16 "
                          "CPUs) or 13-bit integers (x86), for encoders; auto: bf16 or i16 for an encoder, else "
                          "f32 if it fits --max-weight-memory."),
        click.option("--max-weight-memory", default=None,
                     help=f"auto's budget for f32 weights (e.g. 8GiB; default: {defaults.WEIGHT_MEMORY_FRACTION:.0%} "
                          "of the machine's RAM)."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="CPU threads for BLAS and numba (default: all cores; with several workers on one "
                          "machine, keep workers x threads <= cores)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def engine_kwargs(kv_cache_memory, num_kv_blocks, block_size, kv_cache_dtype, max_num_seqs, max_num_batched_tokens,
                  max_model_len, no_prefix_caching, admission_order, batch_invariant, weights, max_weight_memory,
                  threads) -> dict:
    """Engine.from_model's keyword arguments; --threads is applied to this process here and now."""
    if threads is not None:
        limit_threads(threads)
    return dict(kv_cache_memory=kv_cache_memory, num_kv_blocks=num_kv_blocks, block_size=block_size,
                kv_cache_dtype=kv_cache_dtype,
                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len, enable_prefix_caching=not no_prefix_caching,
                admission_order=admission_order,
                batch_invariant=batch_invariant, weights=weights, max_weight_memory=max_weight_memory)


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
        click.option("--json-schema", "json_schema", type=click.Path(dir_okay=False), default=None,
                     help="The output is JSON following the JSON schema in this file."),
        click.option("--regex", default=None, help="The output matches this regular expression."),
        click.option("--choice", multiple=True, help="The output is exactly one of these strings (repeatable)."),
        click.option("--grammar", type=click.Path(dir_okay=False), default=None,
                     help="The output follows the Lark grammar in this file."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def constraint_of(json_schema: str | None, regex: str | None, choice: tuple[str, ...], grammar: str | None) -> dict | None:
    """The constraint options as SamplingParams' structured_outputs (None without one); MiroError in one
    sentence for two at once or a file that cannot be read."""
    import json

    given = {name: value for name, value in (("json", json_schema), ("regex", regex), ("choice", list(choice)),
                                             ("grammar", grammar)) if value}
    if len(given) > 1:
        raise MiroError("give one of --json-schema, --regex, --choice and --grammar, not several.")
    if not given:
        return None
    (kind, value), = given.items()
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
