"""Paged attention's arithmetic over one KV block (core/layers/attention.py runs it): how the cache holds a value
(float32 or float16 bits), a block's scores for a group of queries, the values pass, and the prefetches of the
blocks ahead; the online softmax between them is attention_softmax.py's. Every function here is inlined into the
attention kernel, so this file is in numba's cache key (kernels/cache_key.py)."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.extending import overload

from miro.core.kernels.simd import (
    LANES,
    fma,
    load16,
    load16_f16,
    prefetch_l2,
    store16,
    zeros16,
)

from miro.core.kernels.halfs import f32_to_f16_bits
from miro.core.kernels.attention_softmax import (
    _online_softmax4,
    _online_softmax4_called,
    _sees_whole_block,
    _softcap,
)

QUERIES = 4  # queries that share each value load (and each key load on 512-bit tiers); rows are padded to it


def as_cache_value(cache, x):
    """x (float32) as the cache stores it: itself, or its float16 bits."""


@overload(as_cache_value)
def _as_cache_value(cache, x):
    if cache.dtype == types.uint16:
        return lambda cache, x: f32_to_f16_bits(np.float32(x))
    return lambda cache, x: np.float32(x)


def load_kv16(flat_cache, i):
    """flat_cache[i:i + 16] as float32x16: loaded, or its float16 bits widened (vcvtph2ps, exact)."""


@overload(load_kv16)
def _load_kv16(flat_cache, i):
    if flat_cache.dtype == types.uint16:
        return lambda flat_cache, i: load16_f16(flat_cache, i)
    return lambda flat_cache, i: load16(flat_cache, i)


def block_as_f32(flat_cache, start, scratch):
    """The block at flat_cache[start:start + scratch.size] as float32, returned as (array, its first index):
    the cache itself, or its float16 widened into scratch. (No views: a view of a shared array, made in a
    loop, costs an atomic reference count that both threads contend for.)"""


@overload(block_as_f32)
def _block_as_f32(flat_cache, start, scratch):
    if flat_cache.dtype == types.uint16:

        def widen(flat_cache, start, scratch):
            for i in range(0, scratch.size, LANES):
                store16(scratch, i, load16_f16(flat_cache, start + i))
            return scratch, 0

        return widen
    return lambda flat_cache, start, scratch: (flat_cache, start)


@njit(inline="always")
def _attend_block(
    capped,
    queries,
    n_q,
    kt,
    k0,
    vb,
    v0,
    b,
    block_size,
    query_last,
    window,
    scale,
    scores,
    top,
    total,
    correction,
    acc,
    ahead,
    cap,
):
    """One block of keys for the n_q queries of a work item: kt[k0 + d * block_size + j] is key j's d,
    vb[v0 + j * head_dim + d] value j's d, in float32 or float16 bits (load_kv16 widens them).

    ahead >= 0 (kt and vb are then the cache itself): the next block's K and V start there. The first group's
    passes prefetch them a line per step, in the shadow of this block's arithmetic: blocks lie in the pool in
    any order, which the hardware's prefetcher cannot guess, and for one group (decode) a burst of 64
    prefetches at once stalls on the cache's miss buffers (measured 1.3x slower). Every prefetch here goes to L2
    (prefetcht1; each line is read once): B=64 decode's attention on the default model, Zen 4, 3 rounds of
    step_time.py in turn, 21.6-28.6 ms against 28.7-39.9 into every level.

    Only decode's items on 256-bit tiers run here (2 queries a key load, _scores2; 512-bit tiers' decode is
    _decode_items_paired's, every prefill _prefill_items'); a last group of 3 queries takes a softmax of 3, its
    values pass 4 with one of zeros. capped is a constant of the kernel's variant (a closure value of its own: a
    plain bool, passed on as a literal to the item functions), so once this is inlined there LLVM folds the
    other branch. Not a jitted closure per variant that the kernel holds (5af21ab, reverted in 6a7e7cd): numba's
    cache key pickles a kernel's closure values, a dispatcher's pickle carries an id of the process that made
    it, and every process then missed the cache (tests/core/test_kernel_cache.py checks the keys).

    capped: each score s, computed with scale / cap, becomes cap * tanh(s) before the softmax sees it (its
    running max included), as ggml's flash attention soft-caps them."""
    rows = -(-n_q // QUERIES) * QUERIES  # the queries padded to whole groups of 4 (the padding is discarded)
    head_dim = queries.shape[1]
    for lane0 in range(0, block_size, LANES):
        # three passes over the queries, a group at a time where they share loads, so that the CPU overlaps
        # their dependency chains; every query's own arithmetic is the same whatever its neighbours
        for qi in range(0, rows, 2):
            k_ahead = ahead + lane0 if ahead >= 0 and qi == 0 else -1
            _scores2(queries, qi, kt, k0 + lane0, block_size, scale, scores, k_ahead)
        _softmax_and_values(
            False,
            True,
            capped,
            scores,
            n_q,
            b * block_size + lane0,
            query_last,
            window,
            top,
            total,
            correction,
            vb,
            v0 + lane0 * head_dim,
            acc,
            ahead + lane0 * head_dim if ahead >= 0 else -1,
            cap,
        )


@njit(inline="always")
def _softmax_and_values(
    wide,
    three,
    capped,
    scores,
    n_q,
    base,
    query_last,
    window,
    top,
    total,
    correction,
    vb,
    v0,
    acc,
    v_ahead,
    cap,
):
    """The second and third passes over 16 keys whose scores are in `scores` (position `base` in lane 0): each
    query's online softmax, then its sum of values (the rows at vb[v0 + j * head_dim:]); v_ahead >= 0: the
    first group's values pass prefetches the same rows there. wide (a constant): 64 columns per pass; three
    (a constant): a last group of 3 queries takes a softmax of 3 (and, with wide, values passes of 3), not 4
    with one of zeros."""
    head_dim = acc.size // correction.size
    rows = -(-n_q // QUERIES) * QUERIES
    if capped:
        _softcap(scores, n_q, cap)
    whole = _sees_whole_block(query_last, n_q, base, window)
    for qi in range(0, rows, QUERIES):
        if three:  # decode: a few queries an item; the helper compiled once (numba's time, see above)
            if n_q - qi == 3 and whole:
                _online_softmax4_called(scores, qi, query_last, base, window, top, total, correction, False, True)
            elif n_q - qi == 3:
                _online_softmax4_called(scores, qi, query_last, base, window, top, total, correction, False, False)
            elif whole:
                _online_softmax4_called(scores, qi, query_last, base, window, top, total, correction, True, True)
            else:
                _online_softmax4_called(scores, qi, query_last, base, window, top, total, correction, True, False)
        elif whole:  # prefill: many queries an item, so the two forms inlined, their masks folded away
            _online_softmax4(scores, qi, query_last, base, window, top, total, correction, True, True)
        else:
            _online_softmax4(scores, qi, query_last, base, window, top, total, correction, True, False)
    for qi in range(0, rows, QUERIES):
        ahead = v_ahead if qi == 0 else -1
        c = 0
        if wide:  # 16 sums in zmm registers: each probability's broadcast serves 4 value loads
            if three and n_q - qi == 3:
                while c + 4 * LANES <= head_dim:
                    _accumulate_values4x4(scores, qi, correction, vb, v0, c, acc, ahead, False)
                    c += 4 * LANES
            else:
                while c + 4 * LANES <= head_dim:
                    _accumulate_values4x4(scores, qi, correction, vb, v0, c, acc, ahead, True)
                    c += 4 * LANES
        for c in range(c, head_dim, LANES):
            _accumulate_values4(scores, qi, correction, vb, v0, c, acc, ahead)


@njit
def _on(ahead, offset):
    """ahead + offset where ahead >= 0 (a place to prefetch), else -1 (none)."""
    return ahead + offset if ahead >= 0 else -1


@njit
def _block_start(block_tables, seq, b, last_block, following, n_kv_heads, kvh, block_values):
    """Where block b of the sequence starts in the flat cache, for b up to last_block; one past it, the start
    of the thread's next item (following); else -1."""
    if b <= last_block:
        return (block_tables[seq, b] * n_kv_heads + kvh) * block_values
    return following if b == last_block + 1 else -1


@njit
def _prefetch_block(flat_k, flat_v, start, n_values):
    """Prefetch n_values of K and of V from start, all at once."""
    step = 64 // flat_k.itemsize  # values per cache line
    for i in range(start, start + n_values, step):
        prefetch_l2(flat_k, i)
        prefetch_l2(flat_v, i)


@njit
def _prefetch_rows(flat_cache, ahead, offset, stride):
    """With ahead >= 0, prefetch the line of flat_cache[ahead + offset], and with a stride the line that many
    values on (K's second row of a step over d, a line of its own in float32)."""
    if ahead >= 0:
        prefetch_l2(flat_cache, ahead + offset)
        if stride:
            prefetch_l2(flat_cache, ahead + offset + stride)


@njit(inline="always")
def _scores2(queries, qi, kt, k0, block_size, scale, scores, k_ahead):
    """_scores4 for 2 queries: 4 vectors of sums, which 256-bit registers hold."""
    e0, e1 = zeros16(), zeros16()
    o0, o1 = zeros16(), zeros16()
    for d in range(0, queries.shape[1], 2):
        k_even = load_kv16(kt, k0 + d * block_size)
        k_odd = load_kv16(kt, k0 + (d + 1) * block_size)
        _prefetch_rows(kt, k_ahead, d * block_size, block_size)
        e0 = fma(queries[qi, d], k_even, e0)
        e1 = fma(queries[qi + 1, d], k_even, e1)
        o0 = fma(queries[qi, d + 1], k_odd, o0)
        o1 = fma(queries[qi + 1, d + 1], k_odd, o1)
    store16(scores, qi * LANES, (e0 + o0) * scale)
    store16(scores, (qi + 1) * LANES, (e1 + o1) * scale)


@njit(inline="always")
def _scores4(queries, qi, kt, k0, block_size, scale, scores, k_ahead):
    """scores[(qi + i) * 16:][:16] = scale * (queries[qi + i] . key j) for i < 4 and the 16 keys whose d-th
    components are at kt[k0 + d * block_size:][:16]. Each query sums even and odd d in two chains. k_ahead >= 0:
    the same rows of the next block, at kt[k_ahead + d * block_size], are prefetched along the way."""
    e0, e1, e2, e3 = zeros16(), zeros16(), zeros16(), zeros16()
    o0, o1, o2, o3 = zeros16(), zeros16(), zeros16(), zeros16()
    for d in range(0, queries.shape[1], 2):
        k_even = load_kv16(kt, k0 + d * block_size)
        k_odd = load_kv16(kt, k0 + (d + 1) * block_size)
        _prefetch_rows(kt, k_ahead, d * block_size, block_size)
        e0 = fma(queries[qi, d], k_even, e0)
        e1 = fma(queries[qi + 1, d], k_even, e1)
        e2 = fma(queries[qi + 2, d], k_even, e2)
        e3 = fma(queries[qi + 3, d], k_even, e3)
        o0 = fma(queries[qi, d + 1], k_odd, o0)
        o1 = fma(queries[qi + 1, d + 1], k_odd, o1)
        o2 = fma(queries[qi + 2, d + 1], k_odd, o2)
        o3 = fma(queries[qi + 3, d + 1], k_odd, o3)
    store16(scores, qi * LANES, (e0 + o0) * scale)
    store16(scores, (qi + 1) * LANES, (e1 + o1) * scale)
    store16(scores, (qi + 2) * LANES, (e2 + o2) * scale)
    store16(scores, (qi + 3) * LANES, (e3 + o3) * scale)


@njit(inline="always")
def _scores4_pair(queries, qi, kt, k0, kn, k1, block_size, scale, scores, scores_next, ahead, ahead_next, four):
    """_scores4 for queries qi..qi + 3 (four, a constant: else the first 3) and two blocks of 16 keys at once,
    the first block's (at kt[k0:]) into scores, the second's (at kn[k1:]) into scores_next: each query's
    broadcast d-th component serves both blocks' key loads, 16 sums in zmm registers. Each query's arithmetic in
    each block is _scores4's. ahead, ahead_next >= 0 (kt and kn are then the cache itself): the same rows of the
    blocks two on are prefetched along the way. The 3 queries' shape serves a group of 3 query heads (SmolLM2's
    decode) without a 4th of zeros."""
    e0, e1, e2, e3 = zeros16(), zeros16(), zeros16(), zeros16()
    o0, o1, o2, o3 = zeros16(), zeros16(), zeros16(), zeros16()
    f0, f1, f2, f3 = zeros16(), zeros16(), zeros16(), zeros16()
    p0, p1, p2, p3 = zeros16(), zeros16(), zeros16(), zeros16()
    for d in range(0, queries.shape[1], 2):
        k_even = load_kv16(kt, k0 + d * block_size)
        k_odd = load_kv16(kt, k0 + (d + 1) * block_size)
        n_even = load_kv16(kn, k1 + d * block_size)
        n_odd = load_kv16(kn, k1 + (d + 1) * block_size)
        _prefetch_rows(kt, ahead, d * block_size, _second_row(kt, block_size))
        _prefetch_rows(kt, ahead_next, d * block_size, _second_row(kt, block_size))
        q0, q1, q2 = queries[qi, d], queries[qi + 1, d], queries[qi + 2, d]
        e0 = fma(q0, k_even, e0)
        e1 = fma(q1, k_even, e1)
        e2 = fma(q2, k_even, e2)
        f0 = fma(q0, n_even, f0)
        f1 = fma(q1, n_even, f1)
        f2 = fma(q2, n_even, f2)
        if four:
            q3 = queries[qi + 3, d]
            e3 = fma(q3, k_even, e3)
            f3 = fma(q3, n_even, f3)
        q0, q1, q2 = queries[qi, d + 1], queries[qi + 1, d + 1], queries[qi + 2, d + 1]
        o0 = fma(q0, k_odd, o0)
        o1 = fma(q1, k_odd, o1)
        o2 = fma(q2, k_odd, o2)
        p0 = fma(q0, n_odd, p0)
        p1 = fma(q1, n_odd, p1)
        p2 = fma(q2, n_odd, p2)
        if four:
            q3 = queries[qi + 3, d + 1]
            o3 = fma(q3, k_odd, o3)
            p3 = fma(q3, n_odd, p3)
    store16(scores, qi * LANES, (e0 + o0) * scale)
    store16(scores, (qi + 1) * LANES, (e1 + o1) * scale)
    store16(scores, (qi + 2) * LANES, (e2 + o2) * scale)
    store16(scores_next, qi * LANES, (f0 + p0) * scale)
    store16(scores_next, (qi + 1) * LANES, (f1 + p1) * scale)
    store16(scores_next, (qi + 2) * LANES, (f2 + p2) * scale)
    if four:
        store16(scores, (qi + 3) * LANES, (e3 + o3) * scale)
        store16(scores_next, (qi + 3) * LANES, (f3 + p3) * scale)


def _second_row(flat_cache, block_size):
    """How far on the second row of a step over d lies when it is on a cache line of its own (float32), else 0
    (float16: both rows of 16 keys share one line): a constant of each cache dtype."""


@overload(_second_row)
def _second_row_impl(flat_cache, block_size):
    if flat_cache.dtype == types.uint16:
        return lambda flat_cache, block_size: 0
    return lambda flat_cache, block_size: block_size


def _values_per_line(flat_cache):
    """Values of the cache in one 64-byte line: a constant of each cache dtype."""


@overload(_values_per_line)
def _values_per_line_impl(flat_cache):
    per_line = 32 if flat_cache.dtype == types.uint16 else 16
    return lambda flat_cache: per_line


@njit(inline="always")
def _accumulate_values4(probs, qi, correction, vb, v0, c, acc, v_ahead):
    """For i < 4 and the 16 columns from c: acc[qi + i] = acc[qi + i] * correction[qi + i] + sum over the 16 keys
    j of probs[(qi + i) * 16 + j] * value j (the row of head_dim at vb[v0 + j * head_dim:]), over j in order.
    v_ahead >= 0: the next block's same rows, at vb[v_ahead:], are prefetched along the way."""
    head_dim = acc.size // correction.size
    r0, r1, r2, r3 = qi * head_dim + c, (qi + 1) * head_dim + c, (qi + 2) * head_dim + c, (qi + 3) * head_dim + c
    a0 = load16(acc, r0) * correction[qi]
    a1 = load16(acc, r1) * correction[qi + 1]
    a2 = load16(acc, r2) * correction[qi + 2]
    a3 = load16(acc, r3) * correction[qi + 3]
    for j in range(LANES):
        value = load_kv16(vb, v0 + j * head_dim + c)
        if c % _values_per_line(vb) == 0:  # the first 16 columns of each cache line
            _prefetch_rows(vb, v_ahead, j * head_dim + c, 0)
        a0 = fma(probs[qi * LANES + j], value, a0)
        a1 = fma(probs[(qi + 1) * LANES + j], value, a1)
        a2 = fma(probs[(qi + 2) * LANES + j], value, a2)
        a3 = fma(probs[(qi + 3) * LANES + j], value, a3)
    store16(acc, r0, a0)
    store16(acc, r1, a1)
    store16(acc, r2, a2)
    store16(acc, r3, a3)


@njit(inline="always")
def _accumulate_values4x4(probs, qi, correction, vb, v0, c, acc, v_ahead, four):
    """_accumulate_values4 for the 64 columns from c at once: 16 sums in zmm registers, each query's broadcast
    probability serving 4 value loads. Each sum's arithmetic is _accumulate_values4's. four (a constant): else
    only queries qi..qi + 2 (a last group of 3; the 4th's sums are left as they are)."""
    head_dim = acc.size // correction.size
    r0, r1, r2, r3 = qi * head_dim + c, (qi + 1) * head_dim + c, (qi + 2) * head_dim + c, (qi + 3) * head_dim + c
    m0, m1, m2 = correction[qi], correction[qi + 1], correction[qi + 2]
    a00, a01, a02, a03 = (
        load16(acc, r0) * m0,
        load16(acc, r0 + 16) * m0,
        load16(acc, r0 + 32) * m0,
        load16(acc, r0 + 48) * m0,
    )
    a10, a11, a12, a13 = (
        load16(acc, r1) * m1,
        load16(acc, r1 + 16) * m1,
        load16(acc, r1 + 32) * m1,
        load16(acc, r1 + 48) * m1,
    )
    a20, a21, a22, a23 = (
        load16(acc, r2) * m2,
        load16(acc, r2 + 16) * m2,
        load16(acc, r2 + 32) * m2,
        load16(acc, r2 + 48) * m2,
    )
    a30, a31, a32, a33 = zeros16(), zeros16(), zeros16(), zeros16()
    if four:
        m3 = correction[qi + 3]
        a30, a31, a32, a33 = (
            load16(acc, r3) * m3,
            load16(acc, r3 + 16) * m3,
            load16(acc, r3 + 32) * m3,
            load16(acc, r3 + 48) * m3,
        )
    for j in range(LANES):
        row = v0 + j * head_dim + c
        x0, x1, x2, x3 = load_kv16(vb, row), load_kv16(vb, row + 16), load_kv16(vb, row + 32), load_kv16(vb, row + 48)
        for line in range(0, 4 * LANES, _values_per_line(vb)):
            _prefetch_rows(vb, v_ahead, j * head_dim + c + line, 0)
        p0, p1, p2 = probs[qi * LANES + j], probs[(qi + 1) * LANES + j], probs[(qi + 2) * LANES + j]
        a00, a01, a02, a03 = fma(p0, x0, a00), fma(p0, x1, a01), fma(p0, x2, a02), fma(p0, x3, a03)
        a10, a11, a12, a13 = fma(p1, x0, a10), fma(p1, x1, a11), fma(p1, x2, a12), fma(p1, x3, a13)
        a20, a21, a22, a23 = fma(p2, x0, a20), fma(p2, x1, a21), fma(p2, x2, a22), fma(p2, x3, a23)
        if four:
            p3 = probs[(qi + 3) * LANES + j]
            a30, a31, a32, a33 = fma(p3, x0, a30), fma(p3, x1, a31), fma(p3, x2, a32), fma(p3, x3, a33)
    store16(acc, r0, a00)
    store16(acc, r0 + 16, a01)
    store16(acc, r0 + 32, a02)
    store16(acc, r0 + 48, a03)
    store16(acc, r1, a10)
    store16(acc, r1 + 16, a11)
    store16(acc, r1 + 32, a12)
    store16(acc, r1 + 48, a13)
    store16(acc, r2, a20)
    store16(acc, r2 + 16, a21)
    store16(acc, r2 + 32, a22)
    store16(acc, r2 + 48, a23)
    if four:
        store16(acc, r3, a30)
        store16(acc, r3 + 16, a31)
        store16(acc, r3 + 32, a32)
        store16(acc, r3 + 48, a33)
