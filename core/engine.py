"""Engine: load a GGUF model once, then compute logits and generate text.

This first engine runs one sequence at a time over a paged KV cache whose
block table is simply 0, 1, 2, ...; prefill goes in chunks of
`max_num_batched_tokens`, then one decode step per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .config import ModelConfig
from .errors import RequestError
from .gguf_file import GGUFFile
from .model import KVCache, LlamaModel, build_step_input
from .registry import resolve_model
from .sampling import SamplingParams, apply_penalties, new_generator, sample_token
from .tokenizer import IncrementalDetokenizer, Tokenizer
from .weights import load_weights

DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_CACHE_TOKENS = 8192


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" or "abort"


@dataclass
class LoadTimes:
    parse_s: float
    tokenizer_s: float
    weights_s: float

    @property
    def total_s(self) -> float:
        return self.parse_s + self.tokenizer_s + self.weights_s


class Engine:
    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Tokenizer,
        *,
        model_name: str = "",
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_num_batched_tokens: int = 512,
        max_model_len: int | None = None,
    ):
        self.model = model
        self.config: ModelConfig = model.config
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = min(max_model_len or DEFAULT_KV_CACHE_TOKENS, self.config.context_length)
        self.cache = KVCache(self.config, num_blocks=-(-self.max_model_len // block_size), block_size=block_size)
        self.load_times: LoadTimes | None = None

    @classmethod
    def from_model(cls, name_or_path: str | Path, log: Callable[[str], None] = lambda m: None, **options) -> "Engine":
        """Load an alias (pulled on first use) or a .gguf path."""
        path = resolve_model(name_or_path, log)
        t0 = time.perf_counter()
        gguf = GGUFFile(path)
        config = ModelConfig.from_gguf(gguf)
        t1 = time.perf_counter()
        tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata, source=str(path))
        t2 = time.perf_counter()
        weights = load_weights(gguf, config)
        t3 = time.perf_counter()
        engine = cls(LlamaModel(config, weights), tokenizer, model_name=str(name_or_path), **options)
        engine.load_times = LoadTimes(parse_s=t1 - t0, tokenizer_s=t2 - t1, weights_s=t3 - t2)
        return engine

    # -- requests -----------------------------------------------------------------------------------

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt, special=True) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise RequestError("the prompt is empty.")
        if any(t < 0 or t >= self.config.vocab_size for t in ids):
            raise RequestError(f"the prompt has token ids outside the vocabulary (0..{self.config.vocab_size - 1}).")
        return ids

    def _check_length(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt + max_tokens > self.max_model_len:
            raise RequestError(
                f"the prompt has {n_prompt} tokens and max_tokens is {max_tokens}: together they exceed "
                f"the model's context length of {self.max_model_len} tokens."
            )

    # -- forward --------------------------------------------------------------------------------------

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Run the prompt through the model in chunks; return the last position's logits."""
        table = list(range(-(-len(ids) // self.block_size)))
        logits = None
        for start in range(0, len(ids), self.max_num_batched_tokens):
            chunk = ids[start:start + self.max_num_batched_tokens]
            is_last = start + len(chunk) == len(ids)
            step = build_step_input([(chunk, start, table)], self.block_size, self.config.n_kv_heads, [is_last])
            out = self.model.forward(step, self.cache)
            if is_last:
                logits = out[0]
        return logits

    def _decode(self, token: int, position: int) -> np.ndarray:
        table = list(range(position // self.block_size + 1))
        step = build_step_input([([token], position, table)], self.block_size, self.config.n_kv_heads, [True])
        return self.model.forward(step, self.cache)[0]

    def logits(self, prompt: str | Sequence[int]) -> np.ndarray:
        """float32 next-token logits after the last position of the prompt."""
        ids = self._prompt_ids(prompt)
        self._check_length(len(ids), 0)
        return self._prefill(ids).copy()

    # -- generation -------------------------------------------------------------------------------------

    def stream(self, prompt: str | Sequence[int], params: SamplingParams, request_id: str = "0") -> Iterator[str]:
        """Generate one completion, yielding text pieces as they complete; the last yield is the RequestOutput."""
        ids = self._prompt_ids(prompt)
        self._check_length(len(ids), params.max_tokens)
        output = RequestOutput(request_id, prompt if isinstance(prompt, str) else None, ids)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.tokenizer.eog_ids
        rng = new_generator(params.seed)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        logits = self._prefill(ids)
        while True:
            row = apply_penalties(logits.copy(), params, ids, output.token_ids)
            if len(output.token_ids) < params.min_tokens:
                row[list(stop_ids)] = -np.inf
            token = sample_token(row, params, rng)
            if token in stop_ids:
                output.finish_reason = "stop"
                break
            output.token_ids.append(token)
            piece = detok.add(token)
            if piece:
                stop_at = _find_stop(output.text + piece, params.stop, len(output.text))
                if stop_at is not None:
                    yield (output.text + piece)[len(output.text):stop_at]
                    output.text = (output.text + piece)[:stop_at]
                    output.finish_reason = "stop"
                    break
                output.text += piece
                yield piece
            if len(output.token_ids) >= params.max_tokens:
                output.finish_reason = "length"
                break
            logits = self._decode(token, len(ids) + len(output.token_ids) - 1)
        if output.finish_reason != "stop" or not params.stop:
            tail = detok.flush()
            output.text += tail
            if tail:
                yield tail
        yield output

    def generate(
        self, prompts: str | Sequence[str | Sequence[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Generate one completion per prompt (a string or a list of token ids)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = params or SamplingParams()
        outputs = []
        for i, prompt in enumerate(prompts):
            *_, result = self.stream(prompt, params, request_id=str(i))
            outputs.append(result)
        return outputs


def _find_stop(text: str, stops: list[str], new_from: int) -> int | None:
    """Index where the earliest stop string starts, searching only where new text could complete one."""
    best = None
    for stop in stops:
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at != -1 and (best is None or at < best):
            best = at
    return best
