"""Sequence: one stream of tokens being generated (a request has n of them), and its progress."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miro.core.sampling.params import SamplingParams
from miro.core.tokenizers.tokenizer import IncrementalDetokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_arrival_counter = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # which of the request's n choices
    prompt_token_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator
    detokenizer: IncrementalDetokenizer
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, how many came from the prefix cache at admission
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict] = field(default_factory=list)  # the sampler's, one per token: ids and logprobs
    spelled_logprobs: list = field(default_factory=list)  # the same as outputs.TokenLogprobs, made as they are read
    arrival: int = field(default_factory=lambda: next(_arrival_counter))
    priority: int = 0  # as vLLM's: lower is more urgent; the scheduler admits and preempts by it
    matcher: Any = None  # structured output: llguidance's matcher, fed every token this sequence takes
    prompt_block_hashes: list[int] | None = None  # the prompt's full blocks' prefix-cache keys (BlockManager's)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True until every prompt token (and any output token recomputed after preemption) but the last is in the cache."""
        return self.num_uncomputed > 1

    @property
    def urgency(self) -> tuple[int, int]:
        """The scheduler's order: more urgent first, then older first."""
        return self.priority, self.arrival

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED


@dataclass
class Request:
    """A generation request: its prompt, parameters, and its n choices' sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    stop_ids: set[int]
