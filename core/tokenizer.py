"""Tokenizer and chat template built from a GGUF file's `tokenizer.ggml.*` metadata.

Byte-level BPE runs on the HuggingFace `tokenizers` library, set up to split
text the way llama.cpp does (src/llama-vocab.cpp), so the ids match llama.cpp's:

* special tokens are cut out of the text first, longest token text first, like
  llama.cpp's `tokenizer_st_partition`; control tokens only when `special=True`,
  user-defined tokens always;
* each remaining fragment goes through llama.cpp's pre-tokenizer regexes for
  `tokenizer.ggml.pre` (each one an isolating split), then byte-level BPE.

Not reproduced: llama.cpp's `clean_spaces` detokenizer option (so decode stays
the inverse of encode) and the lstrip/rstrip attributes it hard-codes for a few
models' special tokens.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .errors import MiroError, ModelFileError, RequestError

# llama.cpp token types (tokenizer.ggml.token_type)
UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 2, 3, 4, 5

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (llama.cpp's regexes, applied one after another; ignore_merges)
_PRE_TOKENIZERS: dict[str, tuple[list[str], bool]] = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], False),
    "gpt-2": ([_GPT2], False),
    "gpt2": ([_GPT2], False),  # llama.cpp only knows the spelling "gpt-2"
    "smollm": ([r"\p{N}", _GPT2], False),
    "starcoder": ([r"\p{N}", _GPT2], False),
    "llama-bpe": ([_LLAMA3], True),
    "llama3": ([_LLAMA3], True),
    "qwen2": ([_QWEN2], False),
}

# token texts llama.cpp treats as end of generation (besides the eos/eot/eom ids)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters back to the bytes they encode."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_DECODE_TABLE = str.maketrans({c: chr(b) for c, b in _byte_level_alphabet().items()})


def _normal_token_bytes(text: str) -> bytes:
    try:
        return text.translate(_BYTE_DECODE_TABLE).encode("latin-1")
    except UnicodeEncodeError:  # not a byte-level token; llama.cpp prints a marker, we keep the text
        return text.encode("utf-8")


class Tokenizer:
    """Byte-level BPE tokenizer giving llama.cpp's ids; see the module docstring."""

    def __init__(self, hf: HFTokenizer, tokens: list[str], token_types: list[int], *,
                 bos_id: int | None, eos_id: int | None, eog_ids: set[int],
                 chat_template: str | None):
        self._hf = hf
        self._tokens = tokens
        self._types = token_types
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids = eog_ids
        self.chat_template = chat_template or CHATML_TEMPLATE
        self.control_ids = {i for i, t in enumerate(token_types) if t in (CONTROL, UNKNOWN)}
        self.special_ids = self.control_ids | {i for i, t in enumerate(token_types) if t == USER_DEFINED}
        # llama.cpp's partition order: longest token text first
        order = sorted(self.special_ids, key=lambda i: -len(tokens[i].encode("utf-8")))
        self._split_all = [(i, tokens[i]) for i in order]
        self._split_plain = [(i, t) for i, t in self._split_all if i not in self.control_ids]

    @classmethod
    def from_gguf_metadata(cls, meta: dict, source: str = "") -> Tokenizer:
        model = meta.get("tokenizer.ggml.model")
        pre = meta.get("tokenizer.ggml.pre") or "default"
        if model != "gpt2" or pre not in _PRE_TOKENIZERS:
            raise ModelFileError(f"{source}: unsupported tokenizer (model '{model}', pre-tokenizer '{pre}'); "
                                 f"supported: 'gpt2' with pre-tokenizer {', '.join(sorted(_PRE_TOKENIZERS))}.")
        try:
            tokens = list(meta["tokenizer.ggml.tokens"])
            merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        except KeyError as exc:
            raise ModelFileError(f"{source}: metadata key '{exc.args[0]}' is missing.") from None
        types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        eog_ids = {i for i, text in enumerate(tokens) if text in _EOG_TEXTS}
        for i in eog_ids:  # llama.cpp forces end-of-generation tokens to control
            types[i] = CONTROL
        regexes, ignore_merges = _PRE_TOKENIZERS[pre]
        try:
            bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=ignore_merges)
        except Exception as exc:  # the tokenizers library rejects inconsistent vocab/merges
            raise ModelFileError(f"{source}: the tokenizer vocabulary or merges are invalid ({exc}).") from None
        hf = HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return cls(hf, tokens, types,
                   bos_id=_token_id(meta, "bos", len(tokens)), eos_id=_token_id(meta, "eos", len(tokens)),
                   eog_ids=eog_ids | {i for i in (_token_id(meta, n, len(tokens)) for n in ("eos", "eot", "eom"))
                                      if i is not None},
                   chat_template=meta.get("tokenizer.chat_template"))

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def id_to_token(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (byte-level characters for normal tokens)."""
        return self._tokens[token_id]

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`, never with BOS; `special=True` also parses control tokens such as <|im_start|>."""
        ids: list[int] = []
        # one encode() per fragment, not encode_batch(): no thread pool, so forked workers are safe
        for piece in self._partition(text, self._split_all if special else self._split_plain):
            if isinstance(piece, int):
                ids.append(piece)
                continue
            try:
                ids.extend(self._hf.encode(piece, add_special_tokens=False).ids)
            except TypeError:  # what the tokenizers library raises for a lone surrogate such as "\ud800"
                raise RequestError("The text to tokenize is not valid Unicode (it has a lone surrogate).") from None
        return ids

    @staticmethod
    def _partition(text: str, split_tokens: list[tuple[int, str]]) -> list[str | int]:
        """Cut special token texts out of `text`: a list of text fragments and token ids."""
        pieces: list[str | int] = [text] if text else []
        for token_id, token_text in split_tokens:
            if not any(isinstance(p, str) and token_text in p for p in pieces):
                continue
            cut: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int):
                    cut.append(piece)
                    continue
                for k, part in enumerate(piece.split(token_text)):
                    if k:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            pieces = cut
        return pieces

    @cached_property
    def _bytes(self) -> list[bytes]:
        out = []
        for text, ttype in zip(self._tokens, self._types):
            if ttype in (CONTROL, UNKNOWN, USER_DEFINED):
                out.append(text.encode("utf-8"))
            elif ttype == UNUSED:
                out.append(b"")
            else:
                out.append(_normal_token_bytes(text))
        return out

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` stands for (control tokens: their text)."""
        return self._bytes[token_id]

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The bytes of `ids` joined, before UTF-8 decoding."""
        table = self._bytes
        skip = self.control_ids if skip_special_tokens else ()
        return b"".join(table[i] for i in ids if i not in skip)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; `skip_special_tokens` drops control tokens (user-defined ones stay, as in llama.cpp)."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def _text_of(self, token_id: int | None) -> str:
        return "" if token_id is None else self._tokens[token_id]

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render `messages` with the model's chat template (ChatML when the file has none)."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self._text_of(self.bos_id),
                                         eos_token=self._text_of(self.eos_id), **extra)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise MiroError(f"The chat template could not be rendered: {str(exc).rstrip('.')}.") from None


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """HF's `tojson`: plain JSON, unlike jinja2's HTML-escaping filter."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _token_id(meta: dict, name: str, n_tokens: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    return int(value) if value is not None and 0 <= int(value) < n_tokens else None


class IncrementalDetokenizer:
    """Turns a stream of token ids into text, emitting only complete UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = tokenizer.control_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        if token_id in self._skip:
            return ""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left (an unfinished character becomes U+FFFD, as `decode` makes it)."""
        return self._decoder.decode(b"", final=True)
