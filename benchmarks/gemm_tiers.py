"""The batch-invariant GEMM's two micro-kernel shapes beside numpy's sgemm, for the default model's shapes.

    python benchmarks/gemm_tiers.py [--tier avx2] [--threads N] [--repeats 15] [--rows 1,8,64,512]

For each (K, N) and row count T: the narrow shape (6 x 16, the 256-bit tiers'), the wide one (8 x 32, the
512-bit tiers') and `a @ w` on the unpacked (K, N) weights, in this one process. Each of the rounds times the
three in turn, each the fastest of a few milliseconds of calls, so load on the machine falls on all three
alike; GFLOP/s are medians over the rounds, a ratio (a kernel's time over sgemm's) the median of the rounds'
ratios. `--tier avx2` runs it under the AVX2 emulation (tiers.py), where both shapes are AVX2 code and the
wide one spills. --threads limits numba and OpenBLAS alike (on a loaded machine one thread each is steadier:
OpenBLAS's threads then stall by far the most).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import tiers

# K=576: the attention projections (q, o; k and v at 192), the MLP's up (1536) and the fused qkv (1728) and
# gate+up (3072); K=1536: the MLP's down; the output head.
SHAPES = [(576, 576), (576, 192), (576, 1536), (576, 1728), (576, 3072), (1536, 576), (576, 49152)]


def _time(fn, calls: int) -> float:
    """The fastest of `calls` calls, in seconds."""
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    tiers.add_argument(parser)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rows", default="1,8,64,512")
    parser.add_argument("--threads", type=int, default=0, help="0: numba's and OpenBLAS's defaults")
    args = parser.parse_args()
    tiers.enter(args)

    import numba
    from threadpoolctl import threadpool_limits

    from miro.core.kernels import cpu
    from miro.core.kernels.f32_gemm import matmul_invariant, pack_panels

    if args.threads:
        numba.set_num_threads(args.threads)
        threadpool_limits(args.threads)

    shapes = {"narrow": cpu.TIERS["avx2"], "wide": cpu.TIERS["avx512"]}
    print(
        f"{tiers.header(args, with_llama=False)}; {numba.get_num_threads()} threads; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'K':>5} {'N':>6} {'T':>4} | {'narrow':>7} {'wide':>7} {'sgemm':>7} GFLOP/s | narrow/sgemm wide/sgemm")
    rng = np.random.default_rng(0)
    for k_dim, n_cols in SHAPES:
        w = rng.standard_normal((k_dim, n_cols)).astype(np.float32)
        panels = pack_panels(w)
        for n_rows in map(int, args.rows.split(",")):
            a = rng.standard_normal((n_rows, k_dim)).astype(np.float32)
            out = np.empty((n_rows, n_cols), np.float32)
            runs = {name: (lambda tier=tier: matmul_invariant(a, panels, out, tier)) for name, tier in shapes.items()}
            runs["sgemm"] = lambda: a @ w
            for fn in runs.values():
                fn()  # compile, warm the caches
            flop = 2.0 * n_rows * k_dim * n_cols
            calls = max(1, int(5e7 // flop))  # a round: each kernel the fastest of a few ms of calls
            rounds = [{name: _time(fn, calls) for name, fn in runs.items()} for _ in range(args.repeats)]
            gflops = {name: flop / np.median([r[name] for r in rounds]) / 1e9 for name in runs}
            ratio = {name: np.median([r[name] / r["sgemm"] for r in rounds]) for name in ("narrow", "wide")}
            print(
                f"{k_dim:5d} {n_cols:6d} {n_rows:4d} | {gflops['narrow']:7.1f} {gflops['wide']:7.1f} "
                f"{gflops['sgemm']:7.1f}         | {ratio['narrow']:12.2f} {ratio['wide']:10.2f}"
            )


if __name__ == "__main__":
    main()
