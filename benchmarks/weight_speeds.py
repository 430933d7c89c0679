"""The table `weights="auto"` decides by: native kernels' throughput over the float32 copy's, per weight type.

    python benchmarks/weight_speeds.py [--rows 64] [--size 2048] [--repeats 15] [--tier avx2]

For each type, one size x size matrix (gguf-py's quantizer where it has one, else random valid K-quant
blocks) times `--rows` activation rows, batch-invariant both ways as the engine runs them by default: the
native kernel (`Linear(fmt="native")`, the CPU tier's kernel from its row's plan in core/kernels/weight_types.py)
against the dequantized copy through the invariant float32 GEMM (`Linear(fmt="f32", invariant=True)`). Prints
GFLOP/s of each, the median of the pairs' ratios, and the ratios as a dict for this tier (weight_format's
NATIVE_SPEEDUP). Run it on an idle machine, on each tier (`--tier avx2` for the AVX2 tier's emulation), and copy
each figure into its type's row (`speedup`) in weight_types.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

import tiers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))
from quant_reference import activations, random_tensor  # noqa: E402  (the tests' tensor writer)

TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16)


def paired_seconds(native, f32, repeats: int) -> tuple[float, float, float]:
    """The two calls in turn, `repeats` pairs: their median times and the median of the pairs' ratios
    f32 / native (a pair shares the machine's speed of the moment, which drifts here by 10-25%)."""
    native(), f32()  # compiled, and the weights in cache as far as they fit
    times = []
    for _ in range(repeats):
        pair = []
        for call in (native, f32):
            t0 = time.perf_counter()
            call()
            pair.append(time.perf_counter() - t0)
        times.append(pair)
    t = np.array(times)
    return float(np.median(t[:, 0])), float(np.median(t[:, 1])), float(np.median(t[:, 1] / t[:, 0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="activation rows per call (a batch's decode step)")
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=15, help="pairs of calls, native and f32 in turn")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, with_llama=False))

    from miro.core.kernels import cpu
    from miro.core.layers.linear import Linear

    x = activations(args.rows, args.size, seed=2)
    flop = 2 * args.rows * args.size * args.size
    speedups = {}
    print(f"{'type':>5} {'native GF/s':>12} {'f32 GF/s':>9} {'native/f32':>10}")
    for qtype in TYPES:
        tensor = random_tensor(qtype, args.size, args.size, seed=1)
        native, f32 = Linear(tensor, "native"), Linear(tensor, "f32", invariant=True)
        t_native, t_f32, ratio = paired_seconds(lambda: native(x), lambda: f32(x), args.repeats)
        speedups[qtype.name] = round(ratio, 2)
        print(f"{qtype.name:>5} {flop / t_native / 1e9:>12.1f} {flop / t_f32 / 1e9:>9.1f} {ratio:>10.2f}")
    print(f'"{cpu.TIER.name}": {{' + ", ".join(f"{name}: {ratio}" for name, ratio in speedups.items()) + "},")


if __name__ == "__main__":
    main()
