"""`miro warmup`: numba's cache filled, for a model and this CPU, before any run (core/engine/compile_ahead.py)."""

from __future__ import annotations

import click

from miro.core.loading.registry import DEFAULT_MODEL

from miro.cli.common import MiroCommand, engine_kwargs, engine_options, log_to_stderr


@click.command("warmup", cls=MiroCommand)
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    help=f"Model alias or .gguf path (repeatable).  [default: {DEFAULT_MODEL}]",
)
@engine_options
def warmup_command(models, **engine):
    """Compile every kernel a run of MODEL calls on this CPU into numba's on-disk cache, so that the next `miro
    run`, worker or engine on this machine (or image) loads them instead of compiling. A machine with another CPU
    compiles once for its own on its first load, into the same cache.

    The engine options (weights, KV cache dtype...) should be those the runs will use: kernels are compiled
    for them."""
    from numba.core import config

    from miro.core.engine.warmup import warm_up
    from miro.core.kernels import cpu

    options = engine_kwargs(**engine)
    where = config.CACHE_DIR or "the __pycache__ folders beside miro's sources"
    for model in models or (DEFAULT_MODEL,):
        done = warm_up(model, log=log_to_stderr, **options)
        first_use = f", {len(done.first_use)} more on first use" if done.first_use else ""
        log_to_stderr(
            f"Warmed {model} for the {cpu.TIER.name} tier in {done.seconds:.1f} s: {done.ahead} kernel "
            f"families compiled ahead{first_use} (numba's cache: {where})."
        )
