"""AMX (Intel Advanced Matrix Extensions) int8 tiles from numba: the permission, the detection, and an int8 GEMM.

AMX adds eight tile registers tmm0-7 (up to 16 rows of 64 bytes each, shaped by a 64-byte configuration loaded
with ldtilecfg) and TDPBUSD: a 16 x 16 int32 tile += a 16 x 64 uint8 tile times a 16 x 64 int8 tile held in the
VNNI layout (row r of the B tile holds K values 4r..4r+3 of each of its 16 columns). One TDPBUSD is 16,384
multiply-adds; vpdpbusd on a zmm is 64.

Three things stand between numba and these instructions:

- Linux gives a process the tile data state only on request: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  (Linux 5.16+). Without it the first tile instruction is SIGILL. The permission is process-wide and one-way, so
  `request_permission` asks once and remembers the answer.
- numba's LLVM has AMX intrinsics only in the form its own AMX pass lowers (the *.internal ones, shapes as SSA
  values); inline assembly with fixed tile registers is simpler and is what is used here. The assembler accepts
  the mnemonics only where numba compiles for amx-tile and amx-int8, so nothing here is compiled unless
  `compiled_features()` has them (under the AVX2 emulation it has not).
- numba does not load LLVM's x86 assembly parser, which inline assembly needs (else LLVM aborts the process):
  `require` (which `gemm` calls) loads it before a kernel is first compiled.
- The tile configuration is per-thread state. Each numba thread loads it itself, at the start of its share of a
  call (one prange iteration per thread), and releases it at the end (tilerelease: the thread's context
  switches then save no tile data).

`gemm(a, packed)` is C[int32, M x N] = A[uint8, M x K] @ B[int8, K x N], exact, with B packed once by `pack_b`:
(N/16, K/64, 16, 64) int8, each 16-column, 64-deep tile of B contiguous (1 KB) in the VNNI layout. Contiguous
tiles rather than the plain K/4 x 4N layout: a tile load then reads 16 consecutive cache lines rather than 16
lines 4N bytes apart, which for N a multiple of 1024 all fall in one L1 set.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

from llvmlite import binding as llvm, ir
from numba import get_num_threads, njit, prange, types
from numba.core.extending import intrinsic
import numpy as np

from miro.core.kernels.cpu import compiled_features
from miro.core.kernels.simd import load16, store16, to_float

SYS_ARCH_PRCTL = 158  # x86-64 syscall number
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

TILE_ROWS = 16  # rows of A (and of C) per tile
TILE_COLS = 16  # columns of B (and of C) per tile: 16 int32 = 64 bytes
TILE_DEPTH = 64  # K per tile: 64 bytes of an A row, 16 rows of 4 in the B tile
CONFIG_BYTES = 64


def request_permission() -> bool:
    """Whether this process may use the AMX tile data (asked of the kernel once per process)."""
    return _permission()


@functools.cache
def _permission() -> bool:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if (
        libc.syscall(
            ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM), ctypes.c_ulong(XFEATURE_XTILEDATA)
        )
        != 0
    ):
        return False
    granted = ctypes.c_ulong(0)
    if libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_GET_XCOMP_PERM), ctypes.byref(granted)) != 0:
        return False
    return bool(granted.value >> XFEATURE_XTILEDATA & 1)


def unusable_reason() -> str | None:
    """Why AMX int8 cannot run in this process, in one sentence; None where it can (flags, permission and a
    small product checked against numpy, once per process)."""
    return _unusable_reason()


@functools.cache
def _unusable_reason() -> str | None:
    reason = _not_ready()
    if reason:
        return reason
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (33, 192), dtype=np.uint8)
    b = rng.integers(-128, 128, (192, 48), dtype=np.int8)
    if not np.array_equal(gemm(a, pack_b(b)), a.astype(np.int32) @ b.astype(np.int32)):
        return "the AMX self-test product differs from numpy's"
    return None


@functools.cache
def _not_ready() -> str | None:
    """Why the AMX kernels cannot be compiled and run here, short of trying them; None once they can."""
    missing = {"amx-tile", "amx-int8"} - compiled_features()
    if missing:
        return f"numba does not compile for {', '.join(sorted(missing))} here (the CPU or NUMBA_CPU_FEATURES lacks it)"
    if not request_permission():
        return "Linux refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): the kernel is older than 5.16 or forbids AMX"
    llvm.initialize_native_asmparser()
    return None


def usable() -> bool:
    return unusable_reason() is None


def ready() -> bool:
    """Whether the AMX kernels can be compiled and run here (unusable_reason's checks short of its self-test
    product, which the kernels' own tests stand for), and MIRO_AMX is not 0 (the switch that keeps them off)."""
    return os.environ.get("MIRO_AMX", "1") != "0" and _not_ready() is None


def require() -> None:
    """Raise unless the tile intrinsics below can be compiled and run here: call it before the first call of
    any kernel made of them."""
    reason = _not_ready()
    if reason:
        raise RuntimeError(f"AMX cannot run here: {reason}")


def config_bytes() -> np.ndarray:
    """The 64-byte configuration every tile register is given: palette 1, 16 rows of 64 bytes."""
    config = np.zeros(CONFIG_BYTES, np.uint8)
    config[0] = 1  # palette 1: eight tiles of up to 16 rows x 64 bytes
    config[16:32] = np.tile(np.array([TILE_DEPTH, 0], np.uint8), 8)  # colsb, uint16 per tile
    config[48:56] = TILE_ROWS  # rows, one byte per tile
    return config


def pack_b(b: np.ndarray) -> np.ndarray:
    """B (K, N) int8 as (ceil(N/16), ceil(K/64), 16, 64) int8 tiles in the VNNI layout, zeros padding K and N:
    packed[j, c, r, 4 n + q] = B[64 c + 4 r + q, 16 j + n]."""
    if b.ndim != 2 or b.dtype != np.int8:
        raise ValueError(f"B must be a 2-D int8 matrix, not {b.dtype} {b.shape}")
    k, n = b.shape
    k_pad, n_pad = -k % TILE_DEPTH, -n % TILE_COLS
    if k_pad or n_pad:
        b = np.pad(b, ((0, k_pad), (0, n_pad)))
    chunks, col_tiles = b.shape[0] // TILE_DEPTH, b.shape[1] // TILE_COLS
    tiles = b.reshape(chunks, TILE_ROWS, 4, col_tiles, TILE_COLS).transpose(3, 0, 1, 4, 2)
    return np.ascontiguousarray(tiles).reshape(col_tiles, chunks, TILE_ROWS, TILE_DEPTH)


def gemm(a: np.ndarray, packed: np.ndarray, n: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """A (M, K) uint8 @ B (packed by pack_b) as (M, n) int32, exact; n defaults to the packed column count.
    `out`, when given, is an (M rounded up to 16, packed columns) int32 array to write into."""
    require()
    if a.ndim != 2 or a.dtype != np.uint8:
        raise ValueError(f"A must be a 2-D uint8 matrix, not {a.dtype} {a.shape}")
    col_tiles, chunks = packed.shape[:2]
    m, k = a.shape
    if -(-k // TILE_DEPTH) != chunks:
        raise ValueError(f"A has {k} columns; B was packed for {chunks * TILE_DEPTH}")
    m_pad, k_pad = -m % TILE_ROWS, chunks * TILE_DEPTH - k
    if m_pad or k_pad or not a.flags.c_contiguous:
        a = np.ascontiguousarray(np.pad(a, ((0, m_pad), (0, k_pad))))
    if out is None:
        out = np.empty((a.shape[0], col_tiles * TILE_COLS), np.int32)
    _gemm_tiles(a, packed, out, _CONFIG, get_num_threads())
    return out[:m, : (col_tiles * TILE_COLS if n is None else n)]


_CONFIG = config_bytes()


def _tmm(literal) -> int:
    if not isinstance(literal, types.IntegerLiteral) or not 0 <= literal.literal_value < 8:
        raise TypeError("a tile register is a literal 0-7")
    return literal.literal_value


def _byte_address(context, builder, array_type, array, offset):
    """&array's data + offset bytes, as an i64."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.add(builder.ptrtoint(data, ir.IntType(64)), offset)


def _asm(builder, text: str, constraints: str, args=()):
    function_type = ir.FunctionType(ir.VoidType(), [arg.type for arg in args])
    builder.asm(function_type, text, constraints, list(args), side_effect=True)


@intrinsic
def tile_load_config(typingctx, config):
    def codegen(context, builder, sig, args):
        _asm(
            builder,
            "ldtilecfg ($0)",
            "r,~{memory}",
            [_byte_address(context, builder, sig.args[0], args[0], ir.Constant(ir.IntType(64), 0))],
        )
        return context.get_dummy_value()

    return types.void(config), codegen


@intrinsic
def tile_release(typingctx):
    def codegen(context, builder, sig, args):
        _asm(builder, "tilerelease", "~{memory}")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic(prefer_literal=True)
def tile_zero(typingctx, tmm):
    register = _tmm(tmm)

    def codegen(context, builder, sig, args):
        _asm(builder, f"tilezero %tmm{register}", "")
        return context.get_dummy_value()

    return types.void(tmm), codegen


@intrinsic(prefer_literal=True)
def tile_load(typingctx, tmm, array, offset, stride):
    """tmm = the 16 rows of 64 bytes at array's data + offset bytes, `stride` bytes apart."""
    register = _tmm(tmm)

    def codegen(context, builder, sig, args):
        address = _byte_address(context, builder, sig.args[1], args[1], args[2])
        _asm(builder, f"tileloadd ($0,$1,1), %tmm{register}", "r,r,~{memory}", [address, args[3]])
        return context.get_dummy_value()

    return types.void(tmm, array, types.int64, types.int64), codegen


@intrinsic(prefer_literal=True)
def tile_store(typingctx, tmm, array, offset, stride):
    """The 16 rows of 64 bytes of tmm to array's data + offset bytes, `stride` bytes apart."""
    register = _tmm(tmm)

    def codegen(context, builder, sig, args):
        address = _byte_address(context, builder, sig.args[1], args[1], args[2])
        _asm(builder, f"tilestored %tmm{register}, ($0,$1,1)", "r,r,~{memory}", [address, args[3]])
        return context.get_dummy_value()

    return types.void(tmm, array, types.int64, types.int64), codegen


def _tile_product(mnemonic: str, operands: str):
    @intrinsic(prefer_literal=True)
    def product(typingctx, c, a, b):
        c_reg, a_reg, b_reg = _tmm(c), _tmm(a), _tmm(b)

        def codegen(context, builder, sig, args):
            _asm(builder, f"{mnemonic} %tmm{b_reg}, %tmm{a_reg}, %tmm{c_reg}", "")
            return context.get_dummy_value()

        return types.void(c, a, b), codegen

    product.__doc__ = (
        f"tmm c (16 x 16 int32) += tmm a ({operands[0]}int8 rows) times tmm b ({operands[1]}int8, VNNI layout)."
    )
    return product


@njit(inline="always")
def aligned(n_bytes):
    """n_bytes uninitialized bytes starting on a cache line."""
    raw = np.empty(n_bytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + n_bytes]


tile_dpbusd = _tile_product("tdpbusd", ("u", ""))
tile_dpbssd = _tile_product("tdpbssd", ("", ""))
tile_dpbsud = _tile_product("tdpbsud", ("", "u"))
tile_dpbf16ps = _tile_product("tdpbf16ps", ("bf16 ", "bf16 "))  # AMX-BF16: float32 sums of bfloat16 pairs


@njit(inline="always")
def tile_dpbs(c, a, b, b_signed):
    """tmm c += tmm a (signed bytes) times tmm b, signed bytes (TDPBSSD) or unsigned (TDPBSUD): b_signed a
    compile-time constant."""
    if b_signed:
        tile_dpbssd(c, a, b)
    else:
        tile_dpbsud(c, a, b)


@njit(parallel=True, cache=True)
def _gemm_tiles(a, packed, out, config, threads):
    """out (M16, N16) int32 = a (M16, K64) uint8 times the packed B; M16, N16 multiples of 16, K64 of 64.

    Each thread takes a contiguous run of column-tile pairs. Per pair, 32 rows at a time: four C tiles
    (tmm0-3) from two A tiles (tmm4-5) and two B tiles (tmm6-7), each tile load feeding two products; a last
    16 rows, or a last single column tile, with fewer."""
    m_tiles = a.shape[0] // TILE_ROWS
    col_tiles, chunks = packed.shape[0], packed.shape[1]
    a_stride = np.int64(a.shape[1])
    c_stride = np.int64(out.shape[1] * 4)
    tile_bytes = np.int64(TILE_ROWS * TILE_DEPTH)
    b_stride = np.int64(TILE_DEPTH)
    pairs = (col_tiles + 1) // 2
    parts = max(1, min(threads, pairs))
    for part in prange(parts):
        first, last = part * pairs // parts, (part + 1) * pairs // parts
        tile_load_config(config)
        for pair in range(first, last):
            j0 = 2 * pair
            two = j0 + 1 < col_tiles
            b0 = np.int64(j0) * chunks * tile_bytes
            b1 = b0 + chunks * tile_bytes
            c0 = np.int64(j0 * TILE_COLS * 4)
            for i in range(0, m_tiles, 2):
                two_rows = i + 1 < m_tiles
                a0 = np.int64(i) * TILE_ROWS * a_stride
                a1 = a0 + TILE_ROWS * a_stride
                tile_zero(0)
                tile_zero(1)
                tile_zero(2)
                tile_zero(3)
                for c in range(chunks):
                    tile_load(4, a, a0 + c * TILE_DEPTH, a_stride)
                    tile_load(6, packed, b0 + c * tile_bytes, b_stride)
                    tile_dpbusd(0, 4, 6)
                    if two:
                        tile_load(7, packed, b1 + c * tile_bytes, b_stride)
                        tile_dpbusd(1, 4, 7)
                    if two_rows:
                        tile_load(5, a, a1 + c * TILE_DEPTH, a_stride)
                        tile_dpbusd(2, 5, 6)
                        if two:
                            tile_dpbusd(3, 5, 7)
                row0 = np.int64(i) * TILE_ROWS * c_stride
                row1 = row0 + TILE_ROWS * c_stride
                tile_store(0, out, row0 + c0, c_stride)
                if two:
                    tile_store(1, out, row0 + c0 + TILE_COLS * 4, c_stride)
                if two_rows:
                    tile_store(2, out, row1 + c0, c_stride)
                    if two:
                        tile_store(3, out, row1 + c0 + TILE_COLS * 4, c_stride)
        tile_release()
    return out


BLOCK = 32  # values per Q8_0 block: one float scale per weight row and per activation row


def config_bytes_blocks32() -> np.ndarray:
    """The configuration for 32-deep products: C tiles tmm0-3 16 x 16 int32, A tiles tmm4-5 16 rows of 32 bytes,
    B tiles tmm6-7 8 rows of 64 bytes (8 quads of 16 columns)."""
    config = config_bytes()
    colsb = config[16:32].view(np.uint16)
    colsb[4:6] = BLOCK
    config[48 + 6 : 48 + 8] = BLOCK // 4
    return config


def pack_w_blocks32(w: np.ndarray) -> np.ndarray:
    """Weight rows W (N, K) int8, K a multiple of 32, as (ceil(N/16), K/32, 8, 64) int8 tiles in the VNNI layout
    (zeros past N): packed[j, b, r, 4 n + q] = W[16 j + n, 32 b + 4 r + q]."""
    n, k = w.shape
    if w.dtype != np.int8 or k % BLOCK:
        raise ValueError(f"W must be int8 with a multiple of {BLOCK} columns, not {w.dtype} {w.shape}")
    w = np.pad(w, ((0, -n % TILE_COLS), (0, 0)))
    tiles = w.reshape(-1, TILE_COLS, k // BLOCK, BLOCK // 4, 4).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(tiles).reshape(-1, k // BLOCK, BLOCK // 4, TILE_DEPTH)


def pack_scales_blocks32(d: np.ndarray) -> np.ndarray:
    """Weight block scales (N, K/32) float32 as (ceil(N/16), K/32, 16): one 16-column vector per tile and block."""
    n, blocks = d.shape
    d = np.pad(d.astype(np.float32), ((0, -n % TILE_COLS), (0, 0)))
    return np.ascontiguousarray(d.reshape(-1, TILE_COLS, blocks).transpose(0, 2, 1))


def gemm_blocks32(a: np.ndarray, d_a: np.ndarray, packed: np.ndarray, d_w: np.ndarray, n: int) -> np.ndarray:
    """Q8_0-style product, float32 (M, n): sum over 32-blocks b of (d_w[n, b] * d_a[m, b]) * isum_b[m, n], block
    after block in float32 (miro's add_block32 for Q8_0, so the bits of its kernels), isum_b the exact int32 dot
    of A's int8 block with W's (tdpbssd). a (M, K) int8, d_a (M, K/32) float32; packed, d_w from
    pack_w_blocks32 and pack_scales_blocks32."""
    require()
    m, k = a.shape
    if a.dtype != np.int8 or k != packed.shape[1] * BLOCK or d_a.shape != (m, k // BLOCK):
        raise ValueError(f"A must be int8 ({m}, {packed.shape[1] * BLOCK}) with ({m}, {packed.shape[1]}) scales")
    m_pad = -m % TILE_ROWS
    a = np.ascontiguousarray(np.pad(a, ((0, m_pad), (0, 0))))
    d_a = np.ascontiguousarray(np.pad(d_a.astype(np.float32), ((0, m_pad), (0, 0))))
    out = np.empty((a.shape[0], packed.shape[0] * TILE_COLS), np.float32)
    _gemm_blocks32(a, d_a, packed, d_w.reshape(d_w.size), out, _CONFIG_BLOCKS32, get_num_threads())
    return out[:m, :n]


_CONFIG_BLOCKS32 = config_bytes_blocks32()


@njit(parallel=True, cache=True)
def _gemm_blocks32(a, d_a, packed, d_w, out, config, threads):
    """out (M16, N16) float32 from a (M16, K) int8 in 32-blocks; the tile walk of _gemm_tiles, 32 deep. After
    each block's four tdpbssd the int32 tiles go to a per-thread scratch and are scaled into float sums there."""
    m_tiles = a.shape[0] // TILE_ROWS
    col_tiles, blocks = packed.shape[0], packed.shape[1]
    a_stride = np.int64(a.shape[1])
    tile_bytes = np.int64(BLOCK // 4 * TILE_DEPTH)
    b_stride = np.int64(TILE_DEPTH)
    scratch_stride = np.int64(TILE_COLS * 4)
    pairs = (col_tiles + 1) // 2
    parts = max(1, min(threads, pairs))
    for part in prange(parts):
        first, last = part * pairs // parts, (part + 1) * pairs // parts
        sums = np.empty(4 * TILE_ROWS * TILE_COLS, np.int32)
        acc = np.empty(4 * TILE_ROWS * TILE_COLS, np.float32)
        tile_load_config(config)
        for pair in range(first, last):
            j0 = 2 * pair
            n_tiles = 2 if j0 + 1 < col_tiles else 1
            b0 = np.int64(j0) * blocks * tile_bytes
            b1 = b0 + blocks * tile_bytes
            for i in range(0, m_tiles, 2):
                m_here = 2 if i + 1 < m_tiles else 1
                a0 = np.int64(i) * TILE_ROWS * a_stride
                a1 = a0 + TILE_ROWS * a_stride
                acc[:] = 0.0
                for b in range(blocks):
                    tile_zero(0)
                    tile_zero(1)
                    tile_zero(2)
                    tile_zero(3)
                    tile_load(4, a, a0 + b * BLOCK, a_stride)
                    tile_load(6, packed, b0 + b * tile_bytes, b_stride)
                    tile_dpbssd(0, 4, 6)
                    if n_tiles == 2:
                        tile_load(7, packed, b1 + b * tile_bytes, b_stride)
                        tile_dpbssd(1, 4, 7)
                    if m_here == 2:
                        tile_load(5, a, a1 + b * BLOCK, a_stride)
                        tile_dpbssd(2, 5, 6)
                        if n_tiles == 2:
                            tile_dpbssd(3, 5, 7)
                    tile_store(0, sums, 0, scratch_stride)
                    tile_store(1, sums, 1024, scratch_stride)
                    tile_store(2, sums, 2048, scratch_stride)
                    tile_store(3, sums, 3072, scratch_stride)
                    for q in range(4):
                        rt, ct = q // 2, q % 2
                        if rt < m_here and ct < n_tiles:
                            dw = load16(d_w, ((j0 + ct) * blocks + b) * TILE_COLS)
                            for r in range(TILE_ROWS):
                                at = (q * TILE_ROWS + r) * TILE_COLS
                                scaled = (dw * d_a[(i + rt) * TILE_ROWS + r, b]) * to_float(load16(sums, at))
                                store16(acc, at, load16(acc, at) + scaled)
                for q in range(4):
                    rt, ct = q // 2, q % 2
                    if rt < m_here and ct < n_tiles:
                        for r in range(TILE_ROWS):
                            out[(i + rt) * TILE_ROWS + r, (j0 + ct) * TILE_COLS : (j0 + ct + 1) * TILE_COLS] = acc[
                                (q * TILE_ROWS + r) * TILE_COLS : (q * TILE_ROWS + r + 1) * TILE_COLS
                            ]
        tile_release()
    return out
