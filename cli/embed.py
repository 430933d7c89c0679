"""`miro embed TEXT...`: embed texts on this machine with an embedding model and print the vectors (one JSON
array per line, in the order given) or write them to a Parquet file."""

from __future__ import annotations

import click
import numpy as np

from miro.core.errors import MiroError

from miro.core.loading.registry import DEFAULT_EMBEDDING_MODEL

from miro.cli.common import MiroCommand, engine_kwargs, engine_options, log_to_stderr


@click.command("embed", cls=MiroCommand)
@click.argument("texts", nargs=-1, required=True)
@click.option(
    "--model",
    "-m",
    default=DEFAULT_EMBEDDING_MODEL,
    show_default=True,
    help="An embedding model: alias or path to a .gguf file.",
)
@click.option(
    "--output",
    "-o",
    "out_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the vectors to this Parquet file (or URL, s3://...) instead of printing them: columns "
    "input_index, prompt, embedding (fixed_size_list<float32>), prompt_tokens.",
)
@click.option(
    "--dimensions",
    type=click.IntRange(min=1),
    default=None,
    help="Keep the first N values of each vector, then normalise (OpenAI's dimensions).",
)
@click.option(
    "--truncate", is_flag=True, help="Cut a text longer than the model's context to fit (otherwise it is an error)."
)
@click.option("--no-normalize", is_flag=True, help="Leave the vectors as pooled, not L2-normalised.")
@engine_options
def embed_command(texts, model, out_path, dimensions, truncate, no_normalize, **engine):
    """Embed each TEXT and print its vector as a JSON array, one line per TEXT, in order.

    Each value is printed as the shortest decimal that reads back as the same float32. With --output the vectors
    go to a Parquet file instead, and a line on stderr says so.
    """
    from miro.core import Engine
    from miro.core.layers.pooling import PoolingParams

    params = PoolingParams(
        dimensions=dimensions, normalize=not no_normalize, truncate_prompt_tokens=-1 if truncate else None
    )
    loaded = Engine.from_model(model, log=log_to_stderr, **engine_kwargs(**engine))
    outputs = loaded.encode(list(texts), params)
    errors = [(index, out.error) for index, out in enumerate(outputs) if out.error]
    if errors:
        if len({error for _, error in errors}) == 1 and len(errors) == len(outputs) > 1:
            raise MiroError(errors[0][1])  # the model's own refusal (it cannot embed), once for every text
        index, error = errors[0]
        raise MiroError(f"text {index + 1}: {error}" if len(outputs) > 1 else error)
    if out_path is None:
        for out in outputs:
            click.echo(vector_json(out.embedding))
        return
    _write(out_path, texts, outputs)


def vector_json(vector: np.ndarray) -> str:
    """A float32 vector as a JSON array of the shortest decimals that read back as the same float32 values."""
    return "[" + ", ".join(str(value) for value in vector.astype(np.float32)) + "]"  # numpy's float32 str


def _write(out_path: str, texts: tuple[str, ...], outputs: list) -> None:
    import pyarrow as pa

    from miro.worker.fleet.output.results import write_parquet

    size = len(outputs[0].embedding)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate([o.embedding for o in outputs])), size)
    table = pa.table(
        {
            "input_index": pa.array(range(len(texts)), pa.int32()),
            "prompt": pa.array(texts, pa.string()),
            "embedding": vectors,
            "prompt_tokens": pa.array([o.num_tokens for o in outputs], pa.int32()),
        }
    )
    write_parquet(table, out_path)
    log_to_stderr(f"Wrote {len(texts):,} embeddings of {size} dimensions to {out_path}.")
