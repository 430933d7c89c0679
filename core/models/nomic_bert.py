"""nomic-bert, the encoder of nomic-embed-text v1 and v1.5, in llama.cpp's GGUF layout: BERT (models/bert.py)
with rotary position embeddings instead of learned ones, a fused QKV matrix and a SwiGLU feed-forward, no
biases but the LayerNorms'. Per input:

    x = token_embd[ids] + token_types[0];  x = LayerNorm(x)
    each block (post-norm):  q, k, v = attn_qkv(x);  q, k = RoPE(q, k)  (NEOX halves, rope.freq_base)
                             x = LayerNorm(x + attn_output(attention(q, k, v)))
                             x = LayerNorm(x + ffn_down(silu(ffn_gate(x)) * ffn_up(x)))

as llama.cpp's BERT graph builds it for LLM_ARCH_NOMIC_BERT (src/models/bert.cpp, nomic-bert.cpp): positions
0..n-1 within each input, the rope type NEOX, n_rot rope.dimension_count (the whole head), the RoPE
scaling keys read as for the decoders (core/layers/rope.py). Attention is bidirectional, each input over its own
tokens only (layers/encoder.py). llama.cpp loads ffn_up.bias and ffn_down.bias for this architecture but
its graph never adds them, and nomic's converter writes none: miro refuses a file that has them, as it
refuses nomic-bert-moe (the MoE layers of nomic-embed-text v2), which is another architecture.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from gguf import MODEL_TENSOR, Keys

from miro.core.layers import pointwise
from miro.core.loading.model_config import ModelConfig
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.layers import encoder
from miro.core.layers.linear import BATCH_INVARIANT_FORMATS, Linear
from miro.core.layers.rope import RopeTable
from miro.core.loading.weights import TensorSpec, bias_name, check_tensors, matrix, norm, tensor_name
from miro.core.models.bert import EncoderInput
from miro.core.models.common import Loader, feed_forward

T = MODEL_TENSOR


@dataclass
class NomicBertLayer:
    wqkv: Linear  # dim -> 3 * dim: q, k, v
    wo: Linear
    attn_norm: tuple[np.ndarray, np.ndarray]  # LayerNorm weight, bias after attention
    w_gate_up: Linear  # dim -> 2 * ffn_dim: gate outputs first, then up
    w_down: Linear
    out_norm: tuple[np.ndarray, np.ndarray]  # LayerNorm weight, bias after the feed-forward


def nomic_bert_tensor_specs(config: ModelConfig, n_token_types: int) -> dict[str, TensorSpec]:
    d, f = config.dim, config.ffn_dim
    specs = {
        tensor_name(T.TOKEN_EMBD): matrix(config.vocab_size, d),
        tensor_name(T.TOKEN_TYPES): matrix(n_token_types, d, optional=True),
        tensor_name(T.TOKEN_EMBD_NORM): norm(d),
        bias_name(T.TOKEN_EMBD_NORM): norm(d),
    }
    for i in range(config.n_layers):
        for kind, rows, cols in (
            (T.ATTN_QKV, 3 * d, d),
            (T.ATTN_OUT, d, d),
            (T.FFN_UP, f, d),
            (T.FFN_GATE, f, d),
            (T.FFN_DOWN, d, f),
        ):
            specs[tensor_name(kind, i)] = matrix(rows, cols)
        for kind in (T.ATTN_OUT_NORM, T.LAYER_OUT_NORM):
            specs[tensor_name(kind, i)] = norm(d)
            specs[bias_name(kind, i)] = norm(d)
    return specs


class NomicBertModel:
    """The encoder: `encode` gives every token's final hidden state; the engine pools them (core/layers/pooling.py)."""

    metadata_keys = frozenset({Keys.Attention.LAYERNORM_EPS, Keys.Attention.CAUSAL})  # see core/loading/model_check.py

    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        types = gguf.tensors.get(tensor_name(T.TOKEN_TYPES))
        return nomic_bert_tensor_specs(config, types.shape[0] if types else 1)

    def __init__(self, config: ModelConfig, loader: Loader):
        gguf = loader.gguf
        check_tensors(gguf, self.tensor_specs(gguf, config), config.architecture)

        def layer_norm(kind, block=None):
            return loader.norm(kind, block), loader.vector(bias_name(kind, block))

        self.layers = [
            NomicBertLayer(
                wqkv=loader.linear(T.ATTN_QKV, block=i),
                wo=loader.linear(T.ATTN_OUT, block=i),
                attn_norm=layer_norm(T.ATTN_OUT_NORM, i),
                w_gate_up=loader.linear(T.FFN_GATE, T.FFN_UP, block=i),
                w_down=loader.linear(T.FFN_DOWN, block=i),
                out_norm=layer_norm(T.LAYER_OUT_NORM, i),
            )
            for i in range(config.n_layers)
        ]
        self.token_embd = loader.embedding()
        self.token_type0 = None  # every input is "sentence A", as llama.cpp has it
        if tensor_name(T.TOKEN_TYPES) in gguf.tensors:
            self.token_type0 = loader.vector(tensor_name(T.TOKEN_TYPES))[0].copy()
        self.embd_norm = layer_norm(T.TOKEN_EMBD_NORM)
        self.rope = RopeTable(config.rope())
        self.config = config
        self.weight_format = loader.weight_format
        self.batch_invariant = loader.weight_format in BATCH_INVARIANT_FORMATS or loader.batch_invariant
        self.weight_memory = loader.memory
        self.weight_fallbacks = list(loader.fallbacks.values())
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf, norm_eps_key=Keys.Attention.LAYERNORM_EPS)
        arch = config.architecture
        if gguf.get(Keys.Attention.CAUSAL.format(arch=arch), False):
            raise ModelFileError(f"{gguf.path}: {arch}.attention.causal is true; miro runs {arch} as an encoder only.")
        if config.n_kv_heads != config.n_heads:
            raise ModelFileError(f"{gguf.path}: a {arch} with grouped key/value heads is not supported.")
        return dataclasses.replace(config, causal=False, rope_neox=True, pooling_type=config.pooling_type or "mean")

    @classmethod
    def load(cls, gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32", batch_invariant: bool = False):
        return cls(config, Loader(gguf, weight_format, batch_invariant))

    def encode(self, batch: EncoderInput) -> np.ndarray:
        """(T, dim) float32: the last layer's hidden state of every token of the packed inputs."""
        cfg = self.config
        x = self.token_embd(batch.token_ids)
        if self.token_type0 is not None:
            x += self.token_type0
        encoder.layernorm(x, *self.embd_norm, cfg.rms_eps, x)
        cos, sin = self.rope.upto(batch.positions)
        attn = np.empty((len(x), cfg.dim), dtype=np.float32)
        for layer in self.layers:
            qkv = layer.wqkv(x)
            encoder.rope_qk(qkv, batch.positions, cos, sin, cfg.n_heads, cfg.head_dim)
            encoder.bidirectional_attention(qkv, batch.bounds, cfg.n_heads, cfg.head_dim, self.scale, attn)
            h = layer.wo(attn, residual=x)
            x = encoder.layernorm(h, *layer.attn_norm, cfg.rms_eps, h)
            h = feed_forward(x, layer.w_gate_up, layer.w_down, pointwise.silu_mul)
            h += x
            x = encoder.layernorm(h, *layer.out_norm, cfg.rms_eps, h)
        return x
