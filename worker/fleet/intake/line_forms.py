"""The two forms a line of a dataset may take, as pydantic models: a simple line (prompt, messages or input,
vLLM's sampling and pooling names, fields of its own) and an OpenAI Batch API line whose body is a chat, a
completion, a Responses or an embeddings request. inputs.py reads a dataset through them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError


def short_text(text: str, limit: int = 80) -> str:
    """A user's key or id, fit for a one-line message: control characters escaped, long text cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stop_as_list(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, list):
        return value
    raise PydanticCustomError("stop_type", "Input should be a string or a list of strings")


def int_id_as_str(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _one_prompt_only(value: Any) -> Any:
    if isinstance(value, list):
        message = "arrays of prompts are not supported, put each prompt on its own line"
        raise PydanticCustomError("prompt_array", message)
    return value


MAX_EMBEDDING_INPUTS = 2048  # inputs one /v1/embeddings request may hold (OpenAI's limit)


def _number_kind(value: Any) -> str | None:
    """Why a JSON value is not a token id (an integer from 0), or None if it is one."""
    if type(value) is int:
        return "a negative number" if value < 0 else None
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, float):
        return "a number with a fraction"
    return {str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(type(value), "not a number")


def _embedding_inputs(value: Any) -> Any:
    """OpenAI's embeddings `input` (a string, a list of strings, a list of token ids, or a list of lists of token
    ids) as a list of inputs, each a non-empty string or a non-empty list of token ids, all of one kind."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and isinstance(value[0], (int, float)):
        value = [value]  # one input given as its token ids
    if not isinstance(value, list):
        raise PydanticCustomError(
            "input_type", "should be a string, a list of strings, a list of token ids or a list of lists of token ids"
        )
    if not value:
        raise PydanticCustomError("input_empty", "should not be an empty list")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise PydanticCustomError(
            "input_count",
            "has {n} inputs, more than the {limit} one request may hold: split it over several lines",
            {"n": f"{len(value):,}", "limit": f"{MAX_EMBEDDING_INPUTS:,}"},
        )
    for index, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise PydanticCustomError("input_blank", "input {index} is an empty string", {"index": index})
        elif isinstance(item, list):
            if not item:
                raise PydanticCustomError(
                    "input_blank", "input {index} is an empty list of token ids", {"index": index}
                )
            for position, token in enumerate(item):
                if (kind := _number_kind(token)) is not None:
                    raise PydanticCustomError(
                        "token_id",
                        "input {index}: token {position} is {kind}, and token ids are integers from 0",
                        {"index": index, "position": position, "kind": kind},
                    )
        else:
            kind = _number_kind(item) or "a number"
            raise PydanticCustomError(
                "input_item",
                "input {index} is {kind}, not a string or a list of token ids",
                {"index": index, "kind": kind},
            )
    if len({type(item) for item in value}) > 1:
        raise PydanticCustomError("input_mixed", "mixes strings and lists of token ids: give one kind")
    return value


NonEmptyStr = Annotated[str, Field(min_length=1)]
EmbeddingInputs = Annotated[list[str] | list[list[int]], BeforeValidator(_embedding_inputs)]
Id = Annotated[NonEmptyStr | None, BeforeValidator(int_id_as_str)]
Stop = Annotated[list[str] | None, BeforeValidator(_stop_as_list)]


def _text_of(value: Any, kinds: tuple[str, ...]) -> Any:
    """Content given as OpenAI content parts of the given types: their text joined with newlines (as vLLM joins
    them)."""
    if not isinstance(value, list):
        return value
    if not value:
        raise PydanticCustomError("no_parts", "a list of content parts must not be empty")
    texts = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            shown = f"of type '{short_text(kind, 40)}'" if isinstance(kind, str) else "without a 'type'"
            raise PydanticCustomError(
                "part_type",
                "content parts {shown} are not supported ({kinds} only)",
                {"shown": shown, "kinds": " or ".join(kinds)},
            )
        if not isinstance(part.get("text"), str):
            raise PydanticCustomError("part_text", "a {kind} content part needs a 'text' string", {"kind": kind})
        texts.append(part["text"])
    return "\n".join(texts)


def _text_of_parts(value: Any) -> Any:
    """Chat content: a string or text parts."""
    return _text_of(value, ("text",))


class Message(BaseModel):
    """A chat message. OpenAI's `developer` role is the system role to a chat template."""

    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, BeforeValidator(_text_of_parts)]

    def as_template_message(self) -> dict:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


Messages = Annotated[list[Message], Field(min_length=1)]


class _Sampling(BaseModel):
    """vLLM-named sampling fields shared by simple lines and OpenAI bodies; null means "not given"."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    stop: Stop = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    n: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    structured_outputs: dict[str, Any] | None = (
        None  # vLLM's: {"json": schema} | {"regex": ...} | {"choice": [...]} | ...
    )

    def sampling(self) -> dict:
        values = self.__dict__  # the fields' values (pydantic keeps them there)
        return {k: v for k in _SAMPLING_FIELDS if (v := values[k]) is not None}


class _Pooling(BaseModel):
    """An embedding request's options beside its input: vLLM's and OpenAI's names; null means "not given"."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    dimensions: Annotated[int, Field(ge=1)] | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: cut a longer input to this many tokens; -1: to the context
    encoding_format: Literal["float", "base64"] | None = None  # how OpenAI output lines give the vector

    def pooling(self) -> dict:
        """PoolingParams keyword arguments."""
        return {
            k: v for k in ("dimensions", "normalize", "truncate_prompt_tokens") if (v := getattr(self, k)) is not None
        }

    def given_pooling_fields(self) -> list[str]:
        values = self.__dict__
        return [k for k in _POOLING_FIELDS if values[k] is not None]


# the field names in declaration order, once (model_fields is a class property: a call per access)
_SAMPLING_FIELDS = tuple(_Sampling.model_fields)
_POOLING_FIELDS = tuple(_Pooling.model_fields)


class SimpleLine(_Sampling, _Pooling):
    model_config = ConfigDict(extra="allow")  # the line's own fields go to the results (see _own_fields)
    id: Id = None
    custom_id: Id = None
    prompt: NonEmptyStr | None = None
    messages: Messages | None = None
    input: EmbeddingInputs | None = None  # an embedding line
    logprobs: int | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SimpleLine:
        if self.id is not None and self.custom_id is not None:
            raise PydanticCustomError("two_ids", "give the id as 'id' or as 'custom_id', not both")
        given = [name for name in ("prompt", "messages", "input") if getattr(self, name) is not None]
        if not given:
            raise PydanticCustomError("no_input", "the line needs a 'prompt', 'messages' or 'input' field")
        if len(given) > 1:
            raise PydanticCustomError(
                "two_inputs", "the line has both '{a}' and '{b}', give only one", {"a": given[0], "b": given[1]}
            )
        return self

    def given_sampling_fields(self) -> list[str]:
        return [k for k in (*_SAMPLING_FIELDS, "logprobs") if getattr(self, k) is not None]


class OpenAILine(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    custom_id: NonEmptyStr
    method: Literal["POST"]
    url: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
    body: dict[str, Any]


# Body fields that change what a request means, which miro cannot honour yet: refused by name, never ignored.
# A field given as its "off" value (null, [], {}, "none", false) is fine. (response_format is honoured: ResponseFormat.)
_UNHONOURED = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "audio", "prediction", "stream")
_OFF_VALUES = (None, [], {}, "none", False)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # name, description, strict: the schema is always enforced
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text (no constraint), json_object (any JSON object) or json_schema."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise PydanticCustomError("json_schema", "'json_schema' goes with type 'json_schema', and only there")
        return self

    def constraint(self) -> dict | None:
        """The format as SamplingParams' structured_outputs."""
        if self.type == "json_schema":
            return {"json": self.json_schema.schema_}
        return {"json_object": True} if self.type == "json_object" else None


class _Body(_Sampling):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send many fields we do not use (user, metadata, ...)
    model: str | None = None
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_miro_cannot_honour(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in _UNHONOURED:
                if name in data and data[name] not in _OFF_VALUES:
                    raise PydanticCustomError(
                        "unhonoured",
                        "'{name}' is not supported by miro yet, and ignoring it "
                        "would change the answer: remove it or set it to null",
                        {"name": name},
                    )
        return data


class ChatBody(_Body):
    messages: Messages
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionBody(_Body):
    prompt: Annotated[NonEmptyStr, BeforeValidator(_one_prompt_only)]
    logprobs: int | None = None


class EmbeddingBody(_Pooling):
    """A /v1/embeddings body: OpenAI's fields and vLLM's truncate_prompt_tokens and normalize. Unknown fields are
    refused, as a misspelt `dimensions` would silently change the vectors."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: EmbeddingInputs
    user: str | None = None  # OpenAI's end-user id: accepted, not used


# A Responses body's fields that change what a request means and that miro cannot honour: refused by name.
_UNHONOURED_RESPONSES = (
    "tools",
    "tool_choice",
    "stream",
    "previous_response_id",
    "conversation",
    "prompt",
    "reasoning",
    "background",
)
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the `include` entry that asks for the output's logprobs


def _text_of_input_parts(value: Any) -> Any:
    """Responses content: a string, or input_text parts (output_text for an earlier assistant answer)."""
    return _text_of(value, ("input_text", "output_text"))


class InputMessage(Message):
    """A Responses input item: a message (its `type`, when given, is "message")."""

    type: Literal["message"] = "message"
    content: Annotated[str, BeforeValidator(_text_of_input_parts)]


def _input_items(value: Any) -> Any:
    """A Responses `input`: a string is one user message; a list holds message items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        for item in value:
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind != "message":
                shown = f"of type '{short_text(kind, 40)}'" if isinstance(kind, str) else "that are not objects"
                raise PydanticCustomError(
                    "item_type", "input items {shown} are not supported (messages only)", {"shown": shown}
                )
    return value


class TextFormat(BaseModel):
    """A Responses `text.format`: text (no constraint), json_object (any JSON object) or json_schema (its name and
    schema beside the type, where chat nests them under json_schema)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced
    description: str | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or not self.name):
            raise PydanticCustomError("json_schema", "type 'json_schema' needs a 'name' and a 'schema'")
        if self.type != "json_schema" and (self.schema_ is not None or self.name is not None):
            raise PydanticCustomError("json_schema", "'name' and 'schema' go with type 'json_schema', and only there")
        return self

    def constraint(self) -> dict | None:
        """The format as SamplingParams' structured_outputs."""
        if self.type == "json_schema":
            return {"json": self.schema_}
        return {"json_object": True} if self.type == "json_object" else None

    def echo(self) -> dict:
        """The format as the Response object gives it back."""
        return self.model_dump(by_alias=True, exclude_none=True)


class TextConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # verbosity: a hint, not a constraint
    format: TextFormat | None = None


class ResponsesBody(_Sampling):
    """A /v1/responses body: OpenAI's Responses fields, and vLLM's sampling names as on a chat body."""

    model_config = ConfigDict(extra="ignore")  # store, user, truncation, service_tier, ... change nothing here
    model: str | None = None
    input: Annotated[Annotated[list[InputMessage], Field(min_length=1)], BeforeValidator(_input_items)]
    instructions: str | None = None
    max_output_tokens: int | None = None
    text: TextConfig | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_miro_cannot_honour(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in _UNHONOURED_RESPONSES:
                if name in data and data[name] not in _OFF_VALUES:
                    raise PydanticCustomError(
                        "unhonoured",
                        "'{name}' is not supported by miro yet, and ignoring it "
                        "would change the answer: remove it or set it to null",
                        {"name": name},
                    )
        return data

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    def messages(self) -> list[dict]:
        """The chat the model sees: the instructions as a system message, then the input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        return system + [m.as_template_message() for m in self.input]
