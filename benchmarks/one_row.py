"""One activation row against a tiled weight from memory: where a call's time goes, against llama.cpp's mul_mat.

    python benchmarks/one_row.py [--types Q4_K,Q4_0] [--shapes llama3.2-1b] [--rounds 5] [--repeats 60]
                                 [--threads 2] [--tier avx2] [--llama-python VENV/bin/python]

At one row a layer reads each weight byte once: its time is the memory's, the kernel's arithmetic where that is
slower, and whatever a call adds. For each shape (quant_linear.py's SHAPES) and type, with copies of the weight
--pool-mib in all (default 8x a 32 MiB L3, so that every call reads from DRAM; quant_linear.py's 2x left llama.cpp's
one graph over the copies some of them in the L3), it times in turn, the least of --repeats calls, median of --rounds:
- stream: a numba kernel that only reads the layer's tiles (quants, scales, mins, sub-scales: every byte the tile
  kernel reads), XOR-ing them as 8-byte words over the same tiles and threads: numba's parallel launch and the
  memory, the least a numba kernel over these bytes can take;
- kernel: the tile kernel alone (Kernels.tiles; the row quantized beforehand, as for several rows);
- call: the whole `Linear(x)` call, as a model's step makes it (its Python, and the kernel quantizing the row
  itself: Linear._lone_row);
- llama: llama.cpp's mul_mat, as quant_linear.py measures it (one ggml graph over the copies, divided by them: one
  op's share of a model's step graph), with --llama-python.
Ratios are llama.cpp's time over each (above 1: miro's is faster); "call" is quant_linear.py's native/llama.
The weights are quant_linear.py's random ones. Nothing is asserted.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as quant_linear.py: numba's pool and llama.cpp's threads

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from numba import njit, prange  # noqa: E402

from miro.core.kernels.quantize_activations import quantize_q8_32, quantize_q8_k, quantize_q8_k_quads  # noqa: E402
from miro.core.kernels.superblock_tiles import natural_order  # noqa: E402
from miro.core.layers.linear import Linear  # noqa: E402
from miro.core.loading.gguf_file import TensorInfo  # noqa: E402

import tiers  # noqa: E402
from quant_linear import SHAPES, llama_cpp_seconds, median_seconds, random_tensor  # noqa: E402

NO_ROWS = np.zeros((0, 0), np.float32)  # the tile kernels' float rows when given quantized ones


@njit(parallel=True, cache=True)
def read_tiles(quants, scales, mins, sub_scales, out):
    """XOR of every 8-byte word of each tile's rows of the four arrays (each row's bytes a multiple of 8)."""
    for tile in prange(quants.shape[0]):
        acc = np.uint64(0)
        for part in (quants[tile].view(np.uint64), sub_scales[tile].view(np.uint64)):
            for i in range(part.size):
                acc ^= part[i]
        for part in (scales[tile].view(np.uint64), mins[tile].view(np.uint64)):
            for i in range(part.size):
                acc ^= part[i]
        out[tile] = acc


def calls_for(layer: Linear, x: np.ndarray):
    """(stream, kernel, call) callables for one copy of a tiled layer and one row x."""
    t, kernels = layer._tiles, layer._kernels()
    out = np.empty((1, layer.out_features), np.float32)
    words = np.empty(t.quants.shape[0], np.uint64)
    if layer._weight_type.activations == "q8_0":  # the 32-value types (tiles.py): no sub-block scales
        a = quantize_q8_32(x)

        def kernel():
            kernels.tiles(t.quants, t.scales, t.mins, a.q, a.d, a.s, a.qsum, out, NO_ROWS)

    else:
        a = (quantize_q8_k if natural_order(layer.type, layer.tier) else quantize_q8_k_quads)(x)

        def kernel():
            kernels.tiles(t.quants, t.scales, t.mins, t.sub_scales, a.q, a.d, a.sum32, out, NO_ROWS)

    sub = t.sub_scales.reshape(t.quants.shape[0], -1)
    return (lambda: read_tiles(t.quants, t.scales, t.mins, sub, words)), kernel, (lambda: layer(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="Q4_K,Q4_0")
    parser.add_argument("--shapes", default="llama3.2-1b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pool-mib", type=int, default=256, help="the copies' bytes in all (default 8x a 32 MiB L3)")
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python: adds llama.cpp's mul_mat")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, args.llama_python, with_llama=bool(args.llama_python)))
    import numba

    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, {args.threads} threads; least of "
        f"{args.repeats} calls, median of {args.rounds} rounds; weights from memory; times in us"
    )
    names = ("stream", "kernel", "call") + (("llama",) if args.llama_python else ())
    print(
        f"{'shape':>11} {'type':>5} {'MB':>5} "
        + " ".join(f"{n:>7}" for n in names)
        + ("  llama/stream llama/kernel llama/call" if args.llama_python else "")
    )
    for out_f, in_f in (shape for name in args.shapes.split(",") for shape in SHAPES[name]):
        for qtype in (GGMLQuantizationType[name] for name in args.types.split(",")):
            if in_f % GGML_QUANT_SIZES[qtype][0]:
                continue  # a K-quant row is whole 256-value blocks (as quant_linear.py skips them)
            tensor = random_tensor(qtype, out_f, in_f, rng)
            first = Linear(TensorInfo(tensor.name, tensor.shape, qtype, tensor.data.copy()))
            if first._tiles is None:
                print(f"{out_f:>5}x{in_f:<5} {qtype.name:>5}: not tiled on this tier")
                continue
            copies = -(-args.pool_mib * 2**20 // first.weight_bytes)
            layers = [first] + [
                Linear(TensorInfo(tensor.name, tensor.shape, qtype, tensor.data.copy())) for _ in range(copies - 1)
            ]
            x = rng.standard_normal((1, in_f)).astype(np.float32)
            per_copy = [calls_for(layer, x) for layer in layers]
            rounds = []
            for _ in range(args.rounds):
                times = [median_seconds([c[i] for c in per_copy], args.repeats, "min") for i in range(3)]
                if args.llama_python:
                    _, t_llama = llama_cpp_seconds(
                        args.llama_python, tensor, copies, [1], args.threads, args.repeats, "min"
                    )
                    times.append(t_llama[1])
                rounds.append(times)
            med = np.median(np.array(rounds), axis=0) * 1e6
            line = f"{out_f:>5}x{in_f:<5} {qtype.name:>5} {layers[0].weight_bytes / 1e6:>5.2f} " + " ".join(
                f"{t:>7.1f}" for t in med
            )
            if args.llama_python:
                line += f"  {med[3] / med[0]:>12.2f} {med[3] / med[1]:>12.2f} {med[3] / med[2]:>10.2f}"
            print(line, flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
