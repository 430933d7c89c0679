"""JobPayload: what one RQ job carries, the contract between `miro submit` and the workers.

Submit builds it from a validated request line and writes it as the job's kwargs (RQ's JSON serializer);
a worker reads it back once, with from_kwargs, and from then on reads attributes, never string keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from miro.core import defaults
from miro.core.errors import MiroError
from miro.core.pooling import PoolingParams
from miro.core.sampling import SamplingParams

# the kind of a request -> (prompt given, messages given, inputs given); a Responses request is a chat request
# whose output line is a Response object
_SHAPES = {"completion": (True, False, False), "chat": (False, True, False), "response": (False, True, False),
           "embedding": (False, False, True)}


@dataclass(frozen=True)
class ResponseEcho:
    """What the Response object of a /v1/responses request gives back of the request, beside its output."""

    instructions: str | None = None
    metadata: dict[str, str] | None = None
    text_format: dict[str, Any] | None = None  # the request's text.format as OpenAI echoes it; None: plain text


@dataclass(frozen=True)
class JobPayload:
    batch_id: str
    custom_id: str
    kind: Literal["chat", "completion", "response", "embedding"]  # the shape of the OpenAI output line and input
    model: str  # the model the batch runs on (an alias, a .gguf path or a served name)
    sampling: dict[str, Any]  # SamplingParams keyword arguments, vLLM's names ({} for an embedding)
    prompt: str | None = None  # kind "completion"
    messages: list[dict[str, str]] | None = None  # kinds "chat", "response": role and content, for the template
    inputs: list[str] | list[list[int]] | None = None  # kind "embedding": one vector each (texts or token ids)
    pooling: dict[str, Any] | None = None  # kind "embedding": PoolingParams keyword arguments
    encoding_format: str | None = None  # kind "embedding": "float" or "base64" in OpenAI output lines
    response: ResponseEcho | None = None  # kind "response": what its Response object gives back
    requested_model: str | None = None  # what the line asked for (an OpenAI body's model), if anything
    line: int | None = None  # the request's line in the input file: the results' order
    extra: dict[str, Any] | None = None  # a simple line's own fields: columns of the results
    priority: str = defaults.PRIORITY  # the batch's: high, normal or low (worker/fleet/routing.py)

    def to_kwargs(self) -> dict[str, Any]:
        """The job's kwargs: every field that is set (JSON-able)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "JobPayload":
        """A job's kwargs as a payload; MiroError in one sentence if they are not one (a job miro did not
        enqueue, or from an incompatible version). Unknown keys from older versions are ignored."""
        names = {f.name for f in fields(cls)}
        missing = [n for n in ("batch_id", "custom_id", "kind", "model") if n not in kwargs]
        if missing:
            raise MiroError(f"the job's payload lacks {', '.join(missing)}: it was not enqueued by miro submit")
        given = {k: v for k, v in kwargs.items() if k in names and v is not None}
        if isinstance(given.get("response"), dict):
            known = {f.name for f in fields(ResponseEcho)}
            given["response"] = ResponseEcho(**{k: v for k, v in given["response"].items() if k in known})
        payload = cls(**given | {"sampling": kwargs.get("sampling") or {}})
        if payload.priority not in defaults.PRIORITIES:
            raise MiroError(f"the job's payload for {payload.custom_id!r} has an unknown priority {payload.priority!r}")
        given = (payload.prompt is not None, payload.messages is not None, payload.inputs is not None)
        if _SHAPES.get(payload.kind) != given:
            raise MiroError(f"the job's payload for {payload.custom_id!r} is neither a chat, a completion, a "
                            "Responses nor an embedding request")
        return payload

    @property
    def task(self) -> str:
        """What the engine does with it: "embed" or "generate" (Engine.supported_tasks' names)."""
        return "embed" if self.kind == "embedding" else "generate"

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
