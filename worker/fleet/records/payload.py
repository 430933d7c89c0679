"""The request record, from validation to the worker: `Request` (a dataset line, validated and normalised:
intake/inputs.py makes it, the spool stores it) and `JobPayload` (that request placed in a batch: what one RQ job
carries, the contract between `miro submit` and the workers).

Submit extends the request into its payload (`JobPayload.of`) and writes it as the job's kwargs (RQ's JSON
serializer); a worker reads it back once, with from_kwargs, and from then on reads attributes, never string keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.layers.pooling import PoolingParams
from miro.core.sampling.params import SamplingParams

# the kind of a request -> (prompt given, messages given, inputs given); a Responses request is a chat request
# whose output line is a Response object
_SHAPES = {
    "completion": (True, False, False),
    "chat": (False, True, False),
    "response": (False, True, False),
    "embedding": (False, False, True),
}


@dataclass(frozen=True)
class ResponseEcho:
    """What the Response object of a /v1/responses request gives back of the request, beside its output."""

    instructions: str | None = None
    metadata: dict[str, str] | None = None
    text_format: dict[str, Any] | None = None  # the request's text.format as OpenAI echoes it; None: plain text


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request as its dataset line states it, validated and normalised; sampling holds SamplingParams keyword
    arguments (vLLM's names)."""

    custom_id: str
    line: int | None = None  # the request's line in the input file: the results' order
    kind: Literal["chat", "completion", "response", "embedding"]  # the shape of the OpenAI output line and input
    prompt: str | None = None  # kind "completion"
    messages: list[dict[str, str]] | None = None  # kinds "chat", "response": role and content, for the template
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams keyword arguments ({} for an embedding)
    requested_model: str | None = None  # what the line asked for (an OpenAI body's model), if anything
    form: Literal["simple", "openai"] | None = None  # the line's form: how it was validated
    url: str | None = None  # an OpenAI line's endpoint
    extra: dict[str, Any] | None = None  # a simple line's own fields (e.g. "category"): columns of the results
    inputs: list[str] | list[list[int]] | None = None  # kind "embedding": one vector each (texts or token ids)
    pooling: dict[str, Any] | None = None  # kind "embedding": PoolingParams keyword arguments
    encoding_format: Literal["float", "base64"] | None = None  # kind "embedding": how OpenAI output lines give vectors
    response: ResponseEcho | None = None  # kind "response": what its Response object gives back of the request

    @property
    def task(self) -> str:
        """What the engine does with it: "embed" or "generate" (Engine.supported_tasks' names)."""
        return "embed" if self.kind == "embedding" else "generate"


_INTAKE_ONLY = ("form", "url")  # how the line was validated: no worker reads them, so no job carries them


@dataclass(frozen=True, kw_only=True)
class JobPayload(Request):
    """A request placed in a batch: the batch, the model it runs on and its priority."""

    batch_id: str
    model: str  # the model the batch runs on (an alias, a .gguf path or a served name)
    priority: str = defaults.PRIORITY  # the batch's: high, normal or low (worker/fleet/intake/routing.py)

    @classmethod
    def of(cls, request: Request, batch_id: str, model: str, priority: str = defaults.PRIORITY) -> "JobPayload":
        """The request as its job carries it (a prompt only for a completion, messages only for a chat)."""
        fields_of_request = {f.name: getattr(request, f.name) for f in fields(Request) if f.name not in _INTAKE_ONLY}
        fields_of_request["prompt"] = request.prompt if request.kind == "completion" else None
        fields_of_request["messages"] = request.messages if request.kind in ("chat", "response") else None
        return cls(**fields_of_request, batch_id=batch_id, model=model, priority=priority)

    def to_kwargs(self) -> dict[str, Any]:
        """The job's kwargs: every field that is set (JSON-able)."""
        return {k: v for k, v in asdict(self).items() if v is not None and k not in _INTAKE_ONLY}

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "JobPayload":
        """A job's kwargs as a payload; MiroError in one sentence if they are not one (a job miro did not
        enqueue, or from an incompatible version). Unknown keys from older versions are ignored."""
        names = {f.name for f in fields(cls)}
        missing = [n for n in ("batch_id", "custom_id", "kind", "model") if n not in kwargs]
        if missing:
            raise MiroError(f"the job's payload lacks {', '.join(missing)}: it was not enqueued by miro submit")
        given = {k: v for k, v in kwargs.items() if k in names and k not in _INTAKE_ONLY and v is not None}
        if isinstance(given.get("response"), dict):
            known = {f.name for f in fields(ResponseEcho)}
            given["response"] = ResponseEcho(**{k: v for k, v in given["response"].items() if k in known})
        payload = cls(**given | {"sampling": kwargs.get("sampling") or {}})
        if payload.priority not in defaults.PRIORITIES:
            raise MiroError(f"the job's payload for {payload.custom_id!r} has an unknown priority {payload.priority!r}")
        given = (payload.prompt is not None, payload.messages is not None, payload.inputs is not None)
        if _SHAPES.get(payload.kind) != given:
            raise MiroError(
                f"the job's payload for {payload.custom_id!r} is neither a chat, a completion, a "
                "Responses nor an embedding request"
            )
        return payload

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.sampling)

    def pooling_params(self) -> PoolingParams:
        return PoolingParams(**(self.pooling or {}))


def payloads_of(kwargs: dict[str, Any]) -> list[JobPayload]:
    """A job's requests: its one payload, or each request of a group job (kwargs {"batch_id", "requests": [...]},
    job_writer.group_kwargs); MiroError in one sentence if they are not miro's."""
    if "requests" not in kwargs:
        return [JobPayload.from_kwargs(kwargs)]
    requests = kwargs["requests"]
    if not isinstance(requests, list) or not requests:
        raise MiroError("the job's payload has no requests: it was not enqueued by miro submit")
    return [JobPayload.from_kwargs(request) for request in requests]


def custom_ids_of(meta: dict[str, Any]) -> list[str]:
    """The custom ids a job's meta names: a group job's `custom_ids`, or a one-request job's `custom_id`."""
    return list(meta["custom_ids"]) if "custom_ids" in meta else [meta["custom_id"]]


def is_group(meta: dict[str, Any]) -> bool:
    """A job the feeder wrote for several requests (job_writer.JobWriter.feed)."""
    return "custom_ids" in meta
