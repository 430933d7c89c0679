"""float32 GEMMs `x @ w` over weights dequantized to (in, out) arrays: OpenBLAS, or numba when rows must not
depend on their batch."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import kernels


def linear_blas(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w through OpenBLAS: fast, but a row's rounding can depend on the row count and position."""
    return x @ w


def linear_invariant(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w with every row computed the same way whatever else is in the batch (numba, slower)."""
    return kernels.matmul_invariant(np.ascontiguousarray(x), w, np.empty((x.shape[0], w.shape[1]), np.float32))


def gemm(batch_invariant: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """OpenBLAS's sgemm may round a row differently depending on how many rows the call has and where the row
    sits (it does with its Haswell/Zen kernels), so a token's logits can depend on its batch. The
    batch-invariant GEMM computes every row identically, at a throughput cost."""
    return linear_invariant if batch_invariant else linear_blas
