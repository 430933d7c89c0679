"""A request's checks before the engine queues it (Engine.add_request, Engine.logits), as vLLM's input processor
makes them: the model does its task, its prompt's token ids are the model's, prompt and max_tokens fit the context
and the whole KV cache, the token ids its parameters name are the model's. Each refusal is one sentence
(RequestError, or the sentence itself from task_refusal); a request that passes them is queued and runs."""

from __future__ import annotations

from typing import Sequence as Seq

from miro.core.engine.block_manager import BlockManager
from miro.core.errors import RequestError
from miro.core.loading.model_config import ModelConfig
from miro.core.loading.registry import DEFAULT_EMBEDDING_MODEL
from miro.core.sampling.params import SamplingParams
from miro.core.tokenizers.tokenizer import Tokenizer


def task_refusal(task: str, supported_tasks: tuple[str, ...], config: ModelConfig, model_name: str) -> str | None:
    """Why the model cannot do `task` ("generate" or "embed"), in one sentence naming it; None if it can."""
    if task in supported_tasks:
        return None
    name = f"model '{model_name}'" if model_name else "the model"
    if task == "embed":
        return (
            f"{name} cannot embed: it generates text, and its file names no pooling type "
            f"({config.architecture}.pooling_type); embed with an embedding model such as {DEFAULT_EMBEDDING_MODEL}."
        )
    return f"{name} is an embedding model: it embeds text (/v1/embeddings, PoolingParams) and cannot generate it."


def prompt_ids(prompt: str | Seq[int], tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """The prompt's token ids: a text tokenized, with BOS where the file asks for it (add_bos_token), as llama.cpp
    adds it; token ids as they are, each checked against the vocabulary."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, special=True, add_special=True)
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise RequestError("the prompt is empty.")
    if any(t < 0 or t >= vocab_size for t in ids):
        raise RequestError(f"the prompt has token ids outside the vocabulary (0..{vocab_size - 1}).")
    return ids


def room_for(n_prompt: int, n: int, block_manager: BlockManager, max_model_len: int) -> int:
    """The most tokens each of n choices can add to an n_prompt-token prompt: up to the context length,
    and as many as the whole KV cache holds for all of them (at least 1, so a prompt that cannot fit
    gets check_fits' error)."""
    bm = block_manager
    shared = n_prompt // bm.block_size if n > 1 else 0
    blocks_each = (bm.num_blocks - shared) // n + shared  # blocks one choice may use, its shared prompt included
    return max(1, min(max_model_len, blocks_each * bm.block_size) - n_prompt)


def check_fits(n_prompt: int, max_tokens: int, n: int, block_manager: BlockManager, max_model_len: int) -> None:
    """The prompt and max_tokens of each of n choices within the context length, and all of them within the
    whole KV cache: RequestError otherwise."""
    if n_prompt + max_tokens > max_model_len:
        raise RequestError(
            f"the prompt has {n_prompt} tokens and max_tokens is {max_tokens}: together they exceed "
            f"the context length of {max_model_len} tokens."
        )
    # the n choices share the prompt's full blocks; each needs the rest of its own
    bm = block_manager
    shared = n_prompt // bm.block_size if n > 1 else 0
    needed = shared + n * (bm.blocks_needed(n_prompt + max_tokens) - shared)
    if needed > bm.num_blocks:
        choices = f" for each of its {n} choices" if n > 1 else ""
        raise RequestError(
            f"the prompt has {n_prompt} tokens and max_tokens is {max_tokens}{choices}: together they need "
            f"{needed * bm.block_size:,} tokens of KV cache, more than the whole cache "
            f"({bm.num_blocks * bm.block_size:,} tokens)."
        )


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """Token ids a request names (stop_token_ids) must be the model's: RequestError otherwise."""
    outside = sorted(t for t in params.stop_token_ids if t >= vocab_size)
    if outside:
        raise RequestError(f"stop_token_ids has {outside[0]}, outside the model's vocabulary (0..{vocab_size - 1}).")
