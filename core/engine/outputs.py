"""What the engine hands back for a request: its choices' text, token ids, finish reasons, logprobs (spelled) and,
for a JSON constraint, the parsed output: everything a result row needs, typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass
class Logprob:
    """A token and its log-probability, spelled as OpenAI gives it: its text (invalid UTF-8 replaced) and bytes."""

    token_id: int
    token: str
    bytes: bytes
    logprob: float


@dataclass
class TokenLogprobs(Logprob):
    """A generated token's logprob and the `logprobs` most likely tokens at its position, most likely first."""

    top_logprobs: list[Logprob] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort", "error" or None while generating
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    logprobs: list[TokenLogprobs] | None = None  # one per token when the request asked for logprobs
    # a JSON-constrained choice that finished with "stop", parsed, as compact JSON text; None for anything else
    parsed: str | None = None


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
