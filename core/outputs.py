"""What the engine hands back for a request: its choices' text, token ids and finish reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort" or None while generating
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    logprobs: list[dict] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    error: str | None = None  # set when the request was refused; outputs is then empty
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    # The first choice's fields, for the common n = 1 case.
    @property
    def text(self) -> str:
        return self.outputs[0].text if self.outputs else ""

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids if self.outputs else []

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason if self.outputs else None


@dataclass
class EmbeddingRequestOutput:
    """An embedding request's result: one vector (vLLM's EmbeddingRequestOutput, flattened)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]  # the tokens embedded (after truncation)
    embedding: "np.ndarray | None" = None  # (dimensions,) float32; None when refused
    finished: bool = True
    error: str | None = None  # set when the request was refused

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)
