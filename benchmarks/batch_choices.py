"""Two scheduling choices measured on ShareGPT prompts: how many sequences a step decodes together
(max_num_seqs), and the order waiting requests are admitted in.

    python benchmarks/batch_choices.py seats [--num-prompts 256] [--seats 32 64 128 256]
    python benchmarks/batch_choices.py admission [--documents 8] [--questions 16]

seats: the ShareGPT workload of throughput.py (same prompts, same output lengths, greedy), once per
max_num_seqs, every run in this one process, each on the default KV cache; prints total tokens/s of each and
its ratio to the first.

admission: a workload where the order matters: `documents` distinct long prompts prefixes (ShareGPT answers
joined to ~600 tokens, a stand-in for a document or a few-shot preamble), each followed by `questions`
different ShareGPT questions, submitted interleaved (document 0's first question, document 1's first
question, ...) into a KV cache that holds about three documents at once; then throughput.py's ShareGPT
workload (--num-prompts), where the prompts share only the chat template's opening, on the default cache.
Runs arrival order against admission by longest cached prefix (prefix) on each, and prints tokens/s, prompt
tokens computed and the prefix cache hit rate of each.
"""

from __future__ import annotations

import argparse
import os
import time

from throughput import load_sharegpt, run_miro


def seats(args) -> None:
    from miro.core import Engine
    from miro.core.loading.registry import resolve_model

    path = str(resolve_model(args.model))
    base = Engine.from_model(path, max_model_len=2048)
    requests = load_sharegpt(base.tokenizer, args.num_prompts)
    print(
        f"{len(requests)} prompts: {sum(len(p) for p, _ in requests)} prompt tokens, "
        f"{sum(n for _, n in requests)} output tokens; KV cache {base.block_manager.num_blocks} blocks of "
        f"{base.block_size}; load average {os.getloadavg()[0]:.2f}"
    )
    rates = {}
    for n in args.seats:
        engine = type(base)(
            base.model, base.tokenizer, max_model_len=2048, max_num_seqs=n, num_kv_blocks=base.block_manager.num_blocks
        )
        run_miro(engine, requests[:4])
        rates[n] = run_miro(engine, requests)
        stats = engine.stats()
        print(
            f"max_num_seqs {n:>4}: {rates[n]:7.1f} total tok/s ({rates[n] / rates[args.seats[0]]:.2f}x), "
            f"preemptions {stats.preemptions}",
            flush=True,
        )


def document_workload(tokenizer, n_documents: int, n_questions: int, output_len: int = 32):
    """(prompt ids, output length) per request: document d's question q at index q * n_documents + d."""
    from sharegpt import first_turns

    answers, questions = [], []
    for question, answer in first_turns():
        if len(tokenizer.encode(question)) <= 48:
            questions.append(question)
        if len(answers) < n_documents * 8:
            answers.append(answer)
        if len(questions) >= n_questions * n_documents and len(answers) >= n_documents * 8:
            break
    documents = []
    for d in range(n_documents):
        text = ""
        for answer in answers[d::n_documents]:
            text += answer + "\n\n"
            if len(tokenizer.encode(text)) >= 600:
                break
        documents.append(tokenizer.decode(tokenizer.encode(text)[:600]))
    requests = []
    for q in range(n_questions):
        for d in range(n_documents):
            content = f"{documents[d]}\n\nQuestion: {questions[q * n_documents + d]}"
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}])
            requests.append((tokenizer.encode(prompt, special=True), output_len))
    return requests


def admission(args) -> None:
    from miro.core import Engine
    from miro.core.loading.registry import resolve_model

    base = Engine.from_model(str(resolve_model(args.model)), max_model_len=2048)
    requests = document_workload(base.tokenizer, args.documents, args.questions)
    prompt_blocks = max(len(p) for p, _ in requests) // base.block_size + 1
    num_blocks = 3 * prompt_blocks + 16 * 4  # about three documents, and each running request's own blocks
    print(
        f"{len(requests)} requests ({args.documents} documents x {args.questions} questions): "
        f"{sum(len(p) for p, _ in requests)} prompt tokens, {sum(n for _, n in requests)} output tokens; "
        f"KV cache {num_blocks} blocks of {base.block_size}; load average {os.getloadavg()[0]:.2f}"
    )
    compare_orders(base, requests, num_blocks)
    sharegpt = load_sharegpt(base.tokenizer, args.num_prompts)
    print(
        f"\n{len(sharegpt)} ShareGPT prompts: {sum(len(p) for p, _ in sharegpt)} prompt tokens, "
        f"{sum(n for _, n in sharegpt)} output tokens; KV cache {base.block_manager.num_blocks} blocks"
    )
    compare_orders(base, sharegpt, base.block_manager.num_blocks)


def compare_orders(base, requests, num_blocks: int) -> None:
    from miro.core import Engine, EngineConfig

    rates = {}
    for order in ("arrival", "prefix"):
        engine = Engine(
            base.model,
            base.tokenizer,
            EngineConfig(max_model_len=2048, num_kv_blocks=num_blocks, admission_order=order),
        )
        run_miro(engine, requests[:2])
        engine = Engine(
            base.model,
            base.tokenizer,
            EngineConfig(max_model_len=2048, num_kv_blocks=num_blocks, admission_order=order),
        )
        t0 = time.perf_counter()
        rates[order] = run_miro(engine, requests)
        stats = engine.stats()
        print(
            f"{order:<8} {rates[order]:7.1f} total tok/s ({rates[order] / rates['arrival']:.2f}x), "
            f"{engine.rates.prompt_tokens_total:,} prompt tokens computed, prefix cache hit rate "
            f"{stats.prefix_cache_hit_rate:.3f}, preemptions {stats.preemptions}, "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("choice", choices=["seats", "admission"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--seats", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--questions", type=int, default=16)
    args = parser.parse_args()
    seats(args) if args.choice == "seats" else admission(args)


if __name__ == "__main__":
    main()
