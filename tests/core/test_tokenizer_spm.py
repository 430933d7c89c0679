"""SentencePiece tokenizers: llama.cpp's ids on Gemma 3 and on tiny vocabularies, decoding, streaming, chat."""

import json
from pathlib import Path

import gguf
import pytest

from miro.core.errors import ModelFileError, RequestError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.tokenizers.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
REFERENCE = json.loads((FIXTURES / "tokenizer_gemma3_llamacpp.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]
PAD, EOS, BOS, START_OF_TURN, END_OF_TURN = 0, 1, 2, 105, 106
BYTE = int(gguf.TokenType.BYTE)

# (fixture key, encode keywords): as scripts/make_spm_tokenizer_fixture.py called llama.cpp's tokenize
MODES = {
    "plain": ("ids", {}),
    "special": ("ids_special", {"special": True}),
    "add_special": ("ids_bos", {"special": True, "add_special": True}),
}


@pytest.fixture(scope="module")
def meta(gemma3_path) -> dict:
    return GGUFFile(gemma3_path).metadata


@pytest.fixture(scope="module")
def gemma(meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta, source="gemma-3-270m-q4_k_m.gguf")


def _mismatches(tok: Tokenizer, cases: list[dict], mode: str) -> list[str]:
    key, options = MODES[mode]
    out = []
    for case in cases:
        got = tok.encode(case["text"], **options)
        if got != case[key]:
            out.append(f"{case['text']!r}: ours {got} llama.cpp {case[key]}")
    return out


def test_reference_covers_the_corpus():
    assert [case["text"] for case in CASES[: REFERENCE["corpus_size"]]] == CORPUS
    assert len(CASES) > len(CORPUS) + 40  # plus Gemma's own special-token, HTML and whitespace texts


@pytest.mark.parametrize("mode", MODES)
def test_ids_match_llamacpp(gemma, mode):
    bad = _mismatches(gemma, CASES, mode)
    assert not bad, f"{len(bad)} of {len(CASES)} texts differ, e.g.\n" + "\n".join(bad[:10])


def test_special_tokens_and_bos(gemma):
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.add_eos) == (BOS, EOS, True, False)
    turn = "<start_of_turn>user\nHi<end_of_turn>"
    assert gemma.encode(turn, special=True)[:1] + gemma.encode(turn, special=True)[-1:] == [START_OF_TURN, END_OF_TURN]
    assert not {START_OF_TURN, END_OF_TURN} & set(gemma.encode(turn))
    assert gemma.encode("Hello", special=True, add_special=True) == [BOS] + gemma.encode("Hello")
    assert gemma.encode("", add_special=True) == [BOS] and gemma.encode("") == []
    assert gemma.encode("a  b")[1] == gemma.encode("  ")[0]  # user-defined whitespace runs: always cut out


def test_end_of_generation_ids_as_llamacpp(gemma):
    # <eos>, <end_of_turn>, and Gemma's HTML "</s>", which llama.cpp also takes for an end-of-generation token
    assert gemma.eog_ids == {EOS, END_OF_TURN, gemma.encode("</s>", special=True)[0]}


def _round_trips(text: str) -> bool:
    return "\u2581" not in text  # a literal "▁" in the text is SentencePiece's space: it decodes as " "


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
def test_decode_round_trips(gemma, special):
    for case in CASES:
        if _round_trips(case["text"]):
            assert gemma.decode(gemma.encode(case["text"], special=special)) == case["text"]
    assert gemma.decode(gemma.encode("a \u2581 b")) == "a   b"


def test_skip_special_tokens_matches_llamacpp_detokenize(gemma):
    for case in CASES:
        assert gemma.decode(case["ids_special"], skip_special_tokens=True) == case["detok"], case["text"]


def _stream(tok: Tokenizer, ids: list[int], skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    return [detok.add(i) for i in ids] + [detok.flush()]


def test_incremental_detokenizer_emits_whole_characters_from_byte_tokens(gemma):
    byte_ids = {i for i in range(gemma.vocab_size) if gemma._types[i] == BYTE}
    assert len(byte_ids) == 256
    fallback = [case for case in CASES if byte_ids & set(case["ids"]) and _round_trips(case["text"])]
    assert len(fallback) >= 20
    split_chars = 0
    for case in fallback:
        pieces = _stream(gemma, case["ids"])
        assert "".join(pieces) == case["text"]
        assert all("\ufffd" not in piece for piece in pieces)
        emitted = ""
        for piece in pieces:
            emitted += piece
            assert case["text"].startswith(emitted)
        split_chars += pieces[:-1].count("")
    assert split_chars > 20  # byte tokens of one character really came one at a time


def test_no_chat_template_is_one_sentence(gemma):
    assert gemma.chat_template is None
    with pytest.raises(RequestError) as info:
        gemma.apply_chat_template([{"role": "user", "content": "Hi!"}])
    message = str(info.value)
    assert message == "The model has no chat template (it takes plain prompts only, not chat messages)."


def test_lone_surrogate_is_a_request_error(gemma):
    with pytest.raises(RequestError, match="lone surrogate"):
        gemma.encode("ok \ud800")


def test_vocabulary_without_scores_is_unsupported(meta):
    bare = {k: v for k, v in meta.items() if k != "tokenizer.ggml.scores"}
    with pytest.raises(ModelFileError, match=r"^g\.gguf: unsupported tokenizer .*without tokenizer\.ggml\.scores"):
        Tokenizer.from_gguf_metadata(bare, source="g.gguf")


# -- tiny vocabularies: the spec and llama.cpp's ids both come from the fixture ------------------------------


def write_spm_gguf(path: Path, spec: dict) -> Path:
    """The vocab-only llama GGUF scripts/make_spm_tokenizer_fixture.py gave llama.cpp for this spec."""
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
    return path


TINY = {spec["name"]: spec for spec in REFERENCE["tiny"]}


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request, tmp_path_factory) -> tuple[Tokenizer, dict]:
    spec = TINY[request.param]
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / f"{spec['name']}.gguf", spec)
    return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path.name), spec


@pytest.mark.parametrize("mode", MODES)
def test_tiny_ids_match_llamacpp(tiny, mode):
    tok, spec = tiny
    bad = _mismatches(tok, spec["cases"], mode)
    assert not bad, f"{len(bad)} of {len(spec['cases'])} texts differ, e.g.\n" + "\n".join(bad[:10])


def test_tiny_decode_matches_llamacpp_detokenize(tiny):
    tok, spec = tiny
    for case in spec["cases"]:
        assert tok.decode(case["ids_special"], skip_special_tokens=True) == case["detok"], case["text"]


def _pieces(tok: Tokenizer, text: str, **options) -> list[str]:
    return [tok.id_to_token(i) for i in tok.encode(text, **options)]


def test_tiny_merges_by_score_with_byte_fallback(tiny):
    tok, spec = tiny
    lead = ["\u2581"] if spec["add_space_prefix"] else []  # the space put in front becomes a token of its own
    assert _pieces(tok, "abc") == lead + ["ab", "c"]  # "ab" and "bc" score the same: the leftmost pair wins
    assert _pieces(tok, "xyz") == lead + ["xyz"]
    assert _pieces(tok, "\u4e2d") == lead + ["<0xE4>", "<0xB8>", "<0xAD>"]  # not in the vocabulary: its bytes
    assert tok.decode(tok.encode("\u4e2d\u6587 caf\u00e9")) == "\u4e2d\u6587 caf\u00e9"
    # llama.cpp merges into any token, even byte and control ones, and so do we
    assert _pieces(tok, "<0x41>") == lead + ["<0x41>"] and tok.decode(tok.encode("<0x41>")) == "A"
    assert _pieces(tok, "<bos>") == lead + ["<bos>"]


def test_tiny_space_prefix(tiny):
    tok, spec = tiny
    if spec["add_space_prefix"]:
        assert _pieces(tok, "hello world") == ["\u2581hello", "\u2581world"]
        assert tok.decode(tok.encode("hello world")) == "hello world"  # the space put in front is dropped
        assert "".join(_stream(tok, tok.encode("hello"))) == " hello"  # not when streaming a continuation
    else:
        assert _pieces(tok, "hello world") == ["hello", "\u2581world"]
