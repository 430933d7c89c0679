"""Linear layers with weights kept as GGUF blocks (fmt="native") against float32 BLAS on the dequantized matrix.

    python benchmarks/quant_linear.py [--types Q4_0,Q4_1,Q8_0,Q4_K,Q6_K] [--tokens 1,8,64,512]
                                      [--shapes tinyllama,smollm2] [--repeats 5] [--threads N] [--tier avx2]
                                      [--llama-python VENV/bin/python] [--rounds N] [--stat median|min] [--hot]

Shapes (out x in): TinyLlama-1.1B's 2048x2048 (q, o), 5632x2048 (gate, up), 2048x5632 (down);
SmolLM2-135M's 576x576, 192x576, 1536x576, 576x1536 and its 49152x576 output head; Llama-3.2-1B's (llama3.2-1b)
2048x2048 (q, o), 512x2048 (k, v), 8192x2048 (gate, up), 2048x8192 (down).
Weights are random: gguf-py's quantizer for the types it has, random valid blocks (finite
float16 scales) for the K-quants.

Both sides run in this process on the same activations x (T, in):
- native: miro.core.layers.linear.Linear(tensor) (8-bit activations, integer dots per block, numba);
- f32: x @ W with W the dequantized (in, out) float32 matrix (numpy's BLAS), as today's engine does.
Each side cycles through copies of its weights totalling over 8x the L3 cache, so every call
reads its weights from DRAM, as a model step does (over 2x, until stop 61, llama.cpp's one graph over the copies
still found some of them in the L3: its 2,048 x 2,048 Q4_K at one row 57-60 us a call there, 68-72 at 8x).
Prints GFLOP/s (2 * T * out * in per call, median of --repeats calls after a warm-up), native / f32, and the
weight bytes each side reads.
--llama-python adds llama.cpp's figure for the same weight bytes, measured in that interpreter (a child
process) through the ggml C API its llama-cpp-python wheel ships (llama_cpp._ggml.libggml, bound with ctypes):
- the weight goes where llama.cpp's model loader would put it: the first of the CPU device's extra buffer types
  (CPU_REPACK: Q4_0 and Q4_K repacked into interleaved rows on AVX2/AVX-512) whose supports_op accepts
  mul_mat(W, x), else the plain CPU buffer; the "llama weights" column names it;
- as many copies of W as native cycles through, so it too reads W from DRAM; one ggml graph holds
  ggml_mul_mat(W_i, x) for every copy, x float32 (T, in) (ggml converts it to the weight's dot type inside the op);
- timed: ggml_backend_graph_compute of that graph on ggml_backend_cpu_init() with --threads threads (default
  all cores), median of --repeats after a warm-up, divided by the copies: so one matmul's share of the graph's
  launch and of ggml's barrier between ops, as in a model's step graph (native's time includes its Python call).
"llama GF/s" is that figure, "native/llama" its time over native's (above 1: native is faster). The child
inherits this script's OMP_WAIT_POLICY=PASSIVE, as numba's OpenMP pool runs; with llama.cpp's default (threads
spinning at its barriers) 2 threads on a machine busy with other work fell to a few GFLOP/s here.
With --tier avx2 give it a llama.cpp built for AVX2 (the header names the interpreter and its build).
--rounds N measures N times, llama.cpp then native in turn, and prints the median of the rounds' figures (each
round's figure the median, or with --stat min the least, of --repeats calls: on a machine shared with other work
the least is the call no other process interrupted). --hot keeps one copy of each weight, so that it stays in the
caches: the kernels' own speed, apart from the memory's (the few-row shapes are bound by it otherwise).
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
import json  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from miro.core.kernels.dequant import dequantize  # noqa: E402
from miro.core.loading.gguf_file import TensorInfo  # noqa: E402
from miro.core.layers.linear import Linear  # noqa: E402

import tiers  # noqa: E402

SHAPES = {
    "tinyllama": [(2048, 2048), (5632, 2048), (2048, 5632)],
    "smollm2": [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)],
    "llama3.2-1b": [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)],
}
CACHE_BYTES = 8 * 32 * 2**20  # 8x this machine's L3 (benchmarks/one_row.py: at 2x some calls found their weights there)


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
    return max(1, min(1024, -(-CACHE_BYTES // nbytes)))


def median_seconds(calls, repeats: int, stat: str = "median") -> float:
    """Median (or least, stat="min") time of one call, cycling through `calls` (one per copy of the weights)."""
    calls[0]()  # warm-up (and numba's first-call compile or cache load)
    times = []
    for i in range(max(repeats, len(calls))):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        times.append(time.perf_counter() - t0)
    return float(np.min(times) if stat == "min" else np.median(times))


LLAMA_CPP_SCRIPT = r'''
"""ggml's mul_mat(W, x) on llama.cpp's CPU backend: stdin holds W's blocks; prints its buffer and seconds per T."""
import ctypes, json, sys, time
import numpy as np
from llama_cpp._ggml import libggml as g

qtype, rows, cols, copies, threads, repeats = map(int, sys.argv[1:7])
tokens = json.loads(sys.argv[7])
least = sys.argv[8] == "min"  # the least of the repeats, else their median
P, F32 = ctypes.c_void_p, 0  # GGML_TYPE_F32


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", P), ("no_alloc", ctypes.c_bool)]


def bind(name, restype, *argtypes):
    f = getattr(g, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


init = bind("ggml_init", P, InitParams)
free = bind("ggml_free", None, P)
tensor_overhead = bind("ggml_tensor_overhead", ctypes.c_size_t)
graph_overhead = bind("ggml_graph_overhead", ctypes.c_size_t)
new_tensor_2d = bind("ggml_new_tensor_2d", P, P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
mul_mat = bind("ggml_mul_mat", P, P, P, P)
new_graph = bind("ggml_new_graph", P, P)
build_forward_expand = bind("ggml_build_forward_expand", None, P, P)
alloc_tensors = bind("ggml_backend_alloc_ctx_tensors_from_buft", P, P, P)
buffer_free = bind("ggml_backend_buffer_free", None, P)
tensor_set = bind("ggml_backend_tensor_set", None, P, P, ctypes.c_size_t, ctypes.c_size_t)
cpu_reg = bind("ggml_backend_cpu_reg", P)
reg_dev_get = bind("ggml_backend_reg_dev_get", P, P, ctypes.c_size_t)
proc_address = bind("ggml_backend_reg_get_proc_address", P, P, ctypes.c_char_p)
supports_op = bind("ggml_backend_dev_supports_op", ctypes.c_bool, P, P)
cpu_buft = bind("ggml_backend_cpu_buffer_type", P)
buft_name = bind("ggml_backend_buft_name", ctypes.c_char_p, P)
cpu_init = bind("ggml_backend_cpu_init", P)
set_n_threads = bind("ggml_backend_cpu_set_n_threads", None, P, ctypes.c_int)
graph_compute = bind("ggml_backend_graph_compute", ctypes.c_int, P, P)


def context(n_tensors, with_graph=False):
    return init(InitParams(n_tensors * tensor_overhead() + (graph_overhead() if with_graph else 0), None, True))


def weight_bufts(dev):
    """The buffer types llama.cpp tries for a CPU weight, in its order: the device's extra ones (repacked), then CPU."""
    get = proc_address(cpu_reg(), b"ggml_backend_dev_get_extra_bufts")
    extra = ctypes.CFUNCTYPE(ctypes.POINTER(P), P)(get)(dev) if get else None
    bufts = []
    while extra and extra[len(bufts)]:
        bufts.append(extra[len(bufts)])
    return bufts + [cpu_buft()]


def computes(dev, w):
    """llama.cpp's test of a weight's buffer type: does the device run mul_mat(w, f32 x of 512 rows) there."""
    ctx = context(2)
    ok = supports_op(dev, mul_mat(ctx, w, new_tensor_2d(ctx, F32, cols, 512)))
    free(ctx)
    return ok


def place_weights(dev, data):
    """`copies` tensors of W's blocks in the first buffer type that computes them (repacking them there)."""
    for buft in weight_bufts(dev):
        ctx = context(copies)
        ws = [new_tensor_2d(ctx, qtype, cols, rows) for _ in range(copies)]
        buf = alloc_tensors(ctx, buft)
        if buf and computes(dev, ws[0]):
            for w in ws:
                tensor_set(w, data.ctypes.data, 0, data.nbytes)
            return buft_name(buft).decode(), ws
        if buf:
            buffer_free(buf)
        free(ctx)
    raise SystemExit("no buffer type computes this weight")


def seconds_per_matmul(backend, ws, n_tok):
    """Median (least) over `repeats` of one graph of mul_mat(w, x) for every copy w, divided by the copies."""
    ctx = context(len(ws) + 1, with_graph=True)
    x = new_tensor_2d(ctx, F32, cols, n_tok)
    graph = new_graph(ctx)
    for w in ws:
        build_forward_expand(graph, mul_mat(ctx, w, x))
    buf = alloc_tensors(ctx, cpu_buft())
    xs = np.random.default_rng(0).standard_normal((n_tok, cols), dtype=np.float32)
    tensor_set(x, xs.ctypes.data, 0, xs.nbytes)
    assert graph_compute(backend, graph) == 0  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert graph_compute(backend, graph) == 0
        times.append(time.perf_counter() - t0)
    buffer_free(buf)
    free(ctx)
    return float(np.min(times) if least else np.median(times)) / len(ws)


dev = reg_dev_get(cpu_reg(), 0)
buffer, ws = place_weights(dev, np.frombuffer(sys.stdin.buffer.read(), np.uint8))
backend = cpu_init()
set_n_threads(backend, threads)
print(json.dumps(dict(buffer=buffer, seconds={n: seconds_per_matmul(backend, ws, n) for n in tokens})))
'''


def llama_cpp_seconds(
    python: str, tensor: TensorInfo, copies: int, tokens: list[int], threads: int, repeats: int, stat: str = "median"
) -> tuple[str, dict[int, float]]:
    """llama.cpp's buffer type for this weight and its seconds per mul_mat at each T (LLAMA_CPP_SCRIPT, in `python`)."""
    rows, cols = tensor.shape
    cmd = [
        python,
        "-c",
        LLAMA_CPP_SCRIPT,
        *map(str, (int(tensor.type), rows, cols, copies, threads, repeats)),
        json.dumps(tokens),
        stat,
    ]
    done = subprocess.run(cmd, input=tensor.data.tobytes(), capture_output=True)  # OMP_WAIT_POLICY as for numba
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp's mul_mat failed:\n{done.stderr.decode()[-3000:]}")
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result["buffer"], {int(n): t for n, t in result["seconds"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="Q4_0,Q4_1,Q8_0,Q4_K,Q6_K")
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--shapes", default="tinyllama,smollm2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="numba and BLAS threads (default: all cores)")
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python: adds llama.cpp's (ggml's) GFLOP/s")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, llama.cpp then native in turn; medians")
    parser.add_argument("--stat", choices=("median", "min"), default="median", help="each round's figure")
    parser.add_argument("--hot", action="store_true", help="one copy of each weight: it stays in the caches")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, args.llama_python, with_llama=bool(args.llama_python)))
    if args.threads:
        import numba
        from threadpoolctl import threadpool_limits

        numba.set_num_threads(args.threads)
        threadpool_limits(args.threads)

    types = [GGMLQuantizationType[name] for name in args.types.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = [shape for name in args.shapes.split(",") for shape in SHAPES[name]]
    rng = np.random.default_rng(0)
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.stat} of {args.repeats} calls, "
        f"median of {args.rounds} rounds; weights {'in cache (--hot)' if args.hot else 'from memory'}"
    )
    print(
        f"{'shape':>11} {'type':>5} {'T':>4} {'native GF/s':>12} {'f32 GF/s':>9} {'native/f32':>10}"
        f" {'native MB':>10} {'f32 MB':>7}"
        + (f" {'llama GF/s':>10} {'native/llama':>12}  llama weights" if args.llama_python else "")
    )
    for out_f, in_f in shapes:
        for qtype in types:
            if in_f % GGML_QUANT_SIZES[qtype][0]:
                continue  # a K-quant row is whole 256-value blocks (GGUF files store such tensors otherwise)
            tensor = random_tensor(qtype, out_f, in_f, rng)
            copies = 1 if args.hot else copies_for(tensor.data.nbytes)
            native = [Linear(TensorInfo(tensor.name, tensor.shape, qtype, tensor.data.copy())) for _ in range(copies)]
            w_in_out = np.ascontiguousarray(dequantize(tensor).T)
            f32 = [w_in_out] + [w_in_out.copy() for _ in range((1 if args.hot else copies_for(w_in_out.nbytes)) - 1)]
            xs = {n_tok: rng.standard_normal((n_tok, in_f)).astype(np.float32) for n_tok in tokens}
            rounds = {n_tok: [] for n_tok in tokens}  # (native, f32, llama.cpp) seconds per round
            for _ in range(args.rounds):
                t_llama = {}
                if args.llama_python:
                    buffer, t_llama = llama_cpp_seconds(
                        args.llama_python,
                        tensor,
                        len(native),
                        tokens,
                        args.threads or os.cpu_count(),
                        args.repeats,
                        args.stat,
                    )
                for n_tok, x in xs.items():
                    rounds[n_tok].append(
                        (
                            median_seconds(
                                [lambda layer=layer, x=x: layer(x) for layer in native], args.repeats, args.stat
                            ),
                            median_seconds([lambda w=w, x=x: x @ w for w in f32], args.repeats, args.stat),
                            t_llama.get(n_tok, np.nan),
                        )
                    )
            for n_tok in tokens:
                t_native, t_f32, t_llama = np.median(np.array(rounds[n_tok]), axis=0)
                flop = 2 * n_tok * out_f * in_f
                print(
                    f"{out_f:>5}x{in_f:<5} {qtype.name:>5} {n_tok:>4} {flop / t_native / 1e9:>12.1f}"
                    f" {flop / t_f32 / 1e9:>9.1f} {t_f32 / t_native:>10.2f}"
                    f" {tensor.data.nbytes / 2**20:>10.1f} {w_in_out.nbytes / 2**20:>7.1f}"
                    + (
                        f" {flop / t_llama / 1e9:>10.1f} {t_llama / t_native:>12.2f}  {buffer}"
                        if args.llama_python
                        else ""
                    ),
                    flush=True,
                )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
