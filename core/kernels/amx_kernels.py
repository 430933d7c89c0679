"""Which AMX int8 kernel a weight type's layers take: amx_tiles.py's for the 32-value blocks (Q4_0, Q4_1, Q8_0),
amx_superblocks.py's for the K-quants. (Here, not in amx_tiles.py, which amx_superblocks.py imports.)"""

from __future__ import annotations

import functools

from miro.core.kernels import amx_superblocks, amx_tiles, cpu
from miro.core.kernels.quant_blocks import SUPERBLOCK_TYPES


@functools.cache
def kernel(qtype: int, tier_name: str):
    """The AMX kernel for a type on a tier (by name), made once per process."""
    if int(qtype) in SUPERBLOCK_TYPES:
        return amx_superblocks.amx_tiles_k(qtype, cpu.get(tier_name))
    return amx_tiles.amx_tiles_32(qtype, cpu.get(tier_name))
