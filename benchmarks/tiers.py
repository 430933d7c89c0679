"""The CPU tier a benchmark runs on, and the llama.cpp build it is compared with.

    parser = argparse.ArgumentParser(...); tiers.add_argument(parser); args = parser.parse_args()
    tiers.enter(args)          # --tier avx2 on an AVX-512 machine: the script runs again under the emulation
    print(tiers.header(args))  # the tier, what numba compiles for, OpenBLAS's kernels, llama.cpp's build

`--tier avx2` re-executes the script with the environment of `miro.core.kernels.cpu.emulation_env("avx2")`:
numba compiling for an AVX2-only CPU (NUMBA_CPU_NAME and NUMBA_CPU_FEATURES: the name alone keeps the host's
features), numpy's dispatch without AVX-512 and OpenBLAS's Haswell kernels, as on a VM that hides AVX-512.
Compare it with llama.cpp built for the same tier (`--llama-python` of a venv built with
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF
-DGGML_AVX_VNNI=OFF", as docs/benchmarks.md says).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tier", help="run under this CPU tier's emulation (avx2, portable); default: this CPU's own")


def enter(args: argparse.Namespace) -> None:
    """Re-run this script under --tier's emulation unless this process already compiles for it."""
    if not args.tier:
        return
    from miro.core.kernels import cpu

    if cpu.TIER.name == args.tier:
        return
    if os.environ.get("MIRO_CPU_TIER") == args.tier:
        raise SystemExit(f"--tier {args.tier}: the emulation did not take (this process runs {cpu.TIER.name})")
    env = {**os.environ, **cpu.emulation_env(args.tier)}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def llama_cpp_build(python: str | None) -> str:
    """llama.cpp's own line of the CPU features it was built for (AVX2 = 1 | AVX512 = 0 | ...)."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    done = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return "not importable"
    info = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    wanted = ("AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX_VNNI", "FMA", "F16C", "REPACK")
    kept = [part.strip() for part in info.split("|") if part.strip().split(" = ")[0] in wanted]
    return " | ".join(kept) or info


def header(args: argparse.Namespace | None = None, llama_python: str | None = None, with_llama: bool = True) -> str:
    """One line: the tier and what numba compiles for, OpenBLAS's core type, llama.cpp's interpreter and build."""
    from miro.core.kernels import cpu

    line = cpu.describe()
    line += f"; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}"
    if with_llama:
        line += f"; llama.cpp ({llama_python or sys.executable}): {llama_cpp_build(llama_python)}"
    return line
