"""Write tests/fixtures/tokenizer_llamacpp.json: llama.cpp's token ids for the tokenizer corpus.

Run from the repository root with the environment that has llama-cpp-python
and gguf (no GPU needed, a few seconds):

    python scripts/make_tokenizer_fixture.py \
        [--model PATH]   # default: smollm2-135m from the miro model cache, pulled if needed

For every text in tests/fixtures/tokenizer_corpus.json it records, from
`llama_cpp.Llama(model_path, vocab_only=True)`:

* ``ids``: ``tokenize(text, add_bos=False, special=False)``
* ``ids_special``: ``tokenize(text, add_bos=False, special=True)``
* ``detok``: ``detokenize(ids_special, special=False)`` as UTF-8 (control
  tokens dropped), the reference for ``decode(..., skip_special_tokens=True)``.

``pre_variants`` holds, for a few other ``tokenizer.ggml.pre`` values, the
``special=False`` ids of the same texts: the model file is copied to a
temporary file with only that metadata string changed, so the same vocabulary
and merges go through llama.cpp's other pre-tokenizer regexes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import tempfile
from pathlib import Path

import gguf
import llama_cpp
from model_cache import cached_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"
OUT = ROOT / "tests" / "fixtures" / "tokenizer_llamacpp.json"
PRE_VARIANTS = ["default", "gpt-2", "llama-bpe", "qwen2"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def with_pre_tokenizer(model: Path, pre: str, out: Path) -> None:
    """Copy `model` to `out` with `tokenizer.ggml.pre` set to `pre` (header rewritten, tensor data moved)."""
    reader = gguf.GGUFReader(model)
    field = reader.fields["tokenizer.ggml.pre"]
    field_end = field.offset + sum(p.nbytes for p in field.parts)
    last = reader.tensors[-1].field
    header_end = last.offset + sum(p.nbytes for p in last.parts)
    key = b"tokenizer.ggml.pre"
    value = pre.encode("utf-8")
    new_field = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", gguf.GGUFValueType.STRING, len(value)) + value
    raw = model.read_bytes()
    header = raw[: field.offset] + new_field + raw[field_end:header_end]
    alignment = int(reader.fields["general.alignment"].contents()) if "general.alignment" in reader.fields else 32
    header += b"\0" * (-len(header) % alignment)
    out.write_bytes(header + raw[reader.data_offset :])


def load(model: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)


def tokenize(llm: llama_cpp.Llama, text: str, special: bool) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)) if text else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    args.model = args.model or cached_model()
    texts = json.loads(CORPUS.read_text(encoding="utf-8"))

    llm = load(args.model)
    cases = []
    for text in texts:
        ids_special = tokenize(llm, text, special=True)
        detok = llm.detokenize(ids_special, special=False).decode("utf-8", errors="replace")
        cases.append(
            {"text": text, "ids": tokenize(llm, text, special=False), "ids_special": ids_special, "detok": detok}
        )

    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = Path(tmp) / f"{pre}.gguf"
            with_pre_tokenizer(args.model, pre, path)
            variant = load(path)
            variants[pre] = [tokenize(variant, text, special=False) for text in texts]
            del variant
            path.unlink()

    fixture = {
        "model": args.model.name,
        "model_sha256": sha256(args.model),
        "llama_cpp_version": llama_cpp.__version__,
        "cases": cases,
        "pre_variants": variants,
    }
    OUT.write_text(json.dumps(fixture, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases and {len(variants)} pre-tokenizer variants to {OUT}")


if __name__ == "__main__":
    main()
