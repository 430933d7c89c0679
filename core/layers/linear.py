"""A linear layer, y = x @ W.T, over a GGUF tensor kept as stored or dequantized once.

fmt="native" keeps the tensor's bytes where they are (a view of the file's memory map, no copy)
and multiplies by the blocks directly, llama.cpp's way: activations quantized to 8 bits per
call, integer dot products per block, float scales per block (see quant_kernels.py). A row's
result is bitwise the same whatever else is in the batch.

fmt="f32" dequantizes once at construction and multiplies with numpy's BLAS: today's path,
four times the file's bytes for 8-bit weights, eight for 4-bit ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..dequant import dequantize
from ..gguf_file import TensorInfo
from . import float_kernels, quant_kernels
from .activations import (quantize_q8_32, quantize_q8_32_columns, quantize_q8_32_quad_groups, quantize_q8_k,
                          quantize_q8_k_columns, quantize_q8_k_pair_groups)
from .quant_blocks import BLOCK32_TYPES, SUPERBLOCK_TYPES

NATIVE_TYPES = BLOCK32_TYPES + SUPERBLOCK_TYPES + float_kernels.FLOAT_TYPES

# The AVX512-VNNI kernels where the CPU has them (the same bits as the portable ones; False to compare).
USE_VNNI = True

# From this many activation rows on, each weight block is decoded once for all rows (the "lanes"
# kernels); below, rows are taken one at a time. Both give the same bits; this only picks the faster.
LANES_MIN_ROWS = 8
LANES_MIN_ROWS_VNNI = 2


class Linear:
    """y = x @ W.T for x (T, in_features) float32 and W (out_features, in_features) as stored in GGUF."""

    def __init__(self, tensor: TensorInfo, fmt: str = "native"):
        self._init(tensor.name, tensor.type, tensor.shape, [tensor.data], fmt)

    @classmethod
    def fused(cls, tensors: Sequence[TensorInfo], fmt: str = "native") -> "Linear":
        """One layer over several tensors with the same type and in_features (Q, K, V; gate, up):
        their outputs side by side. Tensors stored back to back in one buffer stay a single view."""
        first = tensors[0]
        for t in tensors[1:]:
            if t.type != first.type or t.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"cannot fuse {t.name} ({t.type.name}, {t.shape}) with {first.name} ({first.type.name}, {first.shape})"
                )
        shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
        layer = cls.__new__(cls)
        layer._init("+".join(t.name for t in tensors), first.type, shape, [t.data for t in tensors], fmt)
        return layer

    def _init(self, name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...], parts: list[np.ndarray], fmt: str):
        if len(shape) != 2:
            raise ValueError(f"{name}: a linear layer needs a 2-D tensor, this one has shape {shape}")
        if fmt not in ("native", "f32"):
            raise ValueError(f"fmt must be 'native' or 'f32', not {fmt!r}")
        if fmt == "native" and int(qtype) not in NATIVE_TYPES:
            raise ValueError(f"{name}: type {qtype.name} has no native kernel (use fmt='f32')")
        self.name = name
        self.type = qtype
        self.fmt = fmt
        self.out_features, self.in_features = shape
        raw = _join(parts)
        self.weight_bytes = 0 if np.shares_memory(raw, parts[0]) else raw.nbytes  # a copy only when fusing scattered parts
        if fmt == "f32":
            self._w = dequantize(TensorInfo(name=name, shape=shape, type=qtype, data=raw))
            self.weight_bytes = self._w.nbytes
        elif int(qtype) in float_kernels.FLOAT_TYPES:
            dtype = np.float32 if qtype == GGMLQuantizationType.F32 else np.uint16
            self._w = raw.view(dtype).reshape(shape)
        else:
            block_values, block_bytes = GGML_QUANT_SIZES[qtype]
            self._w = raw.reshape(self.out_features, self.in_features // block_values * block_bytes)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(T, in_features) float32 -> (T, out_features) float32."""
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"{self.name}: expected x of shape (T, {self.in_features}), got {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.fmt == "f32":
            return x @ self._w.T
        out = np.empty((x.shape[0], self.out_features), np.float32)
        if x.shape[0] == 0:
            return out
        if int(self.type) in float_kernels.FLOAT_TYPES:
            return float_kernels.matmul_float(int(self.type), self._w, x, out)
        if int(self.type) in BLOCK32_TYPES:
            return self._matmul_block32(x, out)
        return self._matmul_superblocks(x, out)

    def _matmul_block32(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Activations in 32-value blocks (Q8_0, with Q8_1's sums) against Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights."""
        kernels = quant_kernels.kernels_for(int(self.type))
        n_tok = x.shape[0]
        if _row_by_row(kernels, n_tok):
            a = quantize_q8_32(x)
            if _use_vnni(kernels) and kernels.rows_vnni is not None:
                return kernels.rows_vnni(self._w, a.q, a.d, a.s, a.qsum, out)
            return kernels.rows(self._w, a.q, a.d, a.s, a.qsum, out, 16)
        if _use_vnni(kernels):
            a = quantize_q8_32_quad_groups(x, _round_up(n_tok, 16))
            return kernels.lanes_vnni(self._w, a.q, a.d, a.s, a.qsum, out)
        a = quantize_q8_32_columns(x, _round_up(n_tok, quant_kernels.LANE_MULTIPLE))
        return kernels.lanes(self._w, a.q, a.d, a.s, a.qsum, out)

    def _matmul_superblocks(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Activations in Q8_K blocks against Q4_K/Q5_K/Q6_K weights."""
        kernels = quant_kernels.kernels_for(int(self.type))
        n_tok = x.shape[0]
        if _row_by_row(kernels, n_tok):
            a = quantize_q8_k(x)
            return kernels.rows(self._w, a.q, a.d, a.sum32, out, 16)
        if _use_vnni(kernels):
            a = quantize_q8_k_pair_groups(x, _round_up(n_tok, 16))
            return kernels.lanes_vnni(self._w, a.q, a.d, a.sum32, out, 16)
        a = quantize_q8_k_columns(x, _round_up(n_tok, quant_kernels.LANE_MULTIPLE))
        return kernels.lanes(self._w, a.q, a.d, a.sum32, out, 16)

    def __repr__(self) -> str:
        return (f"Linear({self.name}, {self.type.name}, {self.out_features}x{self.in_features}, fmt={self.fmt}, "
                f"weight_bytes={self.weight_bytes:,})")


def _use_vnni(kernels: quant_kernels.Kernels) -> bool:
    return kernels.lanes_vnni is not None and USE_VNNI


def _row_by_row(kernels: quant_kernels.Kernels, n_tok: int) -> bool:
    return n_tok < (LANES_MIN_ROWS_VNNI if _use_vnni(kernels) else LANES_MIN_ROWS)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """The parts' bytes as one uint8 array: a view when they lie back to back in one buffer, else a copy."""
    if len(parts) == 1:
        return parts[0]
    root = parts[0]
    while isinstance(root.base, np.ndarray):
        root = root.base
    buffer = root.base if root.base is not None else root
    contiguous = all(p.flags.c_contiguous for p in parts) and all(
        _address(p) + p.nbytes == _address(q) for p, q in zip(parts, parts[1:])
    )
    if contiguous:
        start = np.frombuffer(buffer, dtype=np.uint8)
        offset = _address(parts[0]) - _address(start)
        if 0 <= offset and offset + sum(p.nbytes for p in parts) <= start.nbytes:
            return start[offset:offset + sum(p.nbytes for p in parts)]
    return np.concatenate([p.reshape(-1) for p in parts])
