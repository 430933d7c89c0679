"""Structured output: constraints on what a request may generate (a JSON schema, any JSON object, a regex,
a choice of strings, a Lark grammar), enforced token by token.

    StructuredOutputsParams (on SamplingParams) -> grammar, compiled and checked once per distinct constraint
    -> a matcher per constrained sequence (llguidance's LLMatcher, fed every token the sequence takes)
    -> each step: StructuredOutputs.start_masks() while the forward pass runs -> TokenMasks -> the sampler
       sets every token the grammar does not allow to -inf, on constrained rows only

The grammar engine is llguidance: benchmarks/grammar_engines.py measured it against xgrammar and
outlines-core on the default model's vocabulary. Its mask computation releases the GIL, so the masks of
a step are computed on a helper thread while numba runs the forward pass.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RequestError

if TYPE_CHECKING:
    from .sequence import Sequence
    from .tokenizer import Tokenizer

# JSON is generated without free whitespace: a small model given the choice can loop on spaces and newlines
JSON_OPTIONS = {"whitespace_flexible": False}
MAX_CONSTRAINT_CHARS = 1_000_000  # a schema, regex or grammar longer than this is refused at submit
MAX_CACHED_GRAMMARS = 256  # compiled grammars an engine keeps (a batch usually has one or a few schemas)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint, named as vLLM names it; exactly one field is set."""

    json: dict | str | None = None  # a JSON schema (an object, or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # a Lark grammar (llguidance's dialect: `start: ...` rules, /regex/ terminals)
    json_object: bool = False  # any JSON object (OpenAI's response_format {"type": "json_object"})

    @classmethod
    def of(cls, value: StructuredOutputsParams | dict) -> StructuredOutputsParams:
        """A StructuredOutputsParams from itself or from its keyword arguments (a job payload's JSON)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise RequestError("structured_outputs must be an object such as {\"json\": {...}}, {\"regex\": \"...\"}, "
                               "{\"choice\": [...]} or {\"grammar\": \"...\"}.")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise RequestError(f"structured_outputs has no field {unknown[0]!r} (it takes one of "
                               f"{', '.join(sorted(names))}).")
        return cls(**value)

    @property
    def kind(self) -> str:
        """The name of the one field that is set."""
        set_fields = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(set_fields) != 1:
            raise RequestError("structured_outputs takes exactly one of json, regex, choice, grammar and json_object, "
                               f"got {', '.join(set_fields) if set_fields else 'none'}.")
        return set_fields[0]

    @property
    def is_json(self) -> bool:
        """Whether the output is JSON (its parsed value goes to the results)."""
        return self.kind in ("json", "json_object")

    def grammar_text(self, label: str | None = None) -> str:
        """The constraint as an llguidance grammar, checked: RequestError in one sentence if it does not compile,
        naming it `label` (default: structured_outputs.KIND)."""
        kind = self.kind
        try:
            return _compiled(kind, _key(self))
        except _Unusable as problem:
            raise RequestError(f"{label or 'structured_outputs.' + kind} {problem}.") from None

    def validate(self, label: str | None = None) -> None:
        self.grammar_text(label)


class _Unusable(Exception):
    """What is wrong with a constraint, as the end of a sentence naming it ("does not compile: ...")."""


def _key(params: StructuredOutputsParams) -> str:
    """A hashable text of the one constraint that is set (a schema's key order kept: it is the output's order)."""
    kind = params.kind
    value = getattr(params, kind)
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise _Unusable(f"is not valid JSON ({e})") from None
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise _Unusable(f"is {len(text):,} characters long, more than the {MAX_CONSTRAINT_CHARS:,} miro accepts")
    return text


@lru_cache(maxsize=1024)
def _compiled(kind: str, key: str) -> str:
    import llguidance

    value = json.loads(key)
    build = llguidance.LLMatcher
    if kind == "json":
        if not isinstance(value, dict):
            raise _Unusable("must be a JSON schema object")
        grammar = build.grammar_from_json_schema(value, overrides=JSON_OPTIONS)
    elif kind == "json_object":
        if value is not True:
            raise _Unusable("must be true or left out")
        grammar = build.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    elif kind == "regex":
        _check_string(value)
        grammar = build.grammar_from_regex(value)
    elif kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise _Unusable("must be a non-empty list of non-empty strings")
        grammar = build.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    else:
        _check_string(value)
        grammar = build.grammar_from_lark(value)
    is_error, messages = build.validate_grammar_with_warnings(grammar)
    if is_error:
        raise _Unusable(f"does not compile: {_first_line(messages[0])}")
    return grammar


def _check_string(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _Unusable("must be a non-empty string")


def _first_line(message: str, limit: int = 200) -> str:
    """llguidance's message as one line: its first line, and the regex parser's "error: ..." line if it has one."""
    lines = [part.strip() for part in message.splitlines() if part.strip()] or ["unknown error"]
    cause = next((part[len("error:"):].strip() for part in lines[1:] if part.startswith("error:")), None)
    line = (lines[0].rstrip(":") + (f": {cause}" if cause else "")).rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class TokenMasks:
    """The allowed tokens of a step's constrained rows: bits[j] is the packed mask of logits row rows[j]."""

    rows: list[int]
    bits: np.ndarray  # (len(rows), ceil(vocab / 32)) int32, bit t of the row set if token t is allowed

    def allowed(self, j: int, vocab: int) -> np.ndarray:
        """Row rows[j]'s allowed tokens as a boolean array of the logits' width."""
        return np.unpackbits(self.bits[j].view(np.uint8), bitorder="little", count=vocab).astype(bool)


class StructuredOutputs:
    """The engine's side of structured output: the vocabulary as llguidance sees it, a matcher per constrained
    sequence, and the masks of each step."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width (a vocabulary may be padded past its tokens)
        self._ll_tokenizer = None
        self._fresh: dict[str, Any] = {}  # grammar -> a matcher at its start, deep-copied for each sequence
        self._executor = None
        self._thread: ThreadPoolExecutor | None = None

    def _llguidance(self):
        """llguidance's tokenizer and executor, built on first use (about 0.1 s for a 49,152-token vocabulary)."""
        if self._ll_tokenizer is None:
            import llguidance

            self._ll_tokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Vocabulary(self.tokenizer, self.vocab_size)),
                n_vocab=self.vocab_size, eos_token=sorted(self.tokenizer.eog_ids))
            self._executor = llguidance.LLExecutor(1)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="miro-masks")
        return self._ll_tokenizer

    def new_matcher(self, params: StructuredOutputsParams):
        """A matcher at the start of the constraint; RequestError if it cannot run on this vocabulary."""
        import llguidance

        grammar = params.grammar_text()
        fresh = self._fresh.get(grammar)
        if fresh is None:
            fresh = llguidance.LLMatcher(self._llguidance(), grammar, log_level=0)
            if fresh.is_error():
                raise RequestError(f"structured_outputs cannot run on this model's vocabulary: "
                                   f"{_first_line(fresh.get_error())}.")
            if len(self._fresh) >= MAX_CACHED_GRAMMARS:
                self._fresh.pop(next(iter(self._fresh)))
            self._fresh[grammar] = fresh
        return fresh.deep_copy()

    def start_masks(self, seqs: list[Sequence]) -> Future | None:
        """Begin computing the masks of the constrained sequences among `seqs` (the rows of the coming logits)
        on a helper thread; None when none is constrained, so unconstrained steps pay nothing."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return None
        matchers = [seqs[i].matcher for i in rows]
        return self._thread.submit(self.masks, matchers, rows)

    def masks(self, matchers: list, rows: list[int]) -> TokenMasks:
        """The masks of `matchers`, one per logits row in `rows`."""
        self._llguidance()
        bits = np.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(m, j) for j, m in enumerate(matchers)], bits.ctypes.data,
                                               bits.shape[1] * 4, len(rows))
        return TokenMasks(rows, bits)


class _Vocabulary:
    """miro's tokenizer in the shape llguidance.TokenizerWrapper reads: every token's bytes, special tokens
    marked with a leading 0xFF byte (so a grammar never produces them), and an encode function."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        special = tokenizer.special_ids | tokenizer.eog_ids
        self.special_token_ids = sorted(special)
        self.tokens = [b"\xff" + tokenizer.id_to_token(i).encode("utf-8") if i in special
                       else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.tokens += [b""] * (vocab_size - len(self.tokens))

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"))


def parsed_json(params: StructuredOutputsParams | None, text: str, finish_reason: str | None) -> str | None:
    """A JSON-constrained output that finished with "stop", parsed and written back as compact JSON text;
    None for anything else (unconstrained, a regex or choice, or cut short by max_tokens)."""
    if params is None or not params.is_json or finish_reason != "stop":
        return None
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return None
