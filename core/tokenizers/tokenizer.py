"""Tokenizer and chat template built from a GGUF file's `tokenizer.ggml.*` metadata.

Both kinds of vocabulary give llama.cpp's ids (src/llama-vocab.cpp). First,
special tokens are cut out of the text, longest token text first, like
llama.cpp's `tokenizer_st_partition`: control tokens only when `special=True`,
user-defined tokens always. Each remaining fragment then goes to the model:

* byte-level BPE (`tokenizer.ggml.model == "gpt2"`) runs on the HuggingFace
  `tokenizers` library, after llama.cpp's pre-tokenizer regexes for
  `tokenizer.ggml.pre` (each one an isolating split);
* SentencePiece (`"llama"`, e.g. Gemma) runs llama.cpp's own merge loop by
  scores with byte fallback: see tokenizer_spm.py;
* WordPiece (`"bert"`, BERT's) runs on `tokenizers` with BERT's normaliser:
  see tokenizer_wpm.py.

`encode(..., add_special=True)` adds BOS / EOS as the file's
`tokenizer.ggml.add_bos_token` / `add_eos_token` say, as llama.cpp's
`add_special` does. Not reproduced: llama.cpp's `clean_spaces` detokenizer
option (so decode stays the inverse of encode) and the lstrip/rstrip
attributes it hard-codes for a few models' special tokens.
"""

from __future__ import annotations

import codecs
import json
from array import array
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from miro.core.errors import MiroError, ModelFileError, RequestError
from miro.core.tokenizers.spm import SentencePieceModel, byte_token_value
from miro.core.tokenizers.wpm import WordPiece

# llama.cpp token types (tokenizer.ggml.token_type)
UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k's split as llama.cpp runs it (LLAMA_VOCAB_PRE_TYPE_GPT4O): its std::regex has no \p{Lu}/\p{Ll}, so an
# upper-case letter is "a letter not in a-z" and a lower-case one "a letter not in A-Z" (any non-ASCII letter is
# both, and combining marks are not letters); contractions in any case stay on the word; digits in threes
_GPT4O_UPPER, _GPT4O_LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}*{_GPT4O_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}+{_GPT4O_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

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
    "gpt-4o": ([_GPT4O], False),
}

# token texts llama.cpp treats as end of generation (besides the eos/eot/eom ids); "</s>" too, even
# Gemma's HTML "</s>" (so, as in llama.cpp, it is a control token there: only parsed with special=True);
# "<|return|>" and "<|call|>" are o200k_harmony's (gpt-oss), "<|flush|>" and "<|calls|>" solar-open's
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "</s>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
    }
)
# harmony's message markers (gpt-oss): llama.cpp makes them user-defined in any vocabulary that has them, so
# they are parsed in any text and printed even when special tokens are skipped
_ALWAYS_SHOWN_TEXTS = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})

# used when a file has no tokenizer.chat_template but its vocabulary has ChatML's tokens
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


class _ByteLevelBPE:
    """Byte-level BPE (`tokenizer.ggml.model == "gpt2"`) on the HF tokenizers library."""

    add_space_prefix = False

    def __init__(self, meta: dict, tokens: list[str], pre: str, source: str):
        try:
            merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        except KeyError as exc:
            raise ModelFileError(f"{source}: metadata key '{exc.args[0]}' is missing.") from None
        regexes, ignore_merges = _PRE_TOKENIZERS[pre]
        try:
            bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=ignore_merges)
        except Exception as exc:  # the tokenizers library rejects inconsistent vocab/merges
            raise ModelFileError(f"{source}: the tokenizer vocabulary or merges are invalid ({exc}).") from None
        self._hf = HFTokenizer(bpe)
        self._hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )

    def encode(self, text: str, after_special: bool) -> list[int]:
        # one encode() per fragment, not encode_batch(): no thread pool, so forked workers are safe
        try:
            return self._hf.encode(text, add_special_tokens=False).ids
        except TypeError:  # what the tokenizers library raises for a lone surrogate such as "\ud800"
            raise RequestError("The text to tokenize is not valid Unicode (it has a lone surrogate).") from None

    token_bytes = staticmethod(_normal_token_bytes)


def _sentencepiece(meta: dict, tokens: list[str], source: str) -> SentencePieceModel:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise ModelFileError(
            f"{source}: unsupported tokenizer (a SentencePiece vocabulary, model 'llama', "
            f"without tokenizer.ggml.scores)."
        )
    # unboxed: a list of Gemma 3's 262,144 scores as Python floats took 8 MiB
    return SentencePieceModel(
        tokens, array("d", scores), add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    )


class _SplitTokens:
    """Special tokens in partition order, grouped by their first two characters to find quickly those in a text.

    Gemma has over 6,000 special tokens; a text is searched only for the groups whose start it contains.
    """

    def __init__(self, in_order: list[tuple[int, str]]):
        self._groups: dict[str, list[tuple[int, int, str]]] = {}
        for rank, (token_id, text) in enumerate(in_order):
            self._groups.setdefault(text[:2], []).append((rank, token_id, text))

    def found_in(self, text: str) -> list[tuple[int, str]]:
        """(id, text) of the tokens that may occur in `text`, in partition order."""
        found = sorted(entry for start, group in self._groups.items() if start in text for entry in group)
        return [(token_id, token_text) for _, token_id, token_text in found]


class Tokenizer:
    """A GGUF file's tokenizer giving llama.cpp's ids; see the module docstring."""

    def __init__(
        self,
        model: _ByteLevelBPE | SentencePieceModel,
        tokens: list[str],
        token_types: list[int],
        *,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: set[int],
        chat_template: str | None,
        add_bos: bool = False,
        add_eos: bool = False,
    ):
        self._model = model
        self._tokens = tokens
        self._types = token_types
        self._bytes: dict[int, bytes] = {}  # token_bytes' results so far
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids = eog_ids
        self.add_bos = add_bos  # whether encode(..., add_special=True) starts with BOS
        self.add_eos = add_eos  # ... and ends with EOS
        if chat_template is None and {"<|im_start|>", "<|im_end|>"} <= set(tokens):
            chat_template = CHATML_TEMPLATE
        self.chat_template = chat_template  # None: the model takes plain prompts only
        self.control_ids = {i for i, t in enumerate(token_types) if t in (CONTROL, UNKNOWN)}
        self.special_ids = self.control_ids | {i for i, t in enumerate(token_types) if t == USER_DEFINED}
        # llama.cpp's partition order: longest token text first
        order = sorted((i for i in self.special_ids if tokens[i]), key=lambda i: -len(tokens[i].encode("utf-8")))
        self._split_all = _SplitTokens([(i, tokens[i]) for i in order])
        self._split_plain = _SplitTokens([(i, tokens[i]) for i in order if i not in self.control_ids])

    @classmethod
    def from_gguf_metadata(cls, meta: dict, source: str = "") -> Tokenizer:
        kind = meta.get("tokenizer.ggml.model")
        pre = meta.get("tokenizer.ggml.pre") or "default"
        if kind not in ("llama", "bert") and (kind != "gpt2" or pre not in _PRE_TOKENIZERS):
            raise ModelFileError(
                f"{source}: unsupported tokenizer (model '{kind}', pre-tokenizer '{pre}'); "
                f"supported: 'llama' (SentencePiece), 'bert' (WordPiece) and 'gpt2' with "
                f"pre-tokenizer {', '.join(sorted(_PRE_TOKENIZERS))}."
            )
        try:
            tokens = list(meta["tokenizer.ggml.tokens"])
        except KeyError as exc:
            raise ModelFileError(f"{source}: metadata key '{exc.args[0]}' is missing.") from None
        n = len(tokens)
        if kind == "llama":  # llama.cpp's defaults for SentencePiece vocabularies
            model = _sentencepiece(meta, tokens, source)
            bos_id, eos_id = _token_id(meta, "bos", n, default=1), _token_id(meta, "eos", n, default=2)
            add_bos = meta.get("tokenizer.ggml.add_bos_token", True)
        elif kind == "bert":  # llama.cpp's WPM: [CLS] (its bos) first, [SEP] last
            model = WordPiece(
                tokens, list(meta.get("tokenizer.ggml.token_type") or [1] * n), _token_id(meta, "unknown", n), source
            )
            bos_id, eos_id = _token_id(meta, "bos", n), _token_id(meta, "seperator", n)
            if bos_id is None or eos_id is None:
                raise ModelFileError(
                    f"{source}: a WordPiece vocabulary needs tokenizer.ggml.bos_token_id ([CLS]) "
                    f"and tokenizer.ggml.seperator_token_id ([SEP])."
                )
            add_bos = True
            meta = {**meta, "tokenizer.ggml.add_eos_token": meta.get("tokenizer.ggml.add_sep_token", True)}
        else:
            model = _ByteLevelBPE(meta, tokens, pre, source)
            bos_id, eos_id = _token_id(meta, "bos", n), _token_id(meta, "eos", n)
            add_bos = meta.get("tokenizer.ggml.add_bos_token", pre in ("llama-bpe", "llama3"))
        add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
        for flag, name, token_id in ((add_bos, "bos", bos_id), (add_eos, "eos", eos_id)):
            if flag and token_id is None:
                raise ModelFileError(
                    f"{source}: tokenizer.ggml.add_{name}_token is true but the file has no {name.upper()} token."
                )
        types = list(meta.get("tokenizer.ggml.token_type") or [1] * n)
        eog_ids = _end_of_generation(tokens, types, meta, eos_id)
        return cls(
            model,
            tokens,
            types,
            bos_id=bos_id,
            eos_id=eos_id,
            eog_ids=eog_ids,
            chat_template=meta.get("tokenizer.chat_template"),
            add_bos=bool(add_bos),
            add_eos=bool(add_eos),
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def id_to_token(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (byte-level characters for normal tokens)."""
        return self._tokens[token_id]

    def encode(self, text: str, special: bool = False, add_special: bool = False) -> list[int]:
        """Token ids of `text`.

        `special=True` also parses control tokens such as <|im_start|> or <start_of_turn>; `add_special=True`
        adds BOS and EOS where the file's add_bos_token / add_eos_token ask for them (without it: never).
        """
        ids = [self.bos_id] if add_special and self.add_bos else []
        after_special = True  # SentencePiece's space prefix goes on the first fragment and after special tokens
        split_tokens = (self._split_all if special else self._split_plain).found_in(text)
        for piece in self._partition(text, split_tokens):
            if isinstance(piece, int):
                ids.append(piece)
                after_special = True
            else:
                ids.extend(self._model.encode(piece, after_special))
                after_special = False
        if add_special and self.add_eos:
            ids.append(self.eos_id)
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

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` stands for (control tokens: their text)."""
        # made on first use and kept: a table of every token's bytes took 14 MiB for Gemma 3's 262,144 tokens
        data = self._bytes.get(token_id)
        if data is None:
            text, ttype = self._tokens[token_id], self._types[token_id]
            if ttype in (CONTROL, UNKNOWN, USER_DEFINED):
                data = text.encode("utf-8")
            elif ttype == UNUSED:
                data = b""
            elif ttype == BYTE and byte_token_value(text) is not None:
                data = bytes([byte_token_value(text)])
            else:
                data = self._model.token_bytes(text)
            self._bytes[token_id] = data
        return data

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The bytes of `ids` joined, before UTF-8 decoding."""
        skip = self.control_ids if skip_special_tokens else ()
        ids = list(ids)
        data = b"".join(self.token_bytes(i) for i in ids if i not in skip)
        if self._model.add_space_prefix and ids and self.token_bytes(ids[0]).startswith(b" "):
            data = data[1:]  # the space encode put in front (llama.cpp's detokenize drops it too)
        return data

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; `skip_special_tokens` drops control tokens (user-defined ones stay, as in llama.cpp)."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def _text_of(self, token_id: int | None) -> str:
        return "" if token_id is None else self._tokens[token_id]

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render `messages` with the model's chat template (ChatML when the file has none but ChatML's tokens)."""
        if self.chat_template is None:
            raise RequestError("The model has no chat template (it takes plain prompts only, not chat messages).")
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._text_of(self.bos_id),
                eos_token=self._text_of(self.eos_id),
                **extra,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise MiroError(f"The chat template could not be rendered: {str(exc).rstrip('.')}.") from None


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """HF's `tojson`: plain JSON, unlike jinja2's HTML-escaping filter."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _end_of_generation(tokens: list[str], types: list[int], meta: dict, eos_id: int | None) -> set[int]:
    """The ids that end generation, as llama.cpp's `llama_vocab::impl::load` picks them; sets `types` as it does.

    All by token text, whatever the architecture: end-of-generation texts become control tokens and harmony's
    markers user-defined; the EOS (`eos_id`) and the file's eos/eot/eom ids join. Then, if the set holds
    "<|end|>", "<|call|>" or "<|calls|>", and "<|return|>" or "<|flush|>" (gpt-oss's o200k_harmony,
    solar-open), "<|end|>" ends a message, not the generation: it leaves the set and becomes user-defined.
    """
    n = len(tokens)
    eog_ids = {i for i, text in enumerate(tokens) if text in _EOG_TEXTS}
    for i in eog_ids:
        types[i] = CONTROL
    for i, text in enumerate(tokens):
        if text in _ALWAYS_SHOWN_TEXTS:
            types[i] = USER_DEFINED
    eog_ids |= {i for i in (_token_id(meta, name, n) for name in ("eos", "eot", "eom")) if i is not None}
    if eos_id is not None:
        eog_ids.add(eos_id)
    texts = {tokens[i] for i in eog_ids}
    has_call = bool(texts & {"<|call|>", "<|calls|>"})
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        for i in [i for i in eog_ids if tokens[i] == "<|end|>"]:
            eog_ids.discard(i)
            types[i] = USER_DEFINED
    return eog_ids


def _token_id(meta: dict, name: str, n_tokens: int, default: int | None = None) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id", default)
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
