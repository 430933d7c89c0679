"""Paged attention's online softmax over one block of 16 keys (attention_blocks.py runs it between the scores and
the values passes): which keys each query sees, four queries' running max, total and rescaling at once, the
soft-cap of gemma2's scores and gpt-oss's sink logits. Inlined into the attention kernel, so this file is in
numba's cache key (kernels/cache_key.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from miro.core.kernels.simd import LANES, exp16, hmax4, hsum4, keep_lanes, load16, store16, zeros16


@njit
def _add_sink(sink, qi, top, total, acc, head_dim):
    """Query qi's sink logit as one more score without a value, after all its keys, as ggml's flash attention
    adds it (ggml_compute_forward_flash_attn_ext, "sinks"): a sink above the running max rescales the values'
    sum by e^(max - sink) and adds 1 to the total, else the total gains e^(sink - max)."""
    m = top[qi]
    if sink > m:
        ms = np.exp(m - sink)
        for d in range(head_dim):
            acc[qi * head_dim + d] *= ms
        total[qi] = total[qi] * ms + np.float32(1.0)
    else:
        total[qi] += np.exp(sink - m)


@njit
def _softcap(scores, n_q, cap):
    """Every query's 16 scores s -> cap * tanh(s) (s already times scale / cap), in float32."""
    for i in range(n_q * LANES):
        scores[i] = cap * np.tanh(scores[i])


@njit(inline="always")
def _key_range(query_last, qi, base, window):
    """Which of the 16 keys from position base query qi sees: lanes first..end-1 (none where end <= first)."""
    seen = query_last[qi] + 1 - base  # keys of the 16 at or before the query
    end = min(seen, LANES)
    first = max(seen - window, 0) if window > 0 else 0
    return first, end


@njit(inline="always")
def _sees_whole_block(query_last, n_q, base, window):
    """Whether each of the item's n_q queries sees all 16 keys from position base."""
    lo, hi = query_last[0], query_last[0]
    for qi in range(1, n_q):
        lo, hi = min(lo, query_last[qi]), max(hi, query_last[qi])
    return lo + 1 - base >= LANES and (window == 0 or hi + 1 - base <= window)


@njit(inline="always")
def _rescale(top, new_top):
    """The factor a query's sums so far are scaled by when its running max rises from top to new_top."""
    return np.float32(1.0) if new_top == top else np.float32(np.exp(top - new_top))  # exp(0) is 1 exactly


@njit(inline="always")
def _online_softmax4(scores, qi, query_last, base, window, top, total, correction, four, whole):
    """For queries qi..qi + 3 (four, a constant: else the first 3, the 4th left as it is), each over the keys
    of the 16 it sees: its scores -> their e^(score - new top), in place, the other lanes 0; its running top
    and total brought up to date, and the factor its sum of values so far is to be scaled by (1 for a query
    that sees none: it keeps its state). The four queries' horizontal max and sum run in one interleaved tree
    (hmax4, hsum4); each query's arithmetic is its own, in the same order whichever three it shares the tree
    with. whole (a constant): every query of the item sees all 16 keys (every block but a prompt's diagonal
    ones and a decode's last), so no lane is masked: the same values without the selects."""
    f0, e0 = _key_range(query_last, qi, base, window)
    f1, e1 = _key_range(query_last, qi + 1, base, window)
    f2, e2 = _key_range(query_last, qi + 2, base, window)
    f3, e3 = _key_range(query_last, qi + 3, base, window) if four else (0, LANES)
    s0, s1 = load16(scores, qi * LANES), load16(scores, (qi + 1) * LANES)
    s2, s3 = load16(scores, (qi + 2) * LANES), load16(scores, (qi + 3) * LANES) if four else zeros16()
    if not whole:
        minus_inf = np.float32(-np.inf)
        s0, s1 = keep_lanes(s0, f0, e0, minus_inf), keep_lanes(s1, f1, e1, minus_inf)
        s2, s3 = keep_lanes(s2, f2, e2, minus_inf), keep_lanes(s3, f3, e3, minus_inf)
    m0, m1, m2, m3 = hmax4(s0, s1, s2, s3)
    n0, n1, n2 = max(top[qi], m0), max(top[qi + 1], m1), max(top[qi + 2], m2)
    n3 = max(top[qi + 3], m3) if four else m3
    c0, c1, c2 = _rescale(top[qi], n0), _rescale(top[qi + 1], n1), _rescale(top[qi + 2], n2)
    c3 = _rescale(top[qi + 3], n3) if four else np.float32(1.0)
    p0, p1, p2, p3 = exp16(s0 - n0), exp16(s1 - n1), exp16(s2 - n2), exp16(s3 - n3)
    if not whole:
        zero = np.float32(0.0)
        p0, p1 = keep_lanes(p0, f0, e0, zero), keep_lanes(p1, f1, e1, zero)
        p2, p3 = keep_lanes(p2, f2, e2, zero), keep_lanes(p3, f3, e3, zero)
    h0, h1, h2, h3 = hsum4(p0, p1, p2, p3)
    total[qi] = total[qi] * c0 + h0
    total[qi + 1] = total[qi + 1] * c1 + h1
    total[qi + 2] = total[qi + 2] * c2 + h2
    top[qi], top[qi + 1], top[qi + 2] = n0, n1, n2
    correction[qi], correction[qi + 1], correction[qi + 2] = c0, c1, c2
    store16(scores, qi * LANES, p0)
    store16(scores, (qi + 1) * LANES, p1)
    store16(scores, (qi + 2) * LANES, p2)
    if four:
        total[qi + 3] = total[qi + 3] * c3 + h3
        top[qi + 3], correction[qi + 3] = n3, c3
        store16(scores, (qi + 3) * LANES, p3)


# the same, compiled once and called, for decode's four forms (three queries or four, whole or not): each inlined
# copy costs numba's front end again, and with decode's inlined too the attention kernel's first compile took 23.5
# s (10.9 before the four-query softmax, 18.8 so; prefill's two inlined copies are its speed on long prompts)
_online_softmax4_called = njit(_online_softmax4.py_func)
