"""The structured-output token mask applied to a step's logits, in numba (the bits come from llguidance)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def mask_rows(logits, rows, bits, emptied):
    """Structured output: logits[rows[j], t] = -inf for every token t whose bit is clear in bits[j] (packed int32
    words, bit t % 32 of word t // 32). emptied[j] is set when no finite logit is left in that row."""
    vocab = logits.shape[1]
    for j in range(rows.shape[0]):
        row = rows[j]
        finite_left = False
        for w in range(bits.shape[1]):
            word = bits[j, w]
            base = w * 32
            for b in range(min(32, vocab - base)):
                if (word >> b) & 1:
                    if np.isfinite(logits[row, base + b]):
                        finite_left = True
                else:
                    logits[row, base + b] = -np.inf
        emptied[j] = not finite_left
