"""The CPU the kernels are compiled for, named as a tier, and which kernel each weight type takes there.

numba compiles for the host unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise, so the features are
read from what numba will compile for, never from the host directly: under the AVX2 emulation
(`emulation_env` below) an AVX-512 machine is an AVX2 one here too.

Tiers, best first (a tier can run the kernels of the tiers it lists in `runs`):

    avx512-vnni   512-bit vectors, int8 dots by vpdpbusd            (Zen 4, Ice Lake and later servers)
    avx512        512-bit vectors, int8 dots by vpmaddubsw+vpmaddwd (Skylake-X, Cascade Lake without VNNI)
    avx-vnni      256-bit vectors, int8 dots by vpdpbusd            (Alder Lake and later desktops)
    avx2          256-bit vectors, int8 dots by vpmaddubsw+vpmaddwd (Haswell to Zen 3, AVX-512 hidden VMs)
    portable      whatever LLVM makes of plain loops                (aarch64, x86 without AVX2)

Every kernel gives the same bits on every tier (integer sums are exact; the float steps are the same IEEE
operations in the same order); the tier chooses only the loop shape and the instructions.

`weight_kernels(qtype, tier)` is the table ggml keeps as `type_traits_cpu`: for a weight type, how its
tensors are stored (the file's rows, or repacked into 16-row tiles) and which kernel takes how many
activation rows. `Linear` asks it and nothing else reads the CPU. MIRO_CPU_TIER names a lower tier to run
(to compare tiers, or to rule out a kernel).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import llvmlite.binding as llvm
from gguf import GGMLQuantizationType
from numba.core import config

from ..errors import MiroError


@dataclass(frozen=True)
class Tier:
    name: str
    vector_bits: int  # the vector width the kernels are shaped for: 512, 256, or 0 (portable: LLVM's choice)
    int8_dot: str  # "vpdpbusd", "vpmaddubsw" (vpmaddubsw + vpmaddwd), or "" (portable loops)
    needs: frozenset[str]  # LLVM features the tier's instructions need, any one set of them
    runs: tuple[str, ...]  # the tiers whose kernels this one can execute, itself first

    @property
    def has_vnni(self) -> bool:
        return self.int8_dot == "vpdpbusd"


_BASE_256 = frozenset({"avx2", "fma", "f16c"})
_BASE_512 = _BASE_256 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}

TIERS: dict[str, Tier] = {
    "avx512-vnni": Tier("avx512-vnni", 512, "vpdpbusd", _BASE_512 | {"avx512vnni"},
                        ("avx512-vnni", "avx512", "avx-vnni", "avx2", "portable")),
    "avx512": Tier("avx512", 512, "vpmaddubsw", _BASE_512, ("avx512", "avx2", "portable")),
    "avx-vnni": Tier("avx-vnni", 256, "vpdpbusd", _BASE_256 | {"avxvnni"}, ("avx-vnni", "avx2", "portable")),
    "avx2": Tier("avx2", 256, "vpmaddubsw", _BASE_256, ("avx2", "portable")),
    "portable": Tier("portable", 0, "", frozenset(), ("portable",)),
}


def compiled_features() -> frozenset[str]:
    """The LLVM features numba compiles for: NUMBA_CPU_FEATURES when set, else the host's."""
    if config.CPU_FEATURES is not None:
        flags = config.CPU_FEATURES.split(",")
        return frozenset(f[1:] for f in flags if f.startswith("+"))
    return frozenset(name for name, on in llvm.get_host_cpu_features().items() if on)


def tier_of(features: frozenset[str]) -> Tier:
    """The best tier whose instructions these features have. AVX512-VNNI with AVX512-VL gives the 256-bit
    vpdpbusd too, so such a CPU can run the avx-vnni kernels."""
    for tier in TIERS.values():
        if tier.needs <= features:
            return tier
        if tier.name == "avx-vnni" and _BASE_256 | {"avx512vnni", "avx512vl"} <= features:
            return tier
    return TIERS["portable"]


COMPILED = tier_of(compiled_features())  # the best tier this process's machine code can run

# Whether LLVM turns float16 <-> float32 into instructions here (F16C on x86; aarch64 always). Without them it
# calls compiler-rt's __extendhfsf2, which numba's JIT cannot resolve: halfs.py then converts with integer ops.
HALF_IN_HARDWARE = (platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")
                    or "f16c" in compiled_features())


def _chosen() -> Tier:
    asked = os.environ.get("MIRO_CPU_TIER", "").strip()
    if not asked:
        return COMPILED
    if asked not in TIERS:
        raise MiroError(f"MIRO_CPU_TIER={asked!r} is not a tier; the tiers are {', '.join(TIERS)}.")
    if asked not in COMPILED.runs:
        raise MiroError(f"MIRO_CPU_TIER={asked} needs instructions this CPU lacks; it runs {', '.join(COMPILED.runs)}.")
    return TIERS[asked]


TIER = _chosen()  # the tier this process runs: COMPILED unless MIRO_CPU_TIER asks for a lower one
# Whether the bfloat16 GEMM (bf16_gemm.py: vdpbf16ps) runs here: AVX512_BF16 compiled for, on a 512-bit tier
HAS_BF16_DOT = "avx512bf16" in compiled_features() and TIER.vector_bits == 512
# Whether the int16 GEMM (int16_gemm.py: 256-bit vpmaddwd) runs here: every x86 tier has AVX2
HAS_INT16_DOT = TIER.vector_bits >= 256


def runnable() -> tuple[str, ...]:
    """The tiers this process can execute, best first (for tests that compare them)."""
    return COMPILED.runs


def get(name: str | None) -> Tier:
    """The tier called `name` (None: the running one), refused when this CPU cannot execute it."""
    if name is None:
        return TIER
    if name not in TIERS:
        raise ValueError(f"unknown CPU tier {name!r}; the tiers are {', '.join(TIERS)}")
    if name not in COMPILED.runs:
        raise ValueError(f"this CPU cannot run the {name} tier; it runs {', '.join(COMPILED.runs)}")
    return TIERS[name]


# ---------------------------------------------------------------- the per-type table

_Q = GGMLQuantizationType
# repacked into 16-row tiles where a tier has int8 dots (tiles.py; the K-quants superblock_tiles.py)
TILE_TYPES = tuple(int(t) for t in (_Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q8_0, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K))
_SUPERBLOCK_TILE_TYPES = (int(_Q.Q4_K), int(_Q.Q5_K), int(_Q.Q6_K))


@dataclass(frozen=True)
class WeightKernels:
    """How a quantized weight type is stored and multiplied on one tier."""

    layout: str  # "tiles": repacked at load into 16-row tiles (tiles.py, superblock_tiles.py), the tile kernel
    #              at every row count; "rows": the file's rows, memory-mapped (the portable tier)
    lanes_from: int  # "rows": from this many activation rows, the lanes kernel (each block decoded once for
    #                  all rows, quant_kernels.py); below, row by row
    tile_tokens: int  # "tiles": activation rows per pass of the tile kernel (what the registers hold: 8 on
    #                   512-bit tiers, 2 on 256-bit ones; the K-quants more, _SUPERBLOCK_TILE_TOKENS); rows past
    #                   the last multiple of it take 2 a pass (padding 1 row to 8 would do 8 times the work)

    def tokens_per_pass(self, n_rows: int) -> int:
        return self.tile_tokens if n_rows >= self.tile_tokens else 2

    def split(self, n_rows: int) -> int:
        """The rows of n_rows that take tile_tokens a pass; the rest take 2."""
        return n_rows - n_rows % self.tile_tokens if self.tile_tokens else 0


_LANES_FROM = 8  # the portable tier's lanes kernel beats row by row from here
# Activation rows per pass of the tile kernels, by vector width: 32-value blocks measured on 2048 x 2048 matrices,
# 2 Zen 4 cores (benchmarks/quant_linear.py). The K-quant kernel keeps a call's weight vectors in registers and
# its int32 sums in memory, so its rows per pass are free of registers: 16 ran 1.08-1.38x 4 (AVX2: Q4_K, Q6_K),
# 1.09-1.19x 8 (AVX-512 Q6_K) and 1.02-1.11x 8 with two tiles a pass (AVX-512 Q4_K) from 16 rows on; Q5_K keeps
# 8 on AVX-512, where 16 was 0.79-1.10x. One Zen 4 core, old and new interleaved.
_TILE_TOKENS = {512: 8, 256: 2}
_Q4K, _Q5K, _Q6K = _SUPERBLOCK_TILE_TYPES
_SUPERBLOCK_TILE_TOKENS = {(512, _Q4K): 16, (512, _Q5K): 8, (512, _Q6K): 16, (256, _Q4K): 16, (256, _Q5K): 16,
                           (256, _Q6K): 16}


def weight_kernels(qtype: int, tier: Tier) -> WeightKernels:
    qtype = int(qtype)
    if not tier.int8_dot or qtype not in TILE_TYPES:
        return WeightKernels("rows", _LANES_FROM, 0)
    if qtype in _SUPERBLOCK_TILE_TYPES:
        return WeightKernels("tiles", 0, _SUPERBLOCK_TILE_TOKENS[tier.vector_bits, qtype])
    return WeightKernels("tiles", 0, _TILE_TOKENS[tier.vector_bits])


def describe() -> str:
    """One line for logs: the tier, and what numba compiles for when that differs from the host."""
    line = f"cpu tier {TIER.name}"
    if TIER is not COMPILED:
        line += f" (MIRO_CPU_TIER; the CPU runs {COMPILED.name})"
    if config.CPU_NAME or config.CPU_FEATURES is not None:
        line += f", numba compiling for {config.CPU_NAME or llvm.get_host_cpu_name()} as set by NUMBA_CPU_*"
    return line


# What makes an AVX-512 machine compile and run as an AVX2-only one (the features a Zen 4 VM that hides
# AVX-512 reports to LLVM): numba's target (NUMBA_CPU_NAME alone keeps the host's
# features), numpy's dispatch and OpenBLAS's kernels. Set in a child process's environment, before it
# imports numpy: for the benchmarks and the test that runs the kernels under it.
AVX2_FEATURES = ("+64bit,+adx,+aes,+avx,+avx2,+bmi,+bmi2,+clflushopt,+clwb,+clzero,+cmov,+crc32,+cx16,+cx8,+f16c,"
                 "+fma,+fsgsbase,+fxsr,+invpcid,+lzcnt,+mmx,+movbe,+pclmul,+popcnt,+prfchw,+rdpid,+rdrnd,+rdseed,"
                 "+sahf,+sha,+shstk,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+sse4a,+ssse3,+vaes,+vpclmulqdq,+xsave,+xsavec,"
                 "+xsaveopt,+xsaves,-avx512f,-avx512vl,-avx512bw,-avx512dq,-avx512vnni,-avxvnni")
EMULATIONS: dict[str, dict[str, str]] = {
    "avx2": {
        "NUMBA_CPU_NAME": "znver4" if llvm.get_host_cpu_name() == "znver4" else "haswell",
        "NUMBA_CPU_FEATURES": AVX2_FEATURES,
        "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
        "OPENBLAS_CORETYPE": "Haswell",
    },
    "portable": {"NUMBA_CPU_NAME": "generic"},
}


def emulation_env(tier: str) -> dict[str, str]:
    """Environment variables under which a child process on this machine compiles for `tier` and reports it."""
    if tier not in EMULATIONS:
        raise ValueError(f"no emulation of the {tier} tier; there is one of {', '.join(EMULATIONS)}")
    return {**EMULATIONS[tier], "MIRO_CPU_TIER": tier}
