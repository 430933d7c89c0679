"""paged_attention against a float64 numpy reference, on packed batches over a shuffled paged KV cache.

Each batch mixes the three kinds of rows a step can hold: a prefill chunk whose
earlier context is already in the cache, a fresh prompt starting at position 0,
and decode tokens (one new token over a long context). Contexts cross block
boundaries and some end exactly on one; every sequence's blocks are drawn from
a random permutation of the pool, so block tables are neither contiguous nor
sorted. The kernel only reads the cache, so every context position's K/V is
simply filled with random values, in the cache's layout (K transposed within a
block), as float32 or as float16 bits. The kernel runs with the CPU tier's scores
shape (4 queries per key load on 512-bit tiers, 2 on 256-bit ones); both shapes
must give the same bits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from miro.core.kernels import cpu
from miro.core.layers.attention import SCORE_QUERIES, paged_attention, score_queries_for
from miro.core.engine.step_input import ATTN_TILE, build_step_input

TOL = 1e-4


def make_batch(
    rng, specs, block_size, n_heads, n_kv_heads, head_dim, spare_blocks=5, q_strided=False, kv_dtype="float32"
):
    """Random cache, block tables and queries for sequences given as (start_position, n_new_tokens).

    Returns (q, k_cache, v_cache, step, tables); step comes from build_step_input.
    """
    n_blocks_per_seq = [-(-(start + n_new) // block_size) for start, n_new in specs]
    num_blocks = sum(n_blocks_per_seq) + spare_blocks
    perm = rng.permutation(num_blocks)
    tables, used = [], 0
    for n in n_blocks_per_seq:
        tables.append([int(b) for b in perm[used : used + n]])
        used += n
    k_cache = rng.standard_normal((num_blocks, n_kv_heads, head_dim, block_size)).astype(np.float32)
    v_cache = rng.standard_normal((num_blocks, n_kv_heads, block_size, head_dim)).astype(np.float32)
    if kv_dtype == "float16":
        k_cache, v_cache = (c.astype(np.float16).view(np.uint16) for c in (k_cache, v_cache))
    chunks = [([0] * n_new, start, table) for (start, n_new), table in zip(specs, tables)]
    step = build_step_input(chunks, block_size, n_kv_heads, [True] * len(specs))
    n_tokens = len(step.positions)
    if q_strided:
        # The model passes q as a view into the wider fused qkv rows (non-contiguous).
        wide = rng.standard_normal((n_tokens, (n_heads + 2 * n_kv_heads) * head_dim)).astype(np.float32)
        q = wide[:, : n_heads * head_dim].reshape(n_tokens, n_heads, head_dim)
        assert n_tokens == 1 or not q.flags.c_contiguous
    else:
        q = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    return q, k_cache, v_cache, step, tables


def run_kernel(q, k_cache, v_cache, step, scale, window=0, score_queries=None, sinks=None):
    out = np.full(q.shape, np.nan, dtype=np.float32)
    paged_attention(
        q,
        k_cache,
        v_cache,
        step.block_tables,
        step.positions,
        step.attn_items,
        scale,
        out,
        window,
        score_queries=score_queries,
        sinks=sinks,
    )
    return out


def reference(q, k_cache, v_cache, specs, tables, scale, window=0, sinks=None):
    """Plain causal softmax attention in float64, per sequence, over K/V gathered from its blocks
    (window > 0: a query at position p sees only keys p - window < k <= p, masked here; sinks: one logit per
    query head, in each softmax's max and denominator, with no value)."""
    n_tokens, n_heads, head_dim = q.shape
    n_kv_heads, block_size = v_cache.shape[1], v_cache.shape[2]
    if k_cache.dtype == np.uint16:
        k_cache, v_cache = (c.view(np.float16) for c in (k_cache, v_cache))
    k_cache = k_cache.transpose(0, 1, 3, 2)  # (blocks, kv heads, positions, head_dim), as v
    group = n_heads // n_kv_heads
    out = np.empty((n_tokens, n_heads, head_dim), dtype=np.float64)
    row = 0
    for (start, n_new), table in zip(specs, tables):
        ctx = start + n_new
        pos = np.arange(ctx)
        blocks = np.asarray(table)[pos // block_size]
        k = k_cache[blocks, :, pos % block_size, :].astype(np.float64)  # (ctx, n_kv_heads, head_dim)
        v = v_cache[blocks, :, pos % block_size, :].astype(np.float64)
        kv_of_head = np.arange(n_heads) // group
        k = k[:, kv_of_head, :].transpose(1, 0, 2)  # (n_heads, ctx, head_dim)
        v = v[:, kv_of_head, :].transpose(1, 0, 2)
        qs = q[row : row + n_new].astype(np.float64).transpose(1, 0, 2)  # (n_heads, n_new, head_dim)
        scores = qs @ k.transpose(0, 2, 1) * float(scale)  # (n_heads, n_new, ctx)
        q_pos = np.arange(start, ctx)
        scores[:, pos[None, :] > q_pos[:, None]] = -np.inf
        if window:
            scores[:, pos[None, :] <= q_pos[:, None] - window] = -np.inf
        sink = np.full((n_heads, 1, 1), -np.inf) if sinks is None else sinks.astype(np.float64)[:, None, None]
        top = np.maximum(scores.max(axis=-1, keepdims=True), sink)
        p = np.exp(scores - top)
        p /= p.sum(axis=-1, keepdims=True) + np.exp(sink - top)
        out[row : row + n_new] = (p @ v).transpose(1, 0, 2)
        row += n_new
    return out


def mixed_specs(rng, block_size):
    """(start, n_new) per sequence: prefill chunks over cached context, fresh prompts, decode tokens."""
    bs = block_size
    specs = [
        (2 * bs + 3, ATTN_TILE + 5),  # prefill chunk over cached context, spans two query tiles
        (0, 3 * bs),  # fresh prompt ending exactly on a block boundary
        (0, 7),  # short fresh prompt inside one block
        (bs, bs),  # chunk starting and ending on block boundaries
        (9 * bs + 5, 1),  # decode, long context crossing many blocks
        (4 * bs - 1, 1),  # decode ending exactly on a block boundary
        (4 * bs, 1),  # decode that is the first token of a fresh block
        (0, 1),  # one-token prompt
    ]
    # A few random ones, decode and prefill.
    for _ in range(3):
        specs.append((int(rng.integers(1, 12 * bs)), 1))
        specs.append((int(rng.integers(0, 4 * bs)), int(rng.integers(1, 2 * ATTN_TILE + 3))))
    order = rng.permutation(len(specs))
    return [specs[i] for i in order]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(2, 2), (6, 2), (16, 2)])
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_matches_float64_reference(kv_dtype, block_size, n_heads, n_kv_heads, head_dim):
    """float16 caches against the reference over the same float16 values: the widening is exact."""
    rng = np.random.default_rng(1000 * block_size + 10 * n_heads + head_dim)
    specs = mixed_specs(rng, block_size)
    q, k_cache, v_cache, step, tables = make_batch(
        rng, specs, block_size, n_heads, n_kv_heads, head_dim, q_strided=(head_dim == 64), kv_dtype=kv_dtype
    )
    scale = np.float32(1.0 / np.sqrt(head_dim))
    # The block tables really are shuffled: not all ascending runs.
    assert any(np.any(np.diff(t) != 1) for t in tables if len(t) > 1)
    out = run_kernel(q, k_cache, v_cache, step, scale)
    ref = reference(q, k_cache, v_cache, specs, tables, scale)
    assert np.all(np.isfinite(out)), "some output rows were not written"
    err = np.abs(out - ref).max()
    assert err < TOL, f"max-abs error {err:.3g}"


def test_large_scores_stay_finite():
    """Peaked softmax (large logits, ~exp(±hundreds)) still matches: the running max must be applied."""
    rng = np.random.default_rng(7)
    specs = [(0, 40), (5 * 16 + 3, 1), (30, 20)]
    q, k_cache, v_cache, step, tables = make_batch(rng, specs, 16, 6, 2, 64)
    q *= 8.0
    k_cache *= 8.0
    scale = np.float32(1.0 / np.sqrt(64))
    out = run_kernel(q, k_cache, v_cache, step, scale)
    ref = reference(q, k_cache, v_cache, specs, tables, scale)
    assert np.all(np.isfinite(out))
    assert np.abs(out - ref).max() < TOL


@pytest.mark.parametrize(
    "n_heads,n_kv_heads,block_size,kv_dtype", [(9, 3, 16, "float32"), (16, 2, 32, "float32"), (9, 3, 16, "float16")]
)
def test_batch_invariance(n_heads, n_kv_heads, block_size, kv_dtype):
    """A sequence's output is bitwise the same computed alone or at any place in a larger packed batch."""
    rng = np.random.default_rng(42 + n_heads)
    head_dim = 64
    specs = mixed_specs(rng, block_size)
    q, k_cache, v_cache, step, tables = make_batch(
        rng, specs, block_size, n_heads, n_kv_heads, head_dim, kv_dtype=kv_dtype
    )
    scale = np.float32(1.0 / np.sqrt(head_dim))
    batch_out = run_kernel(q, k_cache, v_cache, step, scale)
    # Also the whole batch in reverse sequence order, so each sequence sits at other rows/items.
    rev = list(range(len(specs)))[::-1]
    rows = np.cumsum([0] + [n for _, n in specs])
    rev_chunks = [([0] * specs[i][1], specs[i][0], tables[i]) for i in rev]
    rev_step = build_step_input(rev_chunks, block_size, n_kv_heads, [True] * len(specs))
    rev_q = np.concatenate([q[rows[i] : rows[i + 1]] for i in rev])
    rev_out = run_kernel(rev_q, k_cache, v_cache, rev_step, scale)
    rev_rows = np.cumsum([0] + [specs[i][1] for i in rev])
    for s, (start, n_new) in enumerate(specs):
        alone_step = build_step_input([([0] * n_new, start, tables[s])], block_size, n_kv_heads, [True])
        alone_q = np.ascontiguousarray(q[rows[s] : rows[s + 1]])
        alone = run_kernel(alone_q, k_cache, v_cache, alone_step, scale)
        in_batch = batch_out[rows[s] : rows[s + 1]]
        j = rev.index(s)
        in_rev = rev_out[rev_rows[j] : rev_rows[j + 1]]
        assert np.array_equal(alone.view(np.uint32), in_batch.view(np.uint32)), f"sequence {s} {(start, n_new)}"
        assert np.array_equal(alone.view(np.uint32), in_rev.view(np.uint32)), f"sequence {s} {(start, n_new)}"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("window", [1, 8, 13, 21])
def test_sliding_window_matches_masked_reference(block_size, window):
    """window > 0 (gemma3's local layers): each query sees only the last `window` positions, itself included;
    the same mixed batches, against a naive attention with those keys masked."""
    rng = np.random.default_rng(100 * block_size + window)
    specs = mixed_specs(rng, block_size)
    q, k_cache, v_cache, step, tables = make_batch(rng, specs, block_size, 4, 1, 32)
    scale = np.float32(1.0 / np.sqrt(32))
    out = run_kernel(q, k_cache, v_cache, step, scale, window)
    ref = reference(q, k_cache, v_cache, specs, tables, scale, window)
    assert np.all(np.isfinite(out)), "some output rows were not written"
    assert np.abs(out - ref).max() < TOL
    # the window changes the answer wherever a query has more than `window` positions behind it
    full = reference(q, k_cache, v_cache, specs, tables, scale)
    long_rows = np.concatenate([np.arange(start, start + n) >= window for start, n in specs])
    assert np.abs(full - ref)[long_rows].max(axis=(1, 2)).min() > 1e-3
    # a window longer than every context is no window
    np.testing.assert_array_equal(
        run_kernel(q, k_cache, v_cache, step, scale, 100_000), run_kernel(q, k_cache, v_cache, step, scale)
    )


def test_scores_shape_follows_the_tier():
    assert score_queries_for(cpu.TIERS["avx512-vnni"]) == score_queries_for(cpu.TIERS["avx512"]) == 4
    assert score_queries_for(cpu.TIERS["avx2"]) == score_queries_for(cpu.TIERS["avx-vnni"]) == 2
    assert SCORE_QUERIES == score_queries_for(cpu.TIER)


# A float32 cache's cases of the kernel's variants (the 2-query shape, softcapping, sinks) are slow: each compiles a
# variant of its own from a cold numba cache; a float16 cache (the default) keeps each variant in the default run.
_F32 = {"marks": pytest.mark.slow}


@pytest.mark.parametrize(
    "n_heads,n_kv_heads,block_size,kv_dtype,window",
    [
        (9, 3, 16, "float16", 0),
        pytest.param(16, 2, 32, "float32", 0, **_F32),
        pytest.param(6, 2, 16, "float32", 13, **_F32),
        (2, 2, 48, "float16", 0),
    ],
)
def test_scores_shapes_give_the_same_bits(n_heads, n_kv_heads, block_size, kv_dtype, window):
    """The 256-bit tiers' shape (2 queries per key load) and the 512-bit tiers' (4): each query's arithmetic is
    the same, only its neighbours in the registers differ."""
    rng = np.random.default_rng(7 * n_heads + block_size)
    specs = mixed_specs(rng, block_size)
    q, k_cache, v_cache, step, _ = make_batch(rng, specs, block_size, n_heads, n_kv_heads, 64, kv_dtype=kv_dtype)
    scale = np.float32(0.125)
    two = run_kernel(q, k_cache, v_cache, step, scale, window, score_queries=2)
    four = run_kernel(q, k_cache, v_cache, step, scale, window, score_queries=4)
    assert np.all(np.isfinite(two))
    assert np.array_equal(two.view(np.uint32), four.view(np.uint32))


_CASE = """
import sys
import numpy as np
sys.path.insert(0, "tests/core")
from test_attention import make_batch, mixed_specs, run_kernel
rng = np.random.default_rng(5)
specs = mixed_specs(rng, 16)
q, k_cache, v_cache, step, _ = make_batch(rng, specs, 16, 9, 3, 64, kv_dtype="float16")
np.save(sys.argv[1], run_kernel(q, k_cache, v_cache, step, np.float32(0.125)))
"""


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu.runnable(), reason="the AVX2 emulation needs a CPU that runs AVX2")
def test_avx2_machine_code_gives_this_processes_bits(tmp_path):
    """The kernel compiled for an AVX2-only CPU (the 2-query shape in ymm registers) and this process's (the
    4-query shape in zmm ones on an AVX-512 machine): the same batch, the same bits."""
    root = Path(__file__).resolve().parents[2]
    mine, theirs = tmp_path / "mine.npy", tmp_path / "avx2.npy"
    for path, extra in ((mine, {}), (theirs, cpu.emulation_env("avx2"))):
        done = subprocess.run(
            [sys.executable, "-c", _CASE, str(path)],
            env={**os.environ, **extra},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert np.array_equal(np.load(mine).view(np.uint32), np.load(theirs).view(np.uint32))


@pytest.mark.parametrize("kv_dtype, window", [pytest.param("float32", 0, **_F32), ("float16", 24)])
def test_softcapped_scores_match_reference(kv_dtype, window):
    """gemma2's attention logit softcapping: every score is cap * tanh(scale q.k / cap) before the softmax (its
    running max included), by the kernel's capped variant; the uncapped kernel is not that variant."""
    rng = np.random.default_rng(11)
    specs = mixed_specs(rng, 16)
    q, k_cache, v_cache, step, tables = make_batch(rng, specs, 16, 6, 2, 64, kv_dtype=kv_dtype)
    q *= 4.0  # scores of +-30 and more: the cap of 5 bites
    scale, cap = np.float32(0.125), 5.0
    out = np.full(q.shape, np.nan, dtype=np.float32)
    paged_attention(
        q, k_cache, v_cache, step.block_tables, step.positions, step.attn_items, scale, out, window, softcap=cap
    )
    ref = _capped_reference(q, k_cache, v_cache, specs, tables, float(scale), cap, window)
    assert np.all(np.isfinite(out))
    assert np.abs(out - ref).max() < TOL
    plain = run_kernel(q, k_cache, v_cache, step, scale, window)
    assert np.abs(plain - ref).max() > 100 * TOL, "the cap changed nothing: the test would not see it missing"


def _capped_reference(q, k_cache, v_cache, specs, tables, scale, cap, window):
    """reference() with each score replaced by cap * tanh(score / cap)."""
    n_tokens, n_heads, head_dim = q.shape
    n_kv_heads, block_size = v_cache.shape[1], v_cache.shape[2]
    if k_cache.dtype == np.uint16:
        k_cache, v_cache = (c.view(np.float16) for c in (k_cache, v_cache))
    k_cache = k_cache.transpose(0, 1, 3, 2)
    group = n_heads // n_kv_heads
    out = np.empty((n_tokens, n_heads, head_dim), dtype=np.float64)
    row = 0
    for (start, n_new), table in zip(specs, tables):
        ctx = start + n_new
        pos = np.arange(ctx)
        blocks = np.asarray(table)[pos // block_size]
        kv_of_head = np.arange(n_heads) // group
        k = k_cache[blocks, :, pos % block_size, :].astype(np.float64)[:, kv_of_head, :].transpose(1, 0, 2)
        v = v_cache[blocks, :, pos % block_size, :].astype(np.float64)[:, kv_of_head, :].transpose(1, 0, 2)
        qs = q[row : row + n_new].astype(np.float64).transpose(1, 0, 2)
        scores = cap * np.tanh(qs @ k.transpose(0, 2, 1) * scale / cap)
        q_pos = np.arange(start, ctx)
        scores[:, pos[None, :] > q_pos[:, None]] = -np.inf
        if window:
            scores[:, pos[None, :] <= q_pos[:, None] - window] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[row : row + n_new] = (p @ v).transpose(1, 0, 2)
        row += n_new
    return out


@pytest.mark.parametrize(
    "kv_dtype, window, n_heads, n_kv_heads",
    [pytest.param("float32", 0, 6, 2, **_F32), ("float16", 24, 8, 2), ("float16", 0, 4, 4)],
)
def test_sinks_join_each_softmaxs_denominator(kv_dtype, window, n_heads, n_kv_heads):
    """gpt-oss's attention sinks: each query head's logit joins its softmax (the max and the denominator) as a
    score with no value, by the kernel's sinks variant; sinks from below every score to above them all, so both of
    ggml's branches (a sink over the running max rescales the sum) run. Both scores shapes give the same bits."""
    rng = np.random.default_rng(41)
    specs = mixed_specs(rng, 16)
    q, k_cache, v_cache, step, tables = make_batch(rng, specs, 16, n_heads, n_kv_heads, 64, kv_dtype=kv_dtype)
    scale = np.float32(0.125)
    sinks = np.linspace(-2.0, 6.0, n_heads).astype(np.float32)
    out = run_kernel(q, k_cache, v_cache, step, scale, window, sinks=sinks)
    ref = reference(q, k_cache, v_cache, specs, tables, scale, window, sinks)
    assert np.all(np.isfinite(out))
    assert np.abs(out - ref).max() < TOL
    plain = run_kernel(q, k_cache, v_cache, step, scale, window)
    assert np.abs(plain - ref).max() > 100 * TOL, "the sinks changed nothing: the test would not see them missing"
    np.testing.assert_array_equal(plain, run_kernel(q, k_cache, v_cache, step, scale, window, sinks=None))
    two = run_kernel(q, k_cache, v_cache, step, scale, window, score_queries=2, sinks=sinks)
    four = run_kernel(q, k_cache, v_cache, step, scale, window, score_queries=4, sinks=sinks)
    assert np.array_equal(two.view(np.uint32), four.view(np.uint32))
    with pytest.raises(ValueError, match="one logit per query head"):
        run_kernel(q, k_cache, v_cache, step, scale, window, sinks=sinks[:-1])


@pytest.mark.parametrize("n_heads,n_kv_heads,kv_dtype", [(9, 3, "float16"), (32, 8, "float16"), (6, 2, "float32")])
def test_a_token_gives_the_same_bits_in_a_prompt_and_as_decode(n_heads, n_kv_heads, kv_dtype):
    """A query is the same bits whether it is a prompt's row (prefill items: blocks scored two at a time on
    512-bit tiers) or a decode step's (one token over the same context): so a sequence recomputed after
    preemption goes on exactly as it would have."""
    rng = np.random.default_rng(n_heads)
    block_size, head_dim, n_new = 16, 64, 2 * ATTN_TILE + 5
    for start in (0, 3 * block_size + 7):
        q, k_cache, v_cache, step, tables = make_batch(
            rng, [(start, n_new)], block_size, n_heads, n_kv_heads, head_dim, kv_dtype=kv_dtype
        )
        prompt = run_kernel(q, k_cache, v_cache, step, np.float32(0.125))
        for row in (0, ATTN_TILE - 1, n_new - 1):
            one = build_step_input([([0], start + row, tables[0])], block_size, n_kv_heads, [True])
            decode = run_kernel(np.ascontiguousarray(q[row : row + 1]), k_cache, v_cache, one, np.float32(0.125))
            assert np.array_equal(decode.view(np.uint32), prompt[row : row + 1].view(np.uint32)), (start, row)
