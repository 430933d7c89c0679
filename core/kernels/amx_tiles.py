"""The tile kernel's integer dots on AMX (amx.py): Q4_0, Q4_1 and Q8_0 tiles (tiles.py) times 16 activation rows at a
time, each block's exact int32 sums by one TDPBSUD (Q4_0's by TDPBSSD), then tile_steps.py's float steps, so the same bits.

Per 16-row weight tile, 16 activation rows at a time, per 32-value block b:

- C (tmm0-3 in turn) = A (16 activation rows x 32 int8, from `a` as it is, tmm4-5) times B (the tile's block:
  8 quads x 16 rows x 4 bytes, tmm6-7: Q4's nibbles unpacked once per tile and block of tokens into a per-thread
  copy by 64-byte vectors, `b_tile`, Q4_1's unsigned, Q4_0's as q - 8, signed; Q8_0's bytes + 128 as the tile
  holds them), stored to a per-thread buffer. Q4_0's C tiles begin at tile_steps' float bias (loaded from a tile
  of it), so its sums need no per-token offset added (tiles_32's start: the offset x the activations' sum, and
  the bias): a broadcast load and an add less per float step, 10-20% less time at 32-512 rows;
- three blocks later (the TDPBSUD's and the store's latency hidden behind the float steps of the blocks before),
  each activation row's 16 sums are read back and given tile_steps.float_step, into 16 float sums held in registers.

The per-thread buffers (the B tiles, the C tiles' sums) start on cache lines (a 64-byte tile row in one line, not
two; amx_superblocks.py measured 2x swings without it), and a part takes its tokens in blocks of A_BYTES (1 MiB,
half a core's L2) over all its tiles, so that at K = 5632 the activations stay in L2. The rows past the last
multiple of 16, and calls of fewer than the table's `amx_from` rows, are the VNNI tile kernel's
(Linear._matmul_block32). On one core of this AMX host (Sapphire Rapids class, shared), SmolLM2's and
TinyLlama's shapes, Q4_1 measured 1.2-1.45x the VNNI kernel at 64 rows, Q4_0 and Q8_0 1.1-1.3x at 64 and about
equal (0.8-1.4x, noisy) at 16. Not more: the tile loads and stores do not overlap the float steps (the AMX
instructions alone and the float steps alone each took about half the time of both together), and the float
steps, 3 to 5 instructions per 16 weight rows, block and activation row, are ggml's arithmetic.
"""

from __future__ import annotations


import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core.extending import intrinsic

from miro.core.kernels import amx
from miro.core.kernels.amx import (
    aligned,
    tile_dpbs,
    tile_load,
    tile_load_config,
    tile_release,
    tile_store,
    tile_zero,
)
from miro.core.kernels.cache_key import HELPERS, cached_variant
from miro.core.kernels.cpu import Tier
from miro.core.kernels.quant_blocks import Q4_0, Q4_1, Q8_0
from miro.core.kernels.simd import load16, load16_f16, zeros16
from miro.core.kernels.tile_steps import FLOAT_BIAS, float_bias_bits, float_step, store_tile_row, tile_constants
from miro.core.kernels.tiles import TILE_ROWS

AMX_TYPES = (Q4_0, Q4_1, Q8_0)  # the types this kernel multiplies
ROWS = 16  # activation rows per A tile
CONFIG = amx.config_bytes_blocks32()  # C 16 x 16 int32, A 16 rows x 32 bytes, B 8 rows x 64 bytes
LAG = 3  # blocks between a block's product and its float steps (4 C tiles in turn)
A_BYTES = 1 << 20  # activation bytes a part takes over all its tiles before the next, in L2 (2 MB a core)
B_BYTES = 512  # one block's B tile: 8 quads x 16 weight rows x 4 bytes


def runs_on(tier: Tier) -> bool:
    """Whether the AMX kernel runs on this tier here: a VNNI tile layout, and AMX int8 ready (amx.ready: the CPU, the
    compile target and the kernel's permission, and MIRO_AMX not 0)."""
    return tier.has_vnni and tier.vector_bits == 512 and amx.ready()


def usable(qtype: int, tier: Tier) -> bool:
    """Whether a layer of this type on this tier takes an AMX kernel (amx_kernels.kernel) for its rows in whole A tiles: its
    row of the weight-type table says so (`amx_from`, the fewest rows it takes it for, 0: never) and AMX runs
    here."""
    from miro.core.kernels.weight_types import WEIGHT_TYPES  # the table imports the kernels, not this module

    row = WEIGHT_TYPES.get(int(qtype))
    return row is not None and row.amx_from > 0 and runs_on(tier)


def amx_tiles_32(qtype: int, tier: Tier):
    """kernel(quants, scales, mins, a, d, s, qsum, out, config, threads): tile_kernels.tiles_32's product for the
    first rows of a, as many as out has (a multiple of 16); None for other types or where it does not run."""
    if int(qtype) not in AMX_TYPES or not runs_on(tier):
        return None
    amx.require()
    has_min, offset, block_quants, vnni, e8m0 = tile_constants(qtype, tier)
    # Q4_0: B holds q - 8 (signed, TDPBSSD) and each product begins at the float bias (a C tile loaded from
    # `bias`), so no sum needs a token's offset added: the same integers, one add and one load less a float step
    centred = qtype == Q4_0
    float_bias = float_bias_bits(qtype)
    begins = not centred and offset != 0  # Q8_0's: its tiles hold q + 128 (the float bias is Q4_0's alone)
    nibbles = qtype != Q8_0
    helpers = HELPERS

    @cached_variant(f"{GGMLQuantizationType(qtype).name}_{tier.name.replace('-', '_')}_amx", parallel=True)
    def matmul_amx_32(quants, scales, mins, a, d, s, qsum, out, config, threads):
        """out (T16, N) = the tiles of N rows times the first T16 rows of a (T, K) int8; d, s, qsum (T, K / 32)."""
        helpers  # in numba's cache key: see cache_key.py
        n_tok = out.shape[0]
        k = a.shape[1]
        n_blocks = k // 32
        n_tiles = quants.shape[0]
        start = np.zeros(n_tok * n_blocks if begins else 1, np.int32)  # tiles_32's: where the integer sums begin
        if begins:
            for t in range(n_tok):
                for b in range(n_blocks):
                    start[t * n_blocks + b] = offset * qsum[t, b]
        token_block = max(ROWS, A_BYTES // k // ROWS * ROWS)  # rows: fewer re-read the weights more often
        a_stride = np.int64(k)
        w_stride = np.int64(64)
        c_stride = np.int64(TILE_ROWS * 4)
        parts = max(1, min(threads, n_tiles))
        # each part's scratch on cache lines (a B tile's row of 64 bytes in one line, not two): Q4's unpacked B tiles,
        # the 4 C tiles' int32 sums ([tile][row][weight row]). Q8_0's B tiles are its tiles as they are, on cache
        # lines or not: a copy onto them took 1.5x the time at 16 rows (88 KB at K = 5632, out of L1)
        b_bytes = n_blocks * B_BYTES if nibbles else 0
        scratch_bytes = b_bytes + 4 * 4 * ROWS * TILE_ROWS
        all_scratch = aligned(parts * scratch_bytes)
        all_spill = np.empty((parts, TILE_ROWS), np.float32)
        bias = aligned(4 * ROWS * TILE_ROWS if centred else 0).view(np.int32)  # a C tile of the float bias's bits
        bias[:] = float_bias
        for part in prange(parts):
            first, last = part * n_tiles // parts, (part + 1) * n_tiles // parts
            scratch = all_scratch[part * scratch_bytes : (part + 1) * scratch_bytes]
            unpacked = scratch[:b_bytes]
            sums = scratch[b_bytes:].view(np.int32)
            spill = all_spill[part]
            tile_load_config(config)
            for t0 in range(0, n_tok, token_block):  # its activations stay in L2 over the part's tiles
                for tile in range(first, last):
                    tile_quants, tile_scales, tile_mins = quants[tile], scales[tile], mins[tile]
                    if nibbles:  # Q4: quads k (low nibbles) and k + 4 (high) of each block, B's 8 rows of 64 bytes
                        for b in range(n_blocks):
                            b_tile(tile_quants, block_quants * b, unpacked, B_BYTES * b, nibbles, centred)
                    weights = unpacked if nibbles else tile_quants
                    n0 = tile * TILE_ROWS
                    for g in range(t0, min(n_tok, t0 + token_block), ROWS):
                        a0 = np.int64(g) * a_stride
                        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zeros16()
                        c8 = c9 = c10 = c11 = c12 = c13 = c14 = c15 = zeros16()
                        for step in range(n_blocks + LAG):
                            if step < n_blocks:  # block `step`'s product into C tile step % 4, stored
                                w_at = np.int64(512 * step)
                                a_at = a0 + 32 * step
                                which = step % 4
                                if which == 0:
                                    _begin_tile(0, bias, centred)
                                    tile_load(4, a, a_at, a_stride)
                                    tile_load(6, weights, w_at, w_stride)
                                    tile_dpbs(0, 4, 6, centred)  # centred Q4_0's q - 8 signed
                                    tile_store(0, sums, np.int64(0), c_stride)
                                elif which == 1:
                                    _begin_tile(1, bias, centred)
                                    tile_load(5, a, a_at, a_stride)
                                    tile_load(7, weights, w_at, w_stride)
                                    tile_dpbs(1, 5, 7, centred)
                                    tile_store(1, sums, np.int64(1024), c_stride)
                                elif which == 2:
                                    _begin_tile(2, bias, centred)
                                    tile_load(4, a, a_at, a_stride)
                                    tile_load(6, weights, w_at, w_stride)
                                    tile_dpbs(2, 4, 6, centred)
                                    tile_store(2, sums, np.int64(2048), c_stride)
                                else:
                                    _begin_tile(3, bias, centred)
                                    tile_load(5, a, a_at, a_stride)
                                    tile_load(7, weights, w_at, w_stride)
                                    tile_dpbs(3, 5, 7, centred)
                                    tile_store(3, sums, np.int64(3072), c_stride)
                            if step >= LAG:  # the float steps of block step - LAG, row after row
                                b = step - LAG
                                at = ROWS * TILE_ROWS * (b % 4)
                                dw = load16_f16(tile_scales, 16 * b)
                                mw = load16_f16(tile_mins, 16 * b) if has_min else dw
                                dw_bias = dw * -FLOAT_BIAS if float_bias else dw
                                s0 = g * n_blocks + b  # row g's block b in start
                                c0 = float_step(
                                    qtype, c0, _sum(sums, at, start, s0, begins), dw, dw_bias, mw, d[g, b], s[g, b]
                                )
                                c1 = float_step(
                                    qtype,
                                    c1,
                                    _sum(sums, at + 16, start, s0 + n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 1, b],
                                    s[g + 1, b],
                                )
                                c2 = float_step(
                                    qtype,
                                    c2,
                                    _sum(sums, at + 32, start, s0 + 2 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 2, b],
                                    s[g + 2, b],
                                )
                                c3 = float_step(
                                    qtype,
                                    c3,
                                    _sum(sums, at + 48, start, s0 + 3 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 3, b],
                                    s[g + 3, b],
                                )
                                c4 = float_step(
                                    qtype,
                                    c4,
                                    _sum(sums, at + 64, start, s0 + 4 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 4, b],
                                    s[g + 4, b],
                                )
                                c5 = float_step(
                                    qtype,
                                    c5,
                                    _sum(sums, at + 80, start, s0 + 5 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 5, b],
                                    s[g + 5, b],
                                )
                                c6 = float_step(
                                    qtype,
                                    c6,
                                    _sum(sums, at + 96, start, s0 + 6 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 6, b],
                                    s[g + 6, b],
                                )
                                c7 = float_step(
                                    qtype,
                                    c7,
                                    _sum(sums, at + 112, start, s0 + 7 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 7, b],
                                    s[g + 7, b],
                                )
                                c8 = float_step(
                                    qtype,
                                    c8,
                                    _sum(sums, at + 128, start, s0 + 8 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 8, b],
                                    s[g + 8, b],
                                )
                                c9 = float_step(
                                    qtype,
                                    c9,
                                    _sum(sums, at + 144, start, s0 + 9 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 9, b],
                                    s[g + 9, b],
                                )
                                c10 = float_step(
                                    qtype,
                                    c10,
                                    _sum(sums, at + 160, start, s0 + 10 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 10, b],
                                    s[g + 10, b],
                                )
                                c11 = float_step(
                                    qtype,
                                    c11,
                                    _sum(sums, at + 176, start, s0 + 11 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 11, b],
                                    s[g + 11, b],
                                )
                                c12 = float_step(
                                    qtype,
                                    c12,
                                    _sum(sums, at + 192, start, s0 + 12 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 12, b],
                                    s[g + 12, b],
                                )
                                c13 = float_step(
                                    qtype,
                                    c13,
                                    _sum(sums, at + 208, start, s0 + 13 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 13, b],
                                    s[g + 13, b],
                                )
                                c14 = float_step(
                                    qtype,
                                    c14,
                                    _sum(sums, at + 224, start, s0 + 14 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 14, b],
                                    s[g + 14, b],
                                )
                                c15 = float_step(
                                    qtype,
                                    c15,
                                    _sum(sums, at + 240, start, s0 + 15 * n_blocks, begins),
                                    dw,
                                    dw_bias,
                                    mw,
                                    d[g + 15, b],
                                    s[g + 15, b],
                                )
                        store_tile_row(out, g, n0, c0, spill)
                        store_tile_row(out, g + 1, n0, c1, spill)
                        store_tile_row(out, g + 2, n0, c2, spill)
                        store_tile_row(out, g + 3, n0, c3, spill)
                        store_tile_row(out, g + 4, n0, c4, spill)
                        store_tile_row(out, g + 5, n0, c5, spill)
                        store_tile_row(out, g + 6, n0, c6, spill)
                        store_tile_row(out, g + 7, n0, c7, spill)
                        store_tile_row(out, g + 8, n0, c8, spill)
                        store_tile_row(out, g + 9, n0, c9, spill)
                        store_tile_row(out, g + 10, n0, c10, spill)
                        store_tile_row(out, g + 11, n0, c11, spill)
                        store_tile_row(out, g + 12, n0, c12, spill)
                        store_tile_row(out, g + 13, n0, c13, spill)
                        store_tile_row(out, g + 14, n0, c14, spill)
                        store_tile_row(out, g + 15, n0, c15, spill)
            tile_release()
        return out

    return matmul_amx_32


@njit(inline="always")
def _begin_tile(c, bias, centred):
    """C tile c's sums begin at the float bias (centred Q4_0) or at zero."""
    if centred:
        tile_load(c, bias, np.int64(0), np.int64(4 * TILE_ROWS))
    else:
        tile_zero(c)


@njit(inline="always")
def _sum(sums, at, start, s_at, begins):
    """One activation row's 16 int32 sums from the stored C tile, begun where tiles_32's begin."""
    total = load16(sums, at)
    return total + start[s_at] if begins else total


@intrinsic(prefer_literal=True)
def b_tile(typingctx, quants, q_at, out, o_at, nibbles, centred):
    """A tile's 32-value block at quants[q_at:] as its B tile (B_BYTES) at out[o_at:]: Q4's 256 bytes, quads
    k in their low nibbles and k + 4 in their high ones, as 8 quads of 64 unsigned bytes (centred: q - 8, signed);
    Q8_0's 512 as they are. Vector loads and stores of 64 bytes (the byte loop numba made was scalar)."""
    if not all(isinstance(flag, types.BooleanLiteral) for flag in (nibbles, centred)):
        return None
    split = nibbles.literal_value
    less = 8 if centred.literal_value else 0

    def codegen(context, builder, signature, args):
        i64, b64 = ir.IntType(64), ir.VectorType(ir.IntType(8), 64)

        def pointer(index, at, offset):
            base = context.make_array(signature.args[index])(context, builder, args[index]).data
            where = builder.gep(base, [builder.add(at, ir.Constant(i64, offset))])
            return builder.bitcast(where, b64.as_pointer())

        for lane in range(4 if split else 8):
            packed = builder.load(pointer(0, args[1], 64 * lane), align=1)
            if split:
                low = builder.and_(packed, ir.Constant(b64, [15] * 64))
                high = builder.lshr(packed, ir.Constant(b64, [4] * 64))
                if less:
                    low = builder.sub(low, ir.Constant(b64, [less] * 64))
                    high = builder.sub(high, ir.Constant(b64, [less] * 64))
                builder.store(low, pointer(2, args[3], 64 * lane), align=64)
                builder.store(high, pointer(2, args[3], 256 + 64 * lane), align=64)
            else:
                builder.store(packed, pointer(2, args[3], 64 * lane), align=64)
        return context.get_dummy_value()

    return types.void(quants, types.intp, out, types.intp, nibbles, centred), codegen


def matmul(kernel, tiles, a, out: np.ndarray) -> np.ndarray:
    """out (T16, N) = tiles (tiles.Tiles) times the first T16 rows of the Q8_0 activations a (Q8Blocks)."""
    return kernel(tiles.quants, tiles.scales, tiles.mins, a.q, a.d, a.s, a.qsum, out, CONFIG, get_num_threads())
