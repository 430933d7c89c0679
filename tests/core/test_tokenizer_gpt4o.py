"""The `gpt-4o` pre-tokenizer (gpt-oss's, OpenAI's o200k split): llama.cpp's ids on a synthetic BPE vocabulary."""

import json
from pathlib import Path

import gguf
import pytest

from miro.core.loading.gguf_file import GGUFFile
from miro.core.tokenizers.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
REFERENCE = json.loads((FIXTURES / "tokenizer_gpt4o_llamacpp.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]

# (fixture key, encode keywords): as scripts/make_gpt4o_tokenizer_fixture.py called llama.cpp's tokenize
MODES = {
    "plain": ("ids", {}),
    "special": ("ids_special", {"special": True}),
    "add_special": ("ids_bos", {"special": True, "add_special": True}),
}


def write_bpe_gguf(path: Path, spec: dict) -> Path:
    """The vocab-only GGUF scripts/make_gpt4o_tokenizer_fixture.py gave llama.cpp for this spec."""
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
    return path


@pytest.fixture(scope="module")
def meta(tmp_path_factory) -> dict:
    return GGUFFile(write_bpe_gguf(tmp_path_factory.mktemp("gpt4o") / "gpt4o.gguf", REFERENCE)).metadata


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta, source="gpt4o.gguf")


def _mismatches(tok: Tokenizer, mode: str) -> list[str]:
    key, options = MODES[mode]
    out = []
    for case in CASES:
        got = tok.encode(case["text"], **options)
        if got != case[key]:
            out.append(f"{case['text']!r}: ours {got} llama.cpp {case[key]}")
    return out


def test_reference_covers_the_corpus():
    assert [case["text"] for case in CASES[: REFERENCE["corpus_size"]]] == CORPUS
    assert len(CASES) >= len(CORPUS) + 25  # plus the o200k texts (contractions, case runs, digits, '/' runs)
    assert REFERENCE["llama_cpp_python_version"] == "0.3.36"


@pytest.mark.parametrize("mode", MODES)
def test_ids_match_llamacpp(tok, mode):
    bad = _mismatches(tok, mode)
    assert not bad, f"{len(bad)} of {len(CASES)} texts differ, e.g.\n" + "\n".join(bad[:10])


def test_decode_matches_llamacpp_detokenize(tok):
    for case in CASES:
        assert tok.decode(case["ids_special"], skip_special_tokens=True) == case["detok"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]  # every byte has a token: nothing is dropped


def test_no_bos_by_default(tok):
    # a gpt-4o file without tokenizer.ggml.add_bos_token gets no BOS from llama.cpp's add_special, nor from ours
    assert (tok.add_bos, tok.add_eos) == (False, False)
    assert tok.bos_id == REFERENCE["bos_id"] and tok.eos_id in tok.eog_ids


def _case(start: str) -> dict:
    (case,) = [c for c in CASES[REFERENCE["corpus_size"] :] if c["text"].startswith(start)]
    return case


@pytest.mark.parametrize(
    ("pre", "text_start"),
    [
        ("llama-bpe", "it's IT'S"),  # llama3 splits the contraction off the word
        ("llama-bpe", "HelloWorld"),  # ... keeps a lower-case run and the next capital together
        ("llama-bpe", "\u00c9COLE"),  # ... keeps a non-ASCII letter before an ASCII capital run
        ("llama-bpe", "foo.//"),  # ... does not let a punctuation run take the '/' after a newline
        ("qwen2", "1234567"),  # qwen2 splits digits one by one
        ("gpt-2", "line one\r\n"),  # gpt-2 cuts CR LF before a word in two, a tab off the word after it
    ],
)
def test_the_fixture_tells_gpt4o_from_other_splits(meta, pre, text_start):
    """The vocabulary has tokens across the places where the splits differ, so a wrong split gets other ids."""
    other = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": pre}, source=pre)
    case = _case(text_start)
    assert other.encode(case["text"]) != case["ids"]
