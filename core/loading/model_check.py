"""Correct or refused, never silently wrong: a file's every tensor and every key that changes the math must be
one miro implements for its architecture, before any weight is read.

Two lists decide it:

- tensors: an architecture's module lists every tensor it reads (core/models, `*_tensor_specs`); any other
  tensor in the file is refused, in a sentence that says what it is when gguf-py's MODEL_TENSORS knows it
  for that architecture (experts, Phi-3's longrope factors, a fused QKV, ...);
- metadata: every `{arch}.*` key is either read by miro (ModelConfig and the architecture's own reader:
  `KEYS_READ` here and each model class's `metadata_keys`), or one that changes nothing in llama.cpp's graph
  for that architecture (`IGNORED_BY_LLAMA_CPP`), or at a value that changes nothing (`NEUTRAL_VALUES`,
  such as expert_count 0). Anything else is refused with the key and its value. Keys outside the
  architecture's prefix (general.*, tokenizer.*, quantize.*) describe the file, not the computation; the
  tokenizer's are checked where the tokenizer is built.
"""

from __future__ import annotations

import re

import gguf
from gguf import Keys

from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile

# Keys every llama-like architecture's config reads (config.ModelConfig.from_gguf and read_rope_scaling).
KEYS_READ = {
    Keys.LLM.VOCAB_SIZE,
    Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.EMBEDDING_LENGTH,
    Keys.LLM.BLOCK_COUNT,
    Keys.LLM.FEED_FORWARD_LENGTH,
    Keys.LLM.POOLING_TYPE,
    Keys.Attention.HEAD_COUNT,
    Keys.Attention.HEAD_COUNT_KV,
    Keys.Attention.KEY_LENGTH,
    Keys.Attention.VALUE_LENGTH,
    Keys.Attention.LAYERNORM_RMS_EPS,
    Keys.Rope.DIMENSION_COUNT,
    Keys.Rope.FREQ_BASE,
    Keys.Rope.SCALING_TYPE,
    Keys.Rope.SCALING_FACTOR,
    "{arch}.rope.scale_linear",
    Keys.Rope.SCALING_ATTN_FACTOR,
    Keys.Rope.SCALING_ORIG_CTX_LEN,
}
# Keys that state a fact and change no arithmetic, in llama.cpp or in HF transformers.
DESCRIPTIVE = {Keys.Rope.SCALING_FINETUNED}
# Keys llama.cpp's graphs for these architectures never read: a file runs there as if they were absent, and
# miro runs it as llama.cpp does. (llama's graph scales attention by 1/sqrt(head size) and attends over the
# whole context whatever attention.scale and attention.sliding_window say.)
IGNORED_BY_LLAMA_CPP = {
    "llama": {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SCALE},
    "smollm3": {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SCALE},  # its loader sets no attention scale either
    "mistral3": {Keys.Attention.SLIDING_WINDOW, Keys.Attention.SCALE},
    "granite": {Keys.Attention.SLIDING_WINDOW},
    # gpt-oss's converter writes YaRN's betas; llama.cpp's gpt-oss loader reads neither (its defaults, 32 and 1)
    "gpt-oss": {Keys.Rope.SCALING_YARN_BETA_FAST, Keys.Rope.SCALING_YARN_BETA_SLOW},
}
# Keys that change nothing at these values (a converter may write the key with its neutral value).
NEUTRAL_VALUES = {
    Keys.LLM.EXPERT_COUNT: (0,),
    Keys.LLM.EXPERT_USED_COUNT: (0,),
    Keys.LLM.EXPERT_SHARED_COUNT: (0,),
    Keys.LLM.ATTN_LOGIT_SOFTCAPPING: (0, 0.0),
    Keys.LLM.FINAL_LOGIT_SOFTCAPPING: (0, 0.0),
    Keys.LLM.LOGIT_SCALE: (1, 1.0),
    Keys.LLM.RESIDUAL_SCALE: (1, 1.0),
    Keys.LLM.EMBEDDING_SCALE: (1, 1.0),
    Keys.Attention.CAUSAL: (True,),
    Keys.Attention.CLAMP_KQV: (0, 0.0),
    Keys.Attention.MAX_ALIBI_BIAS: (0, 0.0),
    Keys.LLM.USE_PARALLEL_RESIDUAL: (False,),
}
# What a refused tensor is, by its kind in gguf-py's MODEL_TENSOR (checked in order: first match wins).
_EXPERT_KINDS = re.compile(r"_EXP(S)?$|_SHEXP$|^FFN_GATE_INP|^FFN_EXP_PROBS_B$")
TENSOR_FEATURES = (
    (
        _EXPERT_KINDS,
        "mixture-of-experts tensors, which miro runs only where the file names its experts "
        "(expert_count) in an architecture with experts",
    ),
    (re.compile(r"^ROPE_FACTORS_(LONG|SHORT)$"), "Phi-3's longrope factors, which miro does not apply"),
    (re.compile(r"^ATTN_QKV$"), "a fused QKV matrix, which miro reads only as separate Q, K and V"),
)


def check_metadata(gguf_file: GGUFFile, architecture: str, arch_keys: set[str] = frozenset()) -> None:
    """Every `{architecture}.*` key is read by miro, ignored by llama.cpp's graph too, or neutral; else one
    sentence naming the file, the key and its value. `arch_keys`: the keys the architecture's module reads
    on top of KEYS_READ (gguf.Keys templates)."""
    known = {
        k.format(arch=architecture)
        for k in KEYS_READ | DESCRIPTIVE | set(arch_keys) | IGNORED_BY_LLAMA_CPP.get(architecture, set())
    }
    neutral = {k.format(arch=architecture): values for k, values in NEUTRAL_VALUES.items()}
    prefix = architecture + "."
    for key, value in gguf_file.metadata.items():
        if not key.startswith(prefix) or key in known:
            continue
        if any(value == v and type(value) is type(v) for v in neutral.get(key, ())):
            continue
        shown = value if not isinstance(value, (list, str)) or len(str(value)) < 60 else f"{str(value)[:57]}..."
        raise ModelFileError(
            f"{gguf_file.path}: metadata key '{key}' = {shown!r} changes how the model computes, and miro does "
            f"not implement it for {architecture}; miro refuses the file rather than run it approximately."
        )


def refuse_unknown_tensors(gguf_file: GGUFFile, specs: dict, architecture: str) -> None:
    """Every tensor in the file is one of `specs` (the architecture's list); else one sentence naming it."""
    for name in gguf_file.tensors:
        if name in specs:
            continue
        kind = tensor_kind(name, architecture)
        if kind is None and _EXPERT_KINDS.search(getattr(tensor_kind_anywhere(name), "name", "")):
            raise ModelFileError(
                f"{gguf_file.path}: tensor '{name}' is one of {TENSOR_FEATURES[0][1]} (and not "
                f"part of llama.cpp's {architecture} layout)."
            )  # PhiMoE's under phi3's name
        if kind is None:
            raise ModelFileError(
                f"{gguf_file.path}: tensor '{name}' is not part of llama.cpp's {architecture} layout; miro "
                f"refuses a file with tensors it does not know."
            )
        for pattern, what in TENSOR_FEATURES:
            if pattern.search(kind.name):
                raise ModelFileError(f"{gguf_file.path}: tensor '{name}' is one of {what}.")
        raise ModelFileError(
            f"{gguf_file.path}: tensor '{name}' ({kind.name}) is part of llama.cpp's {architecture} layout, but "
            f"miro does not implement it; miro refuses the file rather than run it without it."
        )


def tensor_kind(name: str, architecture: str) -> gguf.MODEL_TENSOR | None:
    """The MODEL_TENSOR kind of a tensor name among those gguf-py lists for `architecture`; None if none."""
    base = re.sub(r"\.(weight|bias)$", "", name)
    base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", base)
    arch = architecture_enum(architecture)
    kinds = gguf.MODEL_TENSORS.get(arch, []) if arch is not None else []
    for kind in kinds:
        if gguf.TENSOR_NAMES[kind] == base:
            return kind
    return None


def tensor_kind_anywhere(name: str) -> gguf.MODEL_TENSOR | None:
    """The MODEL_TENSOR kind whose gguf-py name `name` has, whatever the architecture; None if none."""
    base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", re.sub(r"\.(weight|bias)$", "", name))
    return next((kind for kind, kind_name in gguf.TENSOR_NAMES.items() if kind_name == base), None)


def architecture_enum(architecture: str) -> gguf.MODEL_ARCH | None:
    for arch, arch_name in gguf.MODEL_ARCH_NAMES.items():
        if arch_name == architecture:
            return arch
    return None
