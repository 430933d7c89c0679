"""Paged attention's work items (core/layers/attention.py runs them, one thread's at a time): where an item starts
in the block table, and its loop over the KV blocks for decode on 512-bit tiers, decode elsewhere, and items of
more queries (prefill). The arithmetic over each block is attention_blocks.py's. Inlined into the attention
kernel, so this file is in numba's cache key (kernels/cache_key.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from miro.core.kernels.simd import (
    LANES,
)

from miro.core.kernels.attention_blocks import (
    QUERIES,
    _attend_block,
    _block_start,
    _on,
    _prefetch_block,
    _scores2,
    _scores4,
    _scores4_pair,
    _softmax_and_values,
    block_as_f32,
)
from miro.core.kernels.attention_softmax import _add_sink


@njit
def _first_block(positions, t_begin, window, block_size):
    """The first block an item's queries see: 0, or with a sliding window the one holding the first query's
    earliest key."""
    if window > 0:
        return max(positions[t_begin] - window + 1, 0) // block_size
    return 0


@njit
def _next_item(items, w, threads, group, decode):
    """The first of items w, w + threads, w + 2 threads... of one group of queries (decode true) or of more,
    else items.shape[0]."""
    while w < items.shape[0] and ((items[w, 3] - items[w, 2]) * group <= QUERIES) != decode:
        w += threads
    return min(w, items.shape[0])


@njit
def _begin_item(q, items, w, group, positions, queries, top, total, acc, correction, query_last):
    """Item w's queries into `queries` (query qi is token t_begin + qi // group, head kvh * group + qi % group),
    their sums zeroed, the last position each sees in query_last; a last group padded with zero queries that
    see nothing (discarded); returns its number of queries."""
    head_dim = q.shape[2]
    kvh, t_begin, t_end = items[w, 1], items[w, 2], items[w, 3]
    n_q = (t_end - t_begin) * group
    for qi in range(-(-n_q // QUERIES) * QUERIES):
        if qi < n_q:
            t, h = t_begin + qi // group, kvh * group + qi % group
            for d in range(head_dim):
                queries[qi, d] = q[t, h, d]
            query_last[qi] = positions[t]
        else:  # the padding of a last group
            for d in range(head_dim):
                queries[qi, d] = 0.0
            query_last[qi] = -1
        for d in range(head_dim):
            acc[qi * head_dim + d] = 0.0
        top[qi] = -np.inf
        total[qi] = 0.0
        correction[qi] = 1.0
    return n_q


@njit
def _end_item(with_sinks, sinks, items, w, group, n_q, top, total, acc, out):
    """Item w's outputs: each query's sum of values over its total (with the sink of its head where the variant
    has them)."""
    head_dim = out.shape[2]
    kvh, t_begin = items[w, 1], items[w, 2]
    for qi in range(n_q):
        if with_sinks:
            _add_sink(sinks[kvh * group + qi % group], qi, top, total, acc, head_dim)
        inv = np.float32(1.0) / total[qi]
        for d in range(head_dim):
            out[t_begin + qi // group, kvh * group + qi % group, d] = acc[qi * head_dim + d] * inv


@njit
def _item_start(items, w, block_tables, positions, window, n_kv_heads, block_size, block_values):
    """Where item w's first block of keys starts in the flat cache; -1 past the last item."""
    if w >= items.shape[0]:
        return -1
    b = _first_block(positions, items[w, 2], window, block_size)
    return (block_tables[items[w, 0], b] * n_kv_heads + items[w, 1]) * block_values


# The thread's items in functions of their own (decode on 512-bit tiers or elsewhere, chosen by the kernel's
# closure constant, which numba prunes before it types the call; and items of more queries), each compiled once
# and called once per thread, not inlined into the kernel's parallel loop: numba's passes over a parallel loop
# take a time that grows much faster than the code's size (with 2a596ca's decode inlined there the kernel's first
# compile took 3.4x as long, 52 s from 15 s). Inlining (inline="always") runs numba's front end once per call
# site and nested call site, and does not prune a branch on a literal argument before it inlines both sides:
# hence one site for each big helper, and the small helpers as plain functions, which LLVM inlines.
# score_queries, capped and with_sinks arrive as literals (LLVM folds their branches). _nrt=False: they allocate
# nothing, and without it numba counts references to the arrays they are passed around each inlined helper
# (atomic adds, some on the shared caches' counts).


@njit(_nrt=False)
def _decode_items_paired(
    score_queries,
    capped,
    with_sinks,
    first,
    threads,
    q,
    flat_k,
    flat_v,
    n_kv_heads,
    block_size,
    block_tables,
    positions,
    items,
    scale,
    out,
    window,
    cap,
    sinks,
    queries,
    top,
    total,
    acc,
    scores,
    scores_next,
    correction,
    query_last,
):
    """The thread's items (first, first + threads, ...) of one group of queries (decode) on 512-bit tiers, each
    key and value widened as it loads: with blocks of 16 keys the scores of two blocks per pass, so that each
    query's broadcast serves two key loads, then each block's softmax and values in order; the rest (an odd last
    block, or blocks of more keys) 16 keys at a time. A group of 3 queries (3 query heads per KV head) takes
    passes of 3, not 4 with one of zeros."""
    group, head_dim = q.shape[1] // n_kv_heads, q.shape[2]
    block_values = head_dim * block_size  # of one KV head in one block
    w = _next_item(items, first, threads, group, True)
    while w < items.shape[0]:
        n = _next_item(items, w + threads, threads, group, True)
        seq, kvh, t_begin, t_end = items[w, 0], items[w, 1], items[w, 2], items[w, 3]
        n_q = _begin_item(q, items, w, group, positions, queries, top, total, acc, correction, query_last)
        following = _item_start(items, n, block_tables, positions, window, n_kv_heads, block_size, block_values)
        b = _first_block(positions, t_begin, window, block_size)
        last_block = positions[t_end - 1] // block_size
        lane0 = 0  # block b's first key not yet seen, a multiple of 16
        while b <= last_block:
            start = (block_tables[seq, b] * n_kv_heads + kvh) * block_values
            if block_size == LANES and b < last_block:  # two blocks in one scores pass
                start_next = (block_tables[seq, b + 1] * n_kv_heads + kvh) * block_values
                ahead = _block_start(block_tables, seq, b + 2, last_block, following, n_kv_heads, kvh, block_values)
                ahead_next = _block_start(
                    block_tables, seq, b + 3, last_block, following, n_kv_heads, kvh, block_values
                )
                if n_q == 3:  # a group of 3 query heads: no 4th of zeros
                    _scores4_pair(
                        queries,
                        0,
                        flat_k,
                        start,
                        flat_k,
                        start_next,
                        block_size,
                        scale,
                        scores,
                        scores_next,
                        ahead,
                        ahead_next,
                        False,
                    )
                else:
                    _scores4_pair(
                        queries,
                        0,
                        flat_k,
                        start,
                        flat_k,
                        start_next,
                        block_size,
                        scale,
                        scores,
                        scores_next,
                        ahead,
                        ahead_next,
                        True,
                    )
                units = 2
            else:  # 16 keys of one block: the last of an odd number, or blocks of more than 16
                ahead = _block_start(block_tables, seq, b + 1, last_block, following, n_kv_heads, kvh, block_values)
                start_next, ahead_next = start, -1  # unread
                _scores4(queries, 0, flat_k, start + lane0, block_size, scale, scores, _on(ahead, lane0))
                units = 1
            for unit in range(units):  # one copy of the softmax and values code for both shapes
                second = unit == 1
                _softmax_and_values(
                    True,
                    True,
                    capped,
                    scores_next if second else scores,
                    n_q,
                    (b + 1) * block_size if second else b * block_size + lane0,
                    query_last,
                    window,
                    top,
                    total,
                    correction,
                    flat_v,
                    start_next if second else start + lane0 * head_dim,
                    acc,
                    ahead_next if second else _on(ahead, lane0 * head_dim),
                    cap,
                )
            if units == 2:
                b += 2
            else:
                lane0 += LANES
                if lane0 == block_size:
                    lane0 = 0
                    b += 1
        _end_item(with_sinks, sinks, items, w, group, n_q, top, total, acc, out)
        w = n


@njit(_nrt=False)
def _decode_items_by_block(
    score_queries,
    capped,
    with_sinks,
    first,
    threads,
    q,
    flat_k,
    flat_v,
    n_kv_heads,
    block_size,
    block_tables,
    positions,
    items,
    scale,
    out,
    window,
    cap,
    sinks,
    queries,
    top,
    total,
    acc,
    scores,
    scores_next,
    correction,
    query_last,
):
    """The thread's items (first, first + threads, ...) of one group of queries (decode) on 256-bit tiers, a
    block at a time, each key and value widened as it loads."""
    group, head_dim = q.shape[1] // n_kv_heads, q.shape[2]
    block_values = head_dim * block_size  # of one KV head in one block
    w = _next_item(items, first, threads, group, True)
    while w < items.shape[0]:
        n = _next_item(items, w + threads, threads, group, True)
        seq, kvh, t_begin, t_end = items[w, 0], items[w, 1], items[w, 2], items[w, 3]
        n_q = _begin_item(q, items, w, group, positions, queries, top, total, acc, correction, query_last)
        following = _item_start(items, n, block_tables, positions, window, n_kv_heads, block_size, block_values)
        b = _first_block(positions, t_begin, window, block_size)
        last_block = positions[t_end - 1] // block_size
        for b in range(b, last_block + 1):
            start = (block_tables[seq, b] * n_kv_heads + kvh) * block_values
            ahead = _block_start(block_tables, seq, b + 1, last_block, following, n_kv_heads, kvh, block_values)
            _attend_block(
                capped,
                queries,
                n_q,
                flat_k,
                start,
                flat_v,
                start,
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
            )
        _end_item(with_sinks, sinks, items, w, group, n_q, top, total, acc, out)
        w = n


@njit(_nrt=False)
def _prefill_items(
    score_queries,
    capped,
    with_sinks,
    first,
    threads,
    q,
    flat_k,
    flat_v,
    n_kv_heads,
    block_size,
    block_tables,
    positions,
    items,
    scale,
    out,
    window,
    cap,
    sinks,
    queries,
    top,
    total,
    acc,
    scores,
    scores_next,
    k_scratch,
    v_scratch,
    k_scratch_next,
    v_scratch_next,
    correction,
    query_last,
):
    """The thread's items (first, first + threads, ...) of more than one group of queries: each block widened
    once, into scratch, for all of them. On 512-bit tiers with blocks of 16 keys, two blocks a pass: each group
    of 4 queries scores both (each broadcast serving two key loads, _scores4_pair), then each block's softmax
    and values in order; the rest (an odd last block, 256-bit tiers, blocks of more keys) 16 keys at a time.
    Each query's arithmetic is the same either way."""
    group, head_dim = q.shape[1] // n_kv_heads, q.shape[2]
    block_values = head_dim * block_size  # of one KV head in one block
    w = _next_item(items, first, threads, group, False)
    while w < items.shape[0]:
        n = _next_item(items, w + threads, threads, group, False)
        seq, kvh, t_begin, t_end = items[w, 0], items[w, 1], items[w, 2], items[w, 3]
        n_q = _begin_item(q, items, w, group, positions, queries, top, total, acc, correction, query_last)
        rows = -(-n_q // QUERIES) * QUERIES
        following = _item_start(items, n, block_tables, positions, window, n_kv_heads, block_size, block_values)
        last_block = positions[t_end - 1] // block_size
        b = _first_block(positions, t_begin, window, block_size)
        lane0 = 0  # block b's first key not yet seen, a multiple of 16
        while b <= last_block:
            start = (block_tables[seq, b] * n_kv_heads + kvh) * block_values
            if score_queries == 4 and block_size == LANES and b < last_block:  # two blocks in one scores pass
                start_next = (block_tables[seq, b + 1] * n_kv_heads + kvh) * block_values
                for ahead in (
                    _block_start(block_tables, seq, b + 2, last_block, following, n_kv_heads, kvh, block_values),
                    _block_start(block_tables, seq, b + 3, last_block, following, n_kv_heads, kvh, block_values),
                ):
                    if ahead >= 0:  # their arithmetic is long enough to hide the next blocks' fetch in one go
                        _prefetch_block(flat_k, flat_v, ahead, block_values)
                kt, k0 = block_as_f32(flat_k, start, k_scratch)
                vb, v0 = block_as_f32(flat_v, start, v_scratch)
                kn, k1 = block_as_f32(flat_k, start_next, k_scratch_next)
                vn, v1 = block_as_f32(flat_v, start_next, v_scratch_next)
                for qi in range(0, rows, QUERIES):
                    _scores4_pair(queries, qi, kt, k0, kn, k1, block_size, scale, scores, scores_next, -1, -1, True)
                units = 2
            else:  # 16 keys of one block
                if lane0 == 0:
                    ahead = _block_start(block_tables, seq, b + 1, last_block, following, n_kv_heads, kvh, block_values)
                    if ahead >= 0:
                        _prefetch_block(flat_k, flat_v, ahead, block_values)
                    kt, k0 = block_as_f32(flat_k, start, k_scratch)
                    vb, v0 = block_as_f32(flat_v, start, v_scratch)
                vn, v1 = vb, v0  # unread
                for qi in range(0, rows, score_queries):
                    if score_queries == 4:
                        _scores4(queries, qi, kt, k0 + lane0, block_size, scale, scores, -1)
                    else:
                        _scores2(queries, qi, kt, k0 + lane0, block_size, scale, scores, -1)
                units = 1
            for unit in range(units):  # one copy of the softmax and values code for both shapes
                second = unit == 1
                _softmax_and_values(
                    score_queries == 4,
                    False,
                    capped,
                    scores_next if second else scores,
                    n_q,
                    (b + 1) * block_size if second else b * block_size + lane0,
                    query_last,
                    window,
                    top,
                    total,
                    correction,
                    vn if second else vb,
                    v1 if second else v0 + lane0 * head_dim,
                    acc,
                    -1,
                    cap,
                )
            if units == 2:
                b += 2
            else:
                lane0 += LANES
                if lane0 == block_size:
                    lane0 = 0
                    b += 1
        _end_item(with_sinks, sinks, items, w, group, n_q, top, total, acc, out)
        w = n
