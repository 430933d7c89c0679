"""EngineStats: the engine's KV cache and token figures (Engine.stats()), named as vLLM's v1 metrics name them.

No numba here: the worker publishes these in its Redis hash, and `miro status` reads them back without loading
the engine.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

STATS_WINDOW_S = 10.0  # the window the engine's token rates are taken over


@dataclass(frozen=True)
class EngineStats:
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_usage: float = 0.0  # 1 means every block is in use
    running: int = 0  # sequences in the running batch
    waiting: int = 0  # admitted, waiting for KV cache room or a seat
    preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prompt_tokens_per_s: float = 0.0  # over the last 10 s (or since the first step, if sooner)
    generation_tokens_per_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens_per_s + self.generation_tokens_per_s


@dataclass
class LoadTimes:
    parse_s: float
    tokenizer_s: float
    weights_s: float

    @property
    def total_s(self) -> float:
        return self.parse_s + self.tokenizer_s + self.weights_s


class TokenRates:
    """Tokens an engine computed: totals, and rates per second over the last STATS_WINDOW_S (or since the first
    step, if sooner), so they fall to 0 when the engine is idle."""

    def __init__(self):
        self.log: deque[tuple[float, int, int]] = deque()  # (time, prompt tokens, generated tokens) of each step
        self.first_step_at: float | None = None  # when the first step began: the window starts no earlier
        self.prompt_tokens_total = 0  # prompt tokens computed (recomputation after preemption included)
        self.generation_tokens_total = 0

    def record(self, prompt_tokens: int, generated: int, step_started: float) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += generated
        self.log.append((time.monotonic(), prompt_tokens, generated))
        if self.first_step_at is None:
            self.first_step_at = step_started
        self._trim()

    def per_second(self) -> tuple[float, float]:
        """(prompt tokens, generated tokens) per second over the window."""
        span = self._trim()
        if not span:
            return 0.0, 0.0
        return sum(p for _, p, _ in self.log) / span, sum(g for _, _, g in self.log) / span

    def _trim(self) -> float:
        """Drop steps that ended before the window; returns the window's length in seconds."""
        now = time.monotonic()
        while self.log and self.log[0][0] <= now - STATS_WINDOW_S:
            self.log.popleft()
        return now - max(now - STATS_WINDOW_S, self.first_step_at if self.first_step_at is not None else now)
