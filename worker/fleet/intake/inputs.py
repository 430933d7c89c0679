"""Validation of a user's JSONL dataset for miro-submit: two line forms in, one normalised Request per line out.

A line generates (a chat or a completion request) or embeds (an embedding request: OpenAI's /v1/embeddings, a
simple line's `input`, or its `prompt` under task "embed"); a batch runs on one model, so it does one or the
other, and a line of the other task is that line's error.

Pydantic models sit at the boundary (one per line form, line_forms.py); what comes out is plain
dataclasses. No Redis here. Every problem becomes one sentence naming the line
and the field, e.g. ``line 7: field 'messages.0.content': Input should be a valid string.``
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from miro.core.errors import MiroError, RequestError
from miro.core.layers.pooling import PoolingParams
from miro.core.sampling.params import SamplingParams
from miro.core.sampling.constraint import StructuredOutputsParams

from miro.worker.fleet.intake.line_forms import (
    LOGPROBS_INCLUDE,
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    OpenAILine,
    ResponsesBody,
    SimpleLine,
    int_id_as_str,
    short_text,
)
from miro.worker.fleet.records.payload import Request, ResponseEcho
from miro.worker.fleet.output.rows import SCHEMA

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
TASKS = ("generate", "embed")  # what a batch does (the engine's supported_tasks names)
_SAMPLING_NAMES = {f.name for f in dataclasses.fields(SamplingParams)}
_JSON_TYPES = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}


@dataclass
class LineError:
    line: int
    custom_id: str | None
    message: str  # one sentence, starting with "line N: "
    code: str = "invalid_request"  # the OpenAI Batch API's error code for the line (miro serve)


class LineProblem(Exception):
    """A line that cannot become a Request; the message is a sentence without "line N: "."""

    custom_id: str | None = None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"key {short_text(duplicate)!r} appears twice in one JSON object")
    return obj


def _describe(errors: list[dict], prefix: tuple = (), known: set[str] = frozenset()) -> str:
    """Pydantic errors as one sentence: field path and pydantic's message, never the input value."""
    parts = []
    for error in errors[:3]:
        loc = ".".join(short_text(str(p), 60) for p in (*prefix, *error["loc"]))
        message = error["msg"].rstrip(".")
        if error["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(error["loc"][-1]), sorted(known), n=1)
            message = "unknown field" + (f" (did you mean '{guess[0]}'?)" if guess else "")
        parts.append(f"field '{loc}': {message}" if loc else message)
    more = f" (and {len(errors) - 3} more problems)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def _validate(model: type[BaseModel], data: Any, prefix: tuple = ()) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise LineProblem(_describe(e.errors(), prefix, set(model.model_fields))) from None


def _simple(obj: dict, number: int, task: str | None) -> dict:
    line = _validate(SimpleLine, obj)
    if line.input is not None or (task == "embed" and line.prompt is not None):
        return _simple_embedding(line, number)
    if given := line.given_pooling_fields():
        raise LineProblem(
            f"field '{given[0]}': only an embedding line takes it (one with 'input', or a 'prompt' under --task embed)"
        )
    sampling = line.sampling()
    if line.logprobs is not None:
        sampling["logprobs"] = line.logprobs
    return dict(
        custom_id=line.id or line.custom_id or f"line-{number}",
        line=number,
        kind="chat" if line.messages is not None else "completion",
        prompt=line.prompt,
        messages=[m.as_template_message() for m in line.messages] if line.messages is not None else None,
        sampling=sampling,
        requested_model=None,
        form="simple",
        url=None,
        extra=_own_fields(line.model_extra or {}),
    )


def _simple_embedding(line: SimpleLine, number: int) -> dict:
    if given := line.given_sampling_fields():
        raise LineProblem(f"field '{given[0]}': a sampling option, and an embedding line generates nothing")
    return dict(
        custom_id=line.id or line.custom_id or f"line-{number}",
        line=number,
        kind="embedding",
        prompt=None,
        messages=None,
        sampling={},
        requested_model=None,
        form="simple",
        url=None,
        extra=_own_fields(line.model_extra or {}),
        inputs=line.input if line.input is not None else [line.prompt],
        pooling=line.pooling(),
        encoding_format=line.encoding_format or "float",
    )


MAX_FIELD_NAME = 128  # characters in the name of a line's own field (a column of the results)
# characters in a custom id: each one is kept in Redis while its batch runs (job meta, the invalid lines) and in every
# row of the results, so a line cannot make Redis hold megabytes for one id. OpenAI's Batch API documents no limit;
# Anthropic's Message Batches take 1 to 64 characters.
MAX_CUSTOM_ID = 512
_MIRO_FIELDS = sorted(SimpleLine.model_fields)  # a line's own field this close to one of these is a typo
_RESULT_COLUMNS = frozenset(SCHEMA.names)  # the results' own columns


@functools.lru_cache(maxsize=4096)  # a dataset's lines share their fields: difflib once per name, not per line
def own_field_problem(name: str) -> str | None:
    """Why a line's own field (or a table's kept column) of this name cannot be a column of the results, or None:
    `model`, a name the results use, or one a letter or so from one of miro's fields (taken for a typo)."""
    if name == "model":
        return "field 'model': a simple line cannot choose its model: give --model, or use OpenAI lines (body.model)"
    guess = difflib.get_close_matches(name, _MIRO_FIELDS, n=1, cutoff=0.8)
    if guess:
        return f"field '{short_text(name, 60)}': unknown field (did you mean '{guess[0]}'?)"
    if name in _RESULT_COLUMNS:
        return f"field '{short_text(name, 60)}': the results have a column of that name, rename it"
    return None


def _own_fields(extra: dict[str, Any]) -> dict[str, Any] | None:
    """A simple line's fields that are not miro's: carried to the results as columns, as Ray Data carries a
    dataset's other columns. A name one letter or so from one of miro's fields is taken for a typo and refused,
    and so is a name the results already use."""
    for name in extra:
        if len(name) > MAX_FIELD_NAME:
            raise LineProblem(
                f"field '{short_text(name, 60)}': a field name of {len(name):,} characters is too long "
                f"for a column (at most {MAX_FIELD_NAME})"
            )
        if (problem := own_field_problem(name)) is not None:
            raise LineProblem(problem)
    return dict(extra) or None


def _openai(obj: dict, number: int) -> dict:
    envelope = _validate(OpenAILine, obj)
    if envelope.url == EMBEDDINGS_URL:
        body = _validate(EmbeddingBody, envelope.body, ("body",))
        return dict(
            custom_id=envelope.custom_id,
            line=number,
            kind="embedding",
            prompt=None,
            messages=None,
            sampling={},
            requested_model=body.model,
            form="openai",
            url=envelope.url,
            inputs=body.input,
            pooling=body.pooling(),
            encoding_format=body.encoding_format or "float",
        )
    if envelope.url == RESPONSES_URL:
        return _responses(envelope, number)
    chat = envelope.url == CHAT_URL
    body = _validate(ChatBody if chat else CompletionBody, envelope.body, ("body",))
    sampling = body.sampling()
    _take_max_tokens(sampling, body.max_tokens, body.max_completion_tokens, "max_completion_tokens")
    if chat:
        if body.top_logprobs is not None and not body.logprobs:
            raise LineProblem("field 'body.top_logprobs': needs 'logprobs' set to true")
        if body.logprobs:
            sampling["logprobs"] = body.top_logprobs or 0
    elif body.logprobs is not None:
        sampling["logprobs"] = body.logprobs
    if body.response_format is not None:
        schema = body.response_format.type == "json_schema"
        _constrain(
            sampling,
            body.response_format.constraint(),
            body.structured_outputs,
            "body.response_format",
            "body.response_format.json_schema.schema" if schema else "body.response_format",
        )
    return dict(
        custom_id=envelope.custom_id,
        line=number,
        kind="chat" if chat else "completion",
        prompt=None if chat else body.prompt,
        messages=[m.as_template_message() for m in body.messages] if chat else None,
        sampling=sampling,
        requested_model=body.model,
        form="openai",
        url=envelope.url,
    )


def _responses(envelope: OpenAILine, number: int) -> dict:
    """A /v1/responses line: a chat request (the instructions as its system message) whose output is a Response."""
    body = _validate(ResponsesBody, envelope.body, ("body",))
    if body.n not in (None, 1):
        raise LineProblem(
            "field 'body.n': a Responses request gives one output; use /v1/chat/completions lines for n choices"
        )
    for entry in body.include or ():
        if entry != LOGPROBS_INCLUDE:
            raise LineProblem(
                f"field 'body.include': '{short_text(entry, 60)}' is not supported (only '{LOGPROBS_INCLUDE}')"
            )
    sampling = body.sampling()
    _take_max_tokens(sampling, body.max_tokens, body.max_output_tokens, "max_output_tokens")
    if body.top_logprobs is not None and not body.wants_logprobs:
        raise LineProblem(f"field 'body.top_logprobs': needs 'include' to list '{LOGPROBS_INCLUDE}'")
    if body.wants_logprobs:
        sampling["logprobs"] = body.top_logprobs or 0
    text_format = body.text.format if body.text is not None else None
    if text_format is not None:
        schema = text_format.type == "json_schema"
        _constrain(
            sampling,
            text_format.constraint(),
            body.structured_outputs,
            "body.text.format",
            "body.text.format.schema" if schema else "body.text.format",
        )
    echo = ResponseEcho(
        instructions=body.instructions,
        metadata=body.metadata,
        text_format=text_format.echo() if text_format is not None else None,
    )
    return dict(
        custom_id=envelope.custom_id,
        line=number,
        kind="response",
        prompt=None,
        messages=body.messages(),
        sampling=sampling,
        requested_model=body.model,
        form="openai",
        url=envelope.url,
        response=echo,
    )


def _take_max_tokens(sampling: dict, max_tokens: int | None, openai_name_value: int | None, openai_name: str) -> None:
    """OpenAI's name for the output limit (max_completion_tokens, max_output_tokens) as vLLM's max_tokens."""
    if openai_name_value is None:
        return
    if max_tokens is not None and max_tokens != openai_name_value:
        raise LineProblem(f"field 'body.{openai_name}': differs from 'body.max_tokens', give only one")
    sampling["max_tokens"] = openai_name_value


def _constrain(
    sampling: dict, constraint: dict | None, structured_outputs: dict | None, field_name: str, label: str
) -> None:
    """An OpenAI output format (response_format, text.format) as the request's structured_outputs, compiled now
    so that a schema that does not compile is this line's error."""
    if constraint is None:
        return
    if structured_outputs is not None:
        raise LineProblem(f"field '{field_name}': give it or 'body.structured_outputs', not both")
    sampling["structured_outputs"] = constraint
    try:
        StructuredOutputsParams.of(constraint).validate(f"field '{label}'")
    except RequestError as e:
        raise LineProblem(str(e).rstrip(".")) from None


def _id_of(obj: dict) -> str | None:
    """The line's custom id as given, if it is one miro keeps (not over MAX_CUSTOM_ID: such a line is named line-N)."""
    for key in ("custom_id", "id"):
        value = int_id_as_str(obj.get(key))
        if isinstance(value, str) and value:
            return value if len(value) <= MAX_CUSTOM_ID else None
    return None


def _check_id_length(obj: dict) -> None:
    for key in ("custom_id", "id"):
        value = int_id_as_str(obj.get(key))  # an id given as a number is its digits
        if isinstance(value, str) and len(value) > MAX_CUSTOM_ID:
            raise LineProblem(
                f"field '{key}': a custom id of {len(value):,} characters is too long (at most {MAX_CUSTOM_ID:,})"
            )


class _NonStandardNumber(ValueError):
    pass


def _refuse_constant(name: str):
    """json.loads accepts NaN, Infinity and -Infinity; JSON (and OpenAI's API) does not."""
    raise _NonStandardNumber(f"not valid JSON ({name} is not a JSON number)")


# json.loads(text, object_pairs_hook=..., parse_constant=...) makes a decoder per call; one serves every line
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)


def parse_line(number: int, text: str, defaults: dict, pooling_defaults: dict, task: str | None) -> Request:
    return parse_object(number, json_object(text), defaults, pooling_defaults, task)


def json_object(text: str) -> dict:
    """A line's JSON object; LineProblem if the line is not one (invalid JSON, NaN, a duplicate key, an array)."""
    try:
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        obj = _DECODER.decode(text)
    except _NonStandardNumber as e:
        raise LineProblem(str(e)) from None
    except json.JSONDecodeError as e:
        raise LineProblem(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except _DuplicateKey as e:
        raise LineProblem(str(e)) from None
    except (ValueError, RecursionError):  # a number with thousands of digits, or nesting too deep
        raise LineProblem("not valid JSON (a number is too long or the nesting too deep)") from None
    if not isinstance(obj, dict):
        raise LineProblem(f"expected a JSON object, got {_JSON_TYPES.get(type(obj), 'a number')}")
    return obj


def parse_object(number: int, obj: dict, defaults: dict, pooling_defaults: dict, task: str | None) -> Request:
    """A line's object (a JSONL line's, or a table row's as columns.py makes it) as a Request; LineProblem if it is
    none."""
    try:
        _check_id_length(obj)
        # the Request's fields, made a Request once its defaults are in (one construction a line, not two)
        values = _openai(obj, number) if obj.keys() & {"url", "method", "body"} else _simple(obj, number, task)
        try:
            if values["kind"] == "embedding":
                values["pooling"] = {**pooling_defaults, **values["pooling"]}
                PoolingParams(**values["pooling"])
            else:
                # a line without max_tokens (and no default for it) runs to a natural stop within the context, as
                # OpenAI's do
                merged = {"max_tokens": None, **defaults, **values["sampling"]}
                values["sampling"] = {k: list(v) if isinstance(v, list) else v for k, v in merged.items()}
                SamplingParams(**values["sampling"])
        except RequestError as e:
            raise LineProblem(str(e).rstrip(".")) from None
    except LineProblem as problem:
        problem.custom_id = _id_of(obj)
        raise
    return Request(**values)


def checked_defaults(defaults: dict | None) -> dict:
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - _SAMPLING_NAMES)
    if unknown:
        raise MiroError(f"Default sampling options {', '.join(unknown)} are not SamplingParams fields.")
    if isinstance(defaults.get("stop"), str):
        defaults["stop"] = [defaults["stop"]]
    try:
        SamplingParams(**defaults)
    except RequestError as e:
        raise MiroError(f"Default sampling options are invalid ({str(e).rstrip('.')}).") from None
    return defaults


def task_mismatch(number: int, request: Request, task: str | None, task_line: int | None) -> str:
    what = "an embedding request" if request.task == "embed" else "a generation request"
    batch = "generates" if request.task == "embed" else "embeds"
    why = f"--task {task}" if task is not None else f"as line {task_line} does"
    return (
        f"line {number}: {what}, but the batch {batch} ({why}); a batch runs on one model, which either embeds "
        "or generates: put the two kinds in two files."
    )


def checked_pooling_defaults(pooling_defaults: dict | None) -> dict:
    pooling_defaults = dict(pooling_defaults or {})
    try:
        PoolingParams(**pooling_defaults)
    except TypeError:
        raise MiroError(
            f"Default pooling options {', '.join(sorted(pooling_defaults))} are not PoolingParams fields."
        ) from None
    except RequestError as e:
        raise MiroError(f"Default pooling options are invalid ({str(e).rstrip('.')}).") from None
    return pooling_defaults
