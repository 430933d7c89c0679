"""A step's sequences in groups, each group's forward pass on its own thread with its share of the cores.

On a small model every kernel call is short (a 576 x 576 product over 64 rows takes well under a millisecond), so
splitting each call over all cores pays a fork and a join per call, about 300 of them a step, and leaves the
cores idle through the step's single-threaded parts. Running the step as groups of whole sequences, each group
through the whole model on one core, pays one handoff a step and overlaps one group's Python with another's
kernels: on SmolLM2-135M on 2 cores a generation ran 1.06-1.11x as fast (docs/engine.md, "Step groups"). Every
group reads every weight, so on models with more weight bytes it is slower, and the default leaves their steps whole.

The results are the same bits: every kernel a decoder runs gives each row bits independent of the other rows
(batch invariance, which this needs and the engine keeps by default), the groups write their own sequences'
K/V slots, and the logits come back in the batch's order. The kernels release the GIL (nogil), so the groups'
kernels run at once; their Python waits its turn.

A group is sized by its cost: its new tokens (the GEMMs' rows) and 1/256 of the positions its attention reads
(a decode token at position 300 costs about 1.2 GEMM rows of work on a 135M model's step). Groups are filled
greedily, the costliest sequences first; where that leaves one group with more than MAX_SHARE of the step's cost
(one long prefill chunk beside a few decodes) the step runs whole, every kernel on every core, as without groups.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numba
import numpy as np

# The default splits the steps of models whose weights hold at most this many bytes: every group reads every weight,
# so the split costs a read of them a step. Measured on a 2-core Zen 4 (docs/engine.md): SmolLM2-135M native (92 MiB)
# 1.06-1.11x; Gemma 3 270M native (235 MiB, most of it its 262k-row head) 0.83-0.97x; a 1B shape 0.95x.
AUTO_MAX_WEIGHT_BYTES = 128 * 2**20
AUTO_GROUPS = 2  # and into this many groups at most (measured on 2 cores only)
ATTENTION_POSITIONS_PER_ROW = 256  # a sequence's cost: new tokens + end position / this
MAX_SHARE = 0.75  # a split whose largest group holds more of the step's cost than this runs as one group


def step_groups_for(model, requested: int | None) -> int:
    """The groups a step is split into: `requested`, or by default AUTO_GROUPS (at most one a thread) for a dense
    batch-invariant decoder whose weights hold at most AUTO_MAX_WEIGHT_BYTES of their own, else 1. (Weights left in
    the memory-mapped file count nothing: on the tiers with int8 dots every quantized matrix is repacked, so only a
    portable-tier or float16 file's would be missed.)"""
    if requested is not None:
        return requested
    if not model.batch_invariant or model.config.n_expert or model.weight_memory > AUTO_MAX_WEIGHT_BYTES:
        return 1
    return max(1, min(AUTO_GROUPS, numba.get_num_threads()))


def split(costs: list[float], n_groups: int) -> list[list[int]] | None:
    """The sequences' indices in n_groups groups of about equal cost (each group's indices in batch order), or
    None where the step should run whole: fewer sequences than groups, or no split with every group's share at
    most MAX_SHARE."""
    if n_groups < 2 or len(costs) < n_groups:
        return None
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    loads = [0.0] * n_groups
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += costs[i]
    if max(loads) > MAX_SHARE * sum(loads):
        return None
    return [sorted(group) for group in groups]


def sequence_cost(start: int, num_new_tokens: int) -> float:
    return num_new_tokens + (start + num_new_tokens) / ATTENTION_POSITIONS_PER_ROW


class StepGroups:
    """Runs forward(group) for each group on a thread of its own, each with threads // n_groups of numba's threads
    (the calling thread's count, read at each step, so --threads and set_num_threads hold)."""

    def __init__(self, n_groups: int):
        self.n_groups = n_groups
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, forward: Callable[[list[int]], np.ndarray], groups: list[list[int]]) -> list[np.ndarray]:
        """forward(indices) for every group at once; the results in the groups' order."""
        per_group = max(1, numba.get_num_threads() // len(groups))
        with self._lock:  # one step at a time through the pool (two engines may share a process, not a runner)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.n_groups, thread_name_prefix="miro-step-group")

            def on_thread(indices: list[int]) -> np.ndarray:
                numba.set_num_threads(per_group)  # this thread's own count (numba's is per thread)
                return forward(indices)

            return list(self._pool.map(on_thread, groups))
