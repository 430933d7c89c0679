"""Grammar engines for structured output, measured on the default model's vocabulary.

    python3 -m venv .venv-grammar
    .venv-grammar/bin/pip install -e . llguidance xgrammar outlines-core jsonschema
    .venv-grammar/bin/python benchmarks/grammar_engines.py [--runs 3] [--model PATH]

A separate venv, because xgrammar pulls torch. Candidates: llguidance (1.9.x),
xgrammar (0.2.x), outlines-core (0.2.x); each is imported lazily, so one that
is missing is reported as "not installed". Nothing is loaded from a hub: each
engine's tokenizer is built from miro's own Tokenizer over the GGUF file
(SmolLM2-135M-Instruct: byte-level BPE, 49,152 tokens, 17 control tokens of
which <|endoftext|> and <|im_end|> end generation).

Each engine is told the special tokens its own way (llguidance: a 0xFF byte in
front of the token's bytes; xgrammar: an empty token, which it classes as
special; outlines-core: the token left out of the vocabulary) and the
end-of-generation ids (EOS / stop tokens), and runs single-threaded. Tables:

1. setup: building the engine's tokenizer / vocabulary (once per process).
   Also: import time and the package's own requirements.
2. compile: ms per constraint (7: flat schema, nested schema, any JSON object,
   date regex, choice of 3 strings, a small SQL-like grammar in Lark and in
   GBNF), fresh compiles (no cache), and the first mask after it (lazy engines
   build there).
3. mask: a walk through a valid output, one full-vocabulary mask per token:
   the engine writes int32 bitmask words (bit j of word w = token 32w+j) into
   a numpy array; median / p99 / max microseconds per mask over the warm
   walks (runs 2..N, a matcher per run from one compiled grammar), the cold
   walk's median (run 1), and the cost of turning the words into a numpy bool
   array and applying it to a float32 logits row (`logits[~allowed] = -inf`).
   The walk steers: at each step the allowed token with the longest byte
   match to the rest of the target, except that a multi-byte UTF-8 character
   is started with its lone lead-byte token (e.g. 0xC3) to go through the
   partial-UTF-8 states.
4. correctness: the target's own tokenization (tok.encode) walked token by
   token (refusal reported); lead-byte tokens allowed inside strings; special
   tokens never allowed; end-of-generation only at the end (no proper prefix
   of a target is itself complete); the final text parses and validates
   (json.loads + jsonschema where installed, re / choice list otherwise); and,
   as a control, whether <|im_start|> leaks into a JSON string when the
   special tokens are handed over as plain text instead.
5. JSON Schema coverage: per feature, compile, a valid instance accepted, an
   invalid one refused ("ok"), or "loose" (invalid one accepted: the keyword
   is not enforced), "rejects valid", or the refusal.

Timings are medians on a shared machine; no timed assertion is made.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grammar_adapters import ENGINES, Constraint, Engine, Refused, Vocab, words_to_bool
from grammar_cases import CONSTRAINTS, COVERAGE

MODEL = Path("~/.cache/miro/models/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()


# ---------------------------------------------------------------- walking a constraint


@dataclass
class Walk:
    ok: bool = True
    why: str = ""
    text: bytes = b""
    mask_us: list[float] = field(default_factory=list)
    bool_us: list[float] = field(default_factory=list)
    apply_us: list[float] = field(default_factory=list)
    lead_byte: list[bool] = field(default_factory=list)  # lead-byte token allowed where a multi-byte char starts
    special_leaks: int = 0  # steps where a non-EOG special token was allowed
    early_eog: int = 0  # steps before the end where an EOG token was allowed
    eog_at_end: list[int] = field(default_factory=list)
    others_at_end: int = 0  # non-EOG tokens allowed at the end


def walk(engine: Engine, compiled, vocab: Vocab, target: bytes, ids: list[int] | None = None) -> Walk:
    """Drive a fresh matcher through `target`: by `ids` if given, else steering (see the module docstring)."""
    state = engine.start(compiled)
    words = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    logits = np.random.default_rng(0).standard_normal(vocab.size, dtype=np.float32)
    eog, non_eog = np.array(vocab.eog), np.array(sorted(set(vocab.special) - set(vocab.eog)))
    w, pos, step = Walk(), 0, 0
    while True:
        t0 = time.perf_counter()
        engine.fill(state, words)
        t1 = time.perf_counter()
        allowed = words_to_bool(words, vocab.size)
        t2 = time.perf_counter()
        row = logits.copy()
        t3 = time.perf_counter()
        row[~allowed] = -np.inf
        t4 = time.perf_counter()
        w.mask_us.append((t1 - t0) * 1e6)
        w.bool_us.append((t2 - t1) * 1e6)
        w.apply_us.append((t4 - t3) * 1e6)
        w.special_leaks += bool(allowed[non_eog].any())
        rest = target[pos:]
        if not rest:
            w.eog_at_end = [int(i) for i in eog if allowed[i]]
            w.others_at_end = int(allowed.sum()) - len(w.eog_at_end)
            if not w.eog_at_end:
                w.ok, w.why = False, "no end-of-generation token allowed at the end"
            return w
        w.early_eog += bool(allowed[eog].any())
        if ids is not None:
            token = ids[step]
            if not allowed[token]:
                w.ok, w.why = False, f"refused token #{step} {vocab.token_bytes[token]!r} after {target[:pos]!r}"
                return w
        else:
            cands = vocab.candidates(rest)
            if rest[0] >= 0xC0:  # a multi-byte UTF-8 character starts: try its lead byte alone first
                lead = vocab.by_bytes.get(rest[:1])
                w.lead_byte.append(lead is not None and bool(allowed[lead]))
                if lead is not None:
                    cands.insert(0, lead)
            token = next((i for i in cands if allowed[i]), None)
            if token is None:
                w.ok, w.why = False, f"nothing allowed continues {rest[:12]!r} after {target[:pos]!r}"
                return w
        if not engine.advance(state, token):
            w.ok, w.why = False, f"mask allowed {vocab.token_bytes[token]!r} but the matcher refused it"
            return w
        w.text += vocab.token_bytes[token]
        pos += len(vocab.token_bytes[token])
        step += 1


# ---------------------------------------------------------------- measures


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def load_engines(vocab: Vocab) -> tuple[list[Engine], dict[str, str]]:
    """Engines that import and set up; {name: setup seconds or why not}."""
    ready, setup = [], {}
    for cls in ENGINES:
        engine = cls()
        try:
            _, import_s = timed(importlib.import_module, engine.package)
        except ImportError:
            setup[engine.name] = "not installed"
            continue
        version = importlib.metadata.version(engine.name)
        requires = [
            r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
            for r in importlib.metadata.requires(engine.name) or []
            if "extra ==" not in r
        ]
        _, seconds = timed(engine.setup, vocab)
        setup[engine.name] = (
            f"{version:8} {import_s * 1000:8.0f} ms {seconds * 1000:8.1f} ms   {', '.join(requires) or '-'}"
        )
        ready.append(engine)
    return ready, setup


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_constraints(engines: list[Engine], vocab: Vocab, runs: int) -> dict:
    """{(engine, constraint): {compile_ms, first_us, walks, canonical} or {refused}}."""
    results = {}
    for c in CONSTRAINTS:
        target = c.target.encode()
        for engine in engines:
            try:
                compiled, seconds = timed(engine.compile, c)
            except Exception as exc:  # noqa: BLE001 - Refused, or an engine's own error: a finding either way
                why = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
                results[engine.name, c.name] = {"refused": why.splitlines()[0][:100]}
                continue
            walks = [walk(engine, compiled, vocab, target) for _ in range(runs)]
            canonical = walk(engine, compiled, vocab, target, ids=vocab.tok.encode(c.target))
            results[engine.name, c.name] = {
                "compile_ms": seconds * 1000,
                "first_us": walks[0].mask_us[0],
                "walks": walks,
                "canonical": canonical,
            }
    return results


def print_setup(setup: dict[str, str], vocab: Vocab) -> None:
    print(
        f"\n1. Setup: tokenizer / vocabulary from miro's Tokenizer ({vocab.size} tokens, "
        f"{len(vocab.special)} special, EOG {vocab.eog})"
    )
    print(f"   {'engine':14} {'version':8} {'import':>11} {'setup':>11}   requires")
    for name, text in setup.items():
        print(f"   {name:14} {text}")


def print_compile(engines: list[Engine], results: dict) -> None:
    print("\n2. Compile: ms per constraint (fresh, single-threaded) | first mask after it, us")
    print(f"   {'constraint':17}" + "".join(f"{e.name:>28}" for e in engines))
    for c in CONSTRAINTS:
        cells = []
        for e in engines:
            r = results[e.name, c.name]
            cells.append("refused" if "refused" in r else f"{r['compile_ms']:10.2f} ms | {r['first_us']:8.0f} us")
        print(f"   {c.name:17}" + "".join(f"{x:>28}" for x in cells))
    for c in CONSTRAINTS:
        for e in engines:
            if "refused" in results[e.name, c.name]:
                print(f"   {e.name} refused {c.name}: {results[e.name, c.name]['refused']}")
    print("   grammar dialects taken:")
    for e in engines:
        print(f"     {e.name:14} {e.dialects}")


def print_masks(engines: list[Engine], results: dict) -> None:
    print("\n3. Mask per token over the steered walk (us): warm median / p99 / max, cold median, steps")
    print(f"   {'constraint':17} {'engine':14} {'median':>8} {'p99':>8} {'max':>8} {'cold med':>9} {'steps':>6}")
    convert, apply = [], []
    for c in CONSTRAINTS:
        for e in engines:
            r = results[e.name, c.name]
            if "refused" in r:
                print(f"   {c.name:17} {e.name:14} {'refused':>8}")
                continue
            warm = [x for w in r["walks"][1:] for x in w.mask_us] or r["walks"][0].mask_us
            steps = len(r["walks"][0].mask_us)
            fail = "" if r["walks"][0].ok else f"  walk failed: {r['walks'][0].why}"
            print(
                f"   {c.name:17} {e.name:14} {np.median(warm):8.1f} {pct(warm, 99):8.1f} {max(warm):8.1f} "
                f"{np.median(r['walks'][0].mask_us):9.1f} {steps:6}{fail}"
            )
            for w in r["walks"]:
                convert += w.bool_us
                apply += w.apply_us
    print(
        f"   bitmask words -> numpy bool[49152] (np.unpackbits, little bit order): median {np.median(convert):.1f} us"
    )
    print(f"   logits[~allowed] = -inf on a float32 row: median {np.median(apply):.1f} us")
    print("   what each engine hands back:")
    for e in engines:
        print(f"     {e.name:14} {e.mask_form}")


def median_us(fn, repeats: int = 200) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(times))


def print_native_forms(engines: list[Engine], vocab: Vocab) -> None:
    """Mask forms to a numpy bool array, in a wide state (inside a JSON string) and a narrow one (after a key)."""
    c = CONSTRAINTS[0]
    prefixes = {"in string": '{"name": "', "after key": '{"name"'}
    print(
        "\n3b. Mask form -> numpy bool[49152], median us (flat schema; in a string: nearly all tokens "
        "allowed; after a key: a few)"
    )
    print(f"   {'engine':14} {'form':46}" + "".join(f"{p:>11}" for p in prefixes))
    masks, counts = {}, {}
    for e in engines:
        compiled = e.compile(c)
        states = {}
        for label, prefix in prefixes.items():
            states[label] = e.start(compiled)
            for token in vocab.tok.encode(prefix):
                e.advance(states[label], token)
        words = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)

        def fill_words(state, e=e, words=words):
            e.fill(state, words)
            return words_to_bool(words, vocab.size)

        rows = {
            "int32 words into numpy + unpackbits": {
                label: median_us(lambda st=st: fill_words(st)) for label, st in states.items()
            }
        }
        for label, st in states.items():
            masks[label] = fill_words(st).copy()
            counts.setdefault(e.name, []).append(f"{label} {int(masks[label].sum())}")
            for name, fn in e.native_forms(st, vocab.size).items():
                assert np.array_equal(fn(), masks[label]), (e.name, name)
                rows.setdefault(name, {})[label] = median_us(fn)
        for name, cells in rows.items():
            print(f"   {e.name:14} {name:46}" + "".join(f"{cells[p]:11.1f}" for p in prefixes))
    if not masks:
        return
    logits = np.random.default_rng(0).standard_normal(vocab.size, dtype=np.float32)
    applies = {
        "logits[~allowed] = -inf": lambda row, a: row.__setitem__(~a, -np.inf),
        "np.copyto(logits, -inf, where=~allowed)": lambda row, a: np.copyto(row, -np.inf, where=~a),
        "np.where(allowed, logits, -inf)": lambda row, a: np.where(a, row, -np.inf),
    }
    for name, fn in applies.items():
        row = logits.copy()
        cells = [median_us(lambda a=masks[p]: fn(row, a)) for p in prefixes]
        print(f"   {'(any)':14} {'apply: ' + name:46}" + "".join(f"{x:11.1f}" for x in cells))
    print("   allowed tokens: " + "; ".join(f"{name} {', '.join(x)}" for name, x in counts.items()))


def yn(flag: bool) -> str:
    return "yes" if flag else "NO"


def print_correctness(engines: list[Engine], results: dict, vocab: Vocab, leaks: dict[str, str]) -> None:
    print(
        "\n4. Correctness (per walk): tok.encode ids accepted | lead-byte tokens allowed | special tokens "
        "never allowed | EOG only at end (ids allowed at end, other tokens then) | final text checks"
    )
    print(
        f"   {'constraint':17} {'engine':14} {'encode ids':>10} {'lead byte':>9} {'no special':>10} "
        f"{'EOG end':>8} {'at end':>12} {'text':>6}"
    )
    notes = []
    for c in CONSTRAINTS:
        for e in engines:
            r = results[e.name, c.name]
            if "refused" in r:
                continue
            w, canon = r["walks"][0], r["canonical"]
            lead = f"{sum(w.lead_byte)}/{len(w.lead_byte)}" if w.lead_byte else "-"
            specials = all(x.special_leaks == 0 for x in (*r["walks"], canon))
            eog_ok = w.ok and w.early_eog == 0 and bool(w.eog_at_end)
            verdict = c.check(w.text.decode("utf-8", "replace")) if w.ok else w.why
            print(
                f"   {c.name:17} {e.name:14} {yn(canon.ok):>10} {lead:>9} {yn(specials):>10} {yn(eog_ok):>8} "
                f"{str(w.eog_at_end) + '+' + str(w.others_at_end):>12} {yn(verdict.startswith('ok')):>6}"
            )
            if not canon.ok:
                notes.append(f"{e.name} / {c.name}: tok.encode ids: {canon.why}")
            if not verdict.startswith("ok"):
                notes.append(f"{e.name} / {c.name}: {verdict}")
    for note in notes:
        print(f"   {note}")
    print("   control: special tokens handed over as plain text; is <|im_start|> allowed inside a JSON string?")
    for name, text in leaks.items():
        print(f"     {name:14} {text}")


def special_leak_control(engines: list[Engine], vocab: Vocab) -> dict[str, str]:
    """Rebuild each engine with unmarked special tokens; see whether <|im_start|> may appear mid-string."""
    im_start = vocab.tok.encode("<|im_start|>", special=True)[0]
    string_schema = Constraint("string", "json_schema", {"type": "string"}, '"x"')
    out = {}
    for engine in engines:
        naive = type(engine)()
        naive.setup(vocab, mark_specials=False)
        state = naive.start(naive.compile(string_schema))
        naive.advance(state, vocab.by_bytes[b'"'])
        words = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
        naive.fill(state, words)
        allowed = words_to_bool(words, vocab.size)
        out[engine.name] = (
            "yes (unmarked, it is just text)" if allowed[im_start] else "no"
        ) + f"; marked: {'no' if _marked_blocks(engine, vocab, string_schema, im_start) else 'YES'}"
    return out


def _marked_blocks(engine: Engine, vocab: Vocab, c: Constraint, token: int) -> bool:
    state = engine.start(engine.compile(c))
    engine.advance(state, vocab.by_bytes[b'"'])
    words = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    engine.fill(state, words)
    return not words_to_bool(words, vocab.size)[token]


# ---------------------------------------------------------------- JSON Schema coverage


def accepts(engine: Engine, compiled, vocab: Vocab, instance) -> bool:
    return walk(engine, compiled, vocab, json.dumps(instance).encode()).ok


def run_coverage(engines: list[Engine], vocab: Vocab) -> dict:
    out = {}
    for feature, schema, good, bad in COVERAGE:
        c = Constraint(feature, "json_schema", schema, json.dumps(good))
        for engine in engines:
            try:
                compiled, seconds = timed(engine.compile, c)
            except Refused as exc:
                out[engine.name, feature] = "refused: " + str(exc).splitlines()[0][:24]
                continue
            except Exception as exc:  # noqa: BLE001 - an engine crash is a finding too
                out[engine.name, feature] = f"error: {type(exc).__name__}"
                continue
            if not accepts(engine, compiled, vocab, good):
                cell = "rejects valid"
            else:
                cell = "loose" if accepts(engine, compiled, vocab, bad) else "ok"
            out[engine.name, feature] = f"{cell} ({seconds * 1000:.0f} ms)"
    return out


def print_coverage(engines: list[Engine], coverage: dict) -> None:
    print("\n5. JSON Schema coverage: valid accepted and invalid refused = ok; loose = invalid accepted (compile ms)")
    print(f"   {'feature':29}" + "".join(f"{e.name:>36}" for e in engines))
    for feature, *_ in COVERAGE:
        print(f"   {feature:29}" + "".join(f"{coverage[e.name, feature]:>36}" for e in engines))


def verdict(engines: list[Engine], results: dict, coverage: dict) -> str:
    if not engines:
        return "no engine installed"
    score = {}
    for e in engines:
        rows = [results[e.name, c.name] for c in CONSTRAINTS]
        done = [r for r in rows if "refused" not in r]
        warm = [x for r in done for w in r["walks"][1:] for x in w.mask_us]
        clean = all(
            r["walks"][0].ok and r["canonical"].ok and r["walks"][0].special_leaks == 0 and r["walks"][0].early_eog == 0
            for r in done
        )
        cov = sum(coverage[e.name, f].startswith("ok") for f, *_ in COVERAGE)
        score[e.name] = (len(done), clean, cov, -float(np.median(warm)) if warm else float("-inf"))
    ranked = sorted(score, key=lambda n: score[n], reverse=True)
    parts = [
        f"{n}: {score[n][0]}/{len(CONSTRAINTS)} constraints, correctness {'clean' if score[n][1] else 'ISSUES'}, "
        f"coverage {score[n][2]}/{len(COVERAGE)} ok, warm mask median {-score[n][3]:.0f} us"
        for n in ranked
    ]
    return (
        f"Verdict: {ranked[0]} (ranked by constraints taken, correctness, schema coverage, then mask speed): "
        + "; ".join(parts)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--runs", type=int, default=3, help="walks per constraint (first cold, the rest warm)")
    args = ap.parse_args()
    vocab, seconds = timed(Vocab.load, args.model)
    print(
        f"{args.model.name}: miro Tokenizer loaded in {seconds * 1000:.0f} ms; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    engines, setup = load_engines(vocab)
    print_setup(setup, vocab)
    results = run_constraints(engines, vocab, max(args.runs, 1))
    print_compile(engines, results)
    print_masks(engines, results)
    print_native_forms(engines, vocab)
    print_correctness(engines, results, vocab, special_leak_control(engines, vocab))
    coverage = run_coverage(engines, vocab)
    print_coverage(engines, coverage)
    print()
    print(verdict(engines, results, coverage))


if __name__ == "__main__":
    main()
