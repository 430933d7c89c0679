"""BERT, the encoder of sentence-embedding models (all-MiniLM-L6-v2, BGE, E5 ...), in llama.cpp's GGUF layout.

One forward pass over a packed batch of whole inputs (EncoderInput): no KV cache, no decode. Per input:

    x = token_embd[ids] + position_embd[0..n-1] + token_types[0];  x = LayerNorm(x)
    each block (post-norm):  x = LayerNorm(x + attn_output(attention(qkv(x))))
                             x = LayerNorm(x + ffn_down(gelu(ffn_up(x))))

Attention is bidirectional, each input over its own tokens only (layers/encoder.py). Every matrix is a
`Linear` as in the decoders (Q, K and V fused into one), each followed by its bias; GELU is the exact
erf form, as HF's BERT and sentence-transformers compute it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from gguf import MODEL_TENSOR, Keys

from miro.core.loading.model_config import ModelConfig
from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.layers import encoder
from miro.core.layers.linear import BATCH_INVARIANT_FORMATS, Linear
from miro.core.loading.weights import TensorSpec, bias_name, check_tensors, matrix, norm, tensor_name
from miro.core.models.common import Loader

T = MODEL_TENSOR


@dataclass
class EncoderInput:
    """A packed batch of whole inputs for an encoder: rows bounds[s]..bounds[s + 1] are input s."""

    token_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int64: 0..n-1 within each input
    bounds: np.ndarray  # (S + 1,) int64


def encoder_input(inputs: list[list[int]]) -> EncoderInput:
    lengths = np.array([len(ids) for ids in inputs], dtype=np.int64)
    bounds = np.zeros(len(inputs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    positions = np.arange(bounds[-1], dtype=np.int64) - np.repeat(bounds[:-1], lengths)
    token_ids = np.fromiter((t for ids in inputs for t in ids), dtype=np.int64, count=int(bounds[-1]))
    return EncoderInput(token_ids, positions, bounds)


@dataclass
class BertLayer:
    wqkv: Linear  # dim -> 3 * dim
    qkv_bias: np.ndarray
    wo: Linear
    wo_bias: np.ndarray
    attn_norm: tuple[np.ndarray, np.ndarray]  # LayerNorm weight, bias after attention
    w_up: Linear
    up_bias: np.ndarray
    w_down: Linear
    down_bias: np.ndarray
    out_norm: tuple[np.ndarray, np.ndarray]  # LayerNorm weight, bias after the feed-forward


def bert_tensor_specs(config: ModelConfig, n_positions: int, n_token_types: int) -> dict[str, TensorSpec]:
    d, f = config.dim, config.ffn_dim
    specs = {
        tensor_name(T.TOKEN_EMBD): matrix(config.vocab_size, d),
        tensor_name(T.POS_EMBD): matrix(n_positions, d),
        tensor_name(T.TOKEN_TYPES): matrix(n_token_types, d),
        tensor_name(T.TOKEN_EMBD_NORM): norm(d),
        bias_name(T.TOKEN_EMBD_NORM): norm(d),
    }
    for i in range(config.n_layers):
        for kind, rows, cols in (
            (T.ATTN_Q, d, d),
            (T.ATTN_K, d, d),
            (T.ATTN_V, d, d),
            (T.ATTN_OUT, d, d),
            (T.FFN_UP, f, d),
            (T.FFN_DOWN, d, f),
        ):
            specs[tensor_name(kind, i)] = matrix(rows, cols)
            specs[bias_name(kind, i)] = norm(rows)
        for kind in (T.ATTN_OUT_NORM, T.LAYER_OUT_NORM):
            specs[tensor_name(kind, i)] = norm(d)
            specs[bias_name(kind, i)] = norm(d)
    return specs


class BertModel:
    """The encoder: `encode` gives every token's final hidden state; the engine pools them (core/layers/pooling.py)."""

    metadata_keys = frozenset({Keys.Attention.LAYERNORM_EPS, Keys.Attention.CAUSAL})  # see core/loading/model_check.py

    @staticmethod
    def tensor_specs(gguf: GGUFFile, config: ModelConfig) -> dict[str, TensorSpec]:
        types = gguf.tensors.get(tensor_name(T.TOKEN_TYPES))
        return bert_tensor_specs(config, config.context_length, types.shape[0] if types else 1)

    def __init__(self, config: ModelConfig, loader: Loader):
        gguf = loader.gguf
        check_tensors(gguf, self.tensor_specs(gguf, config), config.architecture)

        def layer_norm(kind, block=None):
            return loader.norm(kind, block), loader.vector(bias_name(kind, block))

        self.layers = [
            BertLayer(
                wqkv=loader.linear(T.ATTN_Q, T.ATTN_K, T.ATTN_V, block=i),
                qkv_bias=np.concatenate([loader.vector(bias_name(k, i)) for k in (T.ATTN_Q, T.ATTN_K, T.ATTN_V)]),
                wo=loader.linear(T.ATTN_OUT, block=i),
                wo_bias=loader.vector(bias_name(T.ATTN_OUT, i)),
                attn_norm=layer_norm(T.ATTN_OUT_NORM, i),
                w_up=loader.linear(T.FFN_UP, block=i),
                up_bias=loader.vector(bias_name(T.FFN_UP, i)),
                w_down=loader.linear(T.FFN_DOWN, block=i),
                down_bias=loader.vector(bias_name(T.FFN_DOWN, i)),
                out_norm=layer_norm(T.LAYER_OUT_NORM, i),
            )
            for i in range(config.n_layers)
        ]
        self.token_embd = loader.embedding()
        self.position_embd = loader.vector(tensor_name(T.POS_EMBD))
        self.token_type0 = loader.vector(tensor_name(T.TOKEN_TYPES))[0].copy()  # every input is "sentence A"
        self.embd_norm = layer_norm(T.TOKEN_EMBD_NORM)
        self.config = config
        self.weight_format = loader.weight_format
        self.batch_invariant = loader.weight_format in BATCH_INVARIANT_FORMATS or loader.batch_invariant
        self.weight_memory = loader.memory
        self.weight_fallbacks = list(loader.fallbacks.values())
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    @staticmethod
    def read_config(gguf: GGUFFile) -> ModelConfig:
        config = ModelConfig.from_gguf(gguf, norm_eps_key=Keys.Attention.LAYERNORM_EPS)
        if gguf.get(Keys.Attention.CAUSAL.format(arch=config.architecture), False):
            raise ModelFileError(f"{gguf.path}: bert.attention.causal is true; miro runs BERT as an encoder only.")
        if config.n_kv_heads != config.n_heads:
            raise ModelFileError(f"{gguf.path}: a BERT with grouped key/value heads is not supported.")
        return dataclasses.replace(config, causal=False, pooling_type=config.pooling_type or "mean")

    @classmethod
    def load(cls, gguf: GGUFFile, config: ModelConfig, weight_format: str = "f32", batch_invariant: bool = False):
        return cls(config, Loader(gguf, weight_format, batch_invariant))

    def encode(self, batch: EncoderInput) -> np.ndarray:
        """(T, dim) float32: the last layer's hidden state of every token of the packed inputs."""
        cfg = self.config
        x = self.token_embd(batch.token_ids)
        x += self.position_embd[batch.positions]
        x += self.token_type0
        encoder.layernorm(x, *self.embd_norm, cfg.rms_eps, x)
        attn = np.empty((len(x), cfg.dim), dtype=np.float32)
        for layer in self.layers:
            qkv = layer.wqkv(x, layer.qkv_bias)
            encoder.bidirectional_attention(qkv, batch.bounds, cfg.n_heads, cfg.head_dim, self.scale, attn)
            h = layer.wo(attn, layer.wo_bias, residual=x)
            x = encoder.layernorm(h, *layer.attn_norm, cfg.rms_eps, h)
            up = layer.w_up(x, layer.up_bias, gelu=True)
            h = layer.w_down(up, layer.down_bias, residual=x)
            x = encoder.layernorm(h, *layer.out_norm, cfg.rms_eps, h)
        return x
