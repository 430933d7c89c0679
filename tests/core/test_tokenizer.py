"""Tokenizer: llama.cpp's ids on the real model, decoding, streaming detokenization, chat template."""

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miro.core.errors import MiroError, ModelFileError, RequestError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.tokenizers.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
REFERENCE = json.loads((FIXTURES / "tokenizer_llamacpp.json").read_text(encoding="utf-8"))
IM_START, IM_END, ENDOFTEXT = 1, 2, 0


@pytest.fixture(scope="module")
def meta(smollm2_path) -> dict:
    path = Path(smollm2_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != REFERENCE["model_sha256"]:
        pytest.skip(f"{path.name} is not the model the llama.cpp reference was made from")
    return GGUFFile(path).metadata


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta, source="smollm2")


def _mismatches(tok: Tokenizer, texts, expected, special: bool) -> list[str]:
    out = []
    for text, ids in zip(texts, expected):
        got = tok.encode(text, special=special)
        if got != ids:
            out.append(f"{text!r}: ours {got} llama.cpp {ids}")
    return out


def test_reference_covers_the_corpus():
    assert len(CORPUS) >= 320
    assert [case["text"] for case in REFERENCE["cases"]] == CORPUS


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
def test_ids_match_llamacpp(tok, special):
    key = "ids_special" if special else "ids"
    bad = _mismatches(tok, CORPUS, [case[key] for case in REFERENCE["cases"]], special)
    assert not bad, f"{len(bad)} of {len(CORPUS)} texts differ, e.g.\n" + "\n".join(bad[:10])


@pytest.mark.parametrize("pre", sorted(REFERENCE["pre_variants"]))
def test_other_pre_tokenizers_match_llamacpp(meta, pre):
    tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": pre}, source=pre)
    bad = _mismatches(tok, CORPUS, REFERENCE["pre_variants"][pre], special=False)
    assert not bad, f"{len(bad)} of {len(CORPUS)} texts differ, e.g.\n" + "\n".join(bad[:10])


def test_special_tokens_parsed_only_when_asked(tok):
    assert tok.encode("<|im_start|>", special=True) == [IM_START]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>", special=True)[0] == IM_START
    plain = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert len(plain) > 5 and not {IM_START, IM_END} & set(plain)
    assert tok.encode("a<|endoftext|>b", special=True) == tok.encode("a") + [ENDOFTEXT] + tok.encode("b")


def test_ids_and_properties(tok):
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (IM_START, IM_END)
    assert {IM_END, ENDOFTEXT} <= tok.eog_ids and IM_START not in tok.eog_ids
    assert set(range(17)) == tok.special_ids
    assert tok.encode("") == [] and tok.encode("hi")[0] != tok.bos_id


def _encodable_bytes(tok) -> set[int]:
    return {b[0] for b in map(tok.token_bytes, range(tok.vocab_size)) if len(b) == 1}


def test_vocabulary_lacks_a_few_bytes(tok):
    # SmolLM2 has no token for these bytes; llama.cpp drops them (the corpus checks that), so do we
    missing = set(range(256)) - _encodable_bytes(tok)
    assert {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2} <= missing
    assert tok.decode(tok.encode("a\x04b\U00040000")) == "ab\ufffd\ufffd\ufffd"


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
def test_decode_round_trips_the_corpus(tok, special):
    keep = _encodable_bytes(tok)
    for text in CORPUS:
        ids = tok.encode(text, special=special)
        expected = bytes(b for b in text.encode("utf-8") if b in keep)
        assert b"".join(tok.token_bytes(i) for i in ids) == expected, text
        if expected == text.encode("utf-8"):
            assert tok.decode(ids) == text


def test_skip_special_tokens_matches_llamacpp_detokenize(tok):
    for case in REFERENCE["cases"]:
        assert tok.decode(case["ids_special"], skip_special_tokens=True) == case["detok"], case["text"]


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.characters(max_codepoint=0x3FFFF, exclude_characters="\x04\x06\x13\x14\x16\x1d", exclude_categories=("Cs",)),
        max_size=60,
    )
)
def test_decode_round_trips_random_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_lone_surrogate_is_a_request_error(tok):
    with pytest.raises(RequestError, match="lone surrogate"):
        tok.encode("ok \ud800")


def _stream(tok, ids, skip=True) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    return [detok.add(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize(
    "text",
    [
        "日本語のテキストと中文混合",
        "emoji 👨‍👩‍👧‍👦 🇺🇸🇯🇵 🤗🔥 done",
        "ßé ĉ 한국어 ﬁ 😀😁",
    ],
)
def test_incremental_detokenizer_never_emits_partial_chars(tok, text):
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # the test must exercise split characters: some token ends mid-character
    assert any(p == "" for p in pieces[:-1])
    # every prefix emitted so far is a prefix of the text, cut at a character boundary
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert text.startswith(emitted)


def test_incremental_detokenizer_matches_decode_on_corpus(tok):
    for case in REFERENCE["cases"]:
        ids = case["ids_special"]
        assert "".join(_stream(tok, ids)) == tok.decode(ids, skip_special_tokens=True)
        assert "".join(_stream(tok, ids, skip=False)) == tok.decode(ids)


def test_incremental_detokenizer_invalid_utf8_like_decode(tok):
    lone = [i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xf0"][0]
    ids = tok.encode("ok ") + [lone] + tok.encode(" end") + [lone]
    assert "".join(_stream(tok, ids)) == tok.decode(ids) == "ok \ufffd end\ufffd"


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
]
EXPECTED_CHATML = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n"
)


def test_chat_template_renders_chatml(tok):
    assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=False) == EXPECTED_CHATML
    assert tok.apply_chat_template(CONVERSATION) == EXPECTED_CHATML + "<|im_start|>assistant\n"


def test_chat_template_default_system_prompt(tok):
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi!"}])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(rendered, special=True)
    assert ids[0] == IM_START and ids.count(IM_START) == 3 and ids.count(IM_END) == 2


def test_chat_template_fallback_is_chatml(meta):
    bare = {k: v for k, v in meta.items() if k != "tokenizer.chat_template"}
    tok = Tokenizer.from_gguf_metadata(bare)
    assert tok.apply_chat_template(CONVERSATION[1:], add_generation_prompt=False) == EXPECTED_CHATML.split("\n", 2)[2]


@pytest.mark.parametrize(
    "template",
    [
        "{{ raise_exception('no system role allowed') }}",
        "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}",
        "{% if %}",
        "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
    ],
)
def test_chat_template_errors_are_miro_errors(meta, template):
    tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.chat_template": template})
    with pytest.raises(MiroError, match="chat template"):
        tok.apply_chat_template(CONVERSATION)


def test_chat_template_variables(meta):
    tok = Tokenizer.from_gguf_metadata(
        {
            **meta,
            "tokenizer.chat_template": "{{ bos_token }}|{{ eos_token }}|"
            "{% for m in messages %}{{ m.content | trim }}{% endfor %}",
        }
    )
    assert tok.apply_chat_template([{"role": "user", "content": "  x  "}]) == "<|im_start|>|<|im_end|>|x"
    tojson = Tokenizer.from_gguf_metadata({**meta, "tokenizer.chat_template": "{{ messages[0] | tojson }}"})
    assert tojson.apply_chat_template([{"role": "user", "content": "<é & 'x'>"}]) == (
        '{"role": "user", "content": "<é & \'x\'>"}'
    )


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer.ggml.model": "llama"},
        {"tokenizer.ggml.model": "t5"},
        {"tokenizer.ggml.pre": "chameleon"},
    ],
)
def test_unsupported_tokenizer_is_a_model_file_error(meta, change):
    with pytest.raises(ModelFileError, match=r"^model\.gguf: unsupported tokenizer"):
        Tokenizer.from_gguf_metadata({**meta, **change}, source="model.gguf")
