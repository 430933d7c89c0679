"""SamplingParams (what a request asks for) and the sampler that turns logits into the next token."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import RequestError


@dataclass
class SamplingParams:
    """Sampling options, named and defaulted as vLLM names them."""

    n: int = 1
    max_tokens: int = 16
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

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        def bad(message: str):
            raise RequestError(message)

        if not isinstance(self.n, int) or self.n < 1:
            bad(f"n must be a positive integer, got {self.n!r}.")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max_tokens must be at least 1, got {self.max_tokens!r}.")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
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
        if any(not s for s in self.stop):
            bad("stop strings must not be empty.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def new_generator(seed: int | None) -> np.random.Generator:
    """One generator per sequence: a seeded request draws the same numbers whatever else is in the batch."""
    return np.random.default_rng(seed)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt_ids, output_ids) -> np.ndarray:
    """Repetition (prompt and output tokens, as vLLM), presence and frequency (output tokens) penalties."""
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.concatenate([np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)]))
        if len(seen):
            values = logits[seen]
            logits[seen] = np.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(output_ids):
        ids, counts = np.unique(np.asarray(output_ids, np.int64), return_counts=True)
        logits[ids] -= params.frequency_penalty * counts + params.presence_penalty
    return logits


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from one row of (already penalised and masked) float32 logits."""
    if params.greedy:
        return int(np.argmax(logits))
    logits = logits.astype(np.float64) / params.temperature
    if params.top_k > 0 and params.top_k < len(logits):
        kth = np.partition(logits, -params.top_k)[-params.top_k]
        logits[logits < kth] = -np.inf
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if params.min_p > 0:
        probs[probs < params.min_p * probs.max()] = 0.0
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        cut = int(np.searchsorted(cumulative, params.top_p * cumulative[-1])) + 1
        probs[order[cut:]] = 0.0
    probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))
