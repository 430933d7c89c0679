"""A fingerprint of the helper modules the cached kernels inline, for numba's on-disk cache.

numba's cache key covers a cached function's own file, bytecode and closure values, not the
helpers it inlines from other files: after an edit to quant_blocks.py, say, a kernel in
quant_kernels.py would keep running its stale cached code. So every cached kernel is made by a
function that binds `helpers = HELPERS` and names `helpers` in the kernel's body: a closure value,
part of the key, so an edit to any of these files recompiles them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from numba import njit

# among them every module whose njit functions or intrinsics another module imports (test_kernel_cache.py checks)
_HELPER_MODULES = (
    "halfs.py",
    "simd.py",
    "simd_narrowing.py",
    "int8_dots.py",
    "superblock_dots.py",
    "quant_blocks.py",
    "tiles.py",
    "tile_steps.py",
    "superblock_tiles.py",
    "grouped_passes.py",
    "q6_k_row.py",
    "quantize_activations.py",
    "attention_softmax.py",
    "attention_blocks.py",
    "attention_items.py",
    "amx.py",
    "f32_gemm.py",
)

HELPERS = hashlib.sha256(b"".join((Path(__file__).parent / name).read_bytes() for name in _HELPER_MODULES)).hexdigest()


def cached_variant(variant: str, **options):
    """njit(cache=True, **options) for a kernel a factory makes once per `variant` (a weight type).

    The variant goes into the function's qualname. numba names a compiled function's environment
    (which holds, among others, the dtype of an array it returns) after its qualname, its argument
    types and a counter local to the process that compiled it; two variants of one qualname compiled
    by different processes can get the same name, and a process that loads both from the cache then
    fails with "In 'NRT_adapt_ndarray_to_python', 'descr' is NULL". Distinct qualnames also give each
    variant its own cache index.
    """

    def decorate(function):
        function.__qualname__ = f"{function.__qualname__}_{variant}"
        function.__name__ = f"{function.__name__}_{variant}"
        return njit(cache=True, **options)(function)

    return decorate
