"""SentencePiece tokenizers (`tokenizer.ggml.model == "llama"`), token for token as llama.cpp does them.

llama.cpp (`llm_tokenizer_spm` in src/llama-vocab.cpp) does not run
SentencePiece itself. On each text fragment left between special tokens it

* puts one space in front when `tokenizer.ggml.add_space_prefix` is set and the
  fragment opens the text or follows a special token, then writes every space
  as "▁" (U+2581);
* starts from one symbol per character and keeps merging the adjacent pair
  whose concatenation is a vocabulary token with the highest score (ties: the
  leftmost pair), until no adjacent pair forms a token; any token can form
  this way, control and byte tokens included;
* emits each symbol's token id, or, for a character that is no token, its
  UTF-8 bytes as the byte tokens <0x00>..<0xFF> (byte fallback).

A BPE model with merges derived from the scores (HF's conversion) comes close
but breaks ties by merge rank rather than position and cannot form control or
byte tokens, so this module runs llama.cpp's loop itself, in Python.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from miro.core.errors import RequestError

SPACE = "\u2581"  # "▁", SentencePiece's visible space


def byte_token_value(text: str) -> int | None:
    """The byte a byte-fallback token such as "<0x0A>" stands for (None for other texts)."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None


class SentencePieceModel:
    """Splits one text fragment (no special tokens in it) into token ids, as llama.cpp's SPM tokenizer."""

    def __init__(self, tokens: list[str], scores: Sequence[float], *, add_space_prefix: bool):
        self._ids: dict[str, int] = {}
        for token_id, text in enumerate(tokens):
            self._ids.setdefault(text, token_id)  # llama.cpp keeps the first id of a repeated text
        self._scores = scores
        self.add_space_prefix = add_space_prefix
        # llama.cpp's byte_to_token: "<0xNN>", else the byte itself as a one-character token
        self._byte_ids = [
            self._ids.get(f"<0x{b:02X}>", self._ids.get(chr(b)) if b < 0x80 else None) for b in range(256)
        ]

    def encode(self, text: str, after_special: bool) -> list[int]:
        """Ids of `text`; `after_special` says it opens the text or follows a special token."""
        if self.add_space_prefix and after_special:
            text = " " + text
        return [token_id for symbol in self._merge(text.replace(" ", SPACE)) for token_id in self._symbol_ids(symbol)]

    def _merge(self, text: str) -> list[str]:
        """The symbols left once no adjacent pair forms a token (llama.cpp's merge loop)."""
        ids, scores = self._ids, self._scores
        symbols = list(text)  # "" marks a symbol merged into its left neighbour
        n = len(symbols)
        prev = list(range(-1, n - 1))
        next_ = list(range(1, n + 1))
        if n:
            next_[-1] = -1
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, length of the merged text)

        def add_pair(left: int, right: int) -> None:
            merged = symbols[left] + symbols[right]
            token_id = ids.get(merged)
            if token_id is not None:
                heapq.heappush(queue, (-scores[token_id], left, right, len(merged)))

        for i in range(1, n):
            add_pair(i - 1, i)
        while queue:
            _, left, right, length = heapq.heappop(queue)
            left_text, right_text = symbols[left], symbols[right]
            if not left_text or not right_text or len(left_text) + len(right_text) != length:
                continue  # one side changed since this pair was queued
            symbols[left] = left_text + right_text
            symbols[right] = ""
            next_[left] = next_[right]
            if next_[left] >= 0:
                prev[next_[left]] = left
            if prev[left] >= 0:
                add_pair(prev[left], left)
            if next_[left] >= 0:
                add_pair(left, next_[left])
        return [symbol for symbol in symbols if symbol]

    def _symbol_ids(self, symbol: str) -> list[int]:
        token_id = self._ids.get(symbol)
        if token_id is not None:
            return [token_id]
        try:
            data = symbol.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800"
            raise RequestError("The text to tokenize is not valid Unicode (it has a lone surrogate).") from None
        out = []
        for b in data:
            if self._byte_ids[b] is None:
                raise RequestError(f"The model's vocabulary has no token for the byte 0x{b:02X} in the text.")
            out.append(self._byte_ids[b])
        return out

    @staticmethod
    def token_bytes(text: str) -> bytes:
        """What a normal (not control, not byte) token stands for: its text with "▁" as a space."""
        return text.replace(SPACE, " ").encode("utf-8")
