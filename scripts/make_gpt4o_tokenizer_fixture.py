"""Write tests/fixtures/tokenizer_gpt4o_llamacpp.json: llama.cpp's ids for the `gpt-4o` pre-tokenizer.

Run from the repository root with the environment that has llama-cpp-python
and gguf (no model, no GPU, a few seconds):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_gpt4o_tokenizer_fixture.py

gpt-oss's GGUFs (and llama4's) name `tokenizer.ggml.pre = "gpt-4o"`, OpenAI's
o200k split. Their vocabulary is 200k tokens and 1 GB of model around it, so
the reference is made on a synthetic byte-level BPE vocabulary instead: the
256 byte tokens, then MERGES merges learnt (most frequent pair first, ties by
the pair's text) on the texts themselves *without* any pre-tokenization, so
many merges straddle the places o200k splits (a word's end and the next
space, digits past the third, a capital after a lower-case letter, a
contraction and the next word): a text split where llama.cpp does not split,
or not split where it does, gets other ids. Then a few control tokens.

The texts are tests/fixtures/tokenizer_corpus.json followed by GPT4O_TEXTS
below (o200k's own rules: contractions in any case attached to the word,
numbers in threes, upper- and lower-case runs, titlecase and modifier
letters, combining marks, punctuation runs taking a trailing `/`, CR, LF).
The vocabulary goes into a vocab-only GGUF written with gguf.GGUFWriter
(`tokenizer.ggml.model = "gpt2"`, pre `gpt-4o`, no add_bos_token key: llama.cpp's
default), and for each text the fixture records, from
`llama_cpp.Llama(path, vocab_only=True)`:

* ``ids``: ``tokenize(text, add_bos=False, special=False)``
* ``ids_special``: ``tokenize(text, add_bos=False, special=True)``
* ``ids_bos``: ``tokenize(text, add_bos=True, special=True)`` (llama-cpp-python's
  ``add_bos`` is llama.cpp's ``add_special``: BOS / EOS as the file asks)
* ``detok``: ``llama_detokenize(ids_special, remove_special=False,
  unparse_special=False)`` as UTF-8 (control tokens dropped).

The spec (tokens, types, merges, BOS/EOS) is stored too: the test writes the
same GGUF from it.
"""

from __future__ import annotations

import ctypes
import json
import re
import tempfile
from collections import Counter
from pathlib import Path

import gguf
import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"
OUT = ROOT / "tests" / "fixtures" / "tokenizer_gpt4o_llamacpp.json"
MERGES = 6000  # a cap: the texts run out of pairs (every chunk one token) before it
CONTROL = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<|startoftext|>", "<|return|>"

GPT4O_TEXTS = [
    # contractions, any case, attached to the word before them (llama3's split them off)
    "it's IT'S It'S iT's he'll HE'LL He'Ll we've WE'VE they're THEY'RE I'm I'M you'd YOU'D",
    "don't DON'T Don'T won't can'T shouldn't've y'all'd've",
    "O'Neil's McDonald's MCDONALD'S O'REILLY'S rock'n'roll",
    "l'\u00e9t\u00e9 c'\u00e9tait L'\u00c9T\u00c9 caf\u00e9's na\u00efve's \u00c9COLE'S",
    "'s 's 'S 'll 'LL x's 9's 1990's the '90s _'s .'s",
    "'re'd's'll 'tis 'twas",
    # upper-case runs, then lower-case runs: CamelCase splits before each capital run
    "HelloWorld helloWorld HELLOworld HELLO_WORLD hello_world",
    "XMLHttpRequest getHTTPResponseCode iPhone eBay HTTPServer ABCdef aBC AbcDEFghiJKL",
    "camelCaseWordsLikeThisOne PascalCaseWordsLikeThatOne SCREAMING_SNAKE_CASE",
    # non-ASCII letters: case as llama.cpp sees it (any letter outside A-Z and a-z counts as both)
    "\u00c9COLE \u00c9cole \u00e9cole \u00dcBER \u00dcber \u00fcber STRA\u00dfE Stra\u00dfe",
    "\u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u041f\u0420\u0418\u0412\u0415\u0422 "
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043f\u0440\u0438\u0432\u0435\u0442",
    "AB\u00c9CD abc\u00e9DEF \u00c9A \u00e9A A\u00e9 a\u00c9 \u00c0\u00c1\u00c2abc xyz\u00c0\u00c1\u00c2",
    # titlecase (Lt) and modifier (Lm) letters, and other letters (Lo)
    "\u01c5ungla \u01c8ubljana \u01cbegu\u0161 \u01f2ealand \u01c4EMAL \u01c6emal",
    "h\u02b0it \u02c8stress \u02b2a \u02e0x \u30e9\u30fc\u30e1\u30f3 \u3005 \u3041\u309d",
    "\u4e2d\u6587English\u65e5\u672c\u8a9eTEXT\ud55c\uad6d\uc5b4text",
    "\u0391\u03b2\u03b3ABC\u0430\u0431\u0432DEF\u05d0\u05d1\u05d2xyz",
    # combining marks: not letters to llama.cpp's split
    "cafe\u0301 CAFE\u0301 e\u0301\u0301\u0301 \u0301abc A\u0308rger a\u0308rger",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u0c24\u0c46\u0c32\u0c41\u0c17\u0c41",
    # numbers: runs of up to three digits, of any script
    "1234567 12345.6789 1,234,567 a1234b x12y3456z 0000000 9999999999",
    "\u0661\u0662\u0663\u0664\u0665 \u0967\u0968\u0969\u096a \uff11\uff12\uff13\uff14 \u00b2\u00b3\u00b9 \u00bd\u00be",
    "\u216b \u217b \u2460\u2461\u2462\u2463 1\u00bd 2\u00b3x",
    "3.14159e-10 0x1F2E3D 1e100 v1.2.3 12:34:56",
    # punctuation runs keep a trailing run of CR, LF and '/'
    "foo.//\nbar </div>\n</span>\r\n a,/\r\n/b --/--\n\n/ )/\n !!\n\n/x",
    "https://example.com/a/b/ ./run.sh ../../up C:\\dir\\file //comment\n",
    ".\r\n\r\n x;\n\n\n y ?/ \"/\n'/",
    # one non-letter, non-digit character (not CR or LF) starts a word
    "_foo $HOME @user #tag .Hello ,World -minus +plus \u00a0word \u200bword \U0001f600word \u0301word",
    "\nword \rword \r\nword \tword  word   word",
    # whitespace runs before words, at the end, non-ASCII spaces
    "a \u3000b x\u00a0\u00a0y \t \tz   \n  x x   \n y\u2003\u2003z \u205f\u205fw",
    "line one\r\nline two\r\n\r\n  indented\n\t\ttabbed  \n",
]

# GPT-2's byte-level alphabet: the printable stand-in character of each byte
_PRINTABLE = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("\u00a1"), ord("\u00ac") + 1),
    *range(ord("\u00ae"), ord("\u00ff") + 1),
]


def byte_chars() -> list[str]:
    """The stand-in character of each byte 0..255."""
    extra = iter(range(256, 512))
    return [chr(b) if b in _PRINTABLE else chr(next(extra)) for b in range(256)]


def learn_merges(texts: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learnt on whitespace-led chunks of the texts, deterministically.

    A chunk is a run of whitespace and the run of other characters after it (" don't", " HelloWorld,",
    "\n\n  x=1;"), coarser than any pre-tokenizer's pieces, so the merges form tokens across the places where
    o200k splits and where other pre-tokenizers split but o200k does not.
    """
    chars = byte_chars()
    chunks = Counter(re.findall(r"\s*\S+|\s+", "\n".join(texts)))
    words = [([chars[b] for b in chunk.encode("utf-8")], count) for chunk, count in sorted(chunks.items())]
    merges = []
    for _ in range(n_merges):
        counts: Counter = Counter()
        for seq, count in words:
            for pair in zip(seq, seq[1:]):
                counts[pair] += count
        if not counts:
            break
        top = max(counts.values())
        left, right = min(pair for pair, count in counts.items() if count == top)
        merges.append((left, right))
        joined = left + right
        for seq, _ in words:
            i = 0
            while i < len(seq) - 1:
                if seq[i] == left and seq[i + 1] == right:
                    seq[i : i + 2] = [joined]
                i += 1
    return merges


def vocabulary(texts: list[str]) -> dict:
    merges = learn_merges(texts, MERGES)
    tokens = byte_chars()
    for left, right in merges:  # a merge may form a control token's text: that token is its result
        if left + right not in tokens and left + right not in CONTROL:
            tokens.append(left + right)
    types = [int(gguf.TokenType.NORMAL)] * len(tokens) + [int(gguf.TokenType.CONTROL)] * len(CONTROL)
    tokens += CONTROL
    return {
        "tokens": tokens,
        "types": types,
        "merges": [f"{a} {b}" for a, b in merges],
        "bos_id": tokens.index(BOS),
        "eos_id": tokens.index(EOS),
    }


def write_bpe_gguf(path: Path, spec: dict) -> None:
    """A vocab-only GGUF with the spec's byte-level BPE vocabulary and pre `gpt-4o` (the test writes the same)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(spec["tokens"])
    w.add_token_types(spec["types"])
    w.add_token_merges(spec["merges"])
    w.add_bos_token_id(spec["bos_id"])
    w.add_eos_token_id(spec["eos_id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(llm: llama_cpp.Llama, text: str, special: bool, add_bos: bool = False) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))


def detokenize(llm: llama_cpp.Llama, ids: list[int]) -> str:
    """llama.cpp's own detokenizer (not llama-cpp-python's, which also drops a space after BOS)."""
    tokens = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(llm._model.vocab, tokens, len(ids), buf, size, False, False)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = -n


def main() -> None:
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    texts = corpus + GPT4O_TEXTS
    spec = vocabulary(texts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt4o.gguf"
        write_bpe_gguf(path, spec)
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        cases = []
        for text in texts:
            ids_special = tokenize(llm, text, special=True)
            cases.append(
                {
                    "text": text,
                    "ids": tokenize(llm, text, special=False),
                    "ids_special": ids_special,
                    "ids_bos": tokenize(llm, text, special=True, add_bos=True),
                    "detok": detokenize(llm, ids_special),
                }
            )
    fixture = {"llama_cpp_python_version": llama_cpp.__version__, "corpus_size": len(corpus), **spec, "cases": cases}
    OUT.write_text(json.dumps(fixture, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} texts, {len(spec['tokens'])} tokens and {len(spec['merges'])} merges to {OUT}")


if __name__ == "__main__":
    main()
