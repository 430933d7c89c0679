"""vLLM's LLM(...) options as miro's EngineConfig, for llm.py's LLM: EngineConfig's own names are taken as they
are, vLLM's are mapped (dtype to weights, kv_cache_memory_bytes, kv_cache_dtype, task/runner), the ones that would
change nothing in miro are accepted, and any other is refused in one sentence (LLMError) saying what miro does
instead."""

from __future__ import annotations

from dataclasses import fields

from miro.core.engine.engine_config import EngineConfig
from miro.core.errors import LLMError

_ENGINE_OPTIONS = {f.name for f in fields(EngineConfig)}  # miro's own names are taken as they are
# vLLM's option -> miro's EngineConfig field (None: vLLM's "use the default")
_RENAMED = {"kv_cache_memory_bytes": "kv_cache_memory"}
_DTYPES = {"auto": None, "float32": "f32", "float": "f32", "fp32": "f32", "bfloat16": "bf16", "bf16": "bf16"}
_KV_CACHE_DTYPES = {"auto": None, "float16": "float16", "half": "float16", "float32": "float32", "float": "float32"}
_TASKS = {"auto": None, "generate": "generate", "embed": "embed", "embedding": "embed", "pooling": "embed"}
SPECIFIC = {  # vLLM's options that name something miro does otherwise, with where to look
    "gpu_memory_utilization": "miro runs on CPUs: size the KV cache with kv_cache_memory_bytes (or "
    "kv_cache_memory='2GiB')",
    "swap_space": "a preempted sequence is recomputed, not swapped",
    "cpu_offload_gb": "the weights already live in CPU memory",
    "pipeline_parallel_size": "miro runs a model on one machine's CPUs; more machines are more workers",
    "data_parallel_size": "miro runs a model on one machine's CPUs; more machines are more workers",
    "enable_lora": "miro has no LoRA adapters",
    "speculative_config": "miro has no speculative decoding",
    "hf_overrides": "the model's configuration is its GGUF file's",
    "revision": "miro loads a local .gguf file or a miro alias, not a Hugging Face revision",
    "tokenizer_revision": "the tokenizer is the GGUF file's own",
    "download_dir": "aliases are pulled into miro's model cache ($MIRO_HOME/models)",
    "hf_token": "miro downloads nothing from Hugging Face",
    "chat_template": "miro renders the chat template the GGUF file carries",
}
_NO_EFFECT = {  # accepted, whatever their value: miro has nothing they would change
    "trust_remote_code",  # a GGUF file holds no code
    "enforce_eager",  # miro has no CUDA graphs: it always runs eagerly
    "disable_log_stats",  # LLM logs no stats
}


def check_loading(model, tokenizer, tokenizer_mode, skip_tokenizer_init, tensor_parallel_size, quantization) -> None:
    """vLLM's options on how a model is loaded: refused unless they ask for what miro does (one GGUF file, its own
    tokenizer and weight types, one machine)."""
    if tokenizer is not None and str(tokenizer) != str(model):
        raise LLMError(
            "miro reads the tokenizer from the GGUF file itself: tokenizer must be left out (or be the model)."
        )
    if tokenizer_mode not in ("auto", "hf"):
        raise LLMError(f"tokenizer_mode {tokenizer_mode!r} is not available: miro's tokenizer is the GGUF file's.")
    if skip_tokenizer_init:
        raise LLMError("skip_tokenizer_init is not supported: miro's prompts and outputs go through the tokenizer.")
    if tensor_parallel_size != 1:
        raise LLMError(
            f"tensor_parallel_size must be 1 (got {tensor_parallel_size}): miro runs a model on one "
            f"machine's CPUs, and more machines are more workers (`miro worker`)."
        )
    if quantization not in (None, "gguf"):
        raise LLMError(
            f"quantization {quantization!r} is not available: miro runs a GGUF file's own weight types, "
            f"so quantize the file (quantization may be left out or be 'gguf')."
        )


def weights_for(dtype, options: dict) -> str | None:
    """vLLM's dtype as EngineConfig's weights (None: "auto", the engine's choice); refused where miro has no such
    format, or where it and a `weights` option ask for different ones."""
    weights = _DTYPES.get(str(dtype).removeprefix("torch."), "refused")
    if weights == "refused":
        raise LLMError(
            f"dtype {dtype!r} is not available in miro: it runs 'auto' (the file's own weight types or a "
            f"float32 copy, whichever is faster), 'float32' or 'bfloat16' (on CPUs with AVX512_BF16)."
        )
    if weights is not None and options.get("weights", weights) != weights:
        raise LLMError(f"dtype={dtype!r} and weights={options['weights']!r} ask for different weight formats.")
    return weights


def task_asked(task: str, runner: str, convert: str) -> str | None:
    """The task asked for ("generate", "embed" or None for the model's own), from vLLM's task/runner."""
    if convert not in ("auto", "none", None):
        raise LLMError(f"convert={convert!r} is not available: miro runs a model as its file describes it.")
    asked = {_TASKS.get(task, "refused"), _TASKS.get(runner, "refused")} - {None}
    if "refused" in asked:
        raise LLMError(
            f"task/runner ({task!r}, {runner!r}) is not available: miro generates or embeds "
            f"(task 'generate' or 'embed', runner 'generate' or 'pooling')."
        )
    if len(asked) > 1:
        raise LLMError(f"task {task!r} and runner {runner!r} ask for different things.")
    return asked.pop() if asked else None


def engine_options(options: dict) -> dict:
    """vLLM's remaining keyword options as EngineConfig fields; any other is refused."""
    config = {}
    for name, value in options.items():
        if name in _NO_EFFECT:
            continue
        if name in _RENAMED:
            config[_RENAMED[name]] = value
        elif name == "kv_cache_dtype":
            if value not in _KV_CACHE_DTYPES:
                raise LLMError(
                    f"kv_cache_dtype {value!r} is not available: miro stores K and V as float16 ('auto') or float32."
                )
            config[name] = _KV_CACHE_DTYPES[value]
        elif name in _ENGINE_OPTIONS:
            config[name] = value
        elif name in SPECIFIC:
            if value is not None and not (name in ("swap_space", "cpu_offload_gb") and value == 0):
                raise LLMError(f"{name} is not an option of miro's LLM: {SPECIFIC[name]}.")
        else:
            accepted = sorted(
                {
                    "model",
                    "tokenizer",
                    "tokenizer_mode",
                    "skip_tokenizer_init",
                    "dtype",
                    "quantization",
                    "seed",
                    "task",
                    "runner",
                    "convert",
                    "tensor_parallel_size",
                    *_NO_EFFECT,
                    *_RENAMED,
                    *_ENGINE_OPTIONS,
                }
            )
            raise LLMError(f"miro's LLM has no option {name!r} (it takes {', '.join(accepted)}).")
    return config
