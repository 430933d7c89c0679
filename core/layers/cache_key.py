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

_HELPER_MODULES = ("halfs.py", "simd.py", "vnni.py", "quant_blocks.py")

HELPERS = hashlib.sha256(b"".join((Path(__file__).parent / name).read_bytes() for name in _HELPER_MODULES)).hexdigest()
