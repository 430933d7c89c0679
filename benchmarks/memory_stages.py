"""Where a model's peak RSS goes (issue 22's memory target): VmRSS and VmHWM after each stage of what
Engine.from_model does, then of a generate() of 48 short prompts x 32 tokens, with default options.

    python benchmarks/memory_stages.py [MODEL]        (default gemma3-270m)

It prints a table and issue 22's target for the model: 1.5 x the file plus the KV cache.
"""

import ctypes, gc, os, sys, time

MODEL = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"


def mem():
    d = {}
    for line in open("/proc/self/status"):
        k, v = line.split(":", 1)
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            d[k] = int(v.split()[0]) / 1024
    return d


last = mem()


def show(stage, note=""):
    global last
    m = mem()
    print(
        f"| {stage:40s} | {m['VmRSS']:7.1f} | {m['VmRSS'] - last['VmRSS']:+7.1f} | {m['VmHWM']:7.1f} | {m['RssFile']:6.1f} | {note}",
        flush=True,
    )
    last = m


print("| stage | VmRSS MiB | delta | VmHWM | file-backed | note |")
show("interpreter")
import numpy

show("import numpy")
import numba

show("import numba (+llvmlite)")
import tokenizers

show("import tokenizers")
from miro.core import Engine, SamplingParams
from miro.core.engine.engine import GGUFFile, read_config, Tokenizer, load_model, resolve_model, EngineConfig

show("import miro.core (rest)")
path = resolve_model(MODEL, lambda m: None)
size = os.path.getsize(path) / 2**20
gguf = GGUFFile(path)
cfg = read_config(gguf)
show("GGUFFile parse (metadata objects)")
tok = Tokenizer.from_gguf_metadata(gguf.metadata, source=str(path))
show("tokenizer")
model = load_model(gguf, cfg, "native", False)
show("weights (native, repacked)", f"weight_memory {model.weight_memory / 2**20:.1f} MiB; file {size:.1f} MiB")
del gguf
gc.collect()
show("GGUFFile dropped")
engine = Engine(model, tok, EngineConfig.of({}), model_name=MODEL)
show("engine (KV cache)", f"KV {engine.runner.cache.nbytes / 2**20:.1f} MiB")
m = engine.runner.model
orig = m.forward
steps = []


def fwd(step, cache):
    out = orig(step, cache)
    if len(steps) < 2:
        steps.append(1)
        show(
            f"step {len(steps)} (T={len(step.token_ids)}) after forward",
            f"logits {out.shape} {out.nbytes / 2**20:.1f} MiB live",
        )
    return out


m.forward = fwd
topics = ["the sea", "a cat", "winter", "coffee", "a library", "trains", "the moon", "bread"]
prompts = [f"Write one sentence about {t} (variant {i})." for i in range(6) for t in topics]
t0 = time.perf_counter()
outs = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0), use_tqdm=False)
dt = time.perf_counter() - t0
show("generate 48 prompts x 32 tokens", f"{sum(len(o.outputs[0].token_ids) for o in outs) / dt:.1f} tok/s")
ctypes.CDLL("libc.so.6").malloc_trim(0)
show("malloc_trim(0)")
print(f"target 1.5 x file + KV = {1.5 * size + engine.runner.cache.nbytes / 2**20:.1f} MiB")
