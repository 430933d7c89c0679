"""EngineConfig: every option of an engine in one record, its defaults from defaults.py, passed whole
(nano-vllm's Config, vLLM's EngineArgs). Engine.from_model(path, **options) builds one from its keywords.
Each value is checked where it is used (weight_format.py, kv_cache.py, scheduler.py), in one sentence."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from . import defaults
from .errors import MiroError


@dataclass(frozen=True)
class EngineConfig:
    # weights: how the matrices are held (weight_format.py): "auto", "f32", "native", "bf16" or "i16"; auto's f32 budget
    weights: str = defaults.WEIGHTS
    max_weight_memory: str | int | None = None  # bytes or "8GiB"; None: a share of the machine's RAM
    # outputs bitwise independent of the batch (native weights always are; f32 then takes the invariant GEMM
    # instead of OpenBLAS): fixed when the weights are laid out
    batch_invariant: bool = defaults.BATCH_INVARIANT
    # the paged KV cache: num_kv_blocks blocks of block_size tokens, or as many as fit in kv_cache_memory
    block_size: int = defaults.BLOCK_SIZE
    num_kv_blocks: int | None = None
    kv_cache_memory: str | int = defaults.KV_CACHE_MEMORY
    kv_cache_dtype: str = defaults.KV_CACHE_DTYPE
    # the scheduler: seats (None: one per 256 tokens of KV cache, within MAX_NUM_SEQS_RANGE), tokens a step,
    # the longest sequence (None: the model's context length)
    max_num_seqs: int | None = defaults.MAX_NUM_SEQS
    max_num_batched_tokens: int = defaults.MAX_NUM_BATCHED_TOKENS
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    admission_order: str = defaults.ADMISSION_ORDER  # within a priority: "prefix" (longest cached first) or "arrival"
    embed_batch_tokens: int = defaults.EMBED_BATCH_TOKENS  # an embedding pass's most tokens (whole inputs, >= 1)

    @classmethod
    def of(cls, options: dict, base: EngineConfig | None = None) -> EngineConfig:
        """base (or the defaults) with the keyword options set; an unknown name is refused in one sentence."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise MiroError(f"the engine has no option {unknown[0]!r} (it takes {', '.join(sorted(names))}).")
        return replace(base or cls(), **options)
