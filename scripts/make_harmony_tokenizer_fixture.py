"""Write tests/fixtures/tokenizer_harmony_llamacpp.json: llama.cpp's special-token rules on harmony vocabularies.

Run from the repository root with the environment that has llama-cpp-python
and gguf (no model, no GPU, a few seconds):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_harmony_tokenizer_fixture.py

llama.cpp (src/llama-vocab.cpp, `llama_vocab::impl::load`) decides some
special tokens' attributes and its end-of-generation set by their text, in any
vocabulary that has them, whatever the architecture: "<|return|>" and
"<|call|>" end generation and become control tokens; "<|start|>",
"<|channel|>", "<|message|>" and "<|constrain|>" become user-defined (parsed in
any text, printed even when special tokens are skipped); and "<|end|>" leaves
the end-of-generation set and becomes user-defined when "<|return|>" and
"<|call|>" are there too (or "<|calls|>" with "<|flush|>", solar-open's).
gpt-oss's vocabulary (o200k_harmony) has them all.

The vocabulary is a synthetic byte-level BPE one (pre `gpt-4o`, merges learnt
on HARMONY_TEXTS as scripts/make_gpt4o_tokenizer_fixture.py learns them, none
forming a special token's text), followed by the special tokens of one of
VARIANTS: gpt-oss's own sixteen, all control in the file as its converter
writes them, and variations (EOS "<|end|>", no "<|call|>", no "<|return|>",
solar-open's "<|calls|>"/"<|flush|>", "<|calls|>" with "<|return|>", every
special token typed normal in the file). Each variant's vocab-only GGUF is
written with general.architecture "llama", which shows the rules key on the
token texts. For each variant the fixture records, from
`llama_cpp.Llama(path, vocab_only=True)`:

* ``eog``: the ids for which ``llama_vocab_is_eog`` is true;
* ``attrs``: ``llama_vocab_get_attr`` of each special token (id -> attribute bits);

and for each text:

* ``ids`` / ``ids_special``: ``tokenize(text, add_bos=False, special=False / True)``;
* ``detok`` / ``detok_special``: ``llama_detokenize(ids_special, remove_special=False,
  unparse_special=False / True)`` as UTF-8.
"""

from __future__ import annotations

import ctypes
import json
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gpt4o_tokenizer_fixture import byte_chars, learn_merges, write_bpe_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer_harmony_llamacpp.json"
MERGES = 3000  # a cap: the texts run out of pairs before it

# gpt-oss's special tokens in its order (ids 199998..200013), every one control in its GGUF
GPT_OSS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|reserved_200000|>",
    "<|reserved_200001|>",
    "<|return|>",
    "<|constrain|>",
    "<|reserved_200004|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|reserved_200009|>",
    "<|reserved_200010|>",
    "<|reserved_200011|>",
    "<|call|>",
    "<|reserved_200013|>",
]
CONTROL, NORMAL = int(gguf.TokenType.CONTROL), int(gguf.TokenType.NORMAL)

# name -> (special tokens, their type in the file, BOS, EOS)
VARIANTS = {
    "gpt-oss": (GPT_OSS, CONTROL, "<|startoftext|>", "<|return|>"),
    "eos-end": (GPT_OSS, CONTROL, "<|startoftext|>", "<|end|>"),
    "no-call": ([t for t in GPT_OSS if t != "<|call|>"], CONTROL, "<|startoftext|>", "<|return|>"),
    "no-return": ([t for t in GPT_OSS if t != "<|return|>"], CONTROL, "<|startoftext|>", "<|endoftext|>"),
    "solar-open": (
        [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|end|>",
            "<|calls|>",
            "<|flush|>",
            "<|start|>",
            "<|message|>",
        ],
        CONTROL,
        "<|im_start|>",
        "<|endoftext|>",
    ),
    "calls-return": (
        ["<|endoftext|>", "<|end|>", "<|calls|>", "<|return|>", "<|channel|>"],
        CONTROL,
        "<|endoftext|>",
        "<|endoftext|>",
    ),
    "typed-normal": (GPT_OSS, NORMAL, "<|startoftext|>", "<|return|>"),
}
SPECIAL_TEXTS = sorted({t for tokens, *_ in VARIANTS.values() for t in tokens} | {"<|im_start|>", "<|im_end|>"})

HARMONY_TEXTS = [
    # a harmony prompt as gpt-oss's chat template renders it
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
    # an answer: analysis, then the final channel
    "<|channel|>analysis<|message|>The user asks a simple sum. Answer 4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
    "<|start|>assistant<|channel|>final<|message|>hi<|end|>",
    # a tool call and its result
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location": "Paris"}<|call|>',
    '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp": 21}<|end|>',
    # the other special tokens, and markers glued to words, doubled, cut short
    "<|startoftext|>plain text<|endoftext|> and <|reserved_200000|> then <|reserved_200013|>",
    "x<|end|>y<|start|>z<|channel|><|message|><|constrain|><|return|><|call|>w",
    "<|start|<|end|>|> <|channel <|message|<|end|><|end|> |start|> <|<|start|>|>",
    "<|calls|>tool<|flush|> <|im_start|>user\nhi<|im_end|>\n",
    "The <|end|> marker ends a message; <|return|> ends the answer and <|call|> a tool call.",
    "plain prose without any marker, numbers 12345 and CamelCase words.",
]


def vocabulary(specials: list[str], special_type: int, bos: str, eos: str, merges: list[tuple[str, str]]) -> dict:
    tokens = byte_chars()
    for left, right in merges:
        tokens.append(left + right)
    types = [NORMAL] * len(tokens) + [special_type] * len(specials)
    tokens += specials
    return {
        "tokens": tokens,
        "types": types,
        "merges": [f"{a} {b}" for a, b in merges],
        "bos_id": tokens.index(bos),
        "eos_id": tokens.index(eos),
    }


def usable_merges(texts: list[str]) -> list[tuple[str, str]]:
    """Merges learnt on the texts, less those that would form a special token's text (and what builds on them)."""
    dropped: set[str] = set()
    kept = []
    for left, right in learn_merges(texts, MERGES):
        if left in dropped or right in dropped or left + right in SPECIAL_TEXTS:
            dropped.add(left + right)
        else:
            kept.append((left, right))
    return kept


def detokenize(llm: llama_cpp.Llama, ids: list[int], unparse_special: bool) -> str:
    tokens = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(llm._model.vocab, tokens, len(ids), buf, size, False, unparse_special)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = -n


def record(path: Path, spec: dict, n_normal: int) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    assert n_vocab == len(spec["tokens"])
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    attrs = {str(i): int(llama_cpp.llama_vocab_get_attr(vocab, i)) for i in range(n_normal, n_vocab)}
    cases = []
    for text in HARMONY_TEXTS:
        ids_special = list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        cases.append(
            {
                "text": text,
                "ids": list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)),
                "ids_special": ids_special,
                "detok": detokenize(llm, ids_special, False),
                "detok_special": detokenize(llm, ids_special, True),
            }
        )
    return {"eog": eog, "attrs": attrs, "cases": cases}


def main() -> None:
    merges = usable_merges(HARMONY_TEXTS)
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (specials, special_type, bos, eos) in VARIANTS.items():
            spec = vocabulary(specials, special_type, bos, eos, merges)
            path = Path(tmp) / f"{name}.gguf"
            write_bpe_gguf(path, spec)
            n_normal = len(spec["tokens"]) - len(specials)
            variants[name] = {
                "specials": specials,
                "special_type": special_type,
                "first_special": n_normal,
                "bos_id": spec["bos_id"],
                "eos_id": spec["eos_id"],
                **record(path, spec, n_normal),
            }
    fixture = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "merges": [f"{a} {b}" for a, b in merges],
        "variants": variants,
    }
    OUT.write_text(json.dumps(fixture, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(variants)} variants x {len(HARMONY_TEXTS)} texts, {len(merges)} merges to {OUT}")
    for name, v in variants.items():
        texts = {v["specials"][int(i) - v["first_special"]]: a for i, a in v["attrs"].items()}
        print(f"  {name}: eog {[v['specials'][i - v['first_special']] for i in v['eog']]}, attrs {texts}")


if __name__ == "__main__":
    main()
