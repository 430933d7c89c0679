"""The engines of embeddings.py, each run in a child process of its own: miro, sentence-transformers at each batch
size and llama.cpp at each (n_ubatch, sequences) packing. embeddings.py's docstring says how each is run; child()
runs one of them and prints one JSON line."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

MODEL = "all-minilm-l6-v2"
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
WARMUP_TEXTS = 16
CHECK_TEXTS = 200  # the first texts whose embeddings the parent compares across engines
ST_BATCH_SIZES = (16, 32, 64, 128)
LLAMA_UBATCHES = (1024, 2048, 4096)
LLAMA_SEQS = (32, 64)

# -- miro (child) ---------------------------------------------------------------------------------------


def run_miro(texts: list[str], setting: dict, threads: int) -> tuple[np.ndarray, int, float, str]:
    from miro.cli.common import limit_threads
    from miro.core import Engine
    from miro.core.layers.pooling import PoolingParams

    limit_threads(threads)
    engine = Engine.from_model(MODEL, **setting["options"])
    params = PoolingParams(truncate_prompt_tokens=MAX_TOKENS)
    engine.embed(texts[:WARMUP_TEXTS], params)  # numba's kernels compile (or load from cache) here
    t0 = time.perf_counter()
    outputs = engine.encode(texts, params)
    vecs = np.stack([out.embedding for out in outputs])
    wall = time.perf_counter() - t0
    errors = [k for k, out in enumerate(outputs) if out.error]
    if errors:
        raise SystemExit(f"miro refused {len(errors)} texts, the first: {outputs[errors[0]].error}")
    options = ", ".join(f"{k}={v}" for k, v in setting["options"].items()) or "defaults"
    return vecs, sum(out.num_tokens for out in outputs), wall, f"{options}; weights {engine.weight_format}"


# -- sentence-transformers (child, under --st-python) ---------------------------------------------------


def st_load(folder: str, threads: int):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(folder, device="cpu").float()
    assert model.max_seq_length == MAX_TOKENS, model.max_seq_length
    return model, torch


def st_encode(model, texts: list[str], batch_size: int) -> np.ndarray:
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def st_sweep(texts: list[str], setting: dict, threads: int) -> dict:
    """texts/s of each batch size on the sweep texts, and the fastest."""
    model, _ = st_load(setting["folder"], threads)
    st_encode(model, texts[:WARMUP_TEXTS], WARMUP_TEXTS)
    rates = {}
    for size in ST_BATCH_SIZES:
        t0 = time.perf_counter()
        st_encode(model, texts, size)
        rates[str(size)] = len(texts) / (time.perf_counter() - t0)
    best = max(rates, key=rates.get)
    return dict(rates=rates, best=dict(folder=setting["folder"], batch_size=int(best)))


def run_st(texts: list[str], setting: dict, threads: int) -> tuple[np.ndarray, int, float, str]:
    model, torch = st_load(setting["folder"], threads)
    size = setting["batch_size"]
    st_encode(model, texts[:WARMUP_TEXTS], WARMUP_TEXTS)
    t0 = time.perf_counter()
    vecs = st_encode(model, texts, size)
    wall = time.perf_counter() - t0
    ids = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
    how = (
        f"batch size {size}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    return vecs, sum(map(len, ids)), wall, how


# -- llama.cpp (child, under --llama-python) ------------------------------------------------------------


def cut(ids: list[int]) -> list[int]:
    """At most MAX_TOKENS ids: the first ones, then the last ([SEP]), as sentence-transformers and miro cut."""
    return ids if len(ids) <= MAX_TOKENS else ids[: MAX_TOKENS - 1] + ids[-1:]


def llama_embed(llm, texts: list[list[int]], ubatch: int, max_seqs: int) -> tuple[np.ndarray, int]:
    """Normalized embeddings of token-id texts, packed into llama_decode calls of <= ubatch tokens and
    <= max_seqs sequences."""
    import llama_cpp
    from llama_cpp._internals import LlamaBatch

    dim = llm.n_embd()
    out = np.empty((len(texts), dim), np.float32)
    batch = LlamaBatch(n_tokens=ubatch, embd=0, n_seq_max=1, verbose=False)
    members, used, total = [], 0, 0

    def decode() -> None:  # the batch's sequences at once; sequence j's pooled embedding is text members[j]'s
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(batch)
        for seq, k in enumerate(members):
            out[k] = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, seq), shape=(dim,))
        batch.reset()
        members.clear()

    for i, ids in enumerate(texts):
        if members and (used + len(ids) > ubatch or len(members) >= max_seqs):
            decode()
            used = 0
        batch.add_sequence(ids, len(members), True)  # every token an output, as Llama.embed marks them
        members.append(i)
        used += len(ids)
        total += len(ids)
    if members:
        decode()
    batch.close()
    return out / np.linalg.norm(out, axis=1, keepdims=True), total


def llama_load(path: str, ubatch: int, threads: int, warmup: list[list[int]]):
    """Llama with flash attention on, or off if the model refuses it; warmed up on `warmup`."""
    from llama_cpp import Llama

    failure = None
    for flash in (True, False):
        llm = None
        try:
            llm = Llama(
                model_path=path,
                embedding=True,
                n_ctx=ubatch,
                n_batch=ubatch,
                n_ubatch=ubatch,
                n_threads=threads,
                n_threads_batch=threads,
                flash_attn=flash,
                verbose=False,
            )
            llama_embed(llm, warmup, ubatch, len(warmup))
            return llm, flash
        except (ValueError, RuntimeError) as err:
            failure = err
            if llm is not None:
                llm.close()
    raise SystemExit(f"llama.cpp refused n_ubatch {ubatch} with flash attention on and off: {failure}")


def llama_sweep(texts: list[str], setting: dict, threads: int) -> dict:
    texts = json.loads(Path(setting["ids"]).read_text())[: len(texts)]
    rates, best = {}, None
    for ubatch in LLAMA_UBATCHES:
        llm, flash = llama_load(setting["path"], ubatch, threads, texts[:WARMUP_TEXTS])
        for seqs in LLAMA_SEQS:
            t0 = time.perf_counter()
            llama_embed(llm, texts, ubatch, seqs)
            label = f"n_ubatch {ubatch}, {seqs} seqs, flash {'on' if flash else 'off'}"
            rates[label] = len(texts) / (time.perf_counter() - t0)
            if best is None or rates[label] > best[0]:
                best = (rates[label], dict(setting, ubatch=ubatch, seqs=seqs))
        llm.close()
    return dict(rates=rates, best=best[1])


def run_llama(texts: list[str], setting: dict, threads: int) -> tuple[np.ndarray, int, float, str]:
    import llama_cpp

    texts = json.loads(Path(setting["ids"]).read_text())
    llm, flash = llama_load(setting["path"], setting["ubatch"], threads, texts[:WARMUP_TEXTS])
    t0 = time.perf_counter()
    vecs, tokens = llama_embed(llm, texts, setting["ubatch"], setting["seqs"])
    wall = time.perf_counter() - t0
    llm.close()
    how = (
        f"n_ubatch {setting['ubatch']}, up to {setting['seqs']} sequences per decode, flash attention "
        f"{'on' if flash else 'off'}; llama-cpp-python {llama_cpp.__version__}"
    )
    return vecs, tokens, wall, how


RUNS = {"miro": run_miro, "sentence-transformers": run_st, "llama.cpp": run_llama}
SWEEPS = {"sentence-transformers": st_sweep, "llama.cpp": llama_sweep}


def child(args: argparse.Namespace) -> None:
    """One engine's run (or sweep) in this process; one JSON line on stdout."""
    texts = json.loads(Path(args.texts).read_text())
    setting = json.loads(args.setting)
    kind, _, mode = args.child.partition(":")
    if mode == "sweep":
        print(json.dumps(SWEEPS[kind](texts[: args.sweep_texts], setting, args.threads)))
        return
    vecs, tokens, wall, how = RUNS[kind](texts, setting, args.threads)
    np.save(args.out, np.asarray(vecs[:CHECK_TEXTS], np.float32))
    print(json.dumps(dict(texts=len(texts), tokens=tokens, wall_s=wall, how=how)))
