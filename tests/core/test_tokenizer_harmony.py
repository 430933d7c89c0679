"""Harmony's special tokens (gpt-oss): llama.cpp's attributes, end-of-generation set, ids and detokenization.

llama.cpp keys these rules on the token texts, in any vocabulary: the fixture's GGUFs are general.architecture
"llama" (scripts/make_harmony_tokenizer_fixture.py).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from gguf_factory import write_tiny_model
from test_tokenizer_gpt4o import write_bpe_gguf

from miro.core import Engine, SamplingParams
from miro.core.loading.gguf_file import GGUFFile
from miro.core.tokenizers.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = json.loads((FIXTURES / "tokenizer_harmony_llamacpp.json").read_text(encoding="utf-8"))
VARIANTS = REFERENCE["variants"]
# llama_token_attr bits
UNKNOWN, CONTROL, USER_DEFINED = 1 << 0, 1 << 3, 1 << 4


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the printable stand-in character of each byte 0..255."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _spec(variant: dict) -> dict:
    """The vocabulary the script gave llama.cpp: byte tokens, one token per merge, then the special tokens."""
    merges = REFERENCE["merges"]
    normal = _byte_chars() + [m.replace(" ", "", 1) for m in merges]
    assert len(normal) == variant["first_special"]
    return {
        "tokens": normal + variant["specials"],
        "types": [1] * len(normal) + [variant["special_type"]] * len(variant["specials"]),
        "merges": merges,
        "bos_id": variant["bos_id"],
        "eos_id": variant["eos_id"],
    }


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    out = {}
    for name, variant in VARIANTS.items():
        path = write_bpe_gguf(tmp_path_factory.mktemp("harmony") / f"{name}.gguf", _spec(variant))
        out[name] = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=f"{name}.gguf")
    return out


def _texts(variant: dict, ids) -> list[str]:
    return sorted(variant["specials"][i - variant["first_special"]] for i in ids)


def test_reference_is_llamacpp_0336_on_the_harmony_variants():
    assert REFERENCE["llama_cpp_python_version"] == "0.3.36"
    assert set(VARIANTS) == {"gpt-oss", "eos-end", "no-call", "no-return", "solar-open", "calls-return", "typed-normal"}
    gpt_oss = VARIANTS["gpt-oss"]
    # what the fixture must show: <|end|> is no end of generation, <|return|> and <|call|> are; the markers print
    assert _texts(gpt_oss, gpt_oss["eog"]) == ["<|call|>", "<|endoftext|>", "<|return|>"]
    assert gpt_oss["cases"][2]["detok"] == "<|start|>assistant<|channel|>final<|message|>hi<|end|>"


@pytest.mark.parametrize("name", VARIANTS)
def test_end_of_generation_is_llamacpps(tokenizers, name):
    variant = VARIANTS[name]
    assert _texts(variant, tokenizers[name].eog_ids) == _texts(variant, variant["eog"])


@pytest.mark.parametrize("name", VARIANTS)
def test_special_token_kinds_are_llamacpps(tokenizers, name):
    """Control (parsed only with special=True, skipped in decoding) and user-defined (always parsed and printed)."""
    tok, attrs = tokenizers[name], {int(i): a for i, a in VARIANTS[name]["attrs"].items()}
    first = VARIANTS[name]["first_special"]
    assert {i for i in tok.control_ids if i >= first} == {i for i, a in attrs.items() if a & (CONTROL | UNKNOWN)}
    assert {i for i in tok.special_ids if i >= first} == {
        i for i, a in attrs.items() if a & (CONTROL | UNKNOWN | USER_DEFINED)
    }


@pytest.mark.parametrize("name", VARIANTS)
def test_ids_and_detokenization_match_llamacpp(tokenizers, name):
    tok = tokenizers[name]
    for case in VARIANTS[name]["cases"]:
        text = case["text"]
        assert tok.encode(text) == case["ids"], text
        assert tok.encode(text, special=True) == case["ids_special"], text
        assert tok.decode(case["ids_special"], skip_special_tokens=True) == case["detok"], text
        assert tok.decode(case["ids_special"]) == case["detok_special"], text
        stream = IncrementalDetokenizer(tok, skip_special_tokens=True)
        assert "".join(stream.add(i) for i in case["ids_special"]) + stream.flush() == case["detok"], text


def _forced_token_model(tmp_path: Path, first_tokens: list[str]) -> Path:
    """A tiny llama whose logits are all 0, so greedy decoding emits token 0; its first tokens are `first_tokens`."""
    info = write_tiny_model(tmp_path / "probe.gguf", tie_embeddings=False)
    tokens = first_tokens + info["tokens"][len(first_tokens) :]
    output = np.zeros((info["vocab_size"], info["dim"]), dtype=np.float32)
    path = tmp_path / "harmony.gguf"
    write_tiny_model(
        path,
        tie_embeddings=False,
        tensor_overrides={"output.weight": output},
        metadata={"tokenizer.ggml.tokens": tokens},
    )
    return path


@pytest.mark.parametrize(
    ("first_tokens", "n_tokens", "finish", "text"),
    [
        # gpt-oss's vocabulary: <|end|> closes a message and is printed; generation goes on
        (["<|end|>", "<|return|>", "<|call|>"], 3, "length", "<|end|><|end|><|end|>"),
        # ... <|call|> ends it (and, as a control token, is not printed)
        (["<|call|>", "<|return|>", "<|end|>"], 1, "stop", ""),
        # without <|return|> or <|flush|>, <|end|> ends generation as before (Phi-3's)
        (["<|end|>", "<|im_start|>", "<|call|>"], 1, "stop", ""),
    ],
)
def test_the_engine_stops_where_llamacpp_does(tmp_path, first_tokens, n_tokens, finish, text):
    engine = Engine.from_model(_forced_token_model(tmp_path, first_tokens), num_kv_blocks=16)
    out = engine.generate(["hello world"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [0] * n_tokens
    assert (out.outputs[0].finish_reason, out.outputs[0].text) == (finish, text)
