"""The KV cache memory pool, and sizing it from a byte budget such as "2GiB"."""

from __future__ import annotations

import re

import numpy as np

from .config import ModelConfig
from .errors import MiroError

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1024**2,
          "g": 1e9, "gb": 1e9, "gib": 1024**3, "t": 1e12, "tb": 1e12, "tib": 1024**4}


def parse_size(text: str | int) -> int:
    """'2GiB', '512MB', '1.5g' or a plain number of bytes -> bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise MiroError(f"cannot read '{text}' as a memory size (examples: 2GiB, 512MB, 1000000).")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class KVCache:
    """K and V for every layer: (n_layers, num_blocks, n_kv_heads, block_size, head_dim) float32."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16):
        shape = (config.n_layers, num_blocks, config.n_kv_heads, block_size, config.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        # np.empty + fill touches every page now, not during the first steps.
        self.k = np.empty(shape, dtype=np.float32)
        self.v = np.empty(shape, dtype=np.float32)
        self.k.fill(0.0)
        self.v.fill(0.0)

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int) -> int:
        return 2 * config.n_layers * config.n_kv_heads * block_size * config.head_dim * 4

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate block src into block dst in every layer."""
        for src, dst in copies:
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]
