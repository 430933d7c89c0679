"""The JSON objects of OpenAI's Files and Batch APIs, as the openai SDK reads them (openai.types.FileObject,
FileDeleted, Batch), and the body of a batch creation."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")  # what a miro batch runs

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int
    reused: int | None = None  # miro's: of `completed`, those the batch took from its reuse_batch_id's rows


class InputTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the prefix cache


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # miro's models do not reason apart from their output


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    usage: BatchUsage | None = None
    model: str | None = None
    metadata: dict[str, str] | None = None
    reuse_batch_id: str | None = None  # miro's: the earlier batch whose rows it reused (batch_reuse.py)


Item = TypeVar("Item")


class Page(BaseModel, Generic[Item]):
    """A cursor page: the SDK asks for the next one with after=last_id while has_more."""

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ExpiresAfter(BaseModel):
    """When a file expires: `seconds` after its creation (OpenAI's only anchor)."""

    anchor: str
    seconds: int


class BatchCreate(BaseModel):
    """POST /v1/batches."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    output_expires_after: ExpiresAfter | None = None  # of the output and error files
    reuse_batch_id: str | None = None  # miro's: reuse this earlier batch's identical deterministic rows
