"""The grouped expert kernels (core/kernels/grouped_experts.py) give, row for row, the bits of the dense path: each
expert's gate, up and down as a `Linear` of their own over that expert's slab of the file (the kernels a dense
model's matrices run), for every quantized type with a grouped kernel and on every tier with int8 dots.

The experts come from a real GGUF file (gguf.GGUFWriter): the 32-value types quantized by gguf-py, the K-quants
(which gguf-py cannot quantize) random valid blocks with small scales, as tests/gguf_factory.py makes them. Each
expert gets a run of rows that takes every pass the kernels have (the type's tile_tokens, 8, 4, 2 and a last
row alone), one expert gets none, one gets a single row."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_factory import encode_weight

from miro.core.kernels import cpu, superblock_tiles
from miro.core.kernels.weight_types import WEIGHT_TYPES
from miro.core.layers.linear import Linear
from miro.core.layers.moe import GroupedExperts, expert_slab
from miro.core.loading.gguf_file import GGUFFile

# every quantized type: the 32-value blocks (Q8_0 activations) and the K-quants (Q8_K activations)
TYPES = [t for t, row in WEIGHT_TYPES.items() if row.activations in ("q8_0", "q8_k")]
K_QUANTS = [t for t in TYPES if WEIGHT_TYPES[t].activations == "q8_k"]
Q4_K = gguf.GGMLQuantizationType.Q4_K
N_EXPERT, WIDTH, DIM = 8, 512, 256  # K-quants: whole 256-value super-blocks along both matrices' rows
# rows per expert, so that every pass of every kernel runs: 37 = 16 + 16 + 4 + 1 (K-quants by vpdpbusd), 16 + 16 + 5
# (by vpmaddubsw: grouped_passes.pass_rows), 8 x 4 + 4 + 1 (32-value blocks); 11 = 8 + 2 + 1 or 8 + 3; 14 = 8 + 6;
# 15 = 8 + 7 or 8 + 4 + 2 + 1; 10 = 8 + 2; 12 = 8 + 4
RUNS = (37, 0, 1, 11, 14, 15, 10, 12)


INT8_TIERS = [name for name in cpu.runnable() if cpu.TIERS[name].int8_dot]
# the default run: Q4_K (the K-quants' kernels; Q4_K_M mixtures) on this machine's tier and on the AVX2 one (the tier
# users' CPUs most often have), Q6_K on AVX2 (its expert tiles a byte a value there), and MXFP4 (gpt-oss's) on this
# machine's; each other pair compiles kernels of its own
# from a cold numba cache, so it is slow (`pytest -m slow` runs every type on every tier with int8 dots)
DEFAULT_PAIRS = {
    (Q4_K, cpu.TIER.name),
    (Q4_K, "avx2"),
    (gguf.GGMLQuantizationType.Q6_K, "avx2"),  # Q6_K's expert tiles of its own there: a byte a value
    (gguf.GGMLQuantizationType.MXFP4, cpu.TIER.name),
}
PAIRS = [
    pytest.param(
        qtype, tier, id=f"{qtype.name}-{tier}", marks=() if (qtype, tier) in DEFAULT_PAIRS else pytest.mark.slow
    )
    for tier in INT8_TIERS
    for qtype in TYPES
]


@pytest.fixture(scope="module")
def expert_file(tmp_path_factory):
    """One GGUF holding, for each type, a layer's gate, up and down expert tensors (E, rows, cols) of that type."""
    path = tmp_path_factory.mktemp("grouped") / "experts.gguf"
    rng = np.random.default_rng(41)
    writer = gguf.GGUFWriter(str(path), "llama")
    for qtype in TYPES:
        for kind, shape in (("gate", (WIDTH, DIM)), ("up", (WIDTH, DIM)), ("down", (DIM, WIDTH))):
            slabs = [
                encode_weight((0.08 * rng.standard_normal(shape)).astype(np.float32), qtype.name, rng)
                for _ in range(N_EXPERT)
            ]
            raw = np.stack(slabs)
            writer.add_tensor(
                f"{qtype.name}.ffn_{kind}_exps.weight", raw, raw_dtype=None if raw.dtype == np.float32 else qtype
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFFile(path)


def _rows(seed: int, n: int, cols: int = DIM) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, cols)).astype(np.float32)
    x[:, ::97] *= 8  # a few large values per row, as hidden states have
    return x


def test_every_quantized_type_has_a_grouped_kernel_where_it_is_tiled():
    for name in cpu.runnable():
        tier = cpu.TIERS[name]
        for qtype in TYPES:
            assert WEIGHT_TYPES[qtype].grouped_on(tier) == bool(tier.int8_dot), f"{qtype.name} on {name}"


@pytest.mark.parametrize(("qtype", "tier"), PAIRS)
def test_grouped_rows_are_the_dense_layers_bits(expert_file, qtype, tier):
    tensors = {kind: expert_file.tensors[f"{qtype.name}.ffn_{kind}_exps.weight"] for kind in ("gate", "up", "down")}
    assert all(t.type == qtype and t.shape[0] == N_EXPERT for t in tensors.values())
    gate, up, down = tensors["gate"], tensors["up"], tensors["down"]
    assert GroupedExperts.takes(gate, up, down, cpu.get(tier))
    grouped = GroupedExperts(gate, up, down, cpu.get(tier))

    # the step's slots sorted by expert: slot s holds token source[s]; expert e's slots starts[e]:starts[e + 1]
    starts = np.concatenate([[0], np.cumsum(RUNS)]).astype(np.int32)
    active = np.flatnonzero(RUNS).astype(np.int32)
    n_tokens = 30
    x = _rows(int(qtype), n_tokens)
    source = np.random.default_rng(3).integers(0, n_tokens, starts[-1])
    gate_up = grouped.product(grouped.gate, grouped.up, x, source, starts, active)
    assert gate_up.shape == (starts[-1], 2 * WIDTH)
    act = _rows(int(qtype) + 1, starts[-1], WIDTH)  # the down matrices' input, one row a slot
    out = grouped.product(grouped.down, grouped.down, act, None, starts, active)
    assert out.shape == (starts[-1], DIM)

    for e in np.flatnonzero(RUNS):
        slots = slice(starts[e], starts[e + 1])
        dense = {kind: Linear(expert_slab(t, e), "native", tier=tier) for kind, t in tensors.items()}
        rows = x[source[slots]]
        expected_gate_up = np.concatenate([dense["gate"](rows), dense["up"](rows)], axis=1)
        np.testing.assert_array_equal(gate_up[slots], expected_gate_up, err_msg=f"gate|up, expert {e}")
        np.testing.assert_array_equal(out[slots], dense["down"](act[slots]), err_msg=f"down, expert {e}")


@pytest.mark.parametrize(
    "qtype", [pytest.param(t, id=t.name, marks=() if t == Q4_K else pytest.mark.slow) for t in K_QUANTS]
)
def test_a_rows_grouped_bits_do_not_depend_on_its_run(expert_file, qtype):
    """One row alone in its expert's run, and at each place of runs of every pass length: the same bits."""
    tensors = [expert_file.tensors[f"{qtype.name}.ffn_{kind}_exps.weight"] for kind in ("gate", "up", "down")]
    grouped = GroupedExperts(*tensors, cpu.TIER)
    row = _rows(9, 1)
    alone = grouped.product(grouped.gate, grouped.up, row, None, np.array([0, 0, 1, 1, 1], np.int32), np.array([1]))
    for n in (2, 3, 4, 7, 8, 9, 16, 17, 33):
        batch = _rows(n, n)
        for at in sorted({0, n // 2, n - 1}):
            batch[at] = row[0]
            starts = np.array([0, 0, n, n, n], np.int32)
            together = grouped.product(grouped.gate, grouped.up, batch, None, starts, np.array([1], np.int32))
            np.testing.assert_array_equal(together[at], alone[0], err_msg=f"{n} rows, at {at}")


@pytest.mark.parametrize("tier", INT8_TIERS)
def test_q6_k_experts_hold_a_byte_per_value_where_vpmaddubsw_takes_them(expert_file, tier):
    """Q6_K's expert tiles on the vpmaddubsw tiers: one byte per value, q - 32 (-32..31); on 512-bit VNNI tiers the
    file's 6 bits per value, as the dense tiles."""
    tensors = [expert_file.tensors[f"Q6_K.ffn_{kind}_exps.weight"] for kind in ("gate", "up", "down")]
    grouped = GroupedExperts(*tensors, cpu.get(tier))
    tiles = grouped.down.tiles
    n_values = N_EXPERT * DIM * WIDTH
    if superblock_tiles.expert_byte_values(gguf.GGMLQuantizationType.Q6_K, cpu.get(tier)):
        assert tiles.quants.nbytes == n_values
        values = tiles.quants.view(np.int8)
        assert values.min() >= -32 and values.max() <= 31 and values.min() < -16 < 16 < values.max()
    else:
        assert tiles.quants.nbytes == n_values * 6 // 8
