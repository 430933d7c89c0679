"""Linear layers with weights kept as GGUF blocks (fmt="native") against float32 BLAS on the dequantized matrix.

    python benchmarks/quant_linear.py [--types Q4_0,Q4_1,Q8_0,Q4_K,Q6_K] [--tokens 1,8,64,512]
                                      [--shapes tinyllama,smollm2] [--repeats 5] [--threads N] [--tier avx2]

Shapes (out x in): TinyLlama-1.1B's 2048x2048 (q, o), 5632x2048 (gate, up), 2048x5632 (down);
SmolLM2-135M's 576x576, 192x576, 1536x576, 576x1536 and its 49152x576 output head.
Weights are random: gguf-py's quantizer for the types it has, random valid blocks (finite
float16 scales) for the K-quants.

Both sides run in this process on the same activations x (T, in):
- native: miro.core.layers.Linear(tensor) (8-bit activations, integer dots per block, numba);
- f32: x @ W with W the dequantized (in, out) float32 matrix (numpy's BLAS), as today's engine does.
Each side cycles through copies of its weights totalling over 2x the L3 cache, so every call
reads its weights from DRAM, as a model step does. Prints GFLOP/s (2 * T * out * in per call,
median of --repeats calls after a warm-up), native / f32, and the weight bytes each side reads.
Nothing is asserted. The machine's load average is printed: ratios are what count on a busy machine.
On a machine shared with other work, OpenBLAS's threads suffer most (its 2-thread sgemm can fall
to a few GFLOP/s while it waits for a core); --threads 1 gives the steadiest ratios.
"""

from __future__ import annotations

import os

# numba's OpenMP pool and OpenBLAS's threads take turns here: without these (set before numpy
# loads OpenBLAS) each side's spinning threads slow the other down by up to 100x.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from miro.core.dequant import dequantize  # noqa: E402
from miro.core.gguf_file import TensorInfo  # noqa: E402
from miro.core.layers import Linear  # noqa: E402

import tiers  # noqa: E402

SHAPES = {
    "tinyllama": [(2048, 2048), (5632, 2048), (2048, 5632)],
    "smollm2": [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)],
}
CACHE_BYTES = 2 * 32 * 2**20  # twice this machine's L3


def random_tensor(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> TensorInfo:
    try:
        weights = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        data = gguf_quants.quantize(weights, qtype).reshape(-1)
    except NotImplementedError:  # K-quants: random bytes, finite small float16 scales
        block_values, block_bytes = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows * cols // block_values, block_bytes), dtype=np.uint8)
        scales = rng.uniform(1e-4, 2e-3, (len(blocks), 2)).astype(np.float16).view(np.uint8)
        if qtype == GGMLQuantizationType.Q6_K:
            blocks[:, 208:210] = scales[:, :2]
        else:
            blocks[:, 0:4] = scales
        data = blocks.reshape(-1)
    return TensorInfo(f"{rows}x{cols}", (rows, cols), qtype, data)


def copies_for(nbytes: int) -> int:
    return max(1, min(64, -(-CACHE_BYTES // nbytes)))


def median_seconds(calls, repeats: int) -> float:
    """Median time of one call, cycling through `calls` (one per copy of the weights)."""
    calls[0]()  # warm-up (and numba's first-call compile or cache load)
    times = []
    for i in range(max(repeats, len(calls))):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="Q4_0,Q4_1,Q8_0,Q4_K,Q6_K")
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--shapes", default="tinyllama,smollm2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="numba and BLAS threads (default: all cores)")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, with_llama=False))
    if args.threads:
        import numba
        from threadpoolctl import threadpool_limits

        numba.set_num_threads(args.threads)
        threadpool_limits(args.threads)

    types = [GGMLQuantizationType[name] for name in args.types.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = [shape for name in args.shapes.split(",") for shape in SHAPES[name]]
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; median of {args.repeats} calls")
    print(f"{'shape':>11} {'type':>5} {'T':>4} {'native GF/s':>12} {'f32 GF/s':>9} {'native/f32':>10}"
          f" {'native MB':>10} {'f32 MB':>7}")
    for out_f, in_f in shapes:
        for qtype in types:
            if in_f % GGML_QUANT_SIZES[qtype][0]:
                continue  # a K-quant row is whole 256-value blocks (GGUF files store such tensors otherwise)
            tensor = random_tensor(qtype, out_f, in_f, rng)
            native = [Linear(TensorInfo(tensor.name, tensor.shape, qtype, tensor.data.copy()))
                      for _ in range(copies_for(tensor.data.nbytes))]
            w_in_out = np.ascontiguousarray(dequantize(tensor).T)
            f32 = [w_in_out] + [w_in_out.copy() for _ in range(copies_for(w_in_out.nbytes) - 1)]
            for n_tok in tokens:
                x = rng.standard_normal((n_tok, in_f)).astype(np.float32)
                t_native = median_seconds([lambda layer=layer: layer(x) for layer in native], args.repeats)
                t_f32 = median_seconds([lambda w=w: x @ w for w in f32], args.repeats)
                flop = 2 * n_tok * out_f * in_f
                print(f"{out_f:>5}x{in_f:<5} {qtype.name:>5} {n_tok:>4} {flop / t_native / 1e9:>12.1f}"
                      f" {flop / t_f32 / 1e9:>9.1f} {t_f32 / t_native:>10.2f}"
                      f" {tensor.data.nbytes / 2**20:>10.1f} {w_in_out.nbytes / 2**20:>7.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
