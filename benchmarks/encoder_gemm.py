"""The encoder's weight formats, GEMM against GEMM, on all-MiniLM-L6-v2's shapes: i16 (int16_gemm.py) beside the
batch-invariant float32 GEMM (gemm.py) and bf16 (bf16_gemm.py, where the CPU has AVX512_BF16).

    python benchmarks/encoder_gemm.py [--tier avx2] [--rows 4096] [--rounds 7]

For each (K, N) of a layer (Q, K and V fused; the attention output; the feed-forward's up and down) at T rows (a
full pass of `embed_batch_tokens`): each round times the formats in turn, each call the whole `Linear` call (the
activations rounded or packed on the call, as a pass does), so load on the machine falls on all alike. Prints
GFLOP/s medians over the rounds and i16 / f32 as the median of the rounds' ratios. `--tier avx2` runs under the
AVX2 emulation (tiers.py), where i16 is what `weights="auto"` takes for an encoder.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tiers

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]  # K x N: qkv, attn_output, ffn_up, ffn_down


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    from miro.core.kernels import cpu
    from miro.core.kernels.bf16_gemm import matmul_bf16, pack_bf16
    from miro.core.kernels.f32_gemm import matmul_invariant, pack_panels
    from miro.core.kernels.int16_gemm import matmul_i16, pack_i16

    print(tiers.header(args, with_llama=False))
    rng = np.random.default_rng(0)
    print(f"{'K x N':>12} {'i16 GF/s':>9} {'f32 GF/s':>9} {'bf16 GF/s':>10} {'i16/f32':>8}")
    for k, n in SHAPES:
        a = rng.standard_normal((args.rows, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        out = np.empty((args.rows, n), np.float32)
        formats = {"i16": (matmul_i16, pack_i16(w)), "f32": (matmul_invariant, pack_panels(w))}
        if cpu.HAS_BF16_DOT:
            formats["bf16"] = (matmul_bf16, pack_bf16(w))
        times: dict[str, list[float]] = {name: [] for name in formats}
        for matmul, packed in formats.values():
            matmul(a, packed, out)  # compiled and warm
        for _ in range(args.rounds):
            for name, (matmul, packed) in formats.items():
                t0 = time.perf_counter()
                matmul(a, packed, out)
                times[name].append(time.perf_counter() - t0)
        flops = 2 * args.rows * k * n / 1e9
        rate = {name: flops / statistics.median(ts) for name, ts in times.items()}
        ratio = statistics.median(f / i for i, f in zip(times["i16"], times["f32"]))
        bf16 = f"{rate['bf16']:10.0f}" if "bf16" in rate else f"{'-':>10}"
        print(f"{f'{k} x {n}':>12} {rate['i16']:9.0f} {rate['f32']:9.0f} {bf16} {ratio:7.2f}x")


if __name__ == "__main__":
    main()
