"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 weights repacked once at load into tiles of 16 rows, for the tile kernel.

The file stores a matrix row by row, each row a run of 32-value blocks. The tile kernel
(tile_kernels.py) wants the opposite: one 64-byte load giving the same 4 values of 16 rows, so
that one vpdpbusd (or vpmaddubsw on a 32-byte half) multiplies 16 (8) weight rows by 4 values of an
activation row broadcast to every row. A tile holds 16 rows; its block b is

    quants[tile, b * QUANT_BYTES:]   [quad k][row r][4 bytes]: the row's bytes 4k..4k+3 of the block
                                      (Q4_0/Q4_1/MXFP4: 4 x 64 bytes of nibbles, the low ones values
                                      4k.., the high ones 16 + 4k..; Q5_0/Q5_1: the same, then 64 bytes of
                                      5th bits, bit q of the row's byte i that of value 4q + i; Q8_0:
                                      8 x 64 bytes, each int8 + 128 for vpdpbusd, or the int8 as
                                      stored for vpmaddubsw: signed_bytes)
    scales[tile, 16 b + r]            the row's float16 d (MXFP4: its E8M0 byte e), mins[tile, 16 b + r] Q4_1's
                                      or Q5_1's float16 m

The same bytes as the file (Q8_0's flipped top bit aside, Q5's 5th bits regrouped), in another order, on every tier: llama.cpp
repacks Q4_0 for its AVX2/AVX512 kernels the same way (its "CPU_REPACK" buffers). Rows past the
matrix's end fill the last tile with zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit, prange

from miro.core.kernels.quant_blocks import HAS_FIFTH_BITS, HAS_MIN, MXFP4, Q8_0, load_u32

TILE_ROWS = 16  # weight rows per tile: one 512-bit vector of int32 sums


def quant_bytes(qtype: int) -> int:
    """A tile's bytes of quants per 32-value block."""
    return TILE_ROWS * (32 if qtype == Q8_0 else 20 if qtype in HAS_FIFTH_BITS else 16)


def _none() -> np.ndarray:
    return np.zeros((0, 0), np.uint8)


@dataclass
class Tiles:
    """A (rows, K) matrix of 32-value blocks, repacked."""

    quants: np.ndarray  # (n_tiles, n_blocks * quant_bytes) uint8
    scales: np.ndarray  # (n_tiles, n_blocks * 16) uint16, float16 bits (MXFP4: the E8M0 byte)
    mins: np.ndarray  # the same for Q4_1 and Q5_1 (K-quants: dmin; Q6_K: int32 row starts); (n_tiles, 0) for others
    signed_bytes: bool  # Q8_0: the file's int8 (else int8 + 128)
    sub_scales: np.ndarray = field(
        default_factory=_none
    )  # K-quants only (superblock_tiles.py): sub-block scales (and mins)

    @property
    def nbytes(self) -> int:
        parts = (self.quants, self.scales, self.mins, self.sub_scales)
        return sum(part.nbytes for part in parts)


def repack_blocks(qtype: int, w: np.ndarray, signed_bytes: bool) -> Tiles:
    """w (rows, n_blocks * block bytes) uint8 of a 32-value block type, as the file stores it, to tiles;
    signed_bytes: Q8_0's int8 kept as they are (for vpmaddubsw), else + 128 (for vpdpbusd). (K-quants:
    superblock_tiles.repack_superblocks.)"""
    qtype = int(qtype)
    rows = w.shape[0]
    n_blocks = w.shape[1] // GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    n_tiles = -(-rows // TILE_ROWS)
    tiles = Tiles(
        np.zeros((n_tiles, n_blocks * quant_bytes(qtype)), np.uint8),
        np.zeros((n_tiles, n_blocks * TILE_ROWS), np.uint16),
        np.zeros((n_tiles, n_blocks * TILE_ROWS if qtype in HAS_MIN else 0), np.uint16),
        signed_bytes,
    )
    flip = 0x80808080 if qtype == Q8_0 and not signed_bytes else 0
    _repack(qtype, w, tiles.quants.view(np.uint32), tiles.scales, tiles.mins, np.uint32(flip))
    return tiles


@njit(cache=True, parallel=True)
def _repack(qtype, w, quants, scales, mins, flip):
    rows = w.shape[0]
    n_tiles, n_scales = scales.shape
    n_blocks = n_scales // TILE_ROWS
    block_bytes = w.shape[1] // n_blocks
    has_min = qtype in HAS_MIN
    fifth_bits = qtype in HAS_FIFTH_BITS
    e8m0 = qtype == MXFP4  # a one-byte scale
    qh = 4 if has_min else 1 if e8m0 else 2  # Q5's 5th bits, after d (and m)
    values_at = (qh + 4) if fifth_bits else qh
    n_quads = 8 if qtype == Q8_0 else 4  # quads of the file's bytes; Q5 adds one of 5th bits
    quads_per_block = n_quads + (1 if fifth_bits else 0)
    for tile in prange(n_tiles):
        for r in range(min(TILE_ROWS, rows - tile * TILE_ROWS)):
            row = w[tile * TILE_ROWS + r]
            for b in range(n_blocks):
                off = b * block_bytes
                if e8m0:
                    scales[tile, b * TILE_ROWS + r] = np.uint16(row[off])
                else:
                    scales[tile, b * TILE_ROWS + r] = np.uint16(row[off]) | (np.uint16(row[off + 1]) << 8)
                if has_min:
                    mins[tile, b * TILE_ROWS + r] = np.uint16(row[off + 2]) | (np.uint16(row[off + 3]) << 8)
                for k in range(n_quads):  # quants is viewed as uint32: one quad of 4 bytes per element
                    quants[tile, (b * quads_per_block + k) * TILE_ROWS + r] = (
                        load_u32(row, off + values_at + 4 * k) ^ flip
                    )
                if fifth_bits:
                    quants[tile, (b * quads_per_block + n_quads) * TILE_ROWS + r] = _fifth_bits_by_quad(
                        load_u32(row, off + qh)
                    )


@njit(inline="always")
def _fifth_bits_by_quad(high_bits):
    """The file's 32 5th bits (bit v: value v's) regrouped: byte i's bit q is value 4q + i's, so that quad q's
    4 bytes take theirs with one shift and mask."""
    out = np.uint32(0)
    for i in range(4):
        for q in range(8):
            out |= ((high_bits >> np.uint32(4 * q + i)) & np.uint32(1)) << np.uint32(8 * i + q)
    return out
