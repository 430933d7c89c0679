"""A linear layer, y = x @ W.T, over a GGUF tensor kept as stored or dequantized once.

fmt="native" keeps the tensor's bytes where they are (a view of the file's memory map, no copy)
and multiplies by the blocks directly, llama.cpp's way: activations quantized to 8 bits per
call, integer dot products per block, float scales per block (see quant_kernels.py). A row's
result is bitwise the same whatever else is in the batch.

fmt="f32" dequantizes once at construction, keeps the (in, out) transpose C-contiguous and multiplies
with numpy's BLAS (or, batch-invariant, with a numba GEMM): four times the file's bytes for 8-bit
weights, eight for 4-bit ones. fmt="bf16" rounds that copy to bfloat16 and multiplies by vdpbf16ps
(bf16_gemm.py, CPUs with AVX512_BF16): half its bytes, twice float32's rate, batch-invariant. fmt="i16" rounds
it to 13-bit integers per block of 128 and multiplies by vpmaddwd (int16_gemm.py, every x86 tier): half its
bytes, up to twice float32's rate where there is no bfloat16 dot, batch-invariant.

`Embedding` is the token-embedding lookup over the same two formats: a dense float32 table, or the
tensor as stored with only the rows a step needs dequantized.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from gguf import GGMLQuantizationType

from miro.core.loading.gguf_file import TensorInfo, release_pages
from miro.core.kernels import amx_bf16, amx_kernels, amx_superblocks, amx_tiles, cpu, quant_kernels
from miro.core.layers import encoder
from miro.core.kernels.amx_bf16 import matmul_amx_bf16
from miro.core.kernels.bf16_gemm import matmul_bf16, pack_bf16
from miro.core.kernels.int16_gemm import matmul_i16, pack_i16
from miro.core.kernels.f32_gemm import matmul_invariant, pack_panels
from miro.core.kernels.quantize_activations import (
    Q8Blocks,
    Q8KBlocks,
    quantize_q8_32,
    quantize_q8_32_columns,
    quantize_q8_k,
    quantize_q8_k_columns,
    quantize_q8_k_quads,
)
from miro.core.kernels.superblock_tiles import natural_order
from miro.core.kernels.weight_types import WEIGHT_TYPES, Kernels, dequantize

WEIGHT_FORMATS = ("f32", "native", "bf16", "i16")
BATCH_INVARIANT_FORMATS = ("native", "bf16", "i16")  # by construction; f32 when built with invariant=True

# Rows per call of a K-quant lanes kernel: its sums (16 weight rows x rows, int32 and float) stay in L2 up to
# here; at 512 rows they do not, and the portable kernel ran 4x slower (benchmarks/weight_speeds.py --rows 512).
SUPERBLOCK_LANES_PER_CALL = 64
# what a tile kernel takes for its quantized rows when it quantizes a lone row itself (Linear._lone_row), and for the
# float rows otherwise
_NO_ROWS = np.zeros((0, 0), np.float32)
_NO_Q8, _NO_SUMS = np.zeros((0, 0), np.int8), np.zeros((0, 0), np.int32)


def has_native_kernel(qtype: GGMLQuantizationType) -> bool:
    """Whether fmt="native" can multiply by tensors of this type (otherwise the layer must be fmt="f32")."""
    row = WEIGHT_TYPES.get(qtype)
    return row is not None and row.native


def owned_bytes(a: np.ndarray) -> int:
    """Bytes `a` holds of its own: 0 for a view of a memory-mapped file (the page cache holds those)."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    return a.nbytes if root.base is None else 0


class Linear:
    """y = x @ W.T for x (T, in_features) float32 and W (out_features, in_features) as stored in GGUF.

    tier: the CPU tier whose kernels and layout to use (cpu.py; None: the one this process runs). Every tier
    gives the same bits; a lower one is there to compare them."""

    def __init__(self, tensor: TensorInfo, fmt: str = "native", invariant: bool = False, tier: str | None = None):
        self._init(tensor.name, tensor.type, tensor.shape, [tensor.data], fmt, invariant, tier)

    @classmethod
    def fused(
        cls, tensors: Sequence[TensorInfo], fmt: str = "native", invariant: bool = False, tier: str | None = None
    ) -> "Linear":
        """One layer over several tensors with the same type and in_features (Q, K, V; gate, up):
        their outputs side by side. Tensors stored back to back in one buffer stay a single view.

        Tensors of different types (a Q4_K_M file's Q6_K attn_v beside Q4_K attn_q/attn_k) become one
        dequantized matrix in f32, and in native a `LinearStack` of one layer per run of a type."""
        first = tensors[0]
        for t in tensors[1:]:
            if t.shape[1:] != first.shape[1:]:
                raise ValueError(f"cannot fuse {t.name} (shape {t.shape}) with {first.name} (shape {first.shape})")
        if any(t.type != first.type for t in tensors):
            if fmt == "native":  # neighbours of one type stay one layer: one activation quantization, one call
                groups = [list(group) for _, group in itertools.groupby(tensors, key=lambda t: t.type)]
                return LinearStack([cls.fused(group, fmt, tier=tier) for group in groups])
            f32 = [
                TensorInfo(t.name, t.shape, GGMLQuantizationType.F32, dequantize(t).view(np.uint8).reshape(-1))
                for t in tensors
            ]
            return cls.fused(f32, fmt, invariant, tier)
        shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
        layer = cls.__new__(cls)
        layer._init(
            "+".join(t.name for t in tensors), first.type, shape, [t.data for t in tensors], fmt, invariant, tier
        )
        return layer

    def _init(
        self,
        name: str,
        qtype: GGMLQuantizationType,
        shape: tuple[int, ...],
        parts: list[np.ndarray],
        fmt: str,
        invariant: bool,
        tier: str | None,
    ):
        if len(shape) != 2:
            raise ValueError(f"{name}: a linear layer needs a 2-D tensor, this one has shape {shape}")
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"fmt must be one of {', '.join(WEIGHT_FORMATS)}, not {fmt!r}")
        if fmt == "bf16" and not cpu.HAS_BF16_DOT:
            raise ValueError(
                f"{name}: fmt='bf16' needs a CPU with AVX512_BF16 (this one runs the {cpu.TIER.name} tier)"
            )
        if fmt == "i16" and not cpu.HAS_INT16_DOT:
            raise ValueError(f"{name}: fmt='i16' needs an x86 CPU with AVX2 (this one runs the {cpu.TIER.name} tier)")
        if fmt == "native" and not has_native_kernel(qtype):
            raise ValueError(f"{name}: type {qtype.name} has no native kernel (use fmt='f32')")
        self.name = name
        self.type = qtype
        self.fmt = fmt
        self.tier = cpu.get(tier)
        self._weight_type = WEIGHT_TYPES.get(qtype)  # its row of the table (weight_types.py); None: not supported
        self._plan = self._weight_type.plan(self.tier) if fmt == "native" else None
        self.out_features, self.in_features = shape
        raw = _join(parts)
        self.weight_bytes = (
            0 if np.shares_memory(raw, parts[0]) else raw.nbytes
        )  # a copy only when fusing scattered parts
        self._tiles = None
        self._amx_tiles = None  # tiles on AMX (amx_kernels.kernel, the table's amx_from), 16 rows at a time, same bits
        self.batch_invariant = invariant or fmt in BATCH_INVARIANT_FORMATS
        self._amx = False  # fmt="bf16" on AMX: amx_bf16.py's kernel (its own bits) rather than vdpbf16ps
        if fmt == "bf16":
            self._w = pack_bf16(dequantize(TensorInfo(name=name, shape=shape, type=qtype, data=raw)).T)
            self.weight_bytes = self._w.nbytes
            self._amx = self.tier.vector_bits == 512 and amx_bf16.ready() and amx_bf16.fits(self._w.shape[1])
        elif fmt == "i16":
            self._w = pack_i16(dequantize(TensorInfo(name=name, shape=shape, type=qtype, data=raw)).T)
            self.weight_bytes = sum(part.nbytes for part in self._w)
        elif fmt == "f32":  # (in, out), the layout `x @ w` is fastest with, or packed for the invariant GEMM
            in_out = dequantize(TensorInfo(name=name, shape=shape, type=qtype, data=raw)).T
            self._w = pack_panels(in_out) if invariant else np.ascontiguousarray(in_out)
            self.weight_bytes = self._w.nbytes
        elif self._weight_type.is_float:
            dtype = np.float32 if self._weight_type.block_bytes == 4 else np.uint16  # F32; F16, BF16 as bits
            self._w = raw.view(dtype).reshape(shape)
        else:
            row = self._weight_type
            self._w = raw.reshape(self.out_features, self.in_features // row.block_values * row.block_bytes)
            if self._plan.layout == "tiles":  # the same bytes in 16-row tiles; the file's pages leave memory
                self._tiles = row.kernels.repack(int(qtype), self._w, self.tier)
                if amx_tiles.usable(int(qtype), self.tier):
                    self._amx_tiles = amx_kernels.kernel(int(qtype), self.tier.name)
                self._w = None
                self.weight_bytes = self._tiles.nbytes
                for part in parts:
                    release_pages(part)

    def _kernels(self) -> Kernels:
        return self._weight_type.kernels_on(self.tier)

    def __call__(
        self, x: np.ndarray, bias: np.ndarray | None = None, residual: np.ndarray | None = None, gelu: bool = False
    ) -> np.ndarray:
        """(T, in_features) float32 -> (T, out_features) float32, then + bias (out_features,), then the exact GELU
        (gelu=True), then + residual (T, out_features), each where asked: the i16 kernel as it stores each tile,
        the others after, with the same float32 operations.

        Each row's result is bitwise independent of the other rows when the layer is `batch_invariant`: native
        kernels always are; f32 weights built with invariant=True are packed for a numba GEMM, else laid out
        for OpenBLAS, whose sgemm may round a row differently depending on how many rows the call has and
        where the row sits.
        """
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"{self.name}: expected x of shape (T, {self.in_features}), got {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.fmt == "i16":
            return matmul_i16(x, self._w, np.empty((x.shape[0], self.out_features), np.float32), bias, residual, gelu)
        return _epilogue(self._product(x), bias, residual, gelu)

    def _product(self, x: np.ndarray) -> np.ndarray:
        if x.shape[0] == 1 and self._tiles is not None and not self._amx_rows(1):
            return self._lone_row(x)
        if self.fmt == "bf16":
            matmul = matmul_amx_bf16 if self._amx else matmul_bf16
            return matmul(x, self._w, np.empty((x.shape[0], self.out_features), np.float32))
        if self.fmt == "f32":
            if self.batch_invariant:
                return matmul_invariant(x, self._w, np.empty((x.shape[0], self.out_features), np.float32), self.tier)
            return x @ self._w
        out = np.empty((x.shape[0], self.out_features), np.float32)
        if x.shape[0] == 0:
            return out
        activations = self._weight_type.activations  # the form the type's kernels take them in
        if activations == "f32":
            return self._kernels().rows(int(self.type), self._w, x, out)
        if activations == "q8_0":
            return self._matmul_block32(x, out)
        return self._matmul_superblocks(x, out)

    def _lone_row(self, x: np.ndarray) -> np.ndarray:
        """One row through the tile kernel, which quantizes it itself: one compiled call, not a quantizer's and the
        kernel's, and less Python (a decode's lone row; the same bits). Zen 4, weights from memory, calls
        interleaved: 1.7-2.8 us less a call (1.03-1.15x); one sequence's decode on the default model 1.06x."""
        t, tiles = self._tiles, self._kernels().tiles
        out = np.empty((1, self.out_features), np.float32)
        if self._weight_type.activations == "q8_0":  # the 32-value types (tile_kernels.tiles_32)
            tiles(t.quants, t.scales, t.mins, _NO_Q8, _NO_ROWS, _NO_ROWS, _NO_SUMS, out, x)
        else:  # the K-quants (superblock_kernels.tiles_k)
            tiles(t.quants, t.scales, t.mins, t.sub_scales, _NO_Q8, _NO_ROWS, _NO_SUMS, out, x)
        return out

    def _amx_rows(self, n_tok: int) -> int:
        """The rows a call gives the AMX kernel: whole A tiles, from the weight type's `amx_from` rows (fewer: none,
        the VNNI tile kernel faster there); 0 where the layer has none."""
        if self._amx_tiles is None or n_tok < self._weight_type.amx_from:
            return 0
        return n_tok - n_tok % amx_tiles.ROWS

    def _matmul_block32(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Activations in 32-value blocks (Q8_0, with Q8_1's sums) against Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights."""
        kernels, plan = self._kernels(), self._plan
        n_tok = x.shape[0]
        if self._tiles is not None:  # repacked at load: the tile kernel for every row count (plan.passes)
            a, t = quantize_q8_32(x), self._tiles
            on_amx = self._amx_rows(n_tok)
            if on_amx:  # AMX's dots for 16 rows at a time, the same bits; the rows past them the tile kernel's
                amx_tiles.matmul(self._amx_tiles, t, a, out[:on_amx])
                if on_amx == n_tok:
                    return out
                a = Q8Blocks(a.q[on_amx:], a.d[on_amx:], a.s[on_amx:], a.qsum[on_amx:])
            kernels.tiles(t.quants, t.scales, t.mins, a.q, a.d, a.s, a.qsum, out[on_amx:], _NO_ROWS)
            return out
        if n_tok < plan.lanes_from:
            a = quantize_q8_32(x)
            return kernels.rows(self._w, a.q, a.d, a.s, a.qsum, out, 16)
        a = quantize_q8_32_columns(x, _round_up(n_tok, quant_kernels.LANE_MULTIPLE))
        return kernels.lanes(self._w, a.q, a.d, a.s, a.qsum, out)

    def _matmul_superblocks(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Activations in Q8_K blocks against Q4_K/Q5_K/Q6_K weights."""
        kernels, plan = self._kernels(), self._plan
        n_tok = x.shape[0]
        if self._tiles is not None:  # repacked at load: the tile kernel for every row count (plan.passes)
            natural = natural_order(self.type, self.tier)  # the activations in the tiles' order
            t, a = self._tiles, (quantize_q8_k if natural else quantize_q8_k_quads)(x)
            on_amx = self._amx_rows(n_tok)
            if on_amx:  # AMX's dots for 16 rows at a time, the same bits; the rows past them tiles_k's
                amx_superblocks.matmul(self._amx_tiles, t, a, out[:on_amx])
                if on_amx == n_tok:
                    return out
                a = Q8KBlocks(a.q[on_amx:], a.d[on_amx:], a.sum32[on_amx:])
            kernels.tiles(t.quants, t.scales, t.mins, t.sub_scales, a.q, a.d, a.sum32, out[on_amx:], _NO_ROWS)
            return out
        if n_tok < plan.lanes_from:
            a = quantize_q8_k(x)
            return kernels.rows(self._w, a.q, a.d, a.sum32, out, 16)
        if n_tok > SUPERBLOCK_LANES_PER_CALL:  # the lanes kernels' sums must stay in L2: a chunk of rows per call
            for t0 in range(0, n_tok, SUPERBLOCK_LANES_PER_CALL):
                self._matmul_superblocks(
                    x[t0 : t0 + SUPERBLOCK_LANES_PER_CALL], out[t0 : t0 + SUPERBLOCK_LANES_PER_CALL]
                )
            return out
        a = quantize_q8_k_columns(x, _round_up(n_tok, quant_kernels.LANE_MULTIPLE))
        return kernels.lanes(self._w, a.q, a.d, a.sum32, out, 16)

    def __repr__(self) -> str:
        return (
            f"Linear({self.name}, {self.type.name}, {self.out_features}x{self.in_features}, fmt={self.fmt}, "
            f"weight_bytes={self.weight_bytes:,})"
        )


class LinearStack:
    """Several layers over the same input, their outputs side by side: a fused layer whose parts differ in type."""

    def __init__(self, layers: list[Linear]):
        self.layers = layers
        self.name = "+".join(layer.name for layer in layers)
        self.fmt = layers[0].fmt
        self.in_features = layers[0].in_features
        self.out_features = sum(layer.out_features for layer in layers)
        self.weight_bytes = sum(layer.weight_bytes for layer in layers)
        self.batch_invariant = all(layer.batch_invariant for layer in layers)

    def __call__(
        self, x: np.ndarray, bias: np.ndarray | None = None, residual: np.ndarray | None = None, gelu: bool = False
    ) -> np.ndarray:
        return _epilogue(np.concatenate([layer(x) for layer in self.layers], axis=1), bias, residual, gelu)


class Embedding:
    """Token embedding rows of a GGUF tensor (vocab, dim): fmt="f32" keeps a dequantized float32 table,
    fmt="native" keeps the tensor as stored and dequantizes only the rows asked for."""

    def __init__(self, tensor: TensorInfo, fmt: str = "native"):
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"fmt must be one of {', '.join(WEIGHT_FORMATS)}, not {fmt!r}")
        self.name, self.type, self.fmt = tensor.name, tensor.type, fmt
        self.vocab_size, self.dim = tensor.shape
        if fmt == "f32":
            self._w = dequantize(tensor)
        else:
            self._w = tensor.data.reshape(self.vocab_size, -1)  # one row of blocks per token
        self.weight_bytes = owned_bytes(self._w)

    def __call__(self, token_ids: np.ndarray) -> np.ndarray:
        """(T,) token ids -> (T, dim) float32, a fresh array."""
        if self.fmt == "f32":
            return self._w[token_ids]
        rows = self._w[token_ids]
        # a read fault maps the file's cached pages around the row too: kept, a run's lookups made most of the
        # table resident (23 of 35 MiB on a 1.1B model); dropped, a step holds only what it reads
        release_pages(self._w)
        return dequantize(
            TensorInfo(name=self.name, shape=(len(token_ids), self.dim), type=self.type, data=rows.reshape(-1))
        )

    def __repr__(self) -> str:
        return f"Embedding({self.name}, {self.type.name}, {self.vocab_size}x{self.dim}, fmt={self.fmt})"


def _epilogue(out: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None, gelu: bool) -> np.ndarray:
    """out + bias, GELU'd, + residual, in place: what the i16 kernel does as it stores."""
    if gelu:
        encoder.add_bias_gelu(out, np.zeros(out.shape[1], np.float32) if bias is None else bias)
    elif bias is not None:
        out += bias
    if residual is not None:
        out += residual
    return out


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
            return start[offset : offset + sum(p.nbytes for p in parts)]
    joined = np.concatenate([p.reshape(-1) for p in parts])
    joined.flags.writeable = False  # read-only as the map's views are: one compiled variant of the kernels taking it
    return joined
