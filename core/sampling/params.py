"""SamplingParams: what a request asks of the sampler, validated when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field

from miro.core.loading.model_config import MAX_CONTEXT_LENGTH
from miro.core.errors import RequestError
from miro.core.sampling.constraint import StructuredOutputsParams

MAX_N = 128  # choices per request, OpenAI's limit
MAX_TOKENS_LIMIT = MAX_CONTEXT_LENGTH  # no model miro loads has a longer context: more is a mistake, refused at submit


@dataclass
class SamplingParams:
    """Sampling options, named and defaulted as vLLM names them."""

    n: int = 1
    max_tokens: int | None = 16  # None: up to the end of the context (OpenAI's default), as far as the KV cache holds
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    # a JSON schema, regex, choice or grammar the output must follow (a dict of its fields is taken too)
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.of(self.structured_outputs)
        self.validate()

    def validate(self) -> None:
        def bad(message: str):
            raise RequestError(message)

        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            bad(f"n must be an integer from 1 to {MAX_N}, got {self.n!r}.")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT
        ):
            bad(
                f"max_tokens must be from 1 to {MAX_TOKENS_LIMIT:,} (longer than any supported context), "
                f"got {self.max_tokens!r}."
            )
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad(f"min_tokens must be between 0 and max_tokens ({self.max_tokens}), got {self.min_tokens!r}.")
        if self.temperature < 0:
            bad(f"temperature must be >= 0, got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if self.top_k < -1:
            bad(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}.")
        if not 0 <= self.min_p <= 1:
            bad(f"min_p must be in [0, 1], got {self.min_p!r}.")
        if self.repetition_penalty <= 0:
            bad(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}.")
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            bad("presence_penalty and frequency_penalty must be in [-2, 2].")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            bad(f"logprobs must be between 0 and 20, got {self.logprobs!r}.")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            bad(f"seed must be a non-negative integer, got {self.seed!r}.")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers.")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty.")
        if self.structured_outputs is not None:
            if self.stop:
                bad(
                    "stop strings cannot be combined with structured_outputs: they could cut the output short of "
                    "what the constraint asks."
                )
            self.structured_outputs.validate()

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature, self.top_k)


def is_greedy(temperature: float, top_k: int) -> bool:
    """Sampling that always takes the most likely token: temperature 0, or top_k 1."""
    return temperature == 0 or top_k == 1


def find_stop(text: str, stops: list[str], new_from: int) -> int | None:
    """Where the earliest stop string starts, looking only where text from `new_from` on could complete one."""
    hits = [text.find(s, max(0, new_from - len(s) + 1)) for s in stops]
    hits = [h for h in hits if h != -1]
    return min(hits) if hits else None
