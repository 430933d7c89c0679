"""EngineStats: the engine's KV cache and token figures (Engine.stats()), named as vLLM's v1 metrics name them.

No numba here: the worker publishes these in its Redis hash, and `miro status` reads them back without loading
the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


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
