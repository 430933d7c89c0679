"""What vLLM's offline API (llm.py) returns, in vLLM's shapes (vllm.outputs): RequestOutput with its
CompletionOutputs and their Logprobs for generate and chat; EmbeddingRequestOutput (a PoolingRequestOutput) with
its EmbeddingOutput for embed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Logprob:
    """One token's log-probability at a position (vLLM's Logprob). rank: its place among the most likely (1 is
    the top), None for a sampled token outside the top `logprobs` miro reports."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One choice of a request (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop string or stop_token_ids entry; None for EOS and the rest
    lora_request: None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    """A generate or chat request's result (vLLM's RequestOutput)."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: None,
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: None = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, prompt_logprobs={self.prompt_logprobs}, "
            f"outputs={self.outputs}, finished={self.finished}, num_cached_tokens={self.num_cached_tokens})"
        )


@dataclass
class EmbeddingOutput:
    """One input's vector (vLLM's EmbeddingOutput): a list of floats."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)

    def __repr__(self) -> str:
        return f"EmbeddingOutput(hidden_size={self.hidden_size})"


class PoolingRequestOutput:
    """A pooling request's result (vLLM's PoolingRequestOutput)."""

    def __init__(
        self, request_id: str, outputs: Any, prompt_token_ids: list[int], num_cached_tokens: int, finished: bool
    ):
        self.request_id = request_id
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.finished = finished

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(request_id={self.request_id!r}, outputs={self.outputs!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, num_cached_tokens={self.num_cached_tokens}, "
            f"finished={self.finished})"
        )


class EmbeddingRequestOutput(PoolingRequestOutput):
    """An embed request's result (vLLM's EmbeddingRequestOutput): `.outputs.embedding`."""
