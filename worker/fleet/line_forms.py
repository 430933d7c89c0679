"""The two forms a line of a dataset may take, as pydantic models: a simple line (prompt or messages, vLLM's
sampling names, fields of its own) and an OpenAI Batch API line whose body is a chat or a completion request.
inputs.py reads a dataset through them."""

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


NonEmptyStr = Annotated[str, Field(min_length=1)]
Id = Annotated[NonEmptyStr | None, BeforeValidator(int_id_as_str)]
Stop = Annotated[list[str] | None, BeforeValidator(_stop_as_list)]


def _text_of_parts(value: Any) -> Any:
    """Content given as OpenAI content parts: their text joined with newlines (as vLLM joins them)."""
    if not isinstance(value, list):
        return value
    if not value:
        raise PydanticCustomError("no_parts", "a list of content parts must not be empty")
    texts = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = f"of type '{short_text(kind, 40)}'" if isinstance(kind, str) else "without a 'type'"
            raise PydanticCustomError("part_type", "content parts {shown} are not supported (text only)",
                                      {"shown": shown})
        if not isinstance(part.get("text"), str):
            raise PydanticCustomError("part_text", "a text content part needs a 'text' string")
        texts.append(part["text"])
    return "\n".join(texts)


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
    structured_outputs: dict[str, Any] | None = None  # vLLM's: {"json": schema} | {"regex": ...} | {"choice": [...]} | ...

    def sampling(self) -> dict:
        return {k: v for k in _Sampling.model_fields if (v := getattr(self, k)) is not None}


class SimpleLine(_Sampling):
    model_config = ConfigDict(extra="allow")  # the line's own fields go to the results (see _own_fields)
    id: Id = None
    custom_id: Id = None
    prompt: NonEmptyStr | None = None
    messages: Messages | None = None
    logprobs: int | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SimpleLine:
        if self.id is not None and self.custom_id is not None:
            raise PydanticCustomError("two_ids", "give the id as 'id' or as 'custom_id', not both")
        if self.prompt is None and self.messages is None:
            raise PydanticCustomError("no_input", "the line needs a 'prompt' or a 'messages' field")
        if self.prompt is not None and self.messages is not None:
            raise PydanticCustomError("two_inputs", "the line has both 'prompt' and 'messages', give only one")
        return self


class OpenAILine(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    custom_id: NonEmptyStr
    method: Literal["POST"]
    url: Literal["/v1/chat/completions", "/v1/completions"]
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
                    raise PydanticCustomError("unhonoured", "'{name}' is not supported by miro yet, and ignoring it "
                                              "would change the answer: remove it or set it to null", {"name": name})
        return data


class ChatBody(_Body):
    messages: Messages
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionBody(_Body):
    prompt: Annotated[NonEmptyStr, BeforeValidator(_one_prompt_only)]
    logprobs: int | None = None
