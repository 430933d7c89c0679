"""The KV cache's memory: its pages become resident as blocks are first written, 4 KiB at a time, so a run holds
the cache it uses and not --kv-cache-memory from load. numpy's own allocation asks for transparent huge pages,
with which one 16 KiB block of a layer made 2 MiB resident."""

from __future__ import annotations

import numpy as np

from miro.core.engine.kv_cache import KVCache
from miro.core.loading.model_config import ModelConfig


def mapping_of(array: np.ndarray) -> dict[str, int]:
    """The kB fields (Rss, AnonHugePages, ...) of /proc/self/smaps summed over the mappings that hold this array's
    bytes (a madvise splits one allocation into several)."""
    first, last = array.ctypes.data, array.ctypes.data + array.nbytes
    fields: dict[str, int] = {}
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start < last and first < end
        elif inside and line.split()[-1] == "kB":
            fields[head.rstrip(":")] = fields.get(head.rstrip(":"), 0) + int(line.split()[1])
    return fields


def config(n_layers: int = 8) -> ModelConfig:
    return ModelConfig(
        architecture="llama",
        n_layers=n_layers,
        dim=512,
        n_heads=8,
        n_kv_heads=4,
        head_dim=64,
        ffn_dim=1024,
        vocab_size=1000,
        context_length=4096,
        rope_theta=10000.0,
        rms_eps=1e-5,
    )


def test_a_blocks_pages_become_resident_when_first_written_not_at_load():
    cfg = config()
    block_bytes = KVCache.bytes_per_block(cfg, 16, "float16")
    cache = KVCache(cfg, num_blocks=(256 << 20) // block_bytes, block_size=16, dtype="float16")  # 256 MiB
    assert mapping_of(cache.k)["Rss"] < 64 and mapping_of(cache.v)["Rss"] < 64  # kB: nothing touched yet

    cache.k[:, 3] = 1.0  # one block, every layer: 8 x 16 KiB of K
    cache.v[:, 3] = 2.0
    one_block_kb = block_bytes // 2 // 1024  # K's share, all layers
    for array in (cache.k, cache.v):
        held = mapping_of(array)
        assert held.get("AnonHugePages", 0) == 0
        assert held["Rss"] <= 2 * one_block_kb, held  # not 2 MiB a layer
    assert float(cache.k[:, 3].sum()) == cache.k[:, 3].size and float(cache.k[:, 4].sum()) == 0.0


def test_copy_on_write_copies_a_block_in_every_layer():
    cache = KVCache(config(n_layers=3), num_blocks=8, block_size=16, dtype="float32")
    cache.k[:, 1] = np.arange(cache.k[:, 1].size, dtype=np.float32).reshape(cache.k[:, 1].shape)
    cache.v[:, 1] = 5.0
    cache.copy_blocks([(1, 6)])
    assert np.array_equal(cache.k[:, 6], cache.k[:, 1]) and np.array_equal(cache.v[:, 6], cache.v[:, 1])
    assert cache.nbytes == 2 * 3 * 8 * 4 * 64 * 16 * 4
