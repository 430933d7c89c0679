"""Embedding requests: each input tokenized and checked when it is added, queued whole, then packed by a
token budget into one forward pass and pooled into its vector.

    add() ... run_pass() -> finished EmbeddingRequestOutputs

An encoder (BERT, config.causal False) runs the pass in one call, every input attending to its own tokens
(models/bert.py). A decoder whose file names a pooling type (Qwen3-Embedding: qwen3, pooling last) runs
it as one prefill step over the engine's paged KV cache, with blocks taken for the pass and freed after it,
and pools the final-normed hidden states (LlamaModel.hidden_states) instead of computing logits.
Inputs are never chunked: a pass holds whole inputs, at least one, up to `batch_tokens` tokens.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from miro.core.engine.block_manager import BlockManager
from miro.core.errors import RequestError, request_fault
from miro.core.models.bert import encoder_input
from miro.core.engine.outputs import EmbeddingRequestOutput
from miro.core.layers.pooling import PoolingParams, finish, pool
from miro.core.engine.sequence import Sequence
from miro.core.engine.step_input import build_step_input


@dataclass
class EmbeddingRequest:
    request_id: str
    prompt: str | None
    token_ids: list[int]
    params: PoolingParams
    pooling_type: str  # the request's override, else the model's
    priority: int  # lower is more urgent, as for generation
    arrival: int


class Embedder:
    def __init__(
        self,
        model,
        tokenizer,
        max_model_len: int,
        batch_tokens: int,
        runner=None,
        block_manager: BlockManager | None = None,
    ):
        """runner and block_manager: the engine's, for a decoder (its KV cache); None for an encoder."""
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.batch_tokens = batch_tokens
        self.runner = runner
        self.block_manager = block_manager
        self.dim = model.config.dim
        self.default_pooling = model.config.pooling_type or "last"
        self.waiting: dict[str, EmbeddingRequest] = {}  # request id -> the request, until its pass
        # the waiting requests, most urgent first ((priority, arrival): unique); an aborted one is skipped when it
        # comes up. A heap, not a sort per pass: with a million inputs queued, sorting them each pass cost more than
        # embedding them
        self._order: list[tuple[int, int, EmbeddingRequest]] = []
        self._arrivals = itertools.count()

    # -- requests -------------------------------------------------------------------------------------

    def make_request(self, request_id: str, prompt, params: PoolingParams, priority: int = 0) -> EmbeddingRequest:
        """The request with its tokens; RequestError, in one sentence, for an input it cannot embed."""
        params.validate()
        ids = self._token_ids(prompt, params.truncate_prompt_tokens)
        if params.dimensions is not None and params.dimensions > self.dim:
            raise RequestError(f"dimensions is {params.dimensions}, but the model's embeddings have {self.dim}.")
        return EmbeddingRequest(
            request_id,
            prompt if isinstance(prompt, str) else None,
            ids,
            params,
            params.pooling_type or self.default_pooling,
            priority,
            next(self._arrivals),
        )

    def _token_ids(self, prompt, truncate: int | None) -> list[int]:
        tokenizer = self.tokenizer
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("the input is an empty string.")
            body = tokenizer.encode(prompt, special=True)
        else:
            body = [int(t) for t in prompt]
            if not body:
                raise RequestError("the input is an empty list of token ids.")
            if any(t < 0 or t >= tokenizer.vocab_size for t in body):
                raise RequestError(f"the input has token ids outside the vocabulary (0..{tokenizer.vocab_size - 1}).")
        # text gets the model's special tokens ([CLS] ... [SEP], or BOS); token ids are taken as given
        head = [tokenizer.bos_id] if isinstance(prompt, str) and tokenizer.add_bos else []
        tail = [tokenizer.eos_id] if isinstance(prompt, str) and tokenizer.add_eos else []
        limit = self.max_model_len if truncate in (None, -1) else min(truncate, self.max_model_len)
        n = len(head) + len(body) + len(tail)
        if n > limit:
            if truncate is None:
                raise RequestError(
                    f"the input has {n:,} tokens, more than the model's context of "
                    f"{self.max_model_len:,}: shorten it, or set truncate_prompt_tokens (--truncate) to cut it."
                )
            if limit <= len(head) + len(tail):
                raise RequestError(
                    f"truncate_prompt_tokens is {truncate}: too few for the model's "
                    f"{len(head) + len(tail)} special tokens and any text."
                )
            body = body[: limit - len(head) - len(tail)]  # the first tokens stay, as sentence-transformers keeps them
        return head + body + tail

    def add(self, request: EmbeddingRequest) -> None:
        self.waiting[request.request_id] = request
        heapq.heappush(self._order, (request.priority, request.arrival, request))

    def _most_urgent(self) -> EmbeddingRequest | None:
        """The most urgent waiting request (left in the queue), or None."""
        while self._order:
            request = self._order[0][2]
            if self.waiting.get(request.request_id) is request:
                return request
            heapq.heappop(self._order)  # aborted (or passed) meanwhile
        return None

    def abort(self, request_id: str) -> EmbeddingRequest | None:
        return self.waiting.pop(request_id, None)

    # -- a pass ---------------------------------------------------------------------------------------

    def run_pass(self) -> list[EmbeddingRequestOutput]:
        """Embed the most urgent waiting inputs that fit one pass; their outputs, finished."""
        if not self.waiting:
            return []
        batch, tokens = [], 0
        while (request := self._most_urgent()) is not None:
            if batch and tokens + len(request.token_ids) > self.batch_tokens:
                break
            if self.runner is not None and not self._fits_cache(batch + [request]):
                break
            heapq.heappop(self._order)
            del self.waiting[request.request_id]
            batch.append(request)
            tokens += len(request.token_ids)
        if not batch:  # a decoder whose KV cache is full of generation: the pass waits for room
            return []
        hidden = self._encode(batch) if self.runner is None else self._decode_prefill(batch)
        return [self._pooled(r, h) for r, h in zip(batch, hidden)]

    @staticmethod
    def _pooled(request: EmbeddingRequest, hidden: np.ndarray) -> EmbeddingRequestOutput:
        """One input's vector from its hidden states; a fault in its pooling is its error alone."""
        try:
            vector = finish(pool(hidden, request.pooling_type), request.params)
        except Exception as exc:  # noqa: BLE001 - this request's fault, said in its output
            return EmbeddingRequestOutput(
                request.request_id, request.prompt, request.token_ids, error=request_fault("pooling its embedding", exc)
            )
        return EmbeddingRequestOutput(request.request_id, request.prompt, request.token_ids, vector)

    def _encode(self, batch: list[EmbeddingRequest]) -> list[np.ndarray]:
        packed = encoder_input([r.token_ids for r in batch])
        states = self.model.encode(packed)
        return [states[packed.bounds[k] : packed.bounds[k + 1]] for k in range(len(batch))]

    def _fits_cache(self, batch: list[EmbeddingRequest]) -> bool:
        bm = self.block_manager
        return sum(bm.blocks_needed(len(r.token_ids)) for r in batch) <= bm.num_free_blocks

    def _decode_prefill(self, batch: list[EmbeddingRequest]) -> list[np.ndarray]:
        """A decoder's pass: the inputs as one prefill step over blocks taken for it and freed after (never
        the prefix cache's: every row's hidden state is computed)."""
        bm = self.block_manager
        seqs = [Sequence(r.request_id, 0, list(r.token_ids), None, None, None) for r in batch]
        try:
            for seq in seqs:
                bm.grow(seq, seq.num_tokens)
            chunks = [(seq.prompt_token_ids, 0, seq.block_table) for seq in seqs]
            step = build_step_input(chunks, self.runner.block_size, self.model.config.n_kv_heads, [False] * len(chunks))
            states = self.model.hidden_states(step, self.runner.cache)
        finally:
            for seq in seqs:
                bm.release(seq)
        bounds = np.cumsum([0] + [len(r.token_ids) for r in batch])
        return [states[bounds[k] : bounds[k + 1]] for k in range(len(batch))]
