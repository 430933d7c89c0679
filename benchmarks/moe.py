"""miro against llama.cpp's batched API on a Qwen3-MoE-shaped mixture of experts with random weights (issue 41).

    python benchmarks/moe.py --llama-python VENV/bin/python [--rounds 3] [--prompts 48] [--tier avx2] [--weights native]

The model: qwen3moe, 16 layers, dim 1024, 16/4 heads of 128 (key_length, as Qwen3-30B-A3B's heads are wider than
dim / heads), 64 experts of 512, 8 active, vocab 32,000 (a byte-level BPE padded), its own head: about 1.7 B
parameters, 0.3 B active. Written with random F16 matrices (uniform in +-0.032; the router F32, as llama.cpp's
quantizer leaves it), then quantized by llama.cpp's llama_model_quantize(LLAMA_FTYPE_MOSTLY_Q4_K_M) under
--llama-python (Q4_K experts and attention, Q6_K for some down experts, attn_v and the head); the F16 file is
deleted once quantized, the result kept in ~/.cache/miro/bench/ for later runs.

Two workloads, each engine in its own process, in turn, --rounds times (medians printed; this machine is shared
and its speed drifts):
- batch: --prompts prompts of 16 to 128 tokens (seeded), each generating 32 tokens, greedy, EOS ignored; miro with
  its defaults (Engine.generate over all of them), llama.cpp with its batched API as examples/parallel runs it
  (benchmarks/throughput.py's run_llama_cpp_batched: 32 sequences per llama_decode, a finished one's slot
  refilled, flash attention on). Total (prompt + generated) tokens/s.
- one: a single sequence (a 64-token prompt, 64 new tokens): miro's generate of one request against the same
  llama.cpp loop with one sequence.
Each engine's peak RSS (its process's VmHWM, read by the process itself as it ends: wait4's ru_maxrss would carry
this parent's own high-water mark across fork and exec) is printed against the file plus the KV cache the run needs
(f16 K and V of every token of the 32 sequences llama.cpp holds at once; miro's cache is sized by its defaults and
its pages become resident as blocks are first written: each miro line also gives the KV pages resident at its end,
read from /proc/self/smaps, and its peak RSS over the file plus those). miro's untimed warm-up (kernels loaded or compiled) runs
the same number of prompts, 4 tokens each: a run's kernels without touching a second run's worth of KV blocks.

--tier avx2 runs miro under the AVX2 tier's emulation (benchmarks/tiers.py): give it a llama.cpp built for AVX2.
--weights: miro's weight format (default auto, the engine's default: on a CPU with AMX it takes a bfloat16 copy of the
attention and head matrices; the experts always run on the file's types), or several, comma-separated (auto,native):
one miro process per format in each round, each against the same round's llama.cpp. Each miro line says what it took.
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
SHAPE = dict(
    n_layers=16,
    dim=1024,
    n_heads=16,
    n_kv_heads=4,
    head_dim=128,
    n_expert=64,
    n_expert_used=8,
    expert_ffn_dim=512,
    vocab=32000,
)
CONTEXT = 4096
CACHE = Path.home() / ".cache" / "miro" / "bench"
HALF_RANGE = 0.032  # random F16 values uniform in +-HALF_RANGE (benchmarks/tinyllama.py's spread)
NEW_TOKENS, ONE_PROMPT, ONE_NEW = 32, 64, 64
PARALLEL = 32


def layout() -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape, in file order."""
    s = SHAPE
    d, q, kv, hd = s["dim"], s["n_heads"] * s["head_dim"], s["n_kv_heads"] * s["head_dim"], s["head_dim"]
    e, f = s["n_expert"], s["expert_ffn_dim"]
    tensors = [("token_embd.weight", (s["vocab"], d))]
    for i in range(s["n_layers"]):
        b = f"blk.{i}"
        tensors += [
            (f"{b}.attn_norm.weight", (d,)),
            (f"{b}.attn_q.weight", (q, d)),
            (f"{b}.attn_k.weight", (kv, d)),
            (f"{b}.attn_v.weight", (kv, d)),
            (f"{b}.attn_output.weight", (d, q)),
            (f"{b}.attn_q_norm.weight", (hd,)),
            (f"{b}.attn_k_norm.weight", (hd,)),
            (f"{b}.ffn_norm.weight", (d,)),
            (f"{b}.ffn_gate_inp.weight", (e, d)),
            (f"{b}.ffn_gate_exps.weight", (e, f, d)),
            (f"{b}.ffn_up_exps.weight", (e, f, d)),
            (f"{b}.ffn_down_exps.weight", (e, d, f)),
        ]
    return tensors + [("output_norm.weight", (d,)), ("output.weight", (s["vocab"], d))]


def write_f16(path: Path, seed: int = 0) -> None:
    """The model with random F16 matrices (norms 1, router F32), one tensor in memory at a time."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    from shaped_models import add_byte_vocab

    s = SHAPE
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("qwen3moe-bench-shaped-random")
    w.add_block_count(s["n_layers"])
    w.add_context_length(CONTEXT)
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(3 * s["dim"])  # unused by qwen3moe, present in real files
    w.add_expert_feed_forward_length(s["expert_ffn_dim"])
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_expert_used"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_byte_vocab(w, s["vocab"])
    tensors = layout()
    f16 = gguf.GGMLQuantizationType.F16
    for name, shape in tensors:
        if len(shape) == 1 or "ffn_gate_inp" in name:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        else:
            byte_shape = quant_shape_to_byte_shape(shape, f16)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=f16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape in tensors:
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
        elif "ffn_gate_inp" in name:
            w.write_tensor_data((rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(np.float32))
        else:  # at most 64 MiB of float16 (a layer's expert tensor) at a time
            values = (rng.random(shape, dtype=np.float32) * (2 * HALF_RANGE) - HALF_RANGE).astype(np.float16)
            w.write_tensor_data(values.view(np.uint8))
    w.close()


def q4_k_m_model(llama_python: str | None, threads: int) -> tuple[Path, str]:
    """llama.cpp's Q4_K_M of the random F16 model: made once, then read from CACHE."""
    from shaped_models import LLAMA_FTYPES, QUANTIZE_SCRIPT

    path = CACHE / f"qwen3moe-{'-'.join(map(str, SHAPE.values()))}-q4_k_m.gguf"
    if path.exists():
        return path, f"cached in {CACHE}"
    if not llama_python:
        raise SystemExit("the Q4_K_M file is made by llama.cpp's quantizer under --llama-python (once; then cached)")
    CACHE.mkdir(parents=True, exist_ok=True)
    f16, partial = path.with_suffix(".f16.tmp"), path.with_suffix(".partial")
    t0 = time.perf_counter()
    try:
        write_f16(f16)
        done = subprocess.run(
            [llama_python, "-c", QUANTIZE_SCRIPT, str(f16), str(partial), str(threads), LLAMA_FTYPES["Q4_K_M"]],
            capture_output=True,
            text=True,
        )
    finally:
        f16.unlink(missing_ok=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.rename(path)
    return path, f"F16 written and quantized by llama.cpp in {time.perf_counter() - t0:.0f} s, cached in {CACHE}"


def workload(kind: str, n_prompts: int) -> list[tuple[list[int], int]]:
    """(prompt ids, tokens to generate): byte tokens (no control ids), seeded."""
    rng = np.random.default_rng(1)
    if kind == "one":
        return [(rng.integers(3, 259, size=ONE_PROMPT).tolist(), ONE_NEW)]
    return [(rng.integers(3, 259, size=int(n)).tolist(), NEW_TOKENS) for n in rng.integers(16, 129, size=n_prompts)]


def kv_bytes(requests, held: int) -> int:
    """f16 K and V of the `held` longest requests' every token, all layers."""
    s = SHAPE
    lengths = sorted((len(p) + n for p, n in requests), reverse=True)[:held]
    return 2 * 2 * s["n_layers"] * s["n_kv_heads"] * s["head_dim"] * sum(lengths)


# -- one engine per process ---------------------------------------------------------------------------------


def run_miro(path: str, requests, threads: int, weights: str) -> dict:
    from miro.cli.common import limit_threads
    from miro.core import Engine, SamplingParams

    limit_threads(threads)
    t0 = time.perf_counter()
    engine = Engine.from_model(path, max_model_len=CONTEXT, weights=weights)
    load_s = time.perf_counter() - t0
    warm = [([3 + (t + 1) % 256 for t in p[:4]], 3) for p, _ in requests]  # compile or load the kernels untimed
    engine.generate([p for p, _ in warm], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in requests]
    t0 = time.perf_counter()
    outs = engine.generate([p for p, _ in requests], params, use_tqdm=False)
    run_s = time.perf_counter() - t0
    assert [len(o.outputs[0].token_ids) for o in outs] == [n for _, n in requests]
    cache = engine.runner.cache
    kv = sum(resident_bytes(a) for a in (cache.k, cache.v))
    return dict(
        load_s=load_s,
        run_s=run_s,
        tokens=sum(len(p) + n for p, n in requests),
        weights=engine.weight_format,
        kv_resident=kv,
    )


def resident_bytes(array) -> int:
    """How many of this array's bytes are resident: Rss of the /proc/self/smaps mappings that hold it."""
    first, last = array.ctypes.data, array.ctypes.data + array.nbytes
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start < last and first < end
        elif inside and head == "Rss:":
            total += int(line.split()[1]) * 1024
    return total


def run_llama_cpp(path: str, requests, parallel: int) -> dict:
    from throughput import run_llama_cpp_batched

    t0 = time.perf_counter()
    rate = run_llama_cpp_batched(path, requests, parallel)
    total = sum(len(p) + n for p, n in requests)
    return dict(load_s=0.0, run_s=total / rate, tokens=total, wall_s=time.perf_counter() - t0)


def own_peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM (resident anonymous and file pages at their high-water mark)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status: peak RSS needs Linux")


def child_result(cmd: list[str]) -> dict:
    """One engine in its own process: its JSON line, with its own peak RSS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        status = proc.wait()
        out.seek(0)
        err.seek(0)
        if status != 0:
            raise SystemExit(f"{cmd[:4]} failed:\n{err.read()[-3000:]}")
        return json.loads(out.read().strip().splitlines()[-1])


def type_mix(path: Path) -> str:
    import gguf

    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return ", ".join(f"{n} {name}" for name, n in counts.most_common())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="batch,one")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    parser.add_argument("--weights", default="auto", help="miro's weight formats, comma-separated (auto, native, ...)")
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "WORKLOAD", "PATH"), help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()
    if args.child:
        engine, kind, path = args.child
        requests = workload(kind, args.prompts)
        result = (
            run_miro(path, requests, args.threads, args.weights)
            if engine == "miro"
            else run_llama_cpp(path, requests, PARALLEL if kind == "batch" else 1)
        )
        print(json.dumps({**result, "peak_rss": own_peak_rss()}))
        return
    tiers.enter(args)
    print(tiers.header(args, args.llama_python), flush=True)
    path, origin = q4_k_m_model(args.llama_python, args.threads)
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**20:,.0f} MiB ({origin}); tensor types: {type_mix(path)}", flush=True)
    for kind in args.workloads.split(","):
        requests = workload(kind, args.prompts)
        kv = kv_bytes(requests, PARALLEL if kind == "batch" else 1)
        print(
            f"\n{kind}: {len(requests)} prompts of {min(len(p) for p, _ in requests)}-"
            f"{max(len(p) for p, _ in requests)} tokens, {requests[0][1]} new each; file + KV "
            f"{(size + kv) / 2**20:,.0f} MiB",
            flush=True,
        )
        formats = args.weights.split(",")
        miros = [f"miro {w}" if len(formats) > 1 else "miro" for w in formats]
        ratios, rss = {m: [] for m in miros}, {}
        for _ in range(args.rounds):
            rates = {}
            for engine, weights in [*zip(miros, formats), ("llama.cpp", "auto")]:
                python = sys.executable if engine != "llama.cpp" else args.llama_python
                cmd = [
                    python,
                    __file__,
                    "--child",
                    "llama.cpp" if engine == "llama.cpp" else "miro",
                    kind,
                    str(path),
                    "--prompts",
                    str(args.prompts),
                    "--threads",
                    str(args.threads),
                    "--weights",
                    weights,
                ]
                r = child_result(cmd)
                rates[engine] = r["tokens"] / r["run_s"]
                rss[engine] = max(rss.get(engine, 0), r["peak_rss"])
                held = ""
                if "kv_resident" in r:
                    own = size + r["kv_resident"]
                    held = (
                        f", KV resident {r['kv_resident'] / 2**20:,.0f} MiB: peak / (file + that KV) "
                        f"{r['peak_rss'] / own:.2f}"
                    )
                print(
                    f"  {engine:>11}: {rates[engine]:7.1f} tok/s ({r['tokens']} tokens in {r['run_s']:.1f} s), "
                    f"load {r['load_s']:.1f} s, peak RSS {r['peak_rss'] / 2**20:,.0f} MiB"
                    + (f", weights {r['weights']}" if "weights" in r else "")
                    + held,
                    flush=True,
                )
            for m in miros:
                ratios[m].append(rates[m] / rates["llama.cpp"])
        for m in miros:
            x = sorted(ratios[m])
            print(
                f"  {m} / llama.cpp, round by round: {', '.join(f'{r:.2f}x' for r in ratios[m])} (in order); "
                f"median {x[len(x) // 2]:.2f}x; peak RSS {m} {rss[m] / 2**20:,.0f} MiB, llama.cpp "
                f"{rss['llama.cpp'] / 2**20:,.0f} MiB, file + KV {(size + kv) / 2**20:,.0f} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
