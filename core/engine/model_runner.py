"""Model runner: owns the KV cache and turns a scheduled batch into logits.

    ScheduledBatch -> copy-on-write block copies -> StepInput (flat arrays) -> model.forward -> ModelRunnerOutput

It knows sequences only as token ids, positions and block tables; requests, sampling and stopping are
the engine's. An architecture (core/models) or another backend plugs in behind `execute`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from miro.core import defaults
from miro.core.errors import RequestError
from miro.core.engine.kv_cache import KVCache, parse_size
from miro.core.models import Model
from miro.core.engine.scheduler import ScheduledBatch
from miro.core.engine.sequence import Sequence
from miro.core.engine.step_input import build_step_input


@dataclass
class ModelRunnerOutput:
    """The sampler's inputs: logits[i] is the next-token distribution of seqs[i]."""

    seqs: list[Sequence]  # the scheduled sequences whose chunk reached their last token, in batch order
    logits: np.ndarray  # (len(seqs), vocab) float32


class ModelRunner:
    def __init__(
        self,
        model: Model,
        block_size: int,
        num_kv_blocks: int | None,
        kv_cache_memory: str | int,
        kv_cache_dtype: str = defaults.KV_CACHE_DTYPE,
    ):
        """A KV cache of num_kv_blocks blocks, or of as many as fit in kv_cache_memory ("1GiB", bytes),
        storing float32 or float16."""
        self.model = model
        self.block_size = block_size
        if num_kv_blocks is None:
            num_kv_blocks = parse_size(kv_cache_memory) // KVCache.bytes_per_block(
                model.config, block_size, kv_cache_dtype
            )
        if num_kv_blocks < 1:
            raise RequestError(f"the KV cache must hold at least one block of {block_size} tokens.")
        self.cache = KVCache(model.config, num_kv_blocks, block_size, kv_cache_dtype)

    @property
    def num_kv_blocks(self) -> int:
        return self.cache.num_blocks

    def execute(self, batch: ScheduledBatch) -> ModelRunnerOutput:
        """Run one step: write every scheduled token's K/V; return logits for the sequences that want them."""
        self.cache.copy_blocks(batch.block_copies)
        chunks = [(s.token_ids, s.start, s.seq.block_table) for s in batch.seqs]
        wants_logits = [s.wants_logits for s in batch.seqs]
        step = build_step_input(chunks, self.block_size, self.model.config.n_kv_heads, wants_logits)
        logits = self.model.forward(step, self.cache)
        return ModelRunnerOutput([s.seq for s in batch.seqs if s.wants_logits], logits)
