"""What a request to vLLM's offline API (llm.py) states: its prompt (TextPrompt, TokensPrompt) and its parameters
(SamplingParams, StructuredOutputsParams), with vLLM's names. A field miro cannot honour is refused (LLMError).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypedDict

from miro.core.errors import LLMError, RequestError
from miro.core.sampling.params import SamplingParams as _EngineSamplingParams


# -- inputs ------------------------------------------------------------------------------------------------


class TextPrompt(TypedDict, total=False):
    """vLLM's TextPrompt: {"prompt": "..."}."""

    prompt: str


class TokensPrompt(TypedDict, total=False):
    """vLLM's TokensPrompt: {"prompt_token_ids": [...]} (a "prompt" key, if given, is what outputs show)."""

    prompt_token_ids: list[int]
    prompt: str


# -- structured outputs ----------------------------------------------------------------------------------

_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
_BACKENDS = (None, "auto", "guidance", "llguidance")  # miro's grammar engine is llguidance (vLLM's "guidance")


@dataclass
class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams (GuidedDecodingParams before): exactly one of json (a JSON schema: a dict,
    its JSON text or a pydantic model class), regex, choice, grammar (Lark, or GBNF/EBNF as vLLM's examples
    write it: converted to Lark by llguidance) and json_object."""

    json: str | dict | Any | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False  # one backend: there is nothing to fall back to
    disable_any_whitespace: bool = False  # miro's JSON never has free whitespace, whichever is asked
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    backend: str | None = None  # GuidedDecodingParams' field: "auto", "guidance" (llguidance) or left out

    def __post_init__(self):
        given = [name for name in _CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise LLMError(
                f"structured outputs take exactly one of {', '.join(_CONSTRAINTS)}, got "
                f"{', '.join(given) if given else 'none'}."
            )
        if self.backend not in _BACKENDS:
            raise LLMError(
                f"miro's structured outputs run on llguidance (vLLM's 'guidance' backend): backend "
                f"{self.backend!r} is not available."
            )
        if self.disable_additional_properties:
            raise LLMError(
                "disable_additional_properties is not supported: say additionalProperties: false in the schema."
            )
        if self.whitespace_pattern is not None:
            raise LLMError("whitespace_pattern is not supported: miro's JSON output has no free whitespace.")
        if self.structural_tag is not None:
            raise LLMError("structural_tag is not supported by miro's structured outputs.")

    @classmethod
    def from_optional(
        cls, json=None, regex=None, choice=None, grammar=None, json_object=None, **options
    ) -> StructuredOutputsParams | None:
        """None when no constraint is given (vLLM's GuidedDecodingParams.from_optional)."""
        if all(value is None for value in (json, regex, choice, grammar, json_object)):
            return None
        return cls(json=json, regex=regex, choice=choice, grammar=grammar, json_object=json_object, **options)

    def engine_constraint(self) -> dict:
        """The constraint as miro's engine takes it: {kind: value}."""
        kind = next(name for name in _CONSTRAINTS if getattr(self, name) not in (None, False))
        value = getattr(self, kind)
        if kind == "json" and hasattr(value, "model_json_schema"):  # a pydantic model class
            value = value.model_json_schema()
        elif kind == "choice":
            value = [str(c) for c in value]
        elif kind == "grammar" and isinstance(value, str):
            value = _lark(value)
        elif kind == "json_object":
            value = True
        return {kind: value}


GuidedDecodingParams = StructuredOutputsParams  # vLLM's name before 0.11


def _lark(grammar: str) -> str:
    """A grammar in llguidance's Lark dialect: GBNF/EBNF (`root ::= ...`, as vLLM's examples and xgrammar take
    it) converted by llguidance; Lark as it is."""
    if "::=" not in grammar:
        return grammar
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(grammar)
    except Exception as exc:  # noqa: BLE001 - llguidance's converter raises its own errors
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise LLMError(f"the GBNF grammar could not be converted to Lark: {message}.") from None


# -- sampling parameters ---------------------------------------------------------------------------------


@dataclass
class SamplingParams(_EngineSamplingParams):
    """vLLM's SamplingParams: miro's (whose fields are vLLM's: n, temperature, top_p, top_k, min_p, the three
    penalties, seed, stop, stop_token_ids, ignore_eos, max_tokens, min_tokens, logprobs, skip_special_tokens,
    structured_outputs) plus vLLM's other fields, refused where miro cannot honour them. An Engine takes it too.

    Unlike miro's own SamplingParams, stop strings may go with structured_outputs (vLLM allows it): the output
    ends where a stop string appears, the constraint unfinished."""

    best_of: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    spaces_between_special_tokens: bool = True  # miro writes special tokens as they are (vLLM's fast tokenizers too)
    logits_processors: Any = None
    include_stop_str_in_output: bool = False  # LLM.generate and LLM.chat put the stop string back
    truncate_prompt_tokens: int | None = None
    output_kind: Any = None
    guided_decoding: StructuredOutputsParams | None = None  # vLLM's name before structured_outputs
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None

    def __post_init__(self):
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.best_of is not None and self.best_of != self.n:
            raise LLMError(
                f"best_of is not supported (got {self.best_of}): miro returns each of the n choices it samples."
            )
        for name, off, why in _UNSUPPORTED_FIELDS:
            if getattr(self, name) not in off:
                raise LLMError(f"SamplingParams.{name} is not supported by miro ({why}).")
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise LLMError("give structured_outputs or guided_decoding (its older name), not both.")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if isinstance(self.structured_outputs, StructuredOutputsParams):
            self.structured_outputs = self.structured_outputs.engine_constraint()
        try:
            super().__post_init__()
        except RequestError as err:
            raise LLMError(str(err)) from None

    def validate(self) -> None:
        """miro's checks, with stop strings allowed beside structured_outputs."""
        if self.structured_outputs is None or not self.stop:
            return super().validate()
        stop, self.stop = self.stop, []
        try:
            super().validate()
        finally:
            self.stop = stop
        if any(not s for s in stop):
            raise RequestError("stop strings must not be empty.")

    def clone(self) -> SamplingParams:
        return replace(self)


_UNSUPPORTED_FIELDS = (  # name, the values that ask for nothing, why another cannot be honoured
    ("prompt_logprobs", (None,), "it returns the logprobs of generated tokens only"),
    ("detokenize", (True,), "outputs always carry their text"),
    ("logits_processors", (None, [], ()), "its sampler takes no Python callbacks"),
    ("truncate_prompt_tokens", (None,), "a prompt longer than the context is refused, not cut"),
    ("output_kind", (None,), "LLM.generate returns each request's final output"),
    ("logit_bias", (None, {}), "its sampler has no per-token bias"),
    ("allowed_token_ids", (None, []), "use structured_outputs choice or regex to restrict the output"),
    ("extra_args", (None, {}), "it has no extension arguments"),
    ("bad_words", (None, []), "its sampler bans no words"),
)
