"""What the architectures share: the tensor specs several of them list, loading tensors as layers in one
weight format, the model around its layers (embedding and head, what the engine reads of it), the
attention step (RoPE, KV-cache write, paged attention) and the logits of the last rows.

Each architecture's module keeps its own tensor list and its own forward pass, top to bottom; the
lines here are the ones that would otherwise repeat in every one of them.
"""

from __future__ import annotations

import numpy as np
from gguf import MODEL_TENSOR

from miro.core.layers import pointwise
from miro.core.loading.model_config import ModelConfig
from miro.core.kernels.dequant import dequantize
from miro.core.loading.gguf_file import GGUFFile
from miro.core.engine.kv_cache import KVCache
from miro.core.layers import attention as attention_kernels
from miro.core.layers.linear import BATCH_INVARIANT_FORMATS, Embedding, Linear, has_native_kernel, owned_bytes
from miro.core.engine.step_input import StepInput
from miro.core.loading.weights import TensorSpec, matrix, norm, tensor_name

T = MODEL_TENSOR


def norm_specs(config: ModelConfig, i: int, *kinds: MODEL_TENSOR) -> dict[str, TensorSpec]:
    """Block i's RMSNorm weights of the given kinds, each over the embedding (ATTN_NORM, FFN_NORM, ...)."""
    return {tensor_name(kind, i): norm(config.dim) for kind in kinds}


def attention_specs(config: ModelConfig, i: int) -> dict[str, TensorSpec]:
    """Block i's attention matrices, as llama has them."""
    d, q, kv = config.dim, config.q_dim, config.kv_dim
    return {
        tensor_name(T.ATTN_Q, i): matrix(q, d),
        tensor_name(T.ATTN_K, i): matrix(kv, d),
        tensor_name(T.ATTN_V, i): matrix(kv, d),
        tensor_name(T.ATTN_OUT, i): matrix(d, q),
    }


def ffn_specs(config: ModelConfig, i: int) -> dict[str, TensorSpec]:
    """Block i's gated feed-forward matrices."""
    d, f = config.dim, config.ffn_dim
    return {
        tensor_name(T.FFN_GATE, i): matrix(f, d),
        tensor_name(T.FFN_UP, i): matrix(f, d),
        tensor_name(T.FFN_DOWN, i): matrix(d, f),
    }


def qk_norm_specs(config: ModelConfig, i: int) -> dict[str, TensorSpec]:
    """Block i's per-head RMSNorm weights of q and k (qwen3, gemma3)."""
    return {tensor_name(T.ATTN_Q_NORM, i): norm(config.head_dim), tensor_name(T.ATTN_K_NORM, i): norm(config.head_dim)}


def embedding_and_head_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """token_embd, output_norm and the optional output.weight (absent: the head is tied to token_embd)."""
    v, d = config.vocab_size, config.dim
    return {
        tensor_name(T.TOKEN_EMBD): matrix(v, d),
        tensor_name(T.OUTPUT_NORM): norm(d),
        tensor_name(T.OUTPUT): matrix(v, d, optional=True),
    }


class Loader:
    """A checked file's tensors as the layers a forward pass uses, matrices in one weight format.

    "f32" dequantizes every matrix once; "native" keeps the file's blocks, except for a type with no
    native kernel, which stays f32 and is noted in `fallbacks`. `memory` counts the bytes the layers
    built so far hold of their own.
    """

    def __init__(self, gguf: GGUFFile, weight_format: str = "f32", batch_invariant: bool = False):
        self.gguf = gguf
        self.weight_format = weight_format
        self.batch_invariant = batch_invariant  # f32 matrices packed for the invariant GEMM
        self.fallbacks: dict[str, str] = {}  # type name -> why its matrices are f32 although "native" was asked
        self.memory = 0

    def vector(self, name: str) -> np.ndarray:
        """A norm weight or a bias, as float32, in memory of its own: read from the file's map at every step, the
        file's pages around it came back into this process (Gemma 3 270M: 12 MiB of them, 2 MiB at a time)."""
        a = dequantize(self.gguf.tensors[name])
        if not owned_bytes(a):
            a = a.copy()
        self.memory += owned_bytes(a)
        return a

    def norm(self, kind: MODEL_TENSOR, block: int | None = None) -> np.ndarray:
        return self.vector(tensor_name(kind, block))

    def linear(self, *kinds: MODEL_TENSOR, block: int | None = None) -> Linear:
        """One layer over the named matrices, their outputs side by side (Q, K, V; gate, up)."""
        parts = [self.gguf.tensors[tensor_name(kind, block)] for kind in kinds]
        fmt = self.weight_format
        if fmt == "native" and not has_native_kernel(parts[0].type):
            fmt = "f32"
            self.fallbacks[parts[0].type.name] = (
                f"{parts[0].type.name} has no native kernel: its matrices are kept as f32"
            )
        layer = Linear.fused(parts, fmt, invariant=self.batch_invariant)
        self.memory += layer.weight_bytes
        return layer

    def embedding(self) -> Embedding:
        fmt = "f32" if self.weight_format in ("bf16", "i16") else self.weight_format  # a lookup: nothing to multiply
        layer = Embedding(self.gguf.tensors[tensor_name(T.TOKEN_EMBD)], fmt)
        self.memory += layer.weight_bytes
        return layer

    def lm_head(self) -> Linear:
        """output.weight, or token_embd where the file ties the head to the embedding."""
        return self.linear(T.OUTPUT if tensor_name(T.OUTPUT) in self.gguf.tensors else T.TOKEN_EMBD)


class LoadedModel:
    """What every architecture's model shares around its own layers: the embedding and the head, what the
    engine reads of a model (config, weight format and memory, fallbacks), attention's scale, read_config()
    and load()."""

    config: ModelConfig
    metadata_keys: frozenset[str] = frozenset()  # {arch}.* keys read beyond ModelConfig.from_gguf's (model_check)

    def _load_embedding_and_head(self, config: ModelConfig, loader: Loader) -> None:
        """After the layers, so that `weight_memory` counts everything the loader built."""
        self.config = config
        self.weight_format = loader.weight_format
        self.batch_invariant = (
            loader.weight_format in BATCH_INVARIANT_FORMATS or loader.batch_invariant
        )  # as every Linear is
        self.token_embd: Embedding = loader.embedding()
        self.output_norm = loader.norm(T.OUTPUT_NORM)
        self.lm_head = loader.lm_head()
        self.weight_memory = loader.memory  # bytes the weights hold of their own
        self.weight_fallbacks = list(loader.fallbacks.values())  # types kept f32 in native mode, and why
        self.scale = np.float32(config.attention_scale or 1.0 / np.sqrt(config.head_dim))
        self.softcap = np.float32(config.final_logit_softcap)

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        """The keys llama-like architectures share; an architecture with keys of its own reads them too."""
        return ModelConfig.from_gguf(gguf)

    @classmethod
    def load(cls, gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32", batch_invariant: bool = False):
        return cls(config, Loader(gguf, weight_format, batch_invariant))


def attention(
    qkv: np.ndarray,
    layer: int,
    step: StepInput,
    cache: KVCache,
    config: ModelConfig,
    rope: tuple[np.ndarray, np.ndarray],
    scale: np.float32,
    out: np.ndarray,
    window: int = 0,
    q_scale: np.ndarray | None = None,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Rotate q and k of the fused qkv rows (in place), write k and v into the cache, attend over it.

    out: (T, n_heads, head_dim), filled; returned as (T, q_dim). window > 0: a sliding-window layer.
    q_scale: (T,) float32, each token's rotated q multiplied by it (mistral3's attention temperature).
    softcap > 0: each score soft-capped before the softmax (gemma2), by the attention kernel's capped variant.
    sinks: (n_heads,) float32, each query head's sink logit in its softmax's denominator (gpt-oss), by the
    kernel's sinks variant.
    """
    cfg = config
    n_tokens = qkv.shape[0]
    cos, sin = rope
    attention_kernels.rope_and_store_kv(
        qkv,
        step.positions,
        cos,
        sin,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        step.slots,
        cache.k[layer],
        cache.v[layer],
        cfg.rope_neox,
    )
    # a contiguous copy: numba's code for strided views is several times slower
    q = np.ascontiguousarray(qkv[:, : cfg.q_dim]).reshape(n_tokens, cfg.n_heads, cfg.head_dim)
    if q_scale is not None:
        q *= q_scale[:, None, None]
    attention_kernels.paged_attention(
        q,
        cache.k[layer],
        cache.v[layer],
        step.block_tables,
        step.positions,
        step.attn_items,
        scale,
        out,
        window,
        softcap=softcap,
        sinks=sinks,
    )
    return out.reshape(n_tokens, cfg.q_dim)


FFN_BYTES = 8 << 20  # the most a step's feed-forward gate/up output takes at a time (see feed_forward)


def feed_forward(
    normed: np.ndarray,
    w_gate_up: Linear,
    w_down: Linear,
    gate_kernel,
    gate_up_bias: np.ndarray | None = None,
    down_bias: np.ndarray | None = None,
) -> np.ndarray:
    """w_down(gate(w_gate_up(normed))), gate_kernel(gate_up, out) one of pointwise.silu_mul / gelu_mul, in runs of
    rows whose gate/up output fits FFN_BYTES: a 512-token prefill's (T, 2 x ffn_dim) output was the step's
    largest buffer (23 MB on a 1.1B model), and every row's result is its own whatever rows share its call.
    The biases, where a file has them, are added to each layer's output."""
    n_rows = normed.shape[0]
    run = max(16, FFN_BYTES // (4 * w_gate_up.out_features))
    act = np.empty((min(n_rows, run), w_down.in_features), dtype=np.float32)
    if n_rows <= run:
        gate_kernel(w_gate_up(normed, gate_up_bias), act)
        return w_down(act, down_bias)
    out = np.empty((n_rows, w_down.out_features), dtype=np.float32)
    for first in range(0, n_rows, run):
        rows = slice(first, first + run)
        chunk = act[: len(normed[rows])]
        gate_kernel(w_gate_up(normed[rows], gate_up_bias), chunk)
        out[rows] = w_down(chunk, down_bias)
    return out


def qk_norm(qkv: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray, config: ModelConfig) -> None:
    """Per-head RMSNorm of the q and k columns of the fused qkv rows, in place."""
    cfg = config
    pointwise.head_rmsnorm(qkv, 0, cfg.n_heads, cfg.head_dim, q_norm, cfg.rms_eps)
    pointwise.head_rmsnorm(qkv, cfg.q_dim, cfg.n_kv_heads, cfg.head_dim, k_norm, cfg.rms_eps)


def logits(
    x: np.ndarray,
    rows: np.ndarray,
    output_norm: np.ndarray,
    lm_head: Linear,
    eps: float,
    softcap: np.float32 = np.float32(0.0),
    logit_scale: float = 1.0,
) -> np.ndarray:
    """The final RMSNorm and the head, on the rows whose next-token logits are wanted; softcap > 0 (gemma's
    final_logit_softcapping): softcap * tanh(logits / softcap); logit_scale != 1 (granite): logits times
    1 / logit_scale, as llama.cpp multiplies them."""
    last = x[rows]
    pointwise.rmsnorm(last, output_norm, eps, last)
    out = lm_head(last)
    if logit_scale != 1.0:
        out *= np.float32(1.0) / np.float32(logit_scale)
    if softcap > 0:
        out *= np.float32(1.0) / softcap
        np.tanh(out, out=out)
        out *= softcap
    return out
