"""Write tests/fixtures/tokenizer_gemma3_llamacpp.json: llama.cpp's ids for SentencePiece vocabularies.

Run from the repository root with the environment that has llama-cpp-python
and gguf (no GPU needed, a few seconds):

    /path/to/venv-with-llama-cpp/bin/python scripts/make_spm_tokenizer_fixture.py [--model PATH]

Without --model it takes gemma3-270m from the miro model cache
($MIRO_HOME/models, default ~/.cache/miro/models), pulling it first if needed
with core/loading/registry.py (loaded on its own: that environment has no miro).

The texts are tests/fixtures/tokenizer_corpus.json followed by GEMMA_TEXTS
below (Gemma's special tokens written in text, its HTML and whitespace-run
tokens, byte-token look-alikes, a long text). For each one it records, from
`llama_cpp.Llama(model_path, vocab_only=True)`:

* ``ids``: ``tokenize(text, add_bos=False, special=False)``
* ``ids_special``: ``tokenize(text, add_bos=False, special=True)``
* ``ids_bos``: ``tokenize(text, add_bos=True, special=True)`` (llama-cpp-python's
  ``add_bos`` is llama.cpp's ``add_special``: BOS / EOS as the file asks)
* ``detok``: ``llama_detokenize(ids_special, remove_special=False,
  unparse_special=False)`` as UTF-8 (control tokens dropped), the reference
  for ``decode(..., skip_special_tokens=True)``.

``tiny`` holds two tiny SentencePiece vocabularies (TINY_* below: byte
fallback, score ties, merges that form byte and control tokens), written as
vocab-only GGUF files with gguf.GGUFWriter, with the same records for
TINY_TEXTS and every eighth corpus text; the tests rebuild the same files from
the spec stored here.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp
from model_cache import cached_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"
OUT = ROOT / "tests" / "fixtures" / "tokenizer_gemma3_llamacpp.json"
ALIAS = "gemma3-270m"

GEMMA_TEXTS = [
    "<start_of_turn>user\nWrite a poem about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi!<end_of_turn>\n",
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<unused0>",
    "<unused6241>",
    "[multimodal]",
    "<start_of_image><end_of_image>",
    "<bos>text<bos>",
    "text <end_of_turn> more",
    "<start_of_turn><end_of_turn>",
    "<start_of_turn",
    "end_of_turn>",
    "<START_OF_TURN>",
    "<<start_of_turn>>",
    "<bos> leading space after a control token",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "<b>bold</b> <i>italic</i> <code>x = 1</code> <s>old</s>",
    "<h1>Title</h1>\n<ul><li>one</li><li>two</li></ul>",
    '<div class="box"><span>y</span></div><a href="#">link</a><img src="a.png">',
    " " * 31,
    " " * 32,
    " " * 45,
    "\t" * 31,
    "\t" * 40,
    "\n" * 31,
    "\n" * 40,
    "a \t b\n\n\tc   d\t\t e",
    "  \n  \n\t\t\n ",
    "x" + " " * 7 + "y" + "\t" * 3 + "z",
    "<0x41>",
    "<0xFF><0x00>",
    "<0x0A> is a newline byte token",
    "<0x>",
    "<0x4>",
    "\u2581 the visible space \u2581\u2581 in text",
    "\u2581\u2581\u2581",
    "\x00\x01\x02\x1b[31mred\x1b[0m\x7f",
    "\U0001f9ec\U0001fae0\U0001faaf \U0001d54f\U0001d550 \U00020000\U0002a6d6 \ue000\uf8ff",
    "\u0915\u094d\u0937 \u0e01\u0e32 \u1780\u17d2\u179a \u10d0\u10d1 \u0531\u0532",
]


def long_text(texts: list[str]) -> str:
    return "\n\n".join(texts[:60])


# Tiny vocabularies: control tokens, user-defined tokens, the 256 byte tokens,
# then normal pieces; a higher score merges first.
TINY_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TINY_USER = ["\n", "<b>"]
TINY_PIECES = [
    # (text, score)
    ("\u2581", -1.0),
    ("e", -2.0),
    ("t", -3.0),
    ("h", -4.0),
    ("l", -5.0),
    ("o", -6.0),
    ("a", -7.0),
    ("b", -8.0),
    ("c", -9.0),
    ("x", -10.0),
    ("y", -11.0),
    ("z", -12.0),
    ("<", -13.0),
    (">", -14.0),
    ("0", -15.0),
    ("4", -16.0),
    ("1", -17.0),
    ("s", -18.0),
    ("w", -19.0),
    ("r", -20.0),
    ("d", -21.0),
    ("\u00e9", -22.0),
    ("\u2581\u2581", -25.0),
    ("he", -30.0),
    ("ll", -31.0),
    ("llo", -32.0),
    ("hello", -33.0),
    ("\u2581hello", -34.0),
    ("\u2581w", -35.0),
    ("or", -36.0),
    ("\u2581wor", -37.0),
    ("ld", -38.0),
    ("\u2581world", -39.0),
    ("\u2581t", -40.0),
    ("\u2581the", -41.0),
    ("\u2581th", -42.0),
    ("ab", -45.0),
    ("bc", -45.0),  # a tie: "abc" -> "ab" "c" (the leftmost pair merges first)
    ("xy", -46.0),
    ("yz", -46.0),
    ("xyz", -47.0),  # "xyz" from "xy" + "z"
    ("<0", -50.0),
    ("<0x", -51.0),
    ("41", -52.0),
    ("41>", -53.0),  # "<0x" + "41>" forms the byte token <0x41>
    ("<b", -55.0),
    ("<bo", -56.0),
    ("s>", -57.0),  # "<bo" + "s>" forms the control token <bos>
]
TINY_TEXTS = [
    "hello world",
    "hello  world",
    " hello",
    "hello\nworld",
    "the then",
    "abc",
    "abcbc",
    "xyz",
    "xyzxyz",
    "<0x41>",
    "<0x41><0x41>",
    "<bos>",
    "a<bos>b",
    "<b>hello</b>",
    "<start_of_turn>hello<end_of_turn>",
    "<start_of_turn> hello",
    "\u4e2d\u6587",
    "caf\u00e9",
    "\U0001f600 x",
    "   ",
    "\n\n",
    "",
    "q",
    "\u2581hello",
]
TINY_VARIANTS = [  # (name, add_space_prefix, add_bos, add_eos)
    ("space_prefix_bos", True, True, False),
    ("no_prefix_eos", False, False, True),
]


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    control, user, normal, byte = (
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.USER_DEFINED),
        int(gguf.TokenType.NORMAL),
        int(gguf.TokenType.BYTE),
    )
    tokens = TINY_CONTROL + TINY_USER + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in TINY_PIECES]
    scores = [-1000.0] * len(TINY_CONTROL) + [-1000.0] * len(TINY_USER) + [0.0] * 256 + [s for _, s in TINY_PIECES]
    kinds = [control] * len(TINY_CONTROL) + [user] * len(TINY_USER) + [byte] * 256 + [normal] * len(TINY_PIECES)
    return tokens, scores, kinds


def write_spm_gguf(path: Path, spec: dict) -> None:
    """A vocab-only llama GGUF with the spec's SentencePiece vocabulary (the tests write the same file)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(spec["tokens"])
    w.add_token_scores(spec["scores"])
    w.add_token_types(spec["types"])
    w.add_bos_token_id(spec["tokens"].index("<bos>"))
    w.add_eos_token_id(spec["tokens"].index("<eos>"))
    w.add_unk_token_id(spec["tokens"].index("<unk>"))
    w.add_add_space_prefix(spec["add_space_prefix"])
    w.add_add_bos_token(spec["add_bos"])
    w.add_add_eos_token(spec["add_eos"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(model: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)


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


def cases(llm: llama_cpp.Llama, texts: list[str]) -> list[dict]:
    out = []
    for text in texts:
        ids_special = tokenize(llm, text, special=True)
        out.append(
            {
                "text": text,
                "ids": tokenize(llm, text, special=False),
                "ids_special": ids_special,
                "ids_bos": tokenize(llm, text, special=True, add_bos=True),
                "detok": detokenize(llm, ids_special),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help=f"the GGUF (default: {ALIAS} in the miro cache)")
    args = parser.parse_args()
    model = args.model or cached_model(ALIAS)
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    texts = corpus + GEMMA_TEXTS + [long_text(corpus)]

    tiny = []
    tokens, scores, kinds = tiny_vocab()
    tiny_texts = TINY_TEXTS + corpus[::8]
    with tempfile.TemporaryDirectory() as tmp:
        for name, add_space_prefix, add_bos, add_eos in TINY_VARIANTS:
            spec = {
                "name": name,
                "tokens": tokens,
                "scores": scores,
                "types": kinds,
                "add_space_prefix": add_space_prefix,
                "add_bos": add_bos,
                "add_eos": add_eos,
            }
            path = Path(tmp) / f"{name}.gguf"
            write_spm_gguf(path, spec)
            tiny.append({**spec, "cases": cases(load(path), tiny_texts)})

    fixture = {
        "model": model.name,
        "model_sha256": sha256(model),
        "llama_cpp_python_version": llama_cpp.__version__,
        "corpus_size": len(corpus),
        "cases": cases(load(model), texts),
        "tiny": tiny,
    }
    OUT.write_text(json.dumps(fixture, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(texts)} texts for {model.name} and {len(tiny)} tiny vocabularies to {OUT}")


if __name__ == "__main__":
    main()
