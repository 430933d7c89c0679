"""The `miro` command line. Errors a user can cause end in one sentence and exit code 1."""

from __future__ import annotations

import sys

import click

from miro.core.errors import MiroError
from miro.core.registry import DEFAULT_MODEL


class MiroGroup(click.Group):
    """A click group that turns MiroError (and Ctrl-C) into one line on stderr and a non-zero exit."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MiroError as err:
            click.echo(f"Error: {err}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)


def log_to_stderr(message: str) -> None:
    click.echo(message, err=True)


model_option = click.option(
    "--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model alias or path to a .gguf file."
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
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 turns top-k off.")
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence token.")
def generate(prompt, model, chat, system, max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos):
    """Generate a completion for PROMPT and print it as it is produced."""
    from miro.core import Engine, SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=list(stop),
        ignore_eos=ignore_eos,
    )
    engine = Engine.from_model(model, log=log_to_stderr)
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
    from miro.core.registry import pull

    path = pull(name, log=log_to_stderr)
    click.echo(str(path))


@models.command("list")
def models_list():
    """List known model aliases and cached files."""
    from miro.core.registry import list_models

    for row in list_models():
        state = "pulled" if row["pulled"] else "not pulled"
        click.echo(f"{row['name']:<16} {state:<11} {row['description']}  {row['path']}")
