"""Helpers shared by the BlockManager tests: sequences and scheduler-like steps."""

from __future__ import annotations

import numpy as np

from miro.core.engine.block_manager import BlockManager
from miro.core.sampling.params import SamplingParams
from miro.core.engine.sequence import Sequence


def make_seq(tokens, request_id="r", index=0, outputs=()) -> Sequence:
    seq = Sequence(
        request_id, index, list(tokens), SamplingParams(max_tokens=64), rng=np.random.default_rng(0), detokenizer=None
    )
    seq.output_token_ids = list(outputs)
    return seq


def run_chunk(bm: BlockManager, seq: Sequence, n: int) -> list[tuple[int, int]]:
    """One scheduler step for `seq`: grow, key the blocks about to be filled, then the engine's update."""
    copies = bm.grow(seq, n)
    bm.register_full_blocks(seq, seq.num_computed_tokens + n)
    seq.num_computed_tokens += n
    return copies


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Admit `seq` and compute all of it, as one chunk."""
    assert bm.admission_cost(seq, seq.num_tokens) <= bm.num_free_blocks
    bm.admit(seq)
    run_chunk(bm, seq, seq.num_uncomputed)
