"""Model hyper-parameters read from GGUF metadata. A missing key is an error, never a default.

Each size must be a positive integer, the sizes must agree with one another
(heads dividing the embedding, block_count matching the blk.N tensors present,
token arrays of one length, bos/eos inside the vocabulary) and the context
length must stay under MAX_CONTEXT_LENGTH. Whether the sizes agree with the
tensor shapes is checked against the architecture's tensor list (core/models).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gguf import Keys

from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.layers.rope import RopeParams, yarn_attn_factor
from miro.core.layers.pooling import GGUF_POOLING_TYPES

# The longest context a file may declare: 4M tokens, above the longest-context llama, qwen and gemma
# GGUFs published (1M for most, 4M for a few llama-3 fine-tunes), far below what one flipped high bit
# in the 32-bit field gives (8192 -> 268,443,648). Nothing is allocated per declared position.
MAX_CONTEXT_LENGTH = 1 << 22
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float  # the norms' epsilon: RMSNorm's, or LayerNorm's for an encoder (bert)
    # What some architectures add (their read_config sets them; llama keeps the defaults):
    rope_neox: bool = False  # RoPE rotates halves (x[i], x[i + head_dim/2]), not adjacent pairs
    sliding_window: int = 0  # keys a local layer's query sees, itself included; 0: every layer is global
    rope_theta_local: float = 0.0  # RoPE base of the local (sliding-window) layers
    causal: bool = True  # False: an encoder (bert), every token attends to its whole input, no KV cache
    pooling_type: str | None = None  # "mean", "cls" or "last" where the file says how it embeds ({arch}.pooling_type)
    # RoPE as the file scales it (rope.dimension_count, rope.scaling.*), read as llama.cpp reads them:
    rope_dim: int = 0  # dimensions rotated; 0: head_dim (the rest pass through unrotated)
    rope_scaling: str = "none"  # "none", "linear" or "yarn"
    rope_factor: float = 1.0  # rope.scaling.factor (context multiple); 1: unscaled
    rope_orig_context: int = 0  # rope.scaling.original_context_length (yarn's ramp), else context_length
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor
    attention_scale: float = 0.0  # q.k scale; 0: 1 / sqrt(head_dim)
    final_logit_softcap: float = 0.0  # logits = c * tanh(logits / c) where c > 0 (gemma)
    unrotated_layers: tuple[int, ...] = ()  # layers whose q and k get no RoPE (smollm3; granite without RoPE)
    embedding_scale: float = 1.0  # the token embeddings are multiplied by it (granite)
    residual_scale: float = 1.0  # each block's attention and feed-forward outputs too, before the residual add
    logit_scale: float = 1.0  # the logits are divided by it (granite)
    rope_yarn_beta_fast: float = 32.0  # YaRN's ramp (mistral3 may set them; llama.cpp's defaults otherwise)
    rope_yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0  # mistral3's yarn_log_multiplier (HF mscale_all_dim): YaRN's magnitude
    attn_temperature_scale: float = 0.0  # > 0: q at position p times 1 + s ln(floor(p / rope_orig_context) + 1)
    attn_logit_softcap: float = 0.0  # > 0: each attention score s becomes c * tanh(s / c) before the softmax (gemma2)
    # The context the model is run with: the engine's max_model_len, set before loading (Engine.from_model); 0:
    # context_length, as llama.cpp's n_ctx 0. Phi-3's longrope picks its long or short factors by it, as llama.cpp
    # picks them by its context size (n_ctx_seq > original context: long), never by a prompt's length.
    n_ctx: int = 0
    # A mixture of experts (core/layers/moe.py; the architecture's read_config sets them): 0 experts is dense.
    n_expert: int = 0  # {arch}.expert_count
    n_expert_used: int = 0  # {arch}.expert_used_count: experts a token runs through
    expert_ffn_dim: int = 0  # each expert's width (ffn_dim, or {arch}.expert_feed_forward_length where read)
    shared_ffn_dim: int = 0  # an always-on shared expert's width; 0: none

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def rope(self, theta: float | None = None, scaled: bool = True) -> RopeParams:
        """A layer's RoPE: the file's base and scaling, or (a sliding-window layer of gemma3) another base
        and no frequency scaling, as llama.cpp's get_rope_freq_base/scale give them per layer."""
        yarn = self.rope_scaling == "yarn"
        freq_scale = 1.0 / self.rope_factor if scaled and self.rope_scaling != "none" else 1.0
        return RopeParams(
            theta=self.rope_theta if theta is None else theta,
            n_rot=self.rope_dim or self.head_dim,
            freq_scale=freq_scale,
            yarn=yarn,
            n_ctx_orig=self.rope_orig_context or self.context_length,
            attn_factor=(
                yarn_attn_factor(self.rope_factor, self.rope_attn_factor, self.rope_yarn_log_mul)
                if yarn
                else self.rope_attn_factor
            ),
            beta_fast=self.rope_yarn_beta_fast,
            beta_slow=self.rope_yarn_beta_slow,
        )

    @classmethod
    def from_gguf(
        cls,
        gguf: GGUFFile,
        norm_eps_key: str = Keys.Attention.LAYERNORM_RMS_EPS,
        partial_rotary: bool = False,
        longrope: bool = False,
    ) -> "ModelConfig":
        """The hyper-parameters llama-like architectures share, under keys prefixed by the file's architecture
        (whether miro runs that architecture is the model registry's question, core/models). partial_rotary: the
        architecture rotates rope.dimension_count dimensions of each head, fewer than head_dim allowed (phi3);
        longrope: rope.scaling.type "longrope" is read as llama.cpp reads it (phi3, read_rope_scaling)."""
        arch = gguf.require(Keys.General.ARCHITECTURE)

        def key(template: str) -> str:  # gguf.Keys templates read "{arch}.context_length" and so on
            return template.format(arch=arch)

        dim = _positive_int(gguf, key(Keys.LLM.EMBEDDING_LENGTH))
        n_heads = _positive_int(gguf, key(Keys.Attention.HEAD_COUNT))
        n_kv_heads = _positive_int(gguf, key(Keys.Attention.HEAD_COUNT_KV), default=n_heads)
        if key(Keys.Attention.KEY_LENGTH) in gguf.metadata:  # qwen3, gemma3: heads need not tile the embedding
            head_dim = _positive_int(gguf, key(Keys.Attention.KEY_LENGTH))
        else:
            _check_divides(gguf, key(Keys.Attention.HEAD_COUNT), n_heads, key(Keys.LLM.EMBEDDING_LENGTH), dim)
            head_dim = dim // n_heads
        _check_divides(gguf, key(Keys.Attention.HEAD_COUNT_KV), n_kv_heads, key(Keys.Attention.HEAD_COUNT), n_heads)
        value_length = _positive_int(gguf, key(Keys.Attention.VALUE_LENGTH), default=head_dim)
        if value_length != head_dim:
            raise ModelFileError(
                f"{gguf.path}: {key(Keys.Attention.VALUE_LENGTH)} is {value_length}, but miro needs it equal to "
                f"the key length ({head_dim})."
            )
        rope_dim = _positive_int(gguf, key(Keys.Rope.DIMENSION_COUNT), default=head_dim)
        if rope_dim > head_dim or rope_dim % 2:
            raise ModelFileError(
                f"{gguf.path}: {key(Keys.Rope.DIMENSION_COUNT)} is {rope_dim}, not an even number "
                f"of dimensions within a head of {head_dim}."
            )
        if (
            rope_dim != head_dim and not partial_rotary
        ):  # llama.cpp's llama, qwen2, qwen3 and gemma3 graphs assert it too
            raise ModelFileError(
                f"{gguf.path}: {key(Keys.Rope.DIMENSION_COUNT)} is {rope_dim}, but {arch} rotates "
                f"whole heads ({head_dim} dimensions); partial rotary is not supported for it."
            )
        context_length = _positive_int(gguf, key(Keys.LLM.CONTEXT_LENGTH))
        if context_length > MAX_CONTEXT_LENGTH:
            raise ModelFileError(
                f"{gguf.path}: {key(Keys.LLM.CONTEXT_LENGTH)} is {context_length:,} tokens, more than "
                f"the {MAX_CONTEXT_LENGTH:,} miro accepts (the file is likely corrupt)."
            )
        n_layers = _positive_int(gguf, key(Keys.LLM.BLOCK_COUNT))
        _check_block_count(gguf, key(Keys.LLM.BLOCK_COUNT), n_layers)
        vocab_size = _check_vocabulary(gguf, key(Keys.LLM.VOCAB_SIZE))
        return cls(
            architecture=arch,
            n_layers=n_layers,
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            ffn_dim=_positive_int(gguf, key(Keys.LLM.FEED_FORWARD_LENGTH)),
            vocab_size=vocab_size,
            context_length=context_length,
            rope_theta=_positive_float(gguf, key(Keys.Rope.FREQ_BASE), default=10000.0),
            rms_eps=_positive_float(gguf, key(norm_eps_key)),
            pooling_type=read_pooling_type(gguf),
            rope_dim=rope_dim,
            **read_rope_scaling(gguf, arch, context_length, longrope),
        )


ROPE_SCALING_TYPES = ("none", "linear", "yarn")
ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"  # the factor's older key, which llama.cpp still reads  # llama.cpp's, less longrope (Phi-3's short and long factors)


def read_rope_scaling(gguf: GGUFFile, arch: str, context_length: int, longrope: bool = False) -> dict:
    """rope.scaling.{type, factor, original_context_length, attn_factor} as llama.cpp's load_hparams reads them:
    the type defaults to linear, the factor to 1 (or the old rope.scale_linear key), so a file with a factor and
    no type is linear-scaled; "none" ignores the factor. longrope (phi3): the type "longrope" is accepted and,
    as in llama.cpp (its ext_factor is 0 for it), scales like linear; its long/short factors are the model's."""
    scaling = gguf.get(Keys.Rope.SCALING_TYPE.format(arch=arch), "linear")
    if longrope and scaling == "longrope":
        scaling = "linear"
    if scaling not in ROPE_SCALING_TYPES:
        raise ModelFileError(
            f"{gguf.path}: {Keys.Rope.SCALING_TYPE.format(arch=arch)} is {scaling!r}; miro applies RoPE scaling "
            f"{', '.join(ROPE_SCALING_TYPES)} ({'Phi-3 longrope' if scaling == 'longrope' else 'not that one'})."
        )
    factor_key = Keys.Rope.SCALING_FACTOR.format(arch=arch)
    if factor_key not in gguf.metadata:
        factor_key = ROPE_SCALE_LINEAR.format(arch=arch)
    factor = gguf.get(factor_key, 0.0)
    if type(factor) not in (int, float) or not math.isfinite(factor) or factor < 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{factor_key}' is {factor!r}, not a positive number.")
    factor = float(factor) or 1.0  # llama.cpp: 0 (or absent) means unscaled
    if scaling == "none" or (scaling == "linear" and factor == 1.0):
        scaling, factor = "none", 1.0
    orig_key = Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch)
    orig = _positive_int(gguf, orig_key, default=context_length)
    return dict(
        rope_scaling=scaling,
        rope_factor=factor,
        rope_orig_context=orig,
        rope_attn_factor=_positive_float(gguf, Keys.Rope.SCALING_ATTN_FACTOR.format(arch=arch), default=1.0),
    )


def read_pooling_type(gguf: GGUFFile) -> str | None:
    """The file's `{arch}.pooling_type` as a name (llama.cpp's enum: 1 mean, 2 cls, 3 last); None when absent or
    0 (none). A kind miro does not pool (4, rank) is an error."""
    key = Keys.LLM.POOLING_TYPE.format(arch=gguf.require(Keys.General.ARCHITECTURE))
    value = gguf.get(key, 0)
    if value == 0:
        return None
    if value not in GGUF_POOLING_TYPES:
        raise ModelFileError(f"{gguf.path}: {key} is {value!r}; miro pools mean (1), cls (2) or last (3).")
    return GGUF_POOLING_TYPES[value]


def _positive_int(gguf: GGUFFile, key: str, default: int | None = None) -> int:
    value = gguf.get(key, default) if default is not None else gguf.require(key)
    if type(value) is not int or value < 1:
        raise ModelFileError(f"{gguf.path}: metadata key '{key}' is {value!r}, not a positive integer.")
    return value


def _positive_float(gguf: GGUFFile, key: str, default: float | None = None) -> float:
    value = gguf.get(key, default) if default is not None else gguf.require(key)
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{key}' is {value!r}, not a positive number.")
    return float(value)


def _check_divides(gguf: GGUFFile, key: str, value: int, whole_key: str, whole: int) -> None:
    if whole % value:
        raise ModelFileError(f"{gguf.path}: {key} is {value}, which does not divide {whole_key} ({whole}).")


def _check_block_count(gguf: GGUFFile, key: str, n_layers: int) -> None:
    """block_count must be the number of blk.N tensor groups: a larger one would read tensors that are not there."""
    blocks = {int(m.group(1)) for name in gguf.tensors if (m := _BLOCK_TENSOR.match(name))}
    n_blocks = max(blocks) + 1 if blocks else 0
    if n_layers != n_blocks:
        raise ModelFileError(
            f"{gguf.path}: {key} is {n_layers:,}, but the file has blk.N tensors for {n_blocks:,} blocks."
        )


def _check_vocabulary(gguf: GGUFFile, vocab_size_key: str) -> int:
    """The token list's length, after checking the per-token arrays, vocab_size and the bos/eos ids against it."""
    tokens = gguf.require(Keys.Tokenizer.LIST)
    if not isinstance(tokens, list) or not tokens:
        raise ModelFileError(f"{gguf.path}: metadata key '{Keys.Tokenizer.LIST}' is not a list of tokens.")
    vocab_size = len(tokens)
    for key in (Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE):  # optional, one entry per token
        if key not in gguf.metadata:
            continue
        values = gguf.metadata[key]
        if not isinstance(values, list) or len(values) != vocab_size:
            length = f"{len(values):,} entries" if isinstance(values, list) else "no list"
            raise ModelFileError(f"{gguf.path}: '{key}' has {length}, but '{Keys.Tokenizer.LIST}' has {vocab_size:,}.")
    declared = gguf.get(vocab_size_key, vocab_size)
    if declared != vocab_size:
        raise ModelFileError(
            f"{gguf.path}: {vocab_size_key} is {declared!r}, but '{Keys.Tokenizer.LIST}' has {vocab_size:,} tokens."
        )
    for key in (Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID):
        token_id = gguf.get(key)
        if token_id is not None and (type(token_id) is not int or not 0 <= token_id < vocab_size):
            raise ModelFileError(
                f"{gguf.path}: {key} is {token_id!r}, outside the vocabulary of {vocab_size:,} tokens."
            )
    return vocab_size
