"""One row per GGML weight type: everything miro knows about a type, in one place (ggml's `type_traits` and
`type_traits_cpu` together).

A row (`WeightType`) holds:

- the block as the file stores it: values and bytes per block (gguf's GGML_QUANT_SIZES; floats: 1 value);
- `dequantize`: a run of whole blocks (uint8) to their float32 values (fmt="f32", "bf16", "i16", and the
  embedding lookup); `dequantize(tensor)` below applies it to a tensor;
- `activations`: the form the native kernels take the activations in: "f32" (as they are), "q8_0" (32-value
  blocks: Q8_0's int8 and float16 scale, with Q8_1's sums; activations.quantize_q8_32*) or "q8_k" (256-value
  Q8_K blocks; activations.quantize_q8_k*);
- `kernels`: its kernel family, the factory of each loop shape (rows: a weight row at a time; lanes: each
  block decoded once for many activation rows; tiles: 16-row tiles on tiers with int8 dots) and the repacking
  into tiles (tiles.py, superblock_tiles.py: the memory layout when repacked); grouped: a mixture's chosen
  experts, each over its rows, in one call over a 3-D expert tensor's tiles (grouped_experts.py). `F32_FALLBACK` (None) says the
  type has no native kernel: Linear(fmt="native") refuses it and the loader keeps its matrices as f32;
- `tile_tokens`: activation rows per pass of its tile kernel, by the tier's vector width (empty: never tiled);
  the rows past the last full pass take 2 a pass and the last one alone, in the same call (tile_kernels.py);
- `speedup`: the native kernels' measured throughput over the float32 copy's, per measured tier
  (weight_format's auto).

`plan(tier)` says how the type's tensors are stored and which kernel takes how many activation rows on a tier
(`WeightKernels`), `kernels_on(tier)` the compiled kernels. Every tier `cpu.TIERS` names gets a native kernel
for every row with a family: tests/core/test_weight_types.py walks the table and fails where one is missing.

Adding a type (DESIGN.md, "Weight types: one table"): its row here; its kernels (the block's decoding in
quant_blocks.py and the branches of the factories of its family, or a family of its own); its repacking
(tiles.py or superblock_tiles.py) where it is tiled; its measured speed-up (benchmarks/weight_speeds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from miro.core.loading.gguf_file import TensorInfo
from miro.core.kernels import (
    float_kernels,
    grouped_experts,
    grouped_superblocks,
    quant_kernels,
    superblock_kernels,
    tile_kernels,
)
from miro.core.kernels.cpu import Tier
from miro.core.kernels.int8_dots import tile_signed_bytes
from miro.core.kernels.superblock_tiles import expert_byte_values, natural_order, repack_superblocks
from miro.core.kernels.tiles import Tiles, repack_blocks

F32_FALLBACK = None  # a row's `kernels` when the type has no native kernel: its matrices are kept as f32
LANES_FROM = 8  # the rows layout (portable tier): from this many activation rows the lanes kernel beats row by row


# ---------------------------------------------------------------- dequantizers


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    return raw.reshape(-1, block_bytes)


def _scale(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 field at byte `start` of each block, as a float32 column."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Unpack 16 bytes per block into 32 values: low nibbles are elements 0-15, high 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


# Q4_0, Q4_1 and Q8_0 (the default model's types) in vectorised numpy: about twice as fast as gguf-py's
# generic code and bitwise equal to it; the other types through gguf.quants.dequantize.
def _q4_1(raw: np.ndarray) -> np.ndarray:
    blocks = _blocks(raw, 20)
    return _scale(blocks, 0) * _nibbles(blocks[:, 4:]) + _scale(blocks, 2)


def _q4_0(raw: np.ndarray) -> np.ndarray:
    blocks = _blocks(raw, 18)
    return (_nibbles(blocks[:, 2:]) - np.float32(8)) * _scale(blocks, 0)


def _q8_0(raw: np.ndarray) -> np.ndarray:
    blocks = _blocks(raw, 34)
    return blocks[:, 2:].view(np.int8).astype(np.float32) * _scale(blocks, 0)


def _f32(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float32)


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float16).astype(np.float32)


def _gguf(qtype: Q, raw: np.ndarray) -> np.ndarray:
    return quants.dequantize(raw, qtype)


# ---------------------------------------------------------------- kernel families


def _repack_blocks32(qtype: int, w: np.ndarray, tier: Tier) -> Tiles:
    return repack_blocks(qtype, w, tile_signed_bytes(qtype, tier.has_vnni))


def _repack_superblocks(qtype: int, w: np.ndarray, tier: Tier) -> Tiles:
    return repack_superblocks(qtype, w, natural_order(qtype, tier))


def _repack_expert_superblocks(qtype: int, w: np.ndarray, tier: Tier) -> Tiles:
    return repack_superblocks(qtype, w, natural_order(qtype, tier), expert_byte_values(qtype, tier))


def _float_kernel(qtype: int):
    return float_kernels.matmul_float  # one kernel for the three float types, the type an argument


@dataclass(frozen=True)
class KernelFamily:
    """The kernels of the types that share a block structure: factories that the rows call with their type."""

    name: str
    rows: Callable  # qtype -> kernel: one weight row at a time; few activation rows on the rows layout (every tier)
    lanes: Callable | None  # qtype -> kernel: each block decoded once for many activation rows (rows layout)
    tiles: Callable | None  # (qtype, tier, tokens) -> kernel over 16-row tiles, on tiers with int8 dots
    repack: Callable | None  # (qtype, w, tier) -> Tiles: the file's rows repacked for `tiles`
    grouped: Callable | None = None  # (qtype, tier, tokens) -> kernel over a 3-D expert tensor's tiles: every
    #                                  chosen expert times its rows in one call (grouped_experts.py)
    repack_experts: Callable | None = None  # (qtype, w, tier) -> Tiles for `grouped`, where not `repack`'s

    def repack_for_experts(self, qtype: int, w: np.ndarray, tier: Tier) -> Tiles:
        """An expert tensor's rows (E x rows, blocks) repacked for the grouped kernel."""
        return (self.repack_experts or self.repack)(qtype, w, tier)


# float32 activations: each weight row widened once per call (float_kernels.py), on every tier
FLOATS = KernelFamily("floats", _float_kernel, None, None, None)
# 32-value blocks against Q8_0 activations: quant_kernels.py's rows and lanes, tile_kernels.tiles_32 over tiles.py
BLOCKS_32 = KernelFamily(
    "blocks32",
    quant_kernels.rows_32,
    quant_kernels.lanes_32,
    tile_kernels.tiles_32,
    _repack_blocks32,
    grouped_experts.grouped_32,
)
# K-quant super-blocks against Q8_K activations: quant_kernels.py's rows and lanes, superblock_kernels.tiles_k over
# superblock_tiles.py
SUPERBLOCKS = KernelFamily(
    "superblocks",
    quant_kernels.rows_k,
    quant_kernels.lanes_k,
    superblock_kernels.tiles_k,
    _repack_superblocks,
    grouped_superblocks.grouped_k,
    _repack_expert_superblocks,
)


# ---------------------------------------------------------------- the rows


@dataclass(frozen=True)
class WeightKernels:
    """How a weight type is stored and multiplied on one tier (WeightType.plan)."""

    layout: str  # "tiles": repacked at load into 16-row tiles (tiles.py, superblock_tiles.py), the tile kernel
    #              at every row count; "rows": the file's rows, memory-mapped (the portable tier; float types)
    lanes_from: int  # "rows": from this many activation rows, the lanes kernel (each block decoded once for
    #                  all rows, quant_kernels.py); below, row by row
    tile_tokens: int  # "tiles": activation rows per pass of the tile kernel (WeightType.tile_tokens); rows past
    #                   the last multiple of it take 2 a pass, then 1 (padding 1 row to 8 would do 8 times the work)
    mid_passes: tuple[int, ...] = ()  # "tiles": rows per pass between tile_tokens and 2, largest first
    #                                  (superblock_kernels.mid_passes: the K-quants' 8 and 4)

    def passes(self, n_rows: int) -> list[int]:
        """The activation rows of each pass of the tile kernel over n_rows, in order (as tile_kernels.py and superblock_kernels.py run them)."""
        full = n_rows // self.tile_tokens if self.tile_tokens else 0
        rest = n_rows - full * self.tile_tokens
        rows = [self.tile_tokens] * full
        for size in (*self.mid_passes, 2, 1):
            rows += [size] * (rest // size)
            rest %= size
        return rows


_ROWS = WeightKernels("rows", LANES_FROM, 0)


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class WeightType:
    """Everything miro knows about one GGML weight type (the module's docstring)."""

    qtype: Q
    block_values: int  # values per block (1 for the float types)
    block_bytes: int  # bytes per block as the file stores it
    dequantize: Callable[[np.ndarray], np.ndarray]  # a run of whole blocks (uint8) -> their float32 values
    activations: str  # "f32", "q8_0" or "q8_k": what the native kernels take (the module's docstring)
    kernels: KernelFamily | None  # its kernel family; F32_FALLBACK (None): no native kernel
    tile_tokens: Mapping[int, int] = field(default_factory=dict)  # vector width -> activation rows per tile pass
    speedup: Mapping[str, float] = field(default_factory=dict)  # measured tier -> native / f32 throughput
    # activation rows from which a layer takes AMX int8 dots where AMX runs (16 rows at a time, the same bits; the
    # rows past them and smaller calls the VNNI tile kernel's); 0: never. amx_tiles.py, one core, TinyLlama's and
    # SmolLM2's shapes (stop 48): Q4_1 from 16, 1.2-1.5x its VNNI tile kernel at 32-64 rows, 0.93-1.25x at 16;
    # Q4_0 and Q8_0 from 32, 1.0-1.23x at 32-64 rows, 0.83-1.08x (Q4_0) and 0.97-1.26x (Q8_0) at 16, 0.87-1.27x
    # at 512. Q4_K, Q5_K, Q6_K (amx_superblocks.py) from 32 (at 16 their weight digits serve too few rows),
    # 1.3-2x tiles_k at 64-512 rows
    amx_from: int = 0

    def __post_init__(self):
        object.__setattr__(self, "tile_tokens", _frozen(self.tile_tokens))
        object.__setattr__(self, "speedup", _frozen(self.speedup))

    @property
    def name(self) -> str:
        return self.qtype.name

    @property
    def is_float(self) -> bool:
        return self.block_values == 1

    @property
    def native(self) -> bool:
        return self.kernels is not F32_FALLBACK

    def tiled_on(self, tier: Tier) -> bool:
        return bool(tier.int8_dot) and self.native and self.kernels.tiles is not None

    def grouped_on(self, tier: Tier) -> bool:
        """Whether a mixture's experts of this type run through the grouped kernel on `tier` (tiled there)."""
        return self.tiled_on(tier) and self.kernels.grouped is not None

    def plan(self, tier: Tier) -> WeightKernels:
        """How this type's tensors are stored on `tier` and which kernel takes how many activation rows."""
        if not self.tiled_on(tier):
            return _ROWS
        if tier.vector_bits not in self.tile_tokens:
            raise ValueError(
                f"{self.name} has no tile kernel shape for the {tier.name} tier's "
                f"{tier.vector_bits}-bit vectors (weight_types.py: its row's tile_tokens)"
            )
        mid = superblock_kernels.mid_passes(int(self.qtype), tier) if self.kernels is SUPERBLOCKS else ()
        return WeightKernels("tiles", 0, self.tile_tokens[tier.vector_bits], mid)

    def kernels_on(self, tier: Tier) -> Kernels:
        """The kernels of this type on `tier`, made on first use (numba compiles or loads them from its cache
        on first call)."""
        key = (int(self.qtype), tier.name)
        if key not in _KERNELS:
            _KERNELS[key] = Kernels(self, tier)
        return _KERNELS[key]


class Kernels:
    """The loop shapes compiled for one weight type on one CPU tier: rows(...) for few activation rows (the float
    types' one kernel), lanes(...) for many; tiles(...) on tiers with int8 dots (any number of activation rows:
    plan(tier).passes), else None. Which one a call takes is the row's plan(tier)."""

    def __init__(self, weight_type: WeightType, tier: Tier):
        family, qtype = weight_type.kernels, int(weight_type.qtype)
        self.rows = family.rows(qtype)
        self.lanes = family.lanes(qtype) if family.lanes is not None else None
        self.tiles = self.grouped = None
        if weight_type.tiled_on(tier):
            self.tiles = family.tiles(qtype, tier, weight_type.plan(tier).tile_tokens)
        if weight_type.grouped_on(tier):
            self.grouped = family.grouped(qtype, tier, weight_type.plan(tier).tile_tokens)


_KERNELS: dict[tuple[int, str], Kernels] = {}

# Activation rows per pass of the tile kernels, by vector width. 32-value blocks measured on 2048 x 2048 matrices,
# 2 Zen 4 cores (benchmarks/quant_linear.py): what the registers hold, 8 on 512-bit tiers, 2 on 256-bit ones. The
# K-quant kernel keeps a call's weight vectors in registers and its int32 sums in memory, so its rows per pass are
# free of registers: 16 ran 1.08-1.38x 4 (AVX2: Q4_K, Q6_K), 1.09-1.19x 8 (AVX-512 Q6_K) and 1.02-1.11x 8 with two
# tiles a pass (AVX-512 Q4_K) from 16 rows on; Q5_K kept 8 on AVX-512, where 16 was 0.79-1.10x. One Zen 4 core,
# old and new interleaved. With the values' order on 512-bit VNNI tiers (superblock_tiles.natural_order) Q5_K's
# 16 ran 1.2-1.3x its 8 at 64 rows (one Xeon core, shared), so 16 there too.
_BLOCK32_TILE_TOKENS = {512: 8, 256: 2}

# The table. `speedup`: native kernels' throughput over the float32 copy's (the batch-invariant GEMM), at 64 rows
# of 2048 x 2048: `python benchmarks/weight_speeds.py [--tier avx2]`, 2 Zen 4 cores, the mean of two runs (each
# the median of 15 pairs). Tiers not measured take the nearest measured one's (weight_format.TABLE_OF); a type
# without a figure counts as f32-speed (1.0).
_ROWS_OF_THE_TABLE = (
    WeightType(Q.F32, 1, 4, _f32, "f32", FLOATS),
    WeightType(Q.F16, 1, 2, _f16, "f32", FLOATS, speedup={"avx512-vnni": 0.4, "avx2": 0.62}),
    WeightType(Q.BF16, 1, 2, partial(_gguf, Q.BF16), "f32", FLOATS),
    WeightType(
        Q.Q8_0,
        32,
        34,
        _q8_0,
        "q8_0",
        BLOCKS_32,
        _BLOCK32_TILE_TOKENS,
        speedup={"avx512-vnni": 2.32, "avx2": 1.29},
        amx_from=32,
    ),
    WeightType(
        Q.Q4_0,
        32,
        18,
        _q4_0,
        "q8_0",
        BLOCKS_32,
        _BLOCK32_TILE_TOKENS,
        speedup={"avx512-vnni": 2.46, "avx2": 1.89},
        amx_from=32,
    ),
    WeightType(
        Q.Q4_1,
        32,
        20,
        _q4_1,
        "q8_0",
        BLOCKS_32,
        _BLOCK32_TILE_TOKENS,
        speedup={"avx512-vnni": 2.4, "avx2": 1.91},
        amx_from=16,
    ),
    WeightType(
        Q.Q5_0,
        32,
        22,
        partial(_gguf, Q.Q5_0),
        "q8_0",
        BLOCKS_32,
        _BLOCK32_TILE_TOKENS,
        speedup={"avx512-vnni": 2.27, "avx2": 1.35},
    ),
    WeightType(
        Q.Q5_1,
        32,
        24,
        partial(_gguf, Q.Q5_1),
        "q8_0",
        BLOCKS_32,
        _BLOCK32_TILE_TOKENS,
        speedup={"avx512-vnni": 2.18, "avx2": 1.35},
    ),
    # MXFP4 (gpt-oss's experts): 32 E2M1 values and an E8M0 exponent; Q8_0 activations as ggml's vec_dot_type
    WeightType(Q.MXFP4, 32, 17, partial(_gguf, Q.MXFP4), "q8_0", BLOCKS_32, _BLOCK32_TILE_TOKENS),
    WeightType(
        Q.Q4_K,
        256,
        144,
        partial(_gguf, Q.Q4_K),
        "q8_k",
        SUPERBLOCKS,
        {512: 16, 256: 16},
        speedup={"avx512-vnni": 1.69, "avx2": 2.01},
        amx_from=32,
    ),
    WeightType(
        Q.Q5_K,
        256,
        176,
        partial(_gguf, Q.Q5_K),
        "q8_k",
        SUPERBLOCKS,
        {512: 16, 256: 16},
        speedup={"avx512-vnni": 1.61, "avx2": 1.8},
        amx_from=32,
    ),
    WeightType(
        Q.Q6_K,
        256,
        210,
        partial(_gguf, Q.Q6_K),
        "q8_k",
        SUPERBLOCKS,
        {512: 16, 256: 16},
        speedup={"avx512-vnni": 1.53, "avx2": 1.53},
        amx_from=32,
    ),
)

WEIGHT_TYPES: Mapping[Q, WeightType] = MappingProxyType({row.qtype: row for row in _ROWS_OF_THE_TABLE})

# derived lists, for the checks that ask "is it one of"
SUPPORTED_TYPES = tuple(WEIGHT_TYPES)  # the types miro loads (dequantizes): the loaders refuse the rest
FLOAT_TYPES = tuple(t for t, row in WEIGHT_TYPES.items() if row.is_float)  # what a norm weight may be
NATIVE_TYPES = tuple(int(t) for t, row in WEIGHT_TYPES.items() if row.native)  # fmt="native" multiplies these


def dequantize(tensor: TensorInfo) -> np.ndarray:
    """A float32 array of `tensor.shape` (C-contiguous) holding the tensor's values."""
    row = WEIGHT_TYPES.get(tensor.type)  # a type miro does not support: gguf-py's code, for what may ask
    values = row.dequantize(tensor.data) if row is not None else quants.dequantize(tensor.data, tensor.type)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(tensor.shape)
