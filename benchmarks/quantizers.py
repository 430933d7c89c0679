"""The activation quantizers every native-weight GEMM runs first, in ns per value, against llama.cpp's own.

    python benchmarks/quantizers.py [--tokens 1,8,64,512] [--dims 576,1536,2048] [--rounds 5] [--calls 200]
                                    [--tier avx2] [--llama-python VENV/bin/python]

For each format, row length K and row count T, on random float32 activations (T, K):
- call: the quantizer as Linear calls it (quantize_activations.quantize_q8_32 / quantize_q8_k_quads /
  quantize_q8_k: the Python call, its output arrays, the serial or parallel path by PARALLEL_FROM);
- serial, parallel: the compiled row kernel alone on preallocated outputs, on the calling thread / split over
  numba's thread pool, called back to back (the pool awake): where they cross is the least PARALLEL_FROM could be
  (inside an engine step a parallel call may also wait for a busy core: see PARALLEL_FROM's comment);
- llama: llama.cpp's CPU quantizer for the same values (ggml-cpu's quantize_row_q8_0 / _q8_1 / _q8_K, SIMD for
  the tier its wheel was built for, one thread: ggml's mul_mat splits the rows over its threads), called through
  ctypes on all T x K values at once in the interpreter --llama-python names (a child process).
Each figure is the least over --rounds rounds of the median of --calls calls (the rounds interleave the sides;
on a machine shared with other work the median of a round moves, its least less). The machine's load average
is printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiers  # noqa: E402

from miro.core.kernels import quantize_activations as qa  # noqa: E402

FORMATS = {  # name: (the public quantizer, its row kernel, ggml's functions for the same blocks)
    "q8_0/q8_1": (qa.quantize_q8_32, qa._rows_q8_32, ("quantize_row_q8_0", "quantize_row_q8_1")),
    "q8_K quads": (qa.quantize_q8_k_quads, qa._rows_q8_k_quads, ("quantize_row_q8_K",)),
    "q8_K": (qa.quantize_q8_k, qa._rows_q8_k, ("quantize_row_q8_K",)),
}

LLAMA_SCRIPT = r'''
"""ggml-cpu's activation quantizers on stdin's cases; prints the least over rounds of each case's median seconds."""
import ctypes, json, sys, time
import numpy as np
from llama_cpp._ggml import libggml as g  # loads libggml, which loads libggml-cpu
import llama_cpp, os

cpu = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))
cpu.ggml_cpu_init()  # its float16 tables, where the CPU lacks F16C
cases, rounds, calls = json.loads(sys.stdin.read())
block_bytes = {"quantize_row_q8_0": (32, 34), "quantize_row_q8_1": (32, 36), "quantize_row_q8_K": (256, 292)}
results = {}
for _ in range(rounds):
    for name, t, k in cases:
        f = getattr(cpu, name)
        f.restype, f.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        x = np.random.default_rng(0).standard_normal((t, k)).astype(np.float32)
        values, size = block_bytes[name]
        y = np.empty(t * k // values * size, np.uint8)
        xp, yp = x.ctypes.data, y.ctypes.data
        f(xp, yp, t * k)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            f(xp, yp, t * k)
            times.append(time.perf_counter() - t0)
        key = f"{name} {t} {k}"
        results[key] = min(results.get(key, 1e9), float(np.median(times)))
print(json.dumps(results))
'''


def _median_seconds(function, calls: int) -> float:
    function()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        function()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _kernel_call(fmt: str, x: np.ndarray, parallel: bool):
    """The row kernel of fmt on preallocated outputs, as a no-argument function."""
    quantize, kernel, _ = FORMATS[fmt]
    parts = list(vars(quantize(x)).values())
    return lambda: kernel(x, *parts, parallel)


def _cases(tokens, dims):
    for fmt in FORMATS:
        for k in dims:
            if fmt != "q8_0/q8_1" and k % 256:
                continue
            for t in tokens:
                yield fmt, t, k


def _llama(python: str, cases, rounds: int, calls: int) -> dict:
    wanted = [[name, t, k] for fmt, t, k in cases for name in FORMATS[fmt][2]]
    done = subprocess.run(
        [python, "-c", LLAMA_SCRIPT], input=json.dumps([wanted, rounds, calls]), capture_output=True, text=True
    )
    if done.returncode != 0:
        print(f"llama.cpp's quantizers did not run: {done.stderr.strip().splitlines()[-1:]}")
        return {}
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--dims", default="576,1536,2048")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--llama-python", help="an interpreter with llama-cpp-python (the peer)")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, args.llama_python, with_llama=bool(args.llama_python)))
    print(f"load average {os.getloadavg()}, PARALLEL_FROM {qa.PARALLEL_FROM} values")
    cases = list(_cases([int(v) for v in args.tokens.split(",")], [int(v) for v in args.dims.split(",")]))
    llama = _llama(args.llama_python, cases, args.rounds, args.calls) if args.llama_python else {}
    best: dict = {}
    for _ in range(args.rounds):
        for fmt, t, k in cases:
            x = np.random.default_rng(0).standard_normal((t, k)).astype(np.float32)
            sides = {
                "call": lambda: FORMATS[fmt][0](x),
                "serial": _kernel_call(fmt, x, False),
                "parallel": _kernel_call(fmt, x, True),
            }
            for side, function in sides.items():
                key = (fmt, t, k, side)
                best[key] = min(best.get(key, 1e9), _median_seconds(function, args.calls))
    print(f"{'format':11s} {'T':>4s} {'K':>5s} | ns/value: {'call':>7s} {'serial':>7s} {'parallel':>8s}", end="")
    print(" | llama.cpp (1 thread) ns/value, llama / miro serial" if llama else "")
    for fmt, t, k in cases:
        n = t * k
        line = f"{fmt:11s} {t:4d} {k:5d} |           "
        line += " ".join(f"{best[(fmt, t, k, side)] * 1e9 / n:{w}.3f}" for side, w in (("call", 7), ("serial", 7)))
        line += f" {best[(fmt, t, k, 'parallel')] * 1e9 / n:8.3f}"
        for name in FORMATS[fmt][2] if llama else ():
            seconds = llama[f"{name} {t} {k}"]
            line += f" | {name[len('quantize_row_') :]} {seconds * 1e9 / n:6.3f} {seconds / best[(fmt, t, k, 'serial')]:5.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
