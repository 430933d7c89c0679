"""Model runner: owns the KV cache and turns a scheduled batch into logits.

    ScheduledBatch -> copy-on-write block copies -> StepInput (flat arrays) -> model.forward -> ModelRunnerOutput

It knows sequences only as token ids, positions and block tables; requests, sampling and stopping are
the engine's. An architecture (core/models) or another backend plugs in behind `execute`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import defaults
from .errors import RequestError
from .kv_cache import KVCache, parse_size
from .scheduler import ScheduledBatch
from .sequence import Sequence

if TYPE_CHECKING:
    from .models import Model

ATTN_TILE = 16  # query tokens per attention work item


@dataclass
class StepInput:
    """Everything the forward pass needs for one step, as flat arrays."""

    token_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int32
    slots: np.ndarray  # (T,) int64: block * block_size + offset where each token's K/V goes
    block_tables: np.ndarray  # (S, max_blocks) int32
    attn_items: np.ndarray  # (W, 4) int32: (seq, kv_head, t_begin, t_end)
    logit_rows: np.ndarray  # (R,) int64: the token rows whose next-token logits are wanted


@dataclass
class ModelRunnerOutput:
    """The sampler's inputs: logits[i] is the next-token distribution of seqs[i]."""

    seqs: list[Sequence]  # the scheduled sequences whose chunk reached their last token, in batch order
    logits: np.ndarray  # (len(seqs), vocab) float32


def build_step_input(
    chunks: list[tuple[list[int], int, list[int]]], block_size: int, n_kv_heads: int, want_logits: list[bool]
) -> StepInput:
    """Pack per-sequence chunks (new token ids, position of the first one, block table) into a StepInput."""
    token_ids, positions, slots, items, logit_rows = [], [], [], [], []
    max_blocks = max(len(table) for _, _, table in chunks)
    block_tables = np.full((len(chunks), max_blocks), -1, dtype=np.int32)
    for seq, ((ids, start, table), wants) in enumerate(zip(chunks, want_logits)):
        first_row = len(token_ids)
        pos = np.arange(start, start + len(ids))
        token_ids.extend(ids)
        positions.extend(pos)
        slots.extend(np.asarray(table, dtype=np.int64)[pos // block_size] * block_size + pos % block_size)
        block_tables[seq, : len(table)] = table
        for t0 in range(first_row, first_row + len(ids), ATTN_TILE):
            t1 = min(t0 + ATTN_TILE, first_row + len(ids))
            items.extend((seq, h, t0, t1) for h in range(n_kv_heads))
        if wants:
            logit_rows.append(len(token_ids) - 1)
    return StepInput(
        token_ids=np.asarray(token_ids, dtype=np.int64),
        positions=np.asarray(positions, dtype=np.int32),
        slots=np.asarray(slots, dtype=np.int64),
        block_tables=block_tables,
        attn_items=np.asarray(items, dtype=np.int32).reshape(-1, 4),
        logit_rows=np.asarray(logit_rows, dtype=np.int64),
    )


class ModelRunner:
    def __init__(self, model: Model, block_size: int, num_kv_blocks: int | None, kv_cache_memory: str | int,
                 batch_invariant: bool = defaults.BATCH_INVARIANT,
                 kv_cache_dtype: str = defaults.KV_CACHE_DTYPE):
        """A KV cache of num_kv_blocks blocks, or of as many as fit in kv_cache_memory ("1GiB", bytes),
        storing float32 or float16."""
        self.model = model
        self.block_size = block_size
        self.batch_invariant = batch_invariant  # outputs bitwise independent of the batch (f32: a numba GEMM)
        if num_kv_blocks is None:
            num_kv_blocks = parse_size(kv_cache_memory) // KVCache.bytes_per_block(model.config, block_size,
                                                                                  kv_cache_dtype)
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
        logits = self.model.forward(step, self.cache, self.batch_invariant)
        return ModelRunnerOutput([s.seq for s in batch.seqs if s.wants_logits], logits)
