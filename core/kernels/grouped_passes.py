"""The grouped K-quant kernel's small pieces (grouped_superblocks.py): which (expert, tile) a work item is, how
many rows an expert's next pass takes, a tile's prefetch."""

from __future__ import annotations

import numba
import numpy as np

from miro.core.kernels.simd import prefetch_l2_lines


@numba.njit(inline="always")
def work_item(item, active, per_expert, shares):
    """Work item `item`'s (expert, j), j its tile among the expert's per_expert: the items in `shares` equal ranges,
    range h every active expert's j from h x per_expert / shares up to the next range's, expert by expert."""
    per_share = per_expert // shares
    share_items = active.shape[0] * per_share
    within = np.int64(item) % share_items
    return active[within // per_share], (np.int64(item) // share_items) * per_share + within % per_share


@numba.njit(inline="always")
def prefetch_superblock(quants, at, n_bytes, sub_scales, sub_at, sub_n):
    """Ask for the cache lines of a tile's super-block into L2: its quants (n_bytes from at) and its sub-block scales
    (sub_n bytes from sub_at). (Its rows' scales and mins too, 2 lines more: measured slower at 256 rows.) Into L2
    rather than every level: moe.py's Qwen3-MoE shape on a Zen 4, in turn, one sequence 116.6-133.9 tok/s against
    92.5-100.1 (3 rounds), 48 prompts 488.9-492.5 against 416.8-455.7 (2 rounds)."""
    prefetch_l2_lines(quants, at, at + n_bytes)
    prefetch_l2_lines(sub_scales, sub_at, sub_at + sub_n)


@numba.njit(inline="always")
def pass_rows(left, tokens, any_below_8):
    """The rows of an expert's next pass with `left` rows to go: `tokens`, then 8 while at least 8 are left (an
    expert's run is a few rows in a decode step; a row's bits are the same in any pass), then the rest in one pass
    where `any_below_8` (the vpmaddubsw kernel's passes of 1 to 7 rows), else 4, 2 and 1."""
    if left >= tokens:
        return tokens
    if left >= 8 and tokens > 8:
        return 8
    if any_below_8:
        return left
    return 4 if left >= 4 and tokens > 4 else 2 if left >= 2 else 1
