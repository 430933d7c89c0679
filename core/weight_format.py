"""Which weight format a model loads in: "native" (the file's blocks, memory-mapped) or "f32" (a dequantized
copy), for Engine.from_model's weights="auto" | "f32" | "native", and the sentence saying why."""

from __future__ import annotations

import os

import numpy as np

from . import defaults
from .errors import MiroError
from .gguf_file import GGUFFile
from .kv_cache import parse_size


def default_max_weight_memory() -> int:
    """Auto's default budget for float32 weights: half the machine's physical memory."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * defaults.WEIGHT_MEMORY_FRACTION)


def f32_weight_bytes(gguf: GGUFFile) -> int:
    """Bytes of a float32 copy of every matrix in the file (a tied output head counts twice: embedding and head)."""
    matrices = [t for t in gguf.tensors.values() if len(t.shape) == 2]
    total = sum(int(np.prod(t.shape)) for t in matrices) * 4
    if "output.weight" not in gguf.tensors and "token_embd.weight" in gguf.tensors:
        total += int(np.prod(gguf.tensors["token_embd.weight"].shape)) * 4
    return total


def choose_weight_format(weights: str, f32_bytes: int, max_weight_memory: str | int | None) -> tuple[str, str]:
    """The format to load ("f32" or "native") and a sentence saying why.

    auto: f32 when its copy fits the budget, else native (both batch-invariant when asked: native by
    construction, f32 through the invariant GEMM)."""
    if weights not in defaults.WEIGHT_CHOICES:
        raise MiroError(f"weights must be one of {', '.join(defaults.WEIGHT_CHOICES)}, not {weights!r}.")
    budget = default_max_weight_memory() if max_weight_memory is None else parse_size(max_weight_memory)
    if weights != "auto":
        return weights, f"weights: {weights} (asked for)"
    if f32_bytes <= budget:
        return "f32", (f"weights: f32 (auto: a float32 copy takes {_size(f32_bytes)}, within the "
                       f"{_size(budget)} weight budget)")
    return "native", (f"weights: native (auto: a float32 copy would take {_size(f32_bytes)}, over the "
                      f"{_size(budget)} weight budget; the quantized tensors are used as stored)")


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
