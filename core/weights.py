"""Load a llama model's weights from GGUF into float32 arrays laid out for `x @ W` GEMMs.

GGUF stores a linear layer as (out, in) rows; we keep (in, out) C-contiguous
copies and fuse Q/K/V into one matrix and gate/up into another, so each
layer runs four GEMMs over all tokens of a step.

What the architecture expects is data: `llama_tensor_specs` lists every
tensor with the shape the config implies, and `check_tensors` holds the file
to it (presence, type, shape) before the first tensor is dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import MODEL_TENSOR, TENSOR_NAMES
from gguf import GGMLQuantizationType as Q

from .config import ModelConfig
from .dequant import SUPPORTED_TYPES, dequantize
from .errors import ModelFileError
from .gguf_file import GGUFFile

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)


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


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]  # numpy order: (out, in) for a matrix
    optional: bool = False  # may be absent (output.weight: the head is then tied to token_embd)
    float_only: bool = False  # must be F32, F16 or BF16 (norm weights are never quantized)


def matrix(rows: int, cols: int, optional: bool = False) -> TensorSpec:
    return TensorSpec((rows, cols), optional=optional)


def norm(size: int) -> TensorSpec:
    return TensorSpec((size,), float_only=True)


def tensor_name(tensor: MODEL_TENSOR, block: int | None = None) -> str:
    """The GGUF name of a weight, e.g. MODEL_TENSOR.ATTN_Q, 3 -> 'blk.3.attn_q.weight'."""
    return TENSOR_NAMES[tensor].format(bid=block) + ".weight"


def llama_tensor_specs(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor a llama file must hold (or may, if optional), with the shape its config implies."""
    T = MODEL_TENSOR
    d, q, kv, f, v = config.dim, config.q_dim, config.kv_dim, config.ffn_dim, config.vocab_size
    specs = {tensor_name(T.TOKEN_EMBD): matrix(v, d)}
    for i in range(config.n_layers):
        specs |= {
            tensor_name(T.ATTN_NORM, i): norm(d),
            tensor_name(T.ATTN_Q, i): matrix(q, d),
            tensor_name(T.ATTN_K, i): matrix(kv, d),
            tensor_name(T.ATTN_V, i): matrix(kv, d),
            tensor_name(T.ATTN_OUT, i): matrix(d, q),
            tensor_name(T.FFN_NORM, i): norm(d),
            tensor_name(T.FFN_GATE, i): matrix(f, d),
            tensor_name(T.FFN_UP, i): matrix(f, d),
            tensor_name(T.FFN_DOWN, i): matrix(d, f),
        }
    specs[tensor_name(T.OUTPUT_NORM)] = norm(d)
    specs[tensor_name(T.OUTPUT)] = matrix(v, d, optional=True)
    return specs


def check_tensors(gguf: GGUFFile, specs: dict[str, TensorSpec]) -> None:
    """Every expected tensor is present, of a type miro dequantizes, with its expected shape."""
    for name, spec in specs.items():
        info = gguf.tensors.get(name)
        if info is None:
            if spec.optional:
                continue
            raise ModelFileError(f"{gguf.path}: tensor '{name}' is missing.")
        if info.type not in SUPPORTED_TYPES:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise ModelFileError(
                f"{gguf.path}: tensor '{name}' has type {info.type.name}, which miro does not support "
                f"(supported: {supported})."
            )
        if info.shape != spec.shape:
            raise ModelFileError(f"{gguf.path}: tensor '{name}' has shape {info.shape}, expected {spec.shape}.")
        if spec.float_only and info.type not in FLOAT_TYPES:
            raise ModelFileError(
                f"{gguf.path}: tensor '{name}' is stored as {info.type.name}, but a norm weight must be one of "
                f"{', '.join(t.name for t in FLOAT_TYPES)}."
            )


def _linear_in_out(*matrices: np.ndarray) -> np.ndarray:
    """Stack (out_i, in) matrices along `out` and return the (in, sum out_i) C-contiguous transpose."""
    return np.ascontiguousarray(np.concatenate(matrices, axis=0).T)


def load_weights(gguf: GGUFFile, config: ModelConfig) -> ModelWeights:
    """Check every tensor against the llama tensor list, then dequantize them into the layout the forward pass uses."""
    check_tensors(gguf, llama_tensor_specs(config))
    T = MODEL_TENSOR

    def load(tensor: MODEL_TENSOR, block: int | None = None) -> np.ndarray:
        return dequantize(gguf.tensors[tensor_name(tensor, block)])

    layers = [
        LayerWeights(
            attn_norm=load(T.ATTN_NORM, i),
            wqkv=_linear_in_out(load(T.ATTN_Q, i), load(T.ATTN_K, i), load(T.ATTN_V, i)),
            wo=_linear_in_out(load(T.ATTN_OUT, i)),
            ffn_norm=load(T.FFN_NORM, i),
            w_gate_up=_linear_in_out(load(T.FFN_GATE, i), load(T.FFN_UP, i)),
            w_down=_linear_in_out(load(T.FFN_DOWN, i)),
        )
        for i in range(config.n_layers)
    ]
    token_embd = load(T.TOKEN_EMBD)
    if tensor_name(T.OUTPUT) in gguf.tensors:
        lm_head = _linear_in_out(load(T.OUTPUT))
    else:  # tied embeddings
        lm_head = np.ascontiguousarray(token_embd.T)
    return ModelWeights(token_embd=token_embd, layers=layers, output_norm=load(T.OUTPUT_NORM), lm_head=lm_head)
