"""PoolingParams: what an embedding request asks, and the pooling that turns hidden states into its vector.

    hidden states (T, dim) of one input -> pool (mean, cls or last) -> cut to `dimensions` -> L2 normalise

The names are vLLM's (PoolingParams, truncate_prompt_tokens) and OpenAI's (dimensions); the pooling kinds
are llama.cpp's (`{arch}.pooling_type`: 1 mean, 2 cls, 3 last).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from miro.core.errors import RequestError

POOLING_TYPES = ("mean", "cls", "last")
GGUF_POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type (0 none, 4 rank)


@dataclass(frozen=True)
class PoolingParams:
    """An embedding request's options: None means the model's own (its file's pooling type, its full size)."""

    pooling_type: str | None = None  # "mean", "cls" or "last"
    normalize: bool = True  # L2 normalisation, as OpenAI's and sentence-transformers' Normalize module
    dimensions: int | None = None  # keep the first `dimensions` values, then normalise (OpenAI's `dimensions`)
    truncate_prompt_tokens: int | None = None  # cut a longer input to its first N tokens; -1: to the context

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise RequestError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}.")
        if not isinstance(self.normalize, bool):
            raise RequestError(f"normalize must be true or false, got {self.normalize!r}.")
        if self.dimensions is not None and (type(self.dimensions) is not int or self.dimensions < 1):
            raise RequestError(f"dimensions must be a positive integer, got {self.dimensions!r}.")
        if self.truncate_prompt_tokens is not None and (
            type(self.truncate_prompt_tokens) is not int
            or (self.truncate_prompt_tokens < 1 and self.truncate_prompt_tokens != -1)
        ):
            raise RequestError(
                "truncate_prompt_tokens must be a positive integer or -1 (the model's context), "
                f"got {self.truncate_prompt_tokens!r}."
            )


def pool(hidden: np.ndarray, kind: str) -> np.ndarray:
    """One input's hidden states (T, dim) -> its (dim,) float32 vector, before cutting and normalising."""
    if kind == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)
    if kind == "cls":
        return hidden[0].astype(np.float32, copy=True)
    return hidden[-1].astype(np.float32, copy=True)


def finish(vector: np.ndarray, params: PoolingParams) -> np.ndarray:
    """Cut to params.dimensions, then L2-normalise when asked (a zero vector stays zero)."""
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.normalize:
        norm = float(np.sqrt(np.dot(vector.astype(np.float64), vector.astype(np.float64))))
        vector = vector / np.float32(max(norm, 1e-12))
    return np.ascontiguousarray(vector, dtype=np.float32)
