"""miro native, miro f32 and llama.cpp's batched API on a TinyLlama-1.1B-, Llama-3.2-1B-, Llama-3.2-3B- or
Qwen2.5-1.5B-shaped model with random weights.

    python benchmarks/tinyllama.py --llama-python VENV/bin/python
                                   [--shape tinyllama|llama3.2-1b|llama3.2-3b|qwen2.5-1.5b]
                                   [--quant Q4_0|Q4_K_M|Q8_0] [--seqs 8] [--prompt-tokens 32] [--new-tokens 16]
                                   [--rounds 1] [--engines native,llama.cpp,f32] [--tier avx2]

The model (--shape), a llama unless named otherwise:
- tinyllama: dim 2048, 22 layers, 32/4 heads, FFN 5632, vocab 32000, separate head;
- llama3.2-1b: dim 2048, 16 layers, 32/8 heads, FFN 8192, vocab 128256, the head tied to the embedding, RoPE base
  500000 and Llama 3's frequency factors (rope_freqs.weight, factor 32 over 8192 positions);
- llama3.2-3b: llama3.2-1b's with dim 3072, 28 layers, 24/8 heads (head_dim 128);
- qwen2.5-1.5b: llama.cpp's qwen2 architecture, dim 1536, 28 layers, 12/2 heads (head_dim 128), FFN 8960, vocab
  151936, the head tied, RoPE base 1000000 (NEOX), RMS eps 1e-6, F32 biases on Q, K and V (0.5 N(0, 1)).
Norms 1. The vocabulary is the tests' byte-level BPE padded to the shape's size (the prompts are token ids).
--quant picks its weights:
- Q4_0 (default): every matrix random Q4_0 blocks (about 0.6 GB for tinyllama), written into a temp folder each
  run;
- Q4_K_M, Q8_0: the same model written with random F16 matrices (uniform, the Q4_0 blocks' range and spread),
  then quantized by llama.cpp's own llama_model_quantize(LLAMA_FTYPE_MOSTLY_Q4_K_M or _Q8_0) under
  --llama-python: its recipe (Q4_K_M: Q4_K for most matrices, Q6_K for the output head, or the tied embedding,
  and some attn_v / ffn_down; Q8_0: every matrix). The F16 file (2.2 GB for tinyllama, 6.4 GB for llama3.2-3b)
  is deleted once quantized; the result is kept in ~/.cache/miro/bench/, named by the shape, seed and quant, for
  later runs.
The file's tensor type mix is printed. Each engine then runs in its own process on the same token-id prompts,
all sequences at once, greedy, EOS ignored, and reports load time, its own peak RSS and total tokens/s
(prompt + generated over the run, load excluded), then how many sequences' greedy tokens each miro engine shares
with llama.cpp's (random weights leave near-ties: a late divergence is rounding, not a wrong layer). f32 holds
every weight as float32 (12.8 GB for llama3.2-3b): leave it out of --engines where memory is short.
--rounds N runs the engines in turn N times and prints native / llama.cpp round by round and the median: this
machine's speed drifts between minutes.
miro's KV cache holds the blocks the run needs, as llama.cpp's context is sized to the run.
llama.cpp runs through llama-cpp-python's low-level API, in the interpreter given by --llama-python (or $LLAMA_PYTHON):
one llama_batch holding every sequence, flash attention on, as llama.cpp's examples/parallel does.

--tier avx2 runs miro under the AVX2 tier's emulation (benchmarks/tiers.py): give it a llama.cpp built for AVX2.

The issue's targets for native: peak RSS <= file size x 1.3 + KV cache; load <= 1 s; throughput >= llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

import tiers

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "tinyllama": dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632, vocab=32000),
    "llama3.2-1b": dict(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab=128256,
        tied=1,
        rope_theta=500000,
        rope_freqs=32,
    ),
    "llama3.2-3b": dict(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab=128256,
        tied=1,
        rope_theta=500000,
        rope_freqs=32,
    ),
    "qwen2.5-1.5b": dict(
        dim=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        ffn_dim=8960,
        vocab=151936,
        tied=1,
        rope_theta=1000000,
        arch="qwen2",
        rms_eps=1e-6,
        qkv_bias=1,
    ),
}
SHAPE_NAME = "tinyllama"  # main() sets the one asked for (--shape)
SHAPE = SHAPES[SHAPE_NAME]
CONTEXT = 2048


Q4_0_SCALE = 0.004  # the random Q4_0 blocks' float16 scale: values (nibble - 8) x scale, in about +-0.03
CACHE = Path.home() / ".cache" / "miro" / "bench"  # llama.cpp's quantized files, one per shape, seed and quant
LLAMA_FTYPES = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}  # made by its quantizer


def layout() -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and shape, in file order: matrices (rows, cols), vectors (norms, biases, rope_freqs)."""
    s = SHAPE
    dim, kv_dim = s["dim"], s["dim"] // s["n_heads"] * s["n_kv_heads"]
    tensors = [("token_embd.weight", (s["vocab"], dim))]
    if s.get("rope_freqs"):
        tensors.append(("rope_freqs.weight", (s["dim"] // s["n_heads"] // 2,)))
    for i in range(s["n_layers"]):
        b = f"blk.{i}"
        tensors += [(f"{b}.attn_norm.weight", (dim,))]
        for proj, rows in (("q", dim), ("k", kv_dim), ("v", kv_dim)):
            tensors.append((f"{b}.attn_{proj}.weight", (rows, dim)))
            if s.get("qkv_bias"):
                tensors.append((f"{b}.attn_{proj}.bias", (rows,)))
        tensors += [
            (f"{b}.attn_output.weight", (dim, dim)),
            (f"{b}.ffn_norm.weight", (dim,)),
            (f"{b}.ffn_gate.weight", (s["ffn_dim"], dim)),
            (f"{b}.ffn_up.weight", (s["ffn_dim"], dim)),
            (f"{b}.ffn_down.weight", (dim, s["ffn_dim"])),
        ]
    tensors.append(("output_norm.weight", (dim,)))
    return tensors if s.get("tied") else tensors + [("output.weight", (s["vocab"], dim))]


def llama3_rope_freqs(head_dim: int, theta: float, factor: float, low=1.0, high=4.0, original=8192) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for a Llama 3.x config (rope_type llama3)."""
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def random_q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_0 blocks with scale Q4_0_SCALE, as (rows, bytes of a row) uint8."""
    blocks = rng.integers(0, 256, size=(rows * cols // 32, 18), dtype=np.uint8)
    blocks[:, :2] = np.array([Q4_0_SCALE], dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, cols // 32 * 18)


def random_f16(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Uniform in the Q4_0 blocks' range +-8 x Q4_0_SCALE (the same spread), as (rows, bytes of a row) uint8."""
    half = 8 * Q4_0_SCALE
    values = rng.random((rows, cols), dtype=np.float32) * (2 * half) - half
    return values.astype(np.float16).view(np.uint8)


RANDOM_MATRIX = {"Q4_0": random_q4_0, "F16": random_f16}


def add_metadata(w, file_type) -> None:
    """The shape's hyperparameters and a byte-level BPE vocabulary padded to its vocabulary size."""
    import gguf

    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_factory import tiny_vocab  # byte-level BPE tokens miro and llama.cpp both read

    s = SHAPE
    tokens, types, merges = tiny_vocab()
    tokens += [f"<x{i}>" for i in range(s["vocab"] - len(tokens))]
    types += [int(gguf.TokenType.NORMAL)] * (s["vocab"] - len(types))
    w.add_name(f"{SHAPE_NAME}-shaped-random")
    w.add_block_count(s["n_layers"])
    w.add_context_length(CONTEXT)
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(s["ffn_dim"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_freq_base(float(s.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(s.get("rms_eps", 1e-5))
    w.add_vocab_size(s["vocab"])
    w.add_rope_dimension_count(s["dim"] // s["n_heads"])
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def write_model(path: Path, weights: str = "Q4_0", seed: int = 0) -> None:
    """A GGUF of the shape, every matrix random `weights` (Q4_0 blocks or F16 values), norms 1, biases N(0, 0.25).

    Tensors are made and written one at a time, so memory holds one matrix (the F16 files are 2.2 to 6.4 GB).
    """
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    qtype = gguf.GGMLQuantizationType[weights]
    file_type = {"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "F16": gguf.LlamaFileType.MOSTLY_F16}[weights]
    tensors = layout()
    w = gguf.GGUFWriter(str(path), SHAPE.get("arch", "llama"))
    add_metadata(w, file_type)
    for name, shape in tensors:
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            byte_shape = quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape in tensors:
        if name == "rope_freqs.weight":
            s = SHAPE
            w.write_tensor_data(llama3_rope_freqs(s["dim"] // s["n_heads"], s["rope_theta"], s["rope_freqs"]))
            continue
        if name.endswith(".bias"):  # large enough to weigh on q and k (Qwen2.5's own are larger still)
            w.write_tensor_data((0.5 * rng.standard_normal(shape)).astype(np.float32))
            continue
        w.write_tensor_data(np.ones(shape, np.float32) if len(shape) == 1 else RANDOM_MATRIX[weights](rng, *shape))
    w.close()


QUANTIZE_SCRIPT = r"""
import ctypes, sys
import llama_cpp as l

src, dst, threads, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
l.llama_backend_init()
params = l.llama_model_quantize_default_params()
params.ftype = getattr(l, ftype)
params.nthread = threads
sys.exit(l.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
"""


def quantized_model(quant: str, llama_python: str | None, threads: int, seed: int = 0) -> tuple[Path, str]:
    """llama.cpp's `quant` (a LLAMA_FTYPES key) of the random F16 model: made once per shape, seed and quant, then
    read from CACHE.

    Returns the path and how it came to be (for the report line).
    """
    path = CACHE / f"{SHAPE_NAME}-{'-'.join(map(str, SHAPE.values()))}-seed{seed}-{quant.lower()}.gguf"
    if path.exists():
        return path, f"cached in {CACHE}"
    if not llama_python:
        raise SystemExit(f"--quant {quant}: llama.cpp's quantizer runs under --llama-python (once; the file is cached)")
    CACHE.mkdir(parents=True, exist_ok=True)
    f16, partial = path.with_suffix(".f16.tmp"), path.with_suffix(".partial")
    t0 = time.perf_counter()
    try:
        write_model(f16, "F16", seed)
        done = subprocess.run(
            [llama_python, "-c", QUANTIZE_SCRIPT, str(f16), str(partial), str(threads), LLAMA_FTYPES[quant]],
            capture_output=True,
            text=True,
        )
    finally:
        f16.unlink(missing_ok=True)  # 2.2 to 6.4 GB: kept only while the quantizer reads it
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.rename(path)
    return path, f"F16 written and quantized by llama.cpp in {time.perf_counter() - t0:.0f} s, cached in {CACHE}"


def model_file(quant: str, folder: Path, llama_python: str | None, threads: int) -> tuple[Path, str]:
    """The model for --quant (Q4_0 written into `folder`, llama.cpp's quants from the cache) and how it came to be."""
    if quant in LLAMA_FTYPES:
        return quantized_model(quant, llama_python, threads)
    path = folder / f"{SHAPE_NAME}-q4_0.gguf"
    t0 = time.perf_counter()
    write_model(path)
    return path, f"written in {time.perf_counter() - t0:.0f} s"


def type_mix(path: Path) -> str:
    """How many tensors of each GGML type the file holds, most common first."""
    import gguf

    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return ", ".join(f"{n} {name}" for name, n in counts.most_common())


def prompts(n_seqs: int, n_tokens: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(3, 259, size=n_tokens).tolist() for _ in range(n_seqs)]  # byte tokens: no control ids


def kv_cache_bytes(n_seqs: int, n_tokens: int) -> int:
    """float32 K and V for every token of every sequence, all layers (what miro's cache needs at least)."""
    s = SHAPE
    return 2 * 4 * s["n_layers"] * s["n_kv_heads"] * (s["dim"] // s["n_heads"]) * n_seqs * n_tokens


# -- one engine per process ---------------------------------------------------------------------------


def run_miro(path: str, weights: str, seqs: list[list[int]], new_tokens: int, threads: int) -> dict:
    sys.path.insert(0, str(ROOT.parent))
    from miro.cli.common import limit_threads
    from miro.core import Engine, SamplingParams

    limit_threads(threads)
    t0 = time.perf_counter()
    # a KV cache of the blocks this run needs, as llama.cpp's context is sized to it (n_ctx below)
    block_size = 16
    blocks = len(seqs) * -(-(max(map(len, seqs)) + new_tokens) // block_size)
    engine = Engine.from_model(
        path, weights=weights, block_size=block_size, num_kv_blocks=blocks, max_num_seqs=len(seqs)
    )
    load_s = time.perf_counter() - t0
    # numba's kernels compile (or load from cache) outside the timing: a run of the same shape on other
    # prompts (so the prefix cache holds nothing the timed run can use)
    warm = [[3 + (t + 1) % 256 for t in s] for s in seqs]
    engine.generate(warm, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    outs = engine.generate(seqs, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    run_s = time.perf_counter() - t0
    generated = [list(o.outputs[0].token_ids) for o in outs]
    return dict(
        load_s=load_s,
        run_s=run_s,
        tokens=sum(map(len, seqs)) + sum(map(len, generated)),
        weight_memory=engine.weight_memory,
        generated=generated,
    )


LLAMA_CPP_SCRIPT = r"""
import json, sys, time, ctypes
import numpy as np
import llama_cpp as l

path, seqs, new_tokens, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
l.llama_backend_init()
t0 = time.perf_counter()
mp = l.llama_model_default_params()
model = l.llama_model_load_from_file(path.encode(), mp)
cp = l.llama_context_default_params()
n_ctx = len(seqs) * (max(map(len, seqs)) + new_tokens + 8)
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, len(seqs)
cp.n_threads = cp.n_threads_batch = threads
cp.flash_attn_type = l.LLAMA_FLASH_ATTN_TYPE_ENABLED
ctx = l.llama_init_from_model(model, cp)
load_s = time.perf_counter() - t0
n_vocab = l.llama_vocab_n_tokens(l.llama_model_get_vocab(model))
batch = l.llama_batch_init(512, 0, len(seqs))

def decode(items):  # items: (token, pos, seq, wants_logits); returns {seq: argmax}
    picks = {}
    for start in range(0, len(items), 512):
        chunk = items[start:start + 512]
        for i, (tok, pos, seq, want) in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, want
        batch.n_tokens = len(chunk)
        assert l.llama_decode(ctx, batch) == 0
        for i, (tok, pos, seq, want) in enumerate(chunk):
            if want:
                row = np.ctypeslib.as_array(l.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                picks[seq] = int(row.argmax())
    return picks

decode([(seqs[0][i], i, 0, i == 3) for i in range(4)])  # warm-up outside the timing, as for miro
l.llama_memory_clear(l.llama_get_memory(ctx), True)
t0 = time.perf_counter()
items = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(seqs) for p, t in enumerate(ids)]
last = decode(items)
lengths = [len(ids) for ids in seqs]
generated = [[last[s]] for s in range(len(seqs))]
for step in range(new_tokens - 1):
    last = decode([(last[s], lengths[s] + step, s, True) for s in range(len(seqs))])
    for s in range(len(seqs)):
        generated[s].append(last[s])
run_s = time.perf_counter() - t0
tokens = sum(lengths) + sum(map(len, generated))
print(json.dumps(dict(load_s=load_s, run_s=run_s, tokens=tokens, generated=generated)))
"""


def child_result(cmd: list[str]) -> dict:
    """Run one engine in its own process; its JSON line plus that process's own peak RSS (wait4's rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[:3]} failed:\n{err.read()[-3000:]}")
        result = json.loads(out.read().strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def print_ratios(runs: list[dict]) -> None:
    """native / llama.cpp tokens/s, round by round (each round runs both in turn), and their median."""
    ratios = sorted(
        r["native"]["tokens"] / r["native"]["run_s"] / (r["llama.cpp"]["tokens"] / r["llama.cpp"]["run_s"])
        for r in runs
        if "native" in r and "llama.cpp" in r
    )
    if ratios:
        print(
            f"native / llama.cpp tok/s, round by round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
            f"median {ratios[len(ratios) // 2]:.2f}x",
            flush=True,
        )


def print_agreement(results: dict) -> None:
    """How many sequences' greedy tokens each miro engine shares with llama.cpp's, and where the others part."""
    if "llama.cpp" not in results:
        return
    theirs = results["llama.cpp"]["generated"]
    for name, r in results.items():
        if name == "llama.cpp":
            continue
        shared = []
        for ours, ref in zip(r["generated"], theirs):
            n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
            shared.append(n)
        same = sum(n == len(ref) for n, ref in zip(shared, theirs))
        parted = sorted(n for n, ref in zip(shared, theirs) if n < len(ref))
        print(
            f"greedy tokens, {name} against llama.cpp: {same} of {len(theirs)} sequences identical"
            + (f"; the others part after {', '.join(map(str, parted))} tokens" if parted else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="tinyllama")
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--engines", default="native,llama.cpp,f32")
    parser.add_argument(
        "--quant",
        choices=("Q4_0", *LLAMA_FTYPES),
        default="Q4_0",
        help="Q4_0: random blocks; Q4_K_M, Q8_0: llama.cpp's quantizer on random F16 weights (cached)",
    )
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("LLAMA_PYTHON"),
        help="A Python with llama-cpp-python installed (without it, llama.cpp is skipped).",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the engines in turn this many times; prints native / llama.cpp round by round",
    )
    parser.add_argument("--child", nargs=2, metavar=("WEIGHTS", "PATH"), help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()
    global SHAPE, SHAPE_NAME
    SHAPE, SHAPE_NAME = SHAPES[args.shape], args.shape
    seqs = prompts(args.seqs, args.prompt_tokens)
    if args.child:
        print(json.dumps(run_miro(args.child[1], args.child[0], seqs, args.new_tokens, args.threads)))
        return
    tiers.enter(args)  # the --child processes inherit the emulation's environment
    print(tiers.header(args, args.llama_python, with_llama="llama.cpp" in args.engines.split(",")), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path, origin = model_file(args.quant, Path(tmp), args.llama_python, args.threads)
        size = path.stat().st_size
        print(f"{path.name}: {size / 2**20:,.0f} MiB ({origin}); tensor types: {type_mix(path)}", flush=True)
        print(
            f"{args.seqs} sequences x ({args.prompt_tokens} prompt + {args.new_tokens} new) tokens, "
            f"{args.threads} threads",
            flush=True,
        )
        runs = []
        for round_ in range(args.rounds):  # the engines in turn, one at a time, so that drift hits each alike
            results = {}
            for name in args.engines.split(","):
                if name == "llama.cpp" and not args.llama_python:
                    print("  llama.cpp: skipped (no --llama-python)", flush=True)
                    continue
                if name == "llama.cpp":
                    cmd = [
                        args.llama_python,
                        "-c",
                        LLAMA_CPP_SCRIPT,
                        str(path),
                        json.dumps(seqs),
                        str(args.new_tokens),
                        str(args.threads),
                    ]
                else:
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        name,
                        str(path),
                        "--shape",
                        args.shape,
                        "--seqs",
                        str(args.seqs),
                        "--prompt-tokens",
                        str(args.prompt_tokens),
                        "--new-tokens",
                        str(args.new_tokens),
                        "--threads",
                        str(args.threads),
                    ]
                results[name] = r = child_result(cmd)
                print(
                    f"{name:>10}: load {r['load_s']:6.2f} s  peak RSS {r['peak_rss'] / 2**20:>8,.0f} MiB  "
                    f"{r['tokens'] / r['run_s']:7.1f} tok/s ({r['tokens']} tokens in {r['run_s']:.1f} s)",
                    flush=True,
                )
            runs.append(results)
        print_agreement(runs[0] if runs else {})
        print_ratios(runs)
        if "native" in results:
            kv = kv_cache_bytes(args.seqs, args.prompt_tokens + args.new_tokens)
            print(
                f"targets for native: peak RSS <= {(size * 1.3 + kv) / 2**20:,.0f} MiB (file x 1.3 + KV), load <= 1 s"
                + (
                    f", tok/s >= llama.cpp's {results['llama.cpp']['tokens'] / results['llama.cpp']['run_s']:.1f}"
                    if "llama.cpp" in results
                    else ""
                )
            )


if __name__ == "__main__":
    main()
