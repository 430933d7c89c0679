"""A mixture-of-experts feed-forward layer: a router picks k of E experts per token, each chosen expert runs a
gated feed-forward on that token, and their outputs are summed, weighted, as llama.cpp's build_moe_ffn does
(scripts/moe_math.md says exactly what it computes per architecture).

`Experts` holds one layer's experts: the router (E rows over the embedding) and the gate, up and down matrices
of every expert, made from the file's 3-D tensors (E, rows, cols) as one `Linear` per expert over that expert's
slab of bytes (a view of the memory map, never dequantized): on tiers with int8 dots the slab is repacked into
the tile layout at load like every quantized matrix (the file's bytes, its mapped pages released), elsewhere the
kernels read it where it lies. Experts run on the file's own types (the native kernels) whatever the model's
weight format: a float32 copy of every expert would multiply a mixture's memory by 4 to 8.

`run_experts(x, experts, routing, activation)` runs a step's rows through them:

1. the router's logits (the float kernel, each row alone), then `route`: the gating function, the top k (ties:
   the lower expert index first, as llama.cpp's std::sort leaves them for E <= 16) and the chosen weights,
   renormalised where `Routing.normalize` says;
2. the rows grouped by expert: each expert's rows go through its gate/up layer, `activation`, and its down
   layer as one matrix product (the same kernels and plan per type and tier as `Linear`, weight_types.py);
3. each result scaled by its weight and the k results of a row summed in top-k order (`combine`, reading them
   where the grouped order left them).

Every step is per row, in an order set by the row alone (the native kernels are batch-invariant, the router
runs through the float kernel, routing and combining in numba per row), so a row's output is bitwise the same
whatever other rows share its experts. Workspace: the rows run in runs of RUN_ROWS_PER_EXPERT x E / k rows
and of at most MOE_RUN_BYTES of per-row expert outputs (k x dim floats a row); within a run, one expert's gathered
rows, its gate/up output and its activation at a time (the grouped path: every chosen expert's, k x (3 x expert
width) floats a row more). So a step's workspace is bounded by the run's rows, whatever the number of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from miro.core.layers.linear import Linear, LinearStack
from miro.core.loading.gguf_file import TensorInfo, release_pages
from miro.core.kernels import cpu
from miro.core.kernels.quantize_activations import quantize_q8_32, quantize_q8_k, quantize_q8_k_quads
from miro.core.kernels.superblock_tiles import natural_order
from miro.core.kernels.tiles import TILE_ROWS
from miro.core.kernels.weight_types import WEIGHT_TYPES

MOE_RUN_BYTES = 8 << 20  # the most the per-row expert outputs (rows x k x dim float32) of a run take at a time
# and a run takes about this many rows per expert, no more (a full pass of the tile kernels on average): its buffers
# then stay closer to the cores' caches. AVX2, 2 threads, moe.py's Qwen3-MoE-shaped batch (64 experts, 8 active),
# runs of 128 rows (16 a expert): 13.0-13.4 s against 14.0-14.3 at 256 rows (the byte cap alone), 13.3 at 64, 14.7-15.0 at 32
RUN_ROWS_PER_EXPERT = 16
NORM_FLOOR = np.float32(6.103515625e-5)  # llama.cpp clamps the chosen weights' sum from below (f16's smallest normal)


@dataclass(frozen=True)
class Routing:
    """How the router's logits become k experts and their weights (llama.cpp's gating_op and norm_w).

    gating: "softmax": softmax over all E logits, the k largest probabilities chosen, each its probability
    (llama, qwen3moe, olmoe, granitemoe); "softmax_topk": the k largest raw logits chosen, their weights a
    softmax over those k alone (gpt-oss: LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT).
    normalize: the k weights divided by their sum (floored at NORM_FLOOR): true for llama, qwen3moe and
    granitemoe, false for olmoe and gpt-oss."""

    n_used: int
    gating: str = "softmax"
    normalize: bool = True

    def __post_init__(self):
        if self.gating not in GATINGS:
            raise ValueError(f"gating must be one of {', '.join(GATINGS)}, not {self.gating!r}")


GATINGS = ("softmax", "softmax_topk")


class Experts:
    """One layer's router and experts; optional biases (gpt-oss) on the router and each expert's matrices.

    router: a `Linear` over the (E, dim) router tensor, in the native float kernel (batch-invariant);
    gate_up[e]: expert e's gate and up rows, their outputs side by side [gate | up] (one fused layer where the
    type is tiled on this tier, so the activations are quantized once; else two layers over the mapped views);
    down[e]: expert e's down matrix."""

    def __init__(
        self,
        router: TensorInfo,
        gate: TensorInfo,
        up: TensorInfo,
        down: TensorInfo,
        router_bias: np.ndarray | None = None,
        gate_up_bias: np.ndarray | None = None,
        down_bias: np.ndarray | None = None,
        tier: str | None = None,
    ):
        n_expert, width, dim = gate.shape
        if up.shape != gate.shape or down.shape != (n_expert, dim, width) or router.shape != (n_expert, dim):
            raise ValueError(
                f"{gate.name}: expert shapes do not agree (router {router.shape}, gate {gate.shape}, "
                f"up {up.shape}, down {down.shape})"
            )
        self.n_expert, self.width, self.dim = n_expert, width, dim
        self.router = Linear(router, "native", tier=tier)
        self.router_bias = router_bias  # (E,)
        self.gate_up_bias = gate_up_bias  # (E, 2 x width): gate's then up's
        self.down_bias = down_bias  # (E, dim)
        self.grouped: GroupedExperts | None = None
        self.gate_up: list[Linear | LinearStack] = []
        self.down: list[Linear] = []
        if GroupedExperts.takes(gate, up, down, cpu.get(tier)):
            self.grouped = GroupedExperts(gate, up, down, cpu.get(tier))
            self.weight_bytes = self.router.weight_bytes + self.grouped.weight_bytes
            return
        tiled = WEIGHT_TYPES[gate.type].tiled_on(cpu.get(tier)) and gate.type == up.type
        for e in range(n_expert):
            parts = [expert_slab(gate, e), expert_slab(up, e)]
            self.gate_up.append(
                Linear.fused(parts, "native", tier=tier)
                if tiled
                else LinearStack([Linear(p, "native", tier=tier) for p in parts])
            )
            self.down.append(Linear(expert_slab(down, e), "native", tier=tier))
        self.weight_bytes = (
            self.router.weight_bytes
            + sum(layer.weight_bytes for layer in self.gate_up)
            + sum(layer.weight_bytes for layer in self.down)
        )  # owned: the repacked tiles

    def __repr__(self) -> str:
        kind = self.grouped.down.type.name + ", grouped" if self.grouped else self.down[0].type.name
        return (
            f"Experts({self.n_expert} x {self.dim}->{self.width}->{self.dim}, {kind}, "
            f"weight_bytes={self.weight_bytes:,})"
        )


class ExpertTiles:
    """A 3-D expert tensor (E, rows, cols) as one (E x rows, cols) matrix repacked into 16-row tiles, expert e's
    from tile e x tiles_per_expert; the file's pages it came from released."""

    def __init__(self, tensor: TensorInfo, tier: cpu.Tier):
        n_expert, rows, cols = tensor.shape
        row = WEIGHT_TYPES[tensor.type]
        self.type, self.rows, self.cols = tensor.type, rows, cols
        self.tiles_per_expert = rows // TILE_ROWS
        matrix = tensor.data.reshape(n_expert * rows, cols // row.block_values * row.block_bytes)
        self.tiles = row.kernels.repack_for_experts(int(tensor.type), matrix, tier)
        release_pages(tensor.data)

    def arrays(self) -> tuple[np.ndarray, ...]:
        t = self.tiles
        return (t.quants, t.scales, t.mins) + ((t.sub_scales,) if WEIGHT_TYPES[self.type].activations == "q8_k" else ())


class GroupedExperts:
    """Every expert's gate, up and down as tiles (ExpertTiles), multiplied by the grouped kernels of their types
    (weight_types.py's `grouped`, grouped_experts.py): a step's chosen experts in one call per stage."""

    def __init__(self, gate: TensorInfo, up: TensorInfo, down: TensorInfo, tier: cpu.Tier):
        self.tier = tier
        self.gate, self.up, self.down = (ExpertTiles(t, tier) for t in (gate, up, down))
        self.weight_bytes = sum(m.tiles.nbytes for m in (self.gate, self.up, self.down))

    @staticmethod
    def takes(gate: TensorInfo, up: TensorInfo, down: TensorInfo, tier: cpu.Tier) -> bool:
        """Whether the grouped kernels run these experts on this tier: gate and up of one type, each type with a
        grouped kernel here, every expert a whole number of tiles."""
        kinds = [WEIGHT_TYPES.get(t.type) for t in (gate, up, down)]
        return (
            gate.type == up.type
            and all(w is not None and w.grouped_on(tier) for w in kinds)
            and gate.shape[1] % TILE_ROWS == 0
            and down.shape[1] % TILE_ROWS == 0
        )

    def product(
        self,
        first: ExpertTiles,
        second: ExpertTiles,
        x: np.ndarray,
        source: np.ndarray | None,
        starts: np.ndarray,
        active: np.ndarray,
    ) -> np.ndarray:
        """(slots, first's and second's outputs side by side; second is first: its alone) for the slots' rows
        x[source] (x as it is where source is None), slot s in expert e's run when starts[e] <= s < starts[e + 1]:
        the activations quantized once, their rows gathered, one call."""
        row = WEIGHT_TYPES[first.type]
        parts = 1 if second is first else 2
        n_slots = len(source) if source is not None else x.shape[0]
        out = np.empty((n_slots, parts * first.rows), np.float32)
        if n_slots == 0:
            return out
        if row.activations == "q8_k":
            a = (quantize_q8_k if natural_order(first.type, self.tier) else quantize_q8_k_quads)(x)  # the tiles' order
            fields = (a.q, a.d, a.sum32)
        else:
            a = quantize_q8_32(x)
            fields = (a.q, a.d, a.s, a.qsum)
        if source is not None:
            fields = tuple(f[source] for f in fields)
        kernel = row.kernels_on(self.tier).grouped
        return kernel(*first.arrays(), *second.arrays(), parts, first.tiles_per_expert, *fields, starts, active, out)


def expert_slab(tensor: TensorInfo, e: int) -> TensorInfo:
    """Expert e's 2-D matrix of a 3-D expert tensor: a view of its contiguous bytes in the memory map."""
    n_expert = tensor.shape[0]
    per_expert = tensor.data.nbytes // n_expert
    return TensorInfo(
        f"{tensor.name}[{e}]", tensor.shape[1:], tensor.type, tensor.data[e * per_expert : (e + 1) * per_expert]
    )


def run_experts(x: np.ndarray, experts: Experts, routing: Routing, activation) -> np.ndarray:
    """(T, dim) normed rows -> (T, dim): the weighted sum of each row's k chosen experts' outputs.

    activation(gate_up, out): (n, 2 x width) [gate | up] -> (n, width), e.g. pointwise.silu_mul."""
    n_rows, k = x.shape[0], routing.n_used
    logits = experts.router(x)
    if experts.router_bias is not None:
        logits += experts.router_bias
    chosen = np.empty((n_rows, k), np.int32)
    weights = np.empty((n_rows, k), np.float32)
    route(logits, routing.gating == "softmax_topk", routing.normalize, chosen, weights)
    out = np.empty((n_rows, experts.dim), np.float32)
    run = max(1, min(MOE_RUN_BYTES // (4 * k * experts.dim), RUN_ROWS_PER_EXPERT * experts.n_expert // k))
    for first in range(0, n_rows, run):
        rows = slice(first, first + run)
        run_rows = _run_grouped if experts.grouped is not None else _run_chosen
        run_rows(x[rows], chosen[rows], weights[rows], experts, activation, out[rows])
    return out


def _run_grouped(
    x: np.ndarray, chosen: np.ndarray, weights: np.ndarray, experts: Experts, activation, out: np.ndarray
) -> None:
    """One run of rows through the grouped kernels: one call for every chosen expert's gate and up, one for
    their down, the slots (row, j) sorted by expert; the results combined per row into out."""
    n_rows, k = chosen.shape
    flat = chosen.reshape(-1)
    order, starts, active = group_slots(flat, experts.n_expert)
    grouped = experts.grouped
    gate_up = grouped.product(grouped.gate, grouped.up, x, order // k, starts, active)
    if experts.gate_up_bias is not None:
        gate_up += experts.gate_up_bias[flat[order]]
    act = np.empty((len(order), experts.width), np.float32)
    activation(gate_up, act)
    y = grouped.product(grouped.down, grouped.down, act, None, starts, active)
    if experts.down_bias is not None:
        y += experts.down_bias[flat[order]]
    combine(y, position_of(order).reshape(n_rows, k), weights, out)


def _run_chosen(
    x: np.ndarray, chosen: np.ndarray, weights: np.ndarray, experts: Experts, activation, out: np.ndarray
) -> None:
    """One run of rows: each expert's rows as one product, the results combined per row into out."""
    n_rows, k = chosen.shape
    flat = chosen.reshape(-1)
    order, starts, _ = group_slots(flat, experts.n_expert)
    counts = np.diff(starts)
    results = np.empty((n_rows * k, experts.dim), np.float32)  # in the slots' sorted order, expert by expert
    act = np.empty((n_rows, experts.width), np.float32)
    start = 0
    for e in np.flatnonzero(counts):
        slots = order[start : start + counts[e]]
        gate_up = experts.gate_up[e](x[slots // k])
        if experts.gate_up_bias is not None:
            gate_up += experts.gate_up_bias[e]
        a = act[: len(slots)]
        activation(gate_up, a)
        y = experts.down[e](a)
        if experts.down_bias is not None:
            y += experts.down_bias[e]
        results[start : start + counts[e]] = y
        start += counts[e]
    combine(results, position_of(order).reshape(n_rows, k), weights, out)


@njit(cache=True)
def group_slots(flat, n_expert):
    """The slots (row, j) of flat (chosen experts, row-major) grouped by expert, each expert's in slot order (a
    stable counting sort): (order, slots' indices in that order; starts, expert e's at starts[e]:starts[e + 1];
    active, the experts with slots, int32)."""
    starts = np.zeros(n_expert + 1, np.int32)
    for e in flat:
        starts[e + 1] += 1
    n_active = 0
    for e in range(n_expert):
        n_active += starts[e + 1] > 0
        starts[e + 1] += starts[e]
    active = np.empty(n_active, np.int32)
    n_active = 0
    for e in range(n_expert):
        if starts[e + 1] > starts[e]:
            active[n_active] = e
            n_active += 1
    order = np.empty(len(flat), np.int64)
    fill = starts[:-1].copy()
    for slot in range(len(flat)):
        e = flat[slot]
        order[fill[e]] = slot
        fill[e] += 1
    return order, starts, active


def position_of(order: np.ndarray) -> np.ndarray:
    """The inverse permutation: position_of(order)[order[i]] = i, so slot s's result is row position[s] of the
    results in sorted order (combine reads them there instead of scattering them back)."""
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    return position


@njit(cache=True)
def _softmax(values, out):
    """ggml's soft_max over one row, in place into out: exp(v - max) in float32, summed in float64, times the
    float32 of 1 / sum."""
    m = values[0]
    for v in values[1:]:
        m = max(m, v)
    total = 0.0
    for i in range(len(values)):
        out[i] = np.float32(np.exp(np.float32(values[i] - m)))
        total += out[i]
    scale = np.float32(1.0 / total)
    for i in range(len(values)):
        out[i] = out[i] * scale


@njit(cache=True, parallel=True)
def route(logits, softmax_topk, normalize, chosen, weights):
    """Each row's k experts (chosen, (T, k) int32, in descending order of their score, ties the lower index
    first) and their weights ((T, k) float32), from the router's logits (T, E), as llama.cpp computes them:
    softmax over all E then the top k (softmax_topk False), or the top k of the raw logits and a softmax over
    those k (True); normalize: the k weights divided by max(their sum, NORM_FLOOR)."""
    n_rows, n_expert = logits.shape
    k = chosen.shape[1]
    for t in prange(n_rows):  # each row alone (its scratch its own)
        probs = np.empty(n_expert, np.float32)
        taken = np.empty(n_expert, np.bool_)
        picked = np.empty(k, np.float32)
        if softmax_topk:
            probs[:] = logits[t]
        else:
            _softmax(logits[t], probs)
        taken[:] = False
        for j in range(k):
            best = -1
            for e in range(n_expert):  # strictly greater: among equals the lowest index stays
                if not taken[e] and (best < 0 or probs[e] > probs[best]):
                    best = e
            taken[best] = True
            chosen[t, j] = best
            picked[j] = probs[best]
        if softmax_topk:
            _softmax(picked.copy(), picked)
        if normalize:
            total = 0.0
            for j in range(k):
                total += picked[j]
            total32 = max(np.float32(total), NORM_FLOOR)
            for j in range(k):
                picked[j] = picked[j] / total32
        weights[t] = picked


@njit(cache=True, parallel=True)
def combine(results, position, weights, out):
    """out[t] = ((r0 w0 + r1 w1) + ...) in top-k order, r_j = results[position[t, j]] (row t's j-th chosen
    expert's output), each product in float32, as llama.cpp weighs each expert's output and adds the k views one
    after another."""
    n_rows, k = position.shape
    dim = results.shape[1]
    for t in prange(n_rows):
        first = results[position[t, 0]]
        for i in range(dim):
            out[t, i] = first[i] * weights[t, 0]
        for j in range(1, k):
            w = weights[t, j]
            r = results[position[t, j]]
            for i in range(dim):
                out[t, i] += r[i] * w
