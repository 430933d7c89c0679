"""Load a llama model's weights from GGUF into float32 arrays laid out for `x @ W` GEMMs.

GGUF stores a linear layer as (out, in) rows; we keep (in, out) C-contiguous
copies and fuse Q/K/V into one matrix and gate/up into another, so each
layer runs four GEMMs over all tokens of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .dequant import SUPPORTED_TYPES, dequantize
from .errors import ModelFileError
from .gguf_file import GGUFFile


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wqkv: np.ndarray  # (dim, q_dim + 2 * kv_dim)
    wo: np.ndarray  # (q_dim, dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate_up: np.ndarray  # (dim, 2 * ffn_dim): gate columns first, then up
    w_down: np.ndarray  # (ffn_dim, dim)


@dataclass
class ModelWeights:
    token_embd: np.ndarray  # (vocab, dim)
    layers: list[LayerWeights]
    output_norm: np.ndarray  # (dim,)
    lm_head: np.ndarray  # (dim, vocab)


class _TensorLoader:
    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{self.gguf.path}: tensor '{name}' is missing.")
        if info.type not in SUPPORTED_TYPES:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise ModelFileError(
                f"{self.gguf.path}: tensor '{name}' has type {info.type.name}, which miro does not support "
                f"(supported: {supported})."
            )
        if info.shape != shape:
            raise ModelFileError(f"{self.gguf.path}: tensor '{name}' has shape {info.shape}, expected {shape}.")
        return dequantize(info)


def _linear_in_out(*matrices: np.ndarray) -> np.ndarray:
    """Stack (out_i, in) matrices along `out` and return the (in, sum out_i) C-contiguous transpose."""
    return np.ascontiguousarray(np.concatenate(matrices, axis=0).T)


def load_weights(gguf: GGUFFile, config: ModelConfig) -> ModelWeights:
    load = _TensorLoader(gguf)
    d, q, kv, f = config.dim, config.q_dim, config.kv_dim, config.ffn_dim
    layers = []
    for i in range(config.n_layers):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=load(p + "attn_norm.weight", (d,)),
                wqkv=_linear_in_out(
                    load(p + "attn_q.weight", (q, d)),
                    load(p + "attn_k.weight", (kv, d)),
                    load(p + "attn_v.weight", (kv, d)),
                ),
                wo=_linear_in_out(load(p + "attn_output.weight", (d, q))),
                ffn_norm=load(p + "ffn_norm.weight", (d,)),
                w_gate_up=_linear_in_out(load(p + "ffn_gate.weight", (f, d)), load(p + "ffn_up.weight", (f, d))),
                w_down=_linear_in_out(load(p + "ffn_down.weight", (d, f))),
            )
        )
    token_embd = load("token_embd.weight", (config.vocab_size, d))
    if "output.weight" in gguf.tensors:
        lm_head = _linear_in_out(load("output.weight", (config.vocab_size, d)))
    else:  # tied embeddings
        lm_head = np.ascontiguousarray(token_embd.T)
    return ModelWeights(
        token_embd=token_embd, layers=layers, output_norm=load("output_norm.weight", (d,)), lm_head=lm_head
    )
