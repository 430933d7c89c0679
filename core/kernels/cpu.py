"""The CPU the kernels are compiled for, named as a tier.

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

What each weight type takes on a tier (ggml's `type_traits_cpu`: the file's rows or 16-row tiles, which kernel
for how many activation rows) is its row's `plan(tier)` in weight_types.py, the one table of weight types.
MIRO_CPU_TIER names a lower tier to run (to compare tiers, or to rule out a kernel).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import llvmlite.binding as llvm
from numba.core import config

from miro.core.errors import MiroError


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
    "avx512-vnni": Tier(
        "avx512-vnni",
        512,
        "vpdpbusd",
        _BASE_512 | {"avx512vnni"},
        ("avx512-vnni", "avx512", "avx-vnni", "avx2", "portable"),
    ),
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
HALF_IN_HARDWARE = (
    platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686") or "f16c" in compiled_features()
)


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
# features), numpy's dispatch and OpenBLAS's kernels. GFNI is named off too: znver4 implies it, the VM hid it, and
# no AVX2-only core (Haswell to Zen 3) has it; with it LLVM turned the kernels' byte shifts into vgf2p8affineqb.
# Set in a child process's environment, before it imports numpy: for the benchmarks and the test that runs the
# kernels under it.
AVX2_FEATURES = (
    "+64bit,+adx,+aes,+avx,+avx2,+bmi,+bmi2,+clflushopt,+clwb,+clzero,+cmov,+crc32,+cx16,+cx8,+f16c,"
    "+fma,+fsgsbase,+fxsr,+invpcid,+lzcnt,+mmx,+movbe,+pclmul,+popcnt,+prfchw,+rdpid,+rdrnd,+rdseed,"
    "+sahf,+sha,+shstk,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+sse4a,+ssse3,+vaes,+vpclmulqdq,+xsave,+xsavec,"
    "+xsaveopt,+xsaves,-avx512f,-avx512vl,-avx512bw,-avx512dq,-avx512vnni,-avxvnni,-gfni"
)
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
