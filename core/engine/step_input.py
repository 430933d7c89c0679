"""The runner -> model contract: one step's tokens as flat arrays, and how they are packed.

It imports numpy alone, so an architecture (core/models) depends on this and never on the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
