"""The paged KV cache's two kernels: RoPE + the K/V write, and causal flash attention over the cache.

Layout of one layer's cache (kv_cache.KVCache holds every layer's):
    k: (num_blocks, n_kv_heads, head_dim, block_size)  K transposed within a block, so that 16 keys' scores
                                                        are one vector: sum over d of q[d] * k[d, 0:16]
    v: (num_blocks, n_kv_heads, block_size, head_dim)
in float32, or float16 bits (uint16), widened to float32 exactly: as each vector is loaded for a work item
of one group of queries (a decode token's), or once per block into scratch for items with more. block_size
and head_dim are multiples of 16 (kv_cache.check_kv_layout).

Every query's result is computed from its own context alone, in an order fixed by positions (blocks of
16 keys from position 0), so it never depends on what else is in the batch.

Queries share each key and value load, in groups whose size the CPU tier sets (cpu.TIER.vector_bits): the
scores pass keeps two sums per query, so 4 queries are 8 vectors of 16 floats, 8 of the 32 zmm registers
but 16 ymm, all of AVX2's, and it spills; 256-bit tiers score 2 queries per load. The values pass keeps
one sum per query (4 queries: 8 ymm) and takes 4 on every tier. A query's arithmetic is the same in any
group, so the tiers give the same bits.

Here: the kernels and their variants. A thread's work items (decode, prefill) are kernels/attention_items.py's,
the arithmetic over one KV block (scores, values, prefetches) kernels/attention_blocks.py's, the online softmax
between them kernels/attention_softmax.py's.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from miro.core.kernels import cpu
from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.attention_blocks import QUERIES, as_cache_value
from miro.core.kernels.attention_items import _decode_items_by_block, _decode_items_paired, _prefill_items
from miro.core.kernels.simd import (
    LANES,
)


def score_queries_for(tier: cpu.Tier) -> int:
    """Queries that share each key load in the scores pass: their 2 sums each must fit the registers."""
    return 4 if tier.vector_bits == 512 else 2


SCORE_QUERIES = score_queries_for(cpu.TIER)


@njit(inline="always")
def _rotate(vec, cos_row, sin_row, neox):
    """RoPE: on adjacent pairs (x[2i], x[2i+1]), as llama.cpp rotates GGUF llama weights, or with neox on
    halves (x[i], x[i + d/2]), as it rotates qwen2, qwen3 and gemma3."""
    half = cos_row.shape[0]
    for i in range(half):
        a_i, b_i = (i, half + i) if neox else (2 * i, 2 * i + 1)
        a = vec[a_i]
        b = vec[b_i]
        vec[a_i] = a * cos_row[i] - b * sin_row[i]
        vec[b_i] = a * sin_row[i] + b * cos_row[i]


@njit(inline="always")
def _lines(n):
    """n float32 zeros from a 64-byte boundary: a vector of 16 never straddles two cache lines (numba aligns
    arrays to 32 bytes, and a straddling load or store costs two)."""
    buffer = np.zeros(n + LANES, dtype=np.float32)
    skip = (-(buffer.ctypes.data // 4)) % LANES
    return buffer[skip : skip + n]


def _build_rope_and_store_kv():
    helpers = HELPERS

    @njit(cache=True)
    def rope_and_store_kv(qkv, positions, cos, sin, n_heads, n_kv_heads, head_dim, slots, k_cache, v_cache, neox=False):
        """Rotate Q (in place in qkv) and K by each token's position; write K and V into the paged cache.

        qkv: (T, (n_heads + 2 * n_kv_heads) * head_dim); slots[t] = block * block_size + offset.
        """
        helpers  # in numba's cache key: see cache_key.py
        block_size = v_cache.shape[2]
        q_end = n_heads * head_dim
        k_end = q_end + n_kv_heads * head_dim
        for t in range(qkv.shape[0]):
            pos = positions[t]
            for h in range(n_heads):
                _rotate(qkv[t, h * head_dim : (h + 1) * head_dim], cos[pos], sin[pos], neox)
            block = slots[t] // block_size
            offset = slots[t] % block_size
            for h in range(n_kv_heads):
                k = qkv[t, q_end + h * head_dim : q_end + (h + 1) * head_dim]
                _rotate(k, cos[pos], sin[pos], neox)
                v = qkv[t, k_end + h * head_dim : k_end + (h + 1) * head_dim]
                for d in range(head_dim):
                    k_cache[block, h, d, offset] = as_cache_value(k_cache, k[d])
                    v_cache[block, h, offset, d] = as_cache_value(v_cache, v[d])

    return rope_and_store_kv


def _build_attend(score_queries: int, capped: bool = False, with_sinks: bool = False):
    """The attention kernel whose scores pass shares each key load among `score_queries` (2 or 4) queries;
    capped: the variant that soft-caps every score (gemma2); with_sinks: the variant whose softmax takes each
    query head's sink logit into its denominator (gpt-oss). Each is a constant of its own compiled code, so the
    plain kernel's code and bits are what they were without them."""
    helpers = HELPERS
    assert score_queries in (2, 4)

    variant = f"scores{score_queries}" + ("_softcap" if capped else "") + ("_sinks" if with_sinks else "")

    @cached_variant(variant, parallel=True)
    def attend(q, k_cache, v_cache, block_tables, positions, items, scale, out, window, threads, cap, sinks):
        """paged_attention's kernel; threads: numba's thread count (read outside: it would keep this from the
        cache); cap: the capped variant's softcap (scale then holds scale / cap); sinks: (n_heads,) float32, the
        sinks variant's logits (else unread).

        Items are dealt like cards: thread i takes items i, i + threads, i + 2 threads... A prompt's items grow
        in cost along the list (later query tiles see more keys), so each thread gets a like share of cheap and
        dear ones. Each thread allocates its scratch once, for the largest item."""
        helpers  # in numba's cache key: see cache_key.py
        n_heads, head_dim = q.shape[1], q.shape[2]
        n_kv_heads, block_size = v_cache.shape[1], v_cache.shape[2]
        group = n_heads // n_kv_heads
        block_values = head_dim * block_size  # of one KV head in one block
        flat_k = k_cache.reshape(k_cache.size)
        flat_v = v_cache.reshape(v_cache.size)
        n_items = items.shape[0]
        most = 1
        for w in range(n_items):
            most = max(most, items[w, 3] - items[w, 2])
        rows = -(-(most * group) // QUERIES) * QUERIES  # whole groups of 4, for the largest item
        for first in prange(threads):
            queries = _lines(rows * head_dim).reshape(rows, head_dim)
            top = np.empty(rows, dtype=np.float32)  # each query's running max score
            total = np.empty(rows, dtype=np.float32)  # and its running sum of e^(score - top)
            acc = _lines(rows * head_dim)  # query qi's weighted sum of values at qi * head_dim
            scores = _lines(rows * LANES)  # query qi's 16 scores, then e^(score - top)
            scores_next = _lines(rows * LANES)  # the same for the second block of a pair (decode, 512-bit)
            correction = np.empty(rows, dtype=np.float32)  # the factor acc[qi] is scaled by before a block's values
            query_last = np.empty(rows, dtype=np.int64)  # the last position query qi sees
            k_scratch = _lines(block_values)  # blocks widened from float16 (prefill): one
            v_scratch = _lines(block_values)
            k_scratch_next = _lines(block_values)  # and the second of a pair
            v_scratch_next = _lines(block_values)
            # the thread's items of one group of queries (decode), then the others: functions of their own,
            # compiled once each, not this parallel loop's body (see _decode_items_paired)
            if score_queries == 4:  # a closure constant: numba prunes the other call before typing it
                _decode_items_paired(
                    score_queries,
                    capped,
                    with_sinks,
                    np.int64(first),  # the parallel loop's own index is unsigned in its body: one type, one compile
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
                )
            else:
                _decode_items_by_block(
                    score_queries,
                    capped,
                    with_sinks,
                    np.int64(first),  # the parallel loop's own index is unsigned in its body: one type, one compile
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
                )
            _prefill_items(
                score_queries,
                capped,
                with_sinks,
                np.int64(first),
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
            )
        return out

    return attend


rope_and_store_kv = _build_rope_and_store_kv()
_ATTEND = {(SCORE_QUERIES, False, False): _build_attend(SCORE_QUERIES)}  # the other shapes are built when asked for
_NO_SINKS = np.zeros(0, np.float32)


def _attend_kernel(score_queries: int, capped: bool = False, with_sinks: bool = False):
    key = (score_queries, capped, with_sinks)
    if key not in _ATTEND:
        _ATTEND[key] = _build_attend(*key)
    return _ATTEND[key]


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    positions,
    items,
    scale,
    out,
    window=0,
    score_queries=None,
    softcap=0.0,
    sinks=None,
):
    """Causal flash attention over the paged cache for a packed batch of query tokens.

    q: (T, n_heads, head_dim); out: same shape.
    block_tables: (S, max_blocks) int32 block ids per sequence.
    positions[t]: the position of query token t; it attends to positions 0..positions[t] of its sequence,
      or with window > 0 (a sliding-window layer) only to the last `window` of them: blocks wholly
      before the tile's first window are never read.
    items: (W, 4) int32 rows (seq, kv_head, t_begin, t_end): one work item per sequence, KV head and tile
      of that sequence's query tokens. Every query head of the KV head's group shares each block; an
      online softmax per query keeps memory O(tile), never the full score matrix.
    score_queries: queries per key load in the scores pass, 2 or 4 (None: the tier's, SCORE_QUERIES); the
      same bits either way.
    softcap > 0 (gemma2's attn_logit_softcapping): each score is softcap * tanh(scale q.k / softcap), as ggml's
      flash attention computes it (scale divided by softcap in float32, then tanh), by a kernel variant of its
      own; 0 runs the uncapped kernel.
    sinks: (n_heads,) float32 or None (gpt-oss's attn_sinks): each query head's learned logit joins its softmax's
      denominator as a score with no value (not scaled), as llama.cpp's attention with sinks computes it, by a
      kernel variant of its own; None runs the kernel without them.
    """
    capped = softcap > 0
    with_sinks = sinks is not None
    if with_sinks and sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks must hold one logit per query head ({q.shape[1]}), not shape {sinks.shape}")
    attend = _attend_kernel(SCORE_QUERIES if score_queries is None else score_queries, capped, with_sinks)
    cap = np.float32(softcap if capped else 1.0)
    sink_logits = np.ascontiguousarray(sinks, dtype=np.float32) if with_sinks else _NO_SINKS
    return attend(
        q,
        k_cache,
        v_cache,
        block_tables,
        positions,
        items,
        np.float32(scale) / cap if capped else scale,
        out,
        window,
        get_num_threads(),
        cap,
        sink_logits,
    )
