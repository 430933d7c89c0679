"""WordPiece (`tokenizer.ggml.model == "bert"`), BERT's vocabulary, on the HF tokenizers library.

A BERT GGUF stores the vocabulary in llama.cpp's "phantom space" form (core/loading/convert.py): a piece that
starts a word as "\u2581foo", a continuation as "bar", special tokens ([CLS], [SEP] ...) as they are.
Turned back into WordPiece's own form ("foo", "##bar") it runs with BERT's normaliser (clean-up, CJK
characters split apart, lower case with accents stripped) and pre-tokeniser (whitespace and punctuation
splits), which give the ids of HF's tokenizer.json and of llama.cpp's WPM tokenizer.
"""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from miro.core.errors import ModelFileError, RequestError

PHANTOM_SPACE = "\u2581"
MAX_CHARS_PER_WORD = 100  # a longer word is [UNK], as BERT's tokenizer and llama.cpp do


class WordPiece:
    add_space_prefix = True  # decode drops the space the first word's phantom space gives

    def __init__(self, tokens: list[str], token_types: list[int], unk_id: int | None, source: str):
        control = {3, 2}  # llama.cpp's CONTROL and UNKNOWN token types stay as they are
        vocab = {}
        for token_id, (text, kind) in enumerate(zip(tokens, token_types)):
            piece = text if kind in control else (text[1:] if text.startswith(PHANTOM_SPACE) else "##" + text)
            vocab.setdefault(piece, token_id)
        if unk_id is None:
            raise ModelFileError(f"{source}: a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id.")
        self._hf = HFTokenizer(
            models.WordPiece(vocab, unk_token=tokens[unk_id], max_input_chars_per_word=MAX_CHARS_PER_WORD)
        )
        self._hf.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
        self._hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def encode(self, text: str, after_special: bool) -> list[int]:
        try:
            return self._hf.encode(text, add_special_tokens=False).ids
        except TypeError:  # a lone surrogate such as "\ud800"
            raise RequestError("The text to tokenize is not valid Unicode (it has a lone surrogate).") from None

    @staticmethod
    def token_bytes(text: str) -> bytes:
        return (" " + text[1:] if text.startswith(PHANTOM_SPACE) else text).encode("utf-8")
