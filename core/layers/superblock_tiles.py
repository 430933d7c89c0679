"""Q4_K, Q5_K and Q6_K weights repacked once at load into tiles of 16 rows, for the K-quant tile kernel.

ggml's reference dot (ggml_vec_dot_q4_K_q8_K_generic and its siblings) keeps 8 integer lanes per
256-value super-block, value e in lane e % 8, each value times its sub-block's scale, and 8 float sums per
row, added together only at the end. A tile keeps those lanes apart: one 64-byte vector gives, for 16
rows, 4 values of one lane l of one 32-value sub-block S, "quad (S, l)": values 32 S + l + 8 i, i < 4.
vpmaddubsw turns it into int16 pairs (values i = 0, 1 and i = 2, 3) and vpmaddwd by the sub-block
scales into lane l's exact int32 sum. The activations come in the same order (activations.py,
quantize_q8_k_quads), so a quad of them is one 4-byte broadcast.

A tile holds 16 rows; super-block sb, lane l of it is LANE_BYTES bytes at
quants[tile, (8 sb + l) * LANE_BYTES:], each vector [row r][byte i], byte i holding value i of the quad:

    Q4_K (256 B)  4 nibble vectors c: low nibbles quad (2c, l), high nibbles quad (2c + 1, l)
    Q5_K (320 B)  the same, then one vector of 5th bits: bit S of byte i is quad (S, l)'s
    Q6_K (384 B)  4 nibble vectors c = 0..3 for the sub-block pairs (0, 2), (1, 3), (4, 6), (5, 7), low
                  nibbles the first; then 2 vectors h of high bits: bits 2q, 2q + 1 of byte i are
                  quad (4h + q, l)'s

and per row r: scales[tile, 16 sb + r] its float16 d, mins[tile, 16 sb + r] its dmin (Q4_K, Q5_K);
sub_scales[tile, (SUB * sb + j) * 16 + r] sub-block j's scale (uint8 6-bit for Q4_K/Q5_K, SUB = 8;
int8 as stored for Q6_K's 16-value sub-blocks, SUB = 16), sub_mins the same for the 6-bit mins.
Each of these is a byte of the file moved, so a tile takes the file's bytes (Q4_K/Q5_K's 12 packed bytes
of scales and mins become 16). Q6_K's tiles add offsets[tile, (8 sb + l) * 16 + r], int32: 128 x the sum
of sc x (q - 32) over lane l, what its kernel's biased activations add (int8_dots.superblock_tile_dot),
512 bytes per 3,360 of a tile's super-block. Rows past the matrix's end fill the last tile with zeros.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit, prange

from .quant_blocks import Q4_K, Q5_K, Q6_K, decode_superblock, scale_min_k4

TILE_ROWS = 16
LANE_BYTES = {Q4_K: 4 * 64, Q5_K: 5 * 64, Q6_K: 6 * 64}  # a tile's bytes of quants per super-block and lane


def sub_blocks(qtype: int) -> int:
    """Sub-blocks, each with its own scale, per super-block."""
    return 16 if qtype == Q6_K else 8


def repack_superblocks(qtype: int, w: np.ndarray):
    """w (rows, n_super * block bytes) uint8, as the file stores it, to a Tiles (tiles.py)."""
    from .tiles import Tiles  # tiles.py hands K-quants to this module

    qtype = int(qtype)
    rows = w.shape[0]
    n_super = w.shape[1] // GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]
    n_tiles = -(-rows // TILE_ROWS)
    n_sub = sub_blocks(qtype)
    has_mins = qtype != Q6_K
    tiles = Tiles(np.zeros((n_tiles, n_super * 8 * LANE_BYTES[qtype]), np.uint8),
                  np.zeros((n_tiles, n_super * TILE_ROWS), np.uint16),
                  np.zeros((n_tiles, n_super * TILE_ROWS if has_mins else 0), np.uint16), False,
                  np.zeros((n_tiles, n_super * n_sub * TILE_ROWS), np.uint8),
                  np.zeros((n_tiles, n_super * n_sub * TILE_ROWS if has_mins else 0), np.uint8),
                  np.zeros((n_tiles, 0 if has_mins else n_super * 8 * TILE_ROWS), np.int32))
    _repack(qtype, w, tiles.quants, tiles.scales, tiles.mins, tiles.sub_scales, tiles.sub_mins, tiles.offsets,
            LANE_BYTES[qtype])
    return tiles


@njit(cache=True, parallel=True)
def _repack(qtype, w, quants, scales, mins, sub_scales, sub_mins, offsets, lane_bytes):
    rows = w.shape[0]
    n_tiles, n_scales = scales.shape
    n_super = n_scales // TILE_ROWS
    block_bytes = w.shape[1] // n_super
    for tile in prange(n_tiles):
        values = np.empty(256, np.int16)
        no_mins = np.empty(8, np.int32)
        for r in range(min(TILE_ROWS, rows - tile * TILE_ROWS)):
            row = w[tile * TILE_ROWS + r]
            for sb in range(n_super):
                off = sb * block_bytes
                at = sb * TILE_ROWS + r
                if qtype == Q6_K:
                    scales[tile, at] = np.uint16(row[off + 208]) | (np.uint16(row[off + 209]) << 8)
                    for j in range(16):
                        sub_scales[tile, (16 * sb + j) * TILE_ROWS + r] = row[off + 192 + j]
                    decode_superblock(qtype, row, off, values, no_mins, 16)  # sc x (q - 32)
                    for lane in range(8):
                        total = 0
                        for e in range(lane, 256, 8):
                            total += values[e]
                        offsets[tile, (8 * sb + lane) * TILE_ROWS + r] = 128 * total
                else:
                    scales[tile, at] = np.uint16(row[off]) | (np.uint16(row[off + 1]) << 8)
                    mins[tile, at] = np.uint16(row[off + 2]) | (np.uint16(row[off + 3]) << 8)
                    for j in range(8):
                        sc, mn = scale_min_k4(j, row, off + 4)
                        sub_scales[tile, (8 * sb + j) * TILE_ROWS + r] = sc
                        sub_mins[tile, (8 * sb + j) * TILE_ROWS + r] = mn
                for lane in range(8):
                    base = (8 * sb + lane) * lane_bytes + 4 * r
                    for i in range(4):
                        j = lane + 8 * i  # value j of a sub-block (of a half, for Q6_K)
                        for c in range(4):
                            if qtype == Q6_K:  # ql bytes 64 h + 32 (c % 2) + j, h = c // 2
                                byte = row[off + 64 * (c // 2) + 32 * (c % 2) + j]
                            else:
                                byte = row[off + (16 if qtype == Q4_K else 48) + 32 * c + j]
                            quants[tile, base + 64 * c + i] = byte
                        if qtype == Q5_K:
                            quants[tile, base + 256 + i] = row[off + 16 + j]
                        if qtype == Q6_K:
                            quants[tile, base + 256 + i] = row[off + 128 + j]
                            quants[tile, base + 320 + i] = row[off + 160 + j]
