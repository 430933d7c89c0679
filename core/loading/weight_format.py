"""Which weight format a model loads in: "native" (the file's blocks, memory-mapped or repacked), "f32" (a
dequantized copy), "bf16" (that copy in bfloat16, on CPUs with AVX512_BF16) or "i16" (in 13-bit integers per
block of 128, on x86), for Engine.from_model's weights="auto" | "f32" | "native" | "bf16" | "i16", and the
sentence saying why.

auto takes the format that is faster for the file's weight types on this CPU's tier, by their measured
speed-ups (each row's in the table of weight types, core/kernels/weight_types.py), and f32 only when its copy
also fits the memory budget. The two give different numbers, each batch-invariant: native follows llama.cpp
(activations quantized to 8 bits per block, integer dots), f32 follows a float32 reference such as HF
transformers (docs/engine.md, "Weights kept quantized" and "auto"). An encoder (an embedding model) takes bf16
where the CPU has it: twice float32's rate, and all-MiniLM-L6-v2's vectors stay within 0.9999 cosine of
sentence-transformers' float32 ones, where its native Q8_0 weights fall to 0.998 (tests/core/test_embeddings.py).
Without bfloat16 it takes i16 (x86 CPUs with AVX2): vpmaddwd does twice float32's products per instruction, and 13
bits per block of 128 keep the vectors closer to float32's than bfloat16 does.

Where AMX runs bfloat16 tiles (Sapphire Rapids and later Xeons), bf16 multiplies by TDPBF16PS
(core/kernels/amx_bf16.py). auto still keeps native for a decoder there: on the default model and 48 ShareGPT
prompts bf16 ran 1.02-1.06x native end to end (its weights, 3x the file's bytes, are read from memory every
step), its numbers are not llama.cpp's, and its copy adds 310 MiB."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.loading.gguf_file import GGUFFile, TensorInfo
from miro.core.engine.kv_cache import parse_size
from miro.core.kernels.weight_types import WEIGHT_TYPES

# Native kernels' throughput over the float32 copy's (the batch-invariant GEMM), per measured tier and weight
# type: each row's `speedup` in the table of weight types (core/kernels/weight_types.py), measured by
# `python benchmarks/weight_speeds.py [--tier avx2]`. Tiers not measured take the nearest measured one's
# (TABLE_OF); a type without a figure counts as f32-speed (1.0).
TABLE_OF = {"avx512-vnni": "avx512-vnni", "avx512": "avx2", "avx-vnni": "avx2", "avx2": "avx2"}  # portable: none
NATIVE_SPEEDUP = {
    tier: {row.name: row.speedup[tier] for row in WEIGHT_TYPES.values() if tier in row.speedup}
    for tier in dict.fromkeys(TABLE_OF.values())
}


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


def matmul_tensors(gguf: GGUFFile) -> list[TensorInfo]:
    """The matrices a forward pass multiplies by: every 2-D tensor, the token embedding only as a tied head."""
    tied = "output.weight" not in gguf.tensors
    return [t for t in gguf.tensors.values() if len(t.shape) == 2 and (t.name != "token_embd.weight" or tied)]


def native_speedup(tensors: list[TensorInfo], tier: str) -> float | None:
    """How much faster the native kernels are estimated to run these matrices than a float32 copy on `tier`:
    the time of each at its type's measured speed-up, weighted by its size; None where nothing is measured."""
    measured = TABLE_OF.get(tier)
    if measured is None:
        return None
    sizes = [(int(np.prod(t.shape)), _speedup(t.type, measured)) for t in tensors]
    return sum(n for n, _ in sizes) / sum(n / speedup for n, speedup in sizes)


def _speedup(qtype, tier: str) -> float:
    row = WEIGHT_TYPES.get(qtype)
    return row.speedup.get(tier, 1.0) if row is not None else 1.0


@dataclass(frozen=True)
class WeightChoice:
    format: str  # "f32", "native", "bf16" or "i16"
    why: str  # one sentence: "weights: native (auto: ...)"
    announce: bool  # worth a line on stderr: native asked for, or taken because a float32 copy would not fit


def choose_weight_format(
    weights: str,
    f32_bytes: int,
    max_weight_memory: str | int | None,
    speedup: float | None = None,
    tier: str = "",
    encoder: bool = False,
    has_bf16: bool = False,
    has_int16: bool = False,
) -> WeightChoice:
    """The format to load ("f32", "native", "bf16" or "i16") and a sentence saying why.

    auto: for an encoder, bf16 where the CPU has it (`has_bf16`), else i16 where the int16 GEMM runs
    (`has_int16`); else native when its kernels are estimated
    faster on this tier (`speedup`, from native_speedup; a tie goes to f32) or the float32 copy is over the
    budget; else f32. All are batch-invariant when asked: native and bf16 by construction, f32 through the
    invariant GEMM."""
    if weights not in defaults.WEIGHT_CHOICES:
        raise MiroError(f"weights must be one of {', '.join(defaults.WEIGHT_CHOICES)}, not {weights!r}.")
    if weights == "bf16" and not has_bf16:
        raise MiroError(
            f"weights 'bf16' need a CPU with AVX512_BF16, and this one runs the {tier} tier without it: "
            f"use 'f32' or 'auto'."
        )
    if weights == "i16" and not has_int16:
        raise MiroError(
            f"weights 'i16' need an x86 CPU with AVX2, and this one runs the {tier} tier: use 'f32' or 'auto'."
        )
    budget = default_max_weight_memory() if max_weight_memory is None else parse_size(max_weight_memory)
    if weights != "auto":
        return WeightChoice(weights, f"weights: {weights} (asked for)", weights == "native")
    if encoder and has_bf16 and f32_bytes // 2 <= budget:
        return WeightChoice(
            "bf16",
            "weights: bf16 (auto: an encoder on a CPU with AVX512_BF16: its matrices in "
            "bfloat16, multiplied at twice float32's rate)",
            False,
        )
    if encoder and has_int16 and f32_bytes // 2 <= budget:
        return WeightChoice(
            "i16",
            "weights: i16 (auto: an encoder on a CPU without AVX512_BF16: its matrices in "
            "13-bit integers per block of 128, multiplied by vpmaddwd)",
            False,
        )
    if speedup is not None and speedup > 1.0:
        return WeightChoice(
            "native",
            f"weights: native (auto: on the {tier} tier the file's kernels are estimated "
            f"{speedup:.1f}x as fast as a float32 copy, which they do without)",
            False,
        )
    if f32_bytes <= budget:
        measured = (
            f", and the file's kernels are estimated {speedup:.2f}x its speed on the {tier} tier"
            if speedup is not None
            else ""
        )
        return WeightChoice(
            "f32",
            f"weights: f32 (auto: a float32 copy takes {_size(f32_bytes)}, within the "
            f"{_size(budget)} weight budget{measured})",
            False,
        )
    return WeightChoice(
        "native",
        f"weights: native (auto: a float32 copy would take {_size(f32_bytes)}, over the "
        f"{_size(budget)} weight budget; the quantized tensors are used as stored)",
        True,
    )


def choose_for_file(gguf: GGUFFile, weights: str, max_weight_memory: str | int | None, encoder: bool) -> WeightChoice:
    """choose_weight_format for a model file on this CPU's tier, as Engine.from_model and `miro models inspect` call
    it, and what a rerun that
    reuses earlier rows (worker/fleet/output/fingerprint.py) predicts the engine will load, before it loads anything
    (tests/e2e/test_reuse_runs.py holds the two to the same choice)."""
    from miro.core.kernels import cpu

    tier = cpu.TIER.name
    return choose_weight_format(
        weights,
        f32_weight_bytes(gguf),
        max_weight_memory,
        native_speedup(matmul_tensors(gguf), tier),
        tier,
        encoder=encoder,
        has_bf16=cpu.HAS_BF16_DOT,
        has_int16=cpu.HAS_INT16_DOT,
    )


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
