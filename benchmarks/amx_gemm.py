"""AMX int8 tiles (core/kernels/amx.py) against miro's VNNI path, and both instructions' peaks on this machine.

    python benchmarks/amx_gemm.py [--rows 1,16,64,256] [--shapes smollm2,1b] [--rounds 3] [--repeats 7]
                                  [--threads 2]

For each weight shape (K in x N out) and each row count M, in rounds with the sides in turn:
- amx: amx.gemm(A, B packed), A (M, K) uint8 already quantized, C (M, N) int32: the bare int8 product;
- amx q8: the same Q8_0 layer through AMX: x quantized by miro's quantize_q8_32, then amx.gemm_blocks32 (32-deep
  tdpbssd per block, each block's int32 tiles scaled into float sums as miro's Q8_0 kernels do, same bits);
- vnni: miro's Linear on that Q8_0 tensor (N, K) (`Linear(tensor)(x)`, x (M, K) float32): what the engine runs
  for native int8 weights today, the activations' quantization and the per-block float scales included.
Each side cycles through copies of its weights totalling 64 MB or more, as quant_linear.py does, so a call
reads its weights from beyond L2 as a model step does. The figure is GOP/s: 2 M K N over the median call, the
median of the rounds; "amx/vnni" and "q8/vnni" are ratios of those times.

The peaks: one register-only loop per thread (prange over the threads), no memory traffic:
- vpdpbusd zmm: 12 independent accumulators, 64 multiply-adds each;
- tdpbusd: 4 accumulator tiles from 2 A and 2 B tiles, 16,384 multiply-adds each.
Nothing is asserted. The machine is shared: the load average is printed; ratios are what count.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402

from gguf import GGMLQuantizationType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402
from llvmlite import ir  # noqa: E402
import numba  # noqa: E402
from numba import njit, prange  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.core.extending import intrinsic  # noqa: E402
import numpy as np  # noqa: E402

from miro.core.kernels import amx  # noqa: E402
from miro.core.kernels.quantize_activations import quantize_q8_32  # noqa: E402
from miro.core.kernels.simd import int32x16, load16  # noqa: E402
from miro.core.layers.linear import Linear  # noqa: E402
from miro.core.loading.gguf_file import TensorInfo  # noqa: E402

SHAPES = {  # (K in, N out)
    "smollm2": [(576, 576), (576, 1536), (1536, 576), (576, 49152)],
    "1b": [(2048, 8192), (8192, 2048)],
}
WEIGHT_BYTES = 64 * 2**20


@intrinsic
def _vpdpbusd(typingctx, acc, a, b):
    def codegen(context, builder, sig, args):
        vector = ir.VectorType(ir.IntType(32), 16)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector] * 3), "llvm.x86.avx512.vpdpbusd.512"
        )
        return builder.call(function, args)

    return int32x16(int32x16, int32x16, int32x16), codegen


@intrinsic
def _lane0(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], ir.Constant(ir.IntType(32), 0))

    return numba.int32(int32x16), codegen


@njit(parallel=True)
def vnni_peak(seed, iterations, threads, sink):
    """threads x iterations x 12 vpdpbusd on registers; sink keeps the sums alive."""
    for t in prange(threads):
        a, b = load16(seed, 0), load16(seed, 16)
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = c10 = c11 = load16(seed, 32)
        for _ in range(iterations):
            c0 = _vpdpbusd(c0, a, b)
            c1 = _vpdpbusd(c1, a, b)
            c2 = _vpdpbusd(c2, a, b)
            c3 = _vpdpbusd(c3, a, b)
            c4 = _vpdpbusd(c4, a, b)
            c5 = _vpdpbusd(c5, a, b)
            c6 = _vpdpbusd(c6, a, b)
            c7 = _vpdpbusd(c7, a, b)
            c8 = _vpdpbusd(c8, a, b)
            c9 = _vpdpbusd(c9, a, b)
            c10 = _vpdpbusd(c10, a, b)
            c11 = _vpdpbusd(c11, a, b)
        sink[t] = (
            _lane0(c0)
            + _lane0(c1)
            + _lane0(c2)
            + _lane0(c3)
            + _lane0(c4)
            + _lane0(c5)
            + _lane0(c6)
            + _lane0(c7)
            + _lane0(c8)
            + _lane0(c9)
            + _lane0(c10)
            + _lane0(c11)
        )


@njit(parallel=True)
def amx_peak(tiles, config, iterations, threads, out):
    """threads x iterations x 4 tdpbusd on tile registers loaded once."""
    for t in prange(threads):
        amx.tile_load_config(config)
        amx.tile_load(4, tiles, 0, 64)
        amx.tile_load(5, tiles, 1024, 64)
        amx.tile_load(6, tiles, 2048, 64)
        amx.tile_load(7, tiles, 3072, 64)
        amx.tile_zero(0)
        amx.tile_zero(1)
        amx.tile_zero(2)
        amx.tile_zero(3)
        for _ in range(iterations):
            amx.tile_dpbusd(0, 4, 6)
            amx.tile_dpbusd(1, 4, 7)
            amx.tile_dpbusd(2, 5, 6)
            amx.tile_dpbusd(3, 5, 7)
        amx.tile_store(0, out, t * 4096, 64)
        amx.tile_store(1, out, t * 4096 + 1024, 64)
        amx.tile_store(2, out, t * 4096 + 2048, 64)
        amx.tile_store(3, out, t * 4096 + 3072, 64)
        amx.tile_release()


def peaks(threads: int, rounds: int) -> tuple[float, float]:
    """(vpdpbusd, tdpbusd) GOP/s over `threads` threads, the best of `rounds` (a peak: interference only lowers it)."""
    amx.require()  # before amx_peak compiles
    rng = np.random.default_rng(0)
    seed = rng.integers(0, 1 << 20, 48).astype(np.int32)
    sink = np.zeros(threads, np.int32)
    tiles = rng.integers(0, 64, 4096).astype(np.uint8)
    out = np.zeros(threads * 4096, np.uint8)
    config = amx.config_bytes()
    vnni_peak(seed, 10, threads, sink)
    amx_peak(tiles, config, 10, threads, out)
    vnni_iterations, amx_iterations = 2_000_000, 100_000
    vnni, tile = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        vnni_peak(seed, vnni_iterations, threads, sink)
        vnni.append(threads * vnni_iterations * 12 * 64 * 2 / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        amx_peak(tiles, config, amx_iterations, threads, out)
        tile.append(threads * amx_iterations * 4 * 16384 * 2 / (time.perf_counter() - t0) / 1e9)
    return max(vnni), max(tile)


def q8_0_tensor(n: int, k: int, rng: np.random.Generator) -> TensorInfo:
    weights = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    data = gguf_quants.quantize(weights, GGMLQuantizationType.Q8_0).reshape(-1)
    return TensorInfo(f"{n}x{k}", (n, k), GGMLQuantizationType.Q8_0, data)


def q8_0_amx(tensor: TensorInfo) -> tuple[np.ndarray, np.ndarray]:
    """The Q8_0 tensor's quants and float32 scales packed for amx.gemm_blocks32."""
    n, k = tensor.shape
    blocks = np.asarray(tensor.data).reshape(n, k // 32, 34)
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    quants = blocks[:, :, 2:].copy().view(np.int8).reshape(n, k)
    return amx.pack_w_blocks32(quants), amx.pack_scales_blocks32(scales)


def amx_q8_0(x: np.ndarray, packed: tuple[np.ndarray, np.ndarray], n: int) -> np.ndarray:
    a = quantize_q8_32(x)
    m = x.shape[0]
    return amx.gemm_blocks32(a.q[:m], a.d[:m], packed[0], packed[1], n)


def median_call(calls, repeats: int) -> float:
    """Median seconds of one call, cycling through `calls` (one per copy of the weights), after a warm-up."""
    calls[0]()
    times = []
    for i in range(max(repeats, len(calls))):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--shapes", default="smollm2,1b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    reason = amx.unusable_reason()
    if reason:
        raise SystemExit(f"AMX is not usable here: {reason}")
    numba.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    print(
        f"threads {args.threads}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds, median of {args.repeats} calls each"
    )
    vnni_top, amx_top = peaks(args.threads, args.rounds)
    print(f"peaks: vpdpbusd {vnni_top:.0f} GOP/s, tdpbusd {amx_top:.0f} GOP/s ({amx_top / vnni_top:.1f}x)")
    print(
        f"{'K x N':>12} {'M':>4} {'amx GOP/s':>10} {'amx q8':>8} {'vnni GOP/s':>11} {'amx/vnni':>9} {'q8/vnni':>8} "
        f"{'amx/peak':>9} {'vnni/peak':>10}"
    )
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        for k, n in SHAPES[shape]:
            copies = max(1, min(64, -(-WEIGHT_BYTES // (k * n))))
            tensor = q8_0_tensor(n, k, rng)
            linears = [Linear(tensor) for _ in range(copies)]
            q8_packed = [q8_0_amx(tensor) for _ in range(copies)]
            probe = rng.standard_normal((3, k)).astype(np.float32)
            assert np.array_equal(linears[0](probe), amx_q8_0(probe, q8_packed[0], n)), "amx q8 lost Linear's bits"
            packed = [amx.pack_b(rng.integers(-128, 128, (k, n), dtype=np.int8)) for _ in range(copies)]
            for m in rows:
                x = rng.standard_normal((m, k)).astype(np.float32)
                a = rng.integers(0, 256, (m, k), dtype=np.uint8)
                out = np.empty((-(-m // 16) * 16, n), np.int32)
                amx_calls = [lambda b=b: amx.gemm(a, b, n, out) for b in packed]
                q8_calls = [lambda p=p: amx_q8_0(x, p, n) for p in q8_packed]
                vnni_calls = [lambda layer=layer: layer(x) for layer in linears]
                amx_times, q8_times, vnni_times = [], [], []
                for _ in range(args.rounds):
                    amx_times.append(median_call(amx_calls, args.repeats))
                    q8_times.append(median_call(q8_calls, args.repeats))
                    vnni_times.append(median_call(vnni_calls, args.repeats))
                ops = 2 * m * k * n / 1e9
                amx_rate, q8_rate, vnni_rate = (ops / np.median(t) for t in (amx_times, q8_times, vnni_times))
                print(
                    f"{k:>5} x {n:<5} {m:>4} {amx_rate:>10.1f} {q8_rate:>8.1f} {vnni_rate:>11.1f} "
                    f"{amx_rate / vnni_rate:>8.2f}x {q8_rate / vnni_rate:>7.2f}x "
                    f"{amx_rate / amx_top:>9.3f} {vnni_rate / vnni_top:>10.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
