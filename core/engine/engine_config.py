"""EngineConfig: every option of an engine in one record, its defaults from defaults.py, passed whole
(nano-vllm's Config, vLLM's EngineArgs). Engine.from_model(path, **options) builds one from its keywords.

Each field also says how it is given from outside (core/options.py): its help text, the values it takes, and the
CLI flag where that is not `--{name}`. The `miro` commands' engine options (cli/common.py) and the MIRO_* environment
names a worker reads (`from_env`) are generated from these fields, so an option cannot be added in one place and
missed in another. Each value is checked where it is used (weight_format.py, kv_cache.py, scheduler.py), in one
sentence."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from miro.core import defaults, options
from miro.core.errors import MiroError
from miro.core.options import option


@dataclass(frozen=True)
class EngineConfig:
    # weights: how the matrices are held (weight_format.py)
    weights: str = option(
        defaults.WEIGHTS,
        choices=defaults.WEIGHT_CHOICES,
        help="f32: matrices dequantized once (fastest, 4-8x the file's size in memory); native: kept as stored in "
        "the memory-mapped file; bf16 / i16: that copy in bfloat16 (AVX512_BF16 CPUs) or 13-bit integers (x86), "
        "for encoders; auto: bf16 or i16 for an encoder, else f32 if it fits --max-weight-memory.",
    )
    max_weight_memory: str | int | None = option(
        None,
        help=f"auto's budget for f32 weights (e.g. 8GiB; default: {defaults.WEIGHT_MEMORY_FRACTION:.0%} of the "
        "machine's RAM).",
    )
    # outputs bitwise independent of the batch, fixed when the weights are laid out
    batch_invariant: bool = option(
        defaults.BATCH_INVARIANT,
        kind=bool,
        flag="--batch-invariant/--no-batch-invariant",
        help="A request's output bitwise independent of what runs beside it (native weights are by construction, "
        "f32 ones take miro's invariant GEMM; --no-batch-invariant: OpenBLAS).",
    )
    # the paged KV cache: num_kv_blocks blocks of block_size tokens, or as many as fit in kv_cache_memory
    block_size: int = option(defaults.BLOCK_SIZE, kind=int, min=16, help="Tokens per KV-cache block, a multiple of 16.")
    num_kv_blocks: int | None = option(
        None, kind=int, min=1, help="KV cache size in blocks (overrides --kv-cache-memory)."
    )
    kv_cache_memory: str | int = option(defaults.KV_CACHE_MEMORY, help="KV cache size in bytes (e.g. 2GiB, 512MB).")
    kv_cache_dtype: str = option(
        defaults.KV_CACHE_DTYPE,
        choices=defaults.KV_CACHE_DTYPES,
        help="How K and V are stored: float16 halves the memory attention reads and doubles the tokens the cache "
        "holds; float32 keeps f32 weights' logits closest to float32 references.",
    )
    # the scheduler
    max_num_seqs: int | None = option(
        defaults.MAX_NUM_SEQS,
        kind=int,
        min=1,
        help=f"Sequences decoded together (default: one per {defaults.TOKENS_PER_SEAT} tokens of KV cache, "
        f"{defaults.MAX_NUM_SEQS_RANGE[0]} to {defaults.MAX_NUM_SEQS_RANGE[1]}).",
    )
    max_num_batched_tokens: int = option(
        defaults.MAX_NUM_BATCHED_TOKENS,
        kind=int,
        min=1,
        help="Tokens one engine step computes at most (prefill chunks and decodes).",
    )
    max_model_len: int | None = option(None, kind=int, min=1, help="Context length limit (default: the model's).")
    enable_prefix_caching: bool = option(
        True,
        kind=bool,
        flag="--prefix-caching/--no-prefix-caching",
        help="Automatic prefix caching: prompts sharing a prefix compute it once.",
    )
    enable_chunked_prefill: bool = option(
        True,
        kind=bool,
        flag="--chunked-prefill/--no-chunked-prefill",
        help="Long prompts in chunks that share a step with decodes (off: a prompt's prefill takes its step whole).",
    )
    admission_order: str = option(
        defaults.ADMISSION_ORDER,
        choices=defaults.ADMISSION_ORDERS,
        help="Which waiting request of a priority starts next: the oldest, or the one with the longest prompt "
        "prefix already in the prefix cache.",
    )
    embed_batch_tokens: int = option(
        defaults.EMBED_BATCH_TOKENS, kind=int, min=1, help="An embedding pass's most tokens (whole inputs)."
    )

    @classmethod
    def of(cls, options: dict, base: EngineConfig | None = None) -> EngineConfig:
        """base (or the defaults) with the keyword options set; an unknown name is refused in one sentence."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise MiroError(f"the engine has no option {unknown[0]!r} (it takes {', '.join(sorted(names))}).")
        return replace(base or cls(), **options)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> dict:
        """The options set in the environment (MIRO_{NAME}, e.g. MIRO_KV_CACHE_MEMORY=2GiB, MIRO_BATCH_INVARIANT=0),
        as Engine.from_model's keyword arguments: for workers started by `rq worker -w`, which pass none."""
        return options.from_env(cls, environ)
