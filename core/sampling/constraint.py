"""A structured-output constraint as a request states it (vLLM's StructuredOutputsParams), its grammar compiled
and checked once per distinct constraint, and the JSON a finished JSON-constrained output parses to.

Nothing here needs the engine: submit checks constraints with it before any job is enqueued, and the results
writer parses outputs with it. structured_output.py enforces the grammars while the engine runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np

from miro.core.errors import RequestError

# JSON is generated without free whitespace: a small model given the choice can loop on spaces and newlines
JSON_OPTIONS = {"whitespace_flexible": False}
MAX_CONSTRAINT_CHARS = 1_000_000  # a schema, regex or grammar longer than this is refused at submit


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
            raise RequestError(
                'structured_outputs must be an object such as {"json": {...}}, {"regex": "..."}, '
                '{"choice": [...]} or {"grammar": "..."}.'
            )
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise RequestError(
                f"structured_outputs has no field {unknown[0]!r} (it takes one of {', '.join(sorted(names))})."
            )
        return cls(**value)

    @property
    def kind(self) -> str:
        """The name of the one field that is set."""
        set_fields = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(set_fields) != 1:
            raise RequestError(
                "structured_outputs takes exactly one of json, regex, choice, grammar and json_object, "
                f"got {', '.join(set_fields) if set_fields else 'none'}."
            )
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
        raise _Unusable(f"does not compile: {first_line(messages[0])}")
    _check_first_token(grammar)
    return grammar


def _check_first_token(grammar: str) -> None:
    """A grammar that compiles may still exceed llguidance's limits at its first token (`start: "a"{60000}`: "Too
    many items"): run it one token on a byte vocabulary, a mask and the first allowed byte consumed. (The engine
    does not rely on this: a grammar that fails later fails its own request.)"""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if not matcher.is_error():
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.flatnonzero(np.unpackbits(bits, bitorder="little")[:_BYTE_VOCAB])
        if len(allowed):
            matcher.consume_token(int(allowed[0]))
    if matcher.is_error():
        raise _Unusable(f"cannot run: {first_line(matcher.get_error())}")


_BYTE_VOCAB = 257  # the 256 bytes and an end-of-sequence token


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, in the shape llguidance.TokenizerWrapper reads."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids = [256]
    tokens = [bytes([b]) for b in range(256)] + [b"\xff<eos>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@lru_cache(maxsize=1)
def _byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=_BYTE_VOCAB, eos_token=256)


def _check_string(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _Unusable("must be a non-empty string")


def first_line(message: str, limit: int = 200) -> str:
    """llguidance's message as one line: its first line, and the regex parser's "error: ..." line if it has one."""
    lines = [part.strip() for part in message.splitlines() if part.strip()] or ["unknown error"]
    cause = next((part[len("error:") :].strip() for part in lines[1:] if part.startswith("error:")), None)
    line = (lines[0].rstrip(":") + (f": {cause}" if cause else "")).rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def parsed_json(params: StructuredOutputsParams | None, text: str, finish_reason: str | None) -> str | None:
    """A JSON-constrained output that finished with "stop", parsed and written back as compact JSON text;
    None for anything else (unconstrained, a regex or choice, or cut short by max_tokens)."""
    if params is None or not params.is_json or finish_reason != "stop":
        return None
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return None
