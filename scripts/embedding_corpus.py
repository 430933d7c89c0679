"""The corpus of scripts/make_embedding_reference.py (its project-venv stage): SENTENCES single sentences and
PARAGRAPHS paragraphs cut from ShareGPT first turns (records picked with random.Random(SEED)), then the
handwritten EDGE_CASES, each at most MAX_TEXT_TOKENS WordPiece tokens. Moved out of that script unchanged; it
imports only the standard library at load, so the script's oracle stages (other venvs) still import it."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 24
SENTENCES, PARAGRAPHS = 30, 30
MAX_TEXT_TOKENS = 254  # + [CLS] and [SEP] = sentence-transformers' max_seq_length

EDGE_CASES = [
    "Café, naïve résumé: the Ångström unit at the façade.",
    "cafe\u0301 nai\u0308ve",  # the same accents, decomposed (NFD)
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "Hello World! hello world! HeLLo WoRLD!",
    "机器学习是人工智能的一个分支。中文文本",
    "日本語のテキストです。東京タワーはどこですか？",
    "안녕하세요, 세계!",
    "Привет, как дела? Всё хорошо, спасибо. Йошкар-Ола",
    "Ελληνικά: αβγ ΔΕΖ ω",
    "مرحبا بالعالم",
    "ภาษาไทย สวัสดี",
    "I love pizza 🍕🔥😀 and my family 👨\u200d👩\u200d👧 👍🏽",
    "Wait... what?!?! ---- (((yes))) !!! ??? ;;; ***",
    "In 2023, 1,234,567.89 dollars; 3.14159, 42%, 1e-10 and 0x1F at 12:30pm on 2024-06-01.",
    "See https://www.example.com/path/to/page?query=1&b=two#frag or mail me@example.org.",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))",
    "column1\tcolumn2\tcolumn3\nrow1\trow2\r\nend\n",
    "spaces    between     words   and\n\n\n\nnewlines  \t  then   more",
    "a",
    "?",
    "x" * 100,  # exactly WordPiece's max_input_chars_per_word: still split into pieces
    "the word " + "pneumonoultramicroscopicsilicovolcanoconiosis" * 3 + " is too long",  # 135 chars: [UNK]
    "fullwidth ＡＢＣ１２３ and no\u00a0break\u2003spaces, zero\u200bwidth",
    "control bell\x07 null\x00 and replacement \ufffd chars",
    "[CLS] [SEP] [MASK] [UNK] [PAD] written inside text",
]


def hf_tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _sentences(text: str) -> list[str]:
    """Plain one-line prose sentences of 6 to 40 words."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        if "```" in para or "\n" in para.strip():
            continue
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", para.strip()):
            if 6 <= len(s.split()) <= 40 and s[-1] in ".!?" and s[0].isupper():
                out.append(s)
    return out


def _paragraphs(text: str) -> list[str]:
    """Blocks between blank lines of 40 to 200 words (lists and code included, as they come)."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if 40 <= len(p.split()) <= 200]


def sharegpt_texts(n_sentences: int, n_paragraphs: int, fits) -> tuple[list[str], list[str]]:
    """Seeded pick of one sentence or paragraph per record, alternating human messages and answers."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sharegpt import first_turns

    records = list(first_turns())
    random.Random(SEED).shuffle(records)
    rng = random.Random(SEED + 1)
    sentences, paragraphs, seen = [], [], set()
    for k, (human, answer) in enumerate(records):
        source = human if k % 2 == 0 else answer
        want_sentence = len(sentences) < n_sentences and (k % 4 < 2 or len(paragraphs) >= n_paragraphs)
        pool = _sentences(source) if want_sentence else _paragraphs(source)
        pool = [t for t in pool if t not in seen and fits(t)]
        if pool:
            text = rng.choice(pool)
            seen.add(text)
            (sentences if want_sentence else paragraphs).append(text)
        if len(sentences) >= n_sentences and len(paragraphs) >= n_paragraphs:
            break
    return sentences, paragraphs


def build_corpus(model_dir: Path) -> tuple[list[str], dict[str, list[int]]]:
    tok = hf_tokenizer(model_dir)

    def fits(text: str) -> bool:
        return len(tok.encode(text).ids) - 2 <= MAX_TEXT_TOKENS

    sentences, paragraphs = sharegpt_texts(SENTENCES, PARAGRAPHS, fits)
    assert all(fits(t) for t in EDGE_CASES)
    texts = sentences + paragraphs + EDGE_CASES
    assert len(set(texts)) == len(texts)
    a, b = len(sentences), len(sentences) + len(paragraphs)
    kinds = {"sharegpt_sentence": [0, a], "sharegpt_paragraph": [a, b], "edge_case": [b, len(texts)]}
    return texts, kinds
