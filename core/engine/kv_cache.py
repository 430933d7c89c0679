"""The KV cache memory pool, and sizing it from a byte budget such as "2GiB"."""

from __future__ import annotations

import mmap
import re

import numpy as np

from miro.core import defaults
from miro.core.loading.model_config import ModelConfig
from miro.core.errors import MiroError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 1024,
    "m": 1e6,
    "mb": 1e6,
    "mib": 1024**2,
    "g": 1e9,
    "gb": 1e9,
    "gib": 1024**3,
    "t": 1e12,
    "tb": 1e12,
    "tib": 1024**4,
}


def parse_size(text: str | int) -> int:
    """'2GiB', '512MB', '1.5g' or a plain number of bytes -> bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise MiroError(f"cannot read '{text}' as a memory size (examples: 2GiB, 512MB, 1000000).")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


# a cache dtype's name -> the numpy dtype its values are stored as (float16 as its bits: numba has no float16)
KV_STORAGE = {"float32": np.float32, "float16": np.uint16}


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    if kv_cache_dtype not in KV_STORAGE:
        raise MiroError(
            f"the KV cache dtype must be one of {', '.join(defaults.KV_CACHE_DTYPES)}, not {kv_cache_dtype!r}."
        )
    return kv_cache_dtype


def check_kv_layout(config: ModelConfig, block_size: int) -> None:
    """The attention kernel takes keys 16 at a time and head dimensions 16 at a time."""
    if block_size % 16:
        raise MiroError(f"the KV cache's block size must be a multiple of 16 tokens, not {block_size}.")
    if config.head_dim % 16:
        raise MiroError(
            f"miro's attention needs a head dimension that is a multiple of 16; this model's is {config.head_dim}."
        )


def zeroed_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array whose pages the OS fills on first write, in 4 KiB pages: a block's pages become resident when
    a sequence first uses it, so a run holds the cache it uses, not the whole --kv-cache-memory (1 GiB by default)
    from load. Not numpy's own allocation: numpy asks for transparent huge pages on large arrays, so a 16 KiB block
    of one layer made 2 MiB resident (one sequence of the Qwen3-MoE-shaped benchmark held 60 MiB of KV for 7 tokens)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux; where THP is "always", a first write would still fault in 2 MiB
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


class KVCache:
    """K and V for every layer, in layers/attention.py's layout:
    k (n_layers, num_blocks, n_kv_heads, head_dim, block_size), v (n_layers, num_blocks, n_kv_heads,
    block_size, head_dim), as float32 or float16 ("float16" halves the bytes attention reads)."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = defaults.BLOCK_SIZE,
        dtype: str = defaults.KV_CACHE_DTYPE,
    ):
        check_kv_layout(config, block_size)
        heads = (config.n_layers, num_blocks, config.n_kv_heads)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.k = zeroed_pages(heads + (config.head_dim, block_size), KV_STORAGE[dtype])
        self.v = zeroed_pages(heads + (block_size, config.head_dim), KV_STORAGE[dtype])

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: str = defaults.KV_CACHE_DTYPE) -> int:
        itemsize = np.dtype(KV_STORAGE[dtype]).itemsize
        return 2 * config.n_layers * config.n_kv_heads * block_size * config.head_dim * itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate block src into block dst in every layer."""
        for src, dst in copies:
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]
