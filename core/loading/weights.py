"""What every architecture's weight loading shares: tensor specs, GGUF tensor names, checking a file
against its architecture's tensor list, and the (in, out) layout the GEMMs use.

What an architecture expects is data: its module in core/models lists every tensor with the shape the
config implies, and `check_tensors` holds the file to it (presence, type, shape) before the first
tensor is dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_TENSOR, TENSOR_NAMES

from miro.core.errors import ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.kernels.weight_types import FLOAT_TYPES, SUPPORTED_TYPES
from miro.core.loading.model_check import refuse_unknown_tensors


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]  # numpy order: (out, in) for a matrix
    optional: bool = False  # may be absent (output.weight: the head is then tied to token_embd)
    float_only: bool = False  # must be F32, F16 or BF16 (norm weights are never quantized)


def matrix(rows: int, cols: int, optional: bool = False) -> TensorSpec:
    return TensorSpec((rows, cols), optional=optional)


def norm(size: int) -> TensorSpec:
    return TensorSpec((size,), float_only=True)


def bias_spec(size: int, optional: bool = True) -> TensorSpec:
    """A bias (or another vector such as rope_freqs): float, optional unless the architecture always has it."""
    return TensorSpec((size,), optional=optional, float_only=True)


def tensor_name(tensor: MODEL_TENSOR, block: int | None = None) -> str:
    """The GGUF name of a weight, e.g. MODEL_TENSOR.ATTN_Q, 3 -> 'blk.3.attn_q.weight'."""
    return TENSOR_NAMES[tensor].format(bid=block) + ".weight"


def bias_name(tensor: MODEL_TENSOR, block: int | None = None) -> str:
    """The GGUF name of a weight's bias, e.g. MODEL_TENSOR.ATTN_Q, 3 -> 'blk.3.attn_q.bias'."""
    return TENSOR_NAMES[tensor].format(bid=block) + ".bias"


def check_tensors(gguf: GGUFFile, specs: dict[str, TensorSpec], architecture: str) -> None:
    """Every tensor of the file is one of `specs` (model_check.refuse_unknown_tensors), and every expected one is
    present, of a type miro dequantizes, with its expected shape."""
    refuse_unknown_tensors(gguf, specs, architecture)
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
