"""This machine's int8 dot-product peak, measured: the ceiling the native kernels' integer dots run against.

    python benchmarks/int8_peak.py [--seconds 0.2] [--rounds 5] [--tier avx2]

A micro-kernel per instruction form (a loop in LLVM IR, run by numba on every core, one prange iteration per
thread), its operands in registers: 12 independent int32 accumulators of one vector of the tier's width (512 or
256 bits) each, per loop trip
- vpdpbusd (AVX512-VNNI; AVX-VNNI on 256-bit tiers): acc += 4 u8 x s8 products per int32 lane, one instruction;
- vpmaddubsw + vpmaddwd + vpaddd (AVX2, AVX-512BW without VNNI: ggml's mul_sum_i8_pairs): u8 x s8 pairs into
  int16, pairs of those into int32 by ones, added; the activation operand changes every trip (one vpaddd per
  operand vector) so that LLVM cannot hoist the loop-invariant products out of the loop;
- vpmaddubsw + vpaddw (the same tiers): the pairs added in int16 accumulators, no vpmaddwd. This is the int8
  kernels' own inner form there (int8_dots.py sums 2 to 8 vpmaddubsw results in int16 before one vpmaddwd by a
  scale pair or by ones), and the fastest a product can be both made and added on these tiers: vpmaddwd shares
  vpmaddubsw's two ports, vpaddw has a third. It is the roofline on tiers without VNNI.
The figure is GOP/s: 2 operations (a multiply and
an add) per int8 product, the best of --rounds runs of --seconds each (the least disturbed on a shared machine).
`peaks()` gives the figures to step_time.py's roofline.

Two more forms on 512-bit tiers with AVX512_BF16 and VNNI (Zen 4, Sapphire Rapids), the same loop otherwise:
- vdpbf16ps: 12 float32 accumulators, each += 16 lanes x 2 bfloat16 products an instruction: the bf16 GEMM peak,
  the roofline of vLLM's CPU backend in bfloat16 (oneDNN's AVX512_BF16 kernels). GOP/s as above, 2 a product;
- vpdpbusd beside 3 FMAs: per trip 8 vpdpbusd and 3 vfmadd on float32 accumulators of their own, the instruction
  mix of the tile kernel's Q4_1 block (8 vpdpbusd, 2 vmulps and a vfmadd a block, token and 16 weight rows,
  tile_kernels.py). Where vpdpbusd and FMA share their pipes (Zen 4) this runs at 8/11 of vpdpbusd's peak: the
  ceiling of a 32-value block type's kernel, whose per-block float steps no integer instruction can take.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

from miro.core.kernels import cpu
from miro.core.kernels.bf16_gemm import BF16_PAIRS
from miro.core.kernels.int8_dots import VectorOps

ACCUMULATORS = 12  # independent dependency chains: more than a dot's latency times its issue rate
WEIGHTS, ACTIVATIONS = 4, 3  # operand vectors: 12 distinct (weight, activation) pairs, one per accumulator


def _seed_loader(context, builder, signature, args, vectors):
    """seed(k): the first 16 int32 of seed vector k (seeds: args[0], int32, 1-D, 16 int32 a vector), as `vectors`."""
    data = context.make_array(signature.args[0])(context, builder, args[0]).data

    def seed(k):
        where = builder.gep(data, [ir.Constant(ir.IntType(64), 16 * k)])
        return builder.load(builder.bitcast(where, vectors.as_pointer()), align=4)

    return seed


def _emit_trips(builder, trips, firsts, trip, start):
    """The loop both micro-kernels run, whole in LLVM IR: `trips` trips over phi values begun at `firsts` (kept in
    registers), each trip `trip(values) -> (new values, their int32 sum)`; returns the last trip's sum (LLVM sinks it
    out of the loop), or `start` where there was no trip."""
    i64 = ir.IntType(64)
    entry = builder.block
    body = builder.append_basic_block("trips")
    done = builder.append_basic_block("done")
    builder.cbranch(builder.icmp_signed(">", trips, ir.Constant(i64, 0)), body, done)
    builder.position_at_end(body)
    count = builder.phi(i64)
    count.add_incoming(ir.Constant(i64, 0), entry)
    values = [builder.phi(first.type) for first in firsts]
    for value, first in zip(values, firsts):
        value.add_incoming(first, entry)
    new_values, summed = trip(values)
    next_count = builder.add(count, ir.Constant(i64, 1))
    for phi, value in zip(values + [count], new_values + [next_count]):
        phi.add_incoming(value, builder.block)
    builder.cbranch(builder.icmp_signed("<", next_count, trips), body, done)
    builder.position_at_end(done)
    total = builder.phi(start.type)
    total.add_incoming(start, entry)
    total.add_incoming(summed, body)
    return total


def _sum_as_int32(builder, values, dwords):
    summed = None
    for value in values:
        as_int = value if value.type == dwords else builder.bitcast(value, dwords)
        summed = as_int if summed is None else builder.add(summed, as_int)
    return summed


@intrinsic(prefer_literal=True)
def _dot_loop(typingctx, seeds, trips, out, bits, vnni, words_only):
    """`trips` trips of ACCUMULATORS independent int8 dots (_emit_trips: accumulators in registers of the tier's
    width): accumulator i += the dot of weights w[i % 4] and activations x[i // 4], by vpdpbusd (vnni) or
    vpmaddubsw + vpmaddwd + vpaddd; without VNNI the activations change every trip (+ a step), so that LLVM cannot
    hoist the loop-invariant products; words_only: vpmaddubsw + vpaddw into int16 accumulators instead (the sums
    wrap: only their instructions count). The operands come from seeds (int32, 1-D: 4 weight vectors, 3 activation
    vectors, the step, the start, 16 int32 each); out[0:16] gets the sum of the accumulators (so that the loop is
    not dead). bits, vnni, words_only: compile-time constants."""
    if not all(isinstance(ty, types.IntegerLiteral) for ty in (bits, vnni, words_only)):
        return None
    width = bits.literal_value // 8
    with_vnni = bool(vnni.literal_value)
    in_words = bool(words_only.literal_value) and not with_vnni

    def codegen(context, builder, signature, args):
        ops = VectorOps(builder, width)
        seed = _seed_loader(context, builder, signature, args, ops.dwords)
        w = [seed(k) for k in range(WEIGHTS)]
        x0 = [seed(WEIGHTS + k) for k in range(ACTIVATIONS)]
        step, start = seed(WEIGHTS + ACTIVATIONS), seed(WEIGHTS + ACTIVATIONS + 1)
        ones = ir.Constant(ops.words, [1] * (width // 2))

        def trip(values):
            accs, xs = values[:ACCUMULATORS], values[ACCUMULATORS:]
            new_xs = xs if with_vnni else [builder.add(x, step) for x in xs]
            new_accs = []
            for i, acc in enumerate(accs):
                wi, xi = w[i % WEIGHTS], new_xs[i // WEIGHTS]
                if with_vnni:
                    new_accs.append(ops.call(f"llvm.x86.avx512.vpdpbusd.{ops.suffix}", ops.dwords, [acc, wi, xi]))
                    continue
                words = ops.maddubs(builder.bitcast(wi, ops.bytes), builder.bitcast(xi, ops.bytes))
                if in_words:
                    new_accs.append(builder.bitcast(builder.add(builder.bitcast(acc, ops.words), words), ops.dwords))
                else:
                    new_accs.append(builder.add(acc, ops.madd(words, ones)))
            return new_accs + new_xs, _sum_as_int32(builder, new_accs, ops.dwords)

        total = _emit_trips(builder, args[1], [start] * ACCUMULATORS + x0, trip, start)
        out_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        builder.store(total, builder.bitcast(out_data, ops.dwords.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(seeds, types.intp, out, bits, vnni, words_only), codegen


MIXED_DOTS, MIXED_FMAS = 8, 3  # the mixed form's instructions a trip: a Q4_1 block's (tile_kernels.float_step)


@intrinsic(prefer_literal=True)
def _float_loop(typingctx, seeds, trips, out, kind):
    """`trips` trips of 512-bit float work (_emit_trips), as _dot_loop's: kind 0, ACCUMULATORS vdpbf16ps into
    float32 accumulators (operands: bfloat16 pairs from seeds); kind 1, MIXED_DOTS vpdpbusd into int32 ones and
    MIXED_FMAS vfmadd into float32 ones of their own. out[0:16] gets the accumulators' sum (bits: the int32 and
    float sums added as int32, only so that the loop is not dead). kind: a compile-time constant."""
    if not isinstance(kind, types.IntegerLiteral):
        return None
    mixed = kind.literal_value == 1

    def codegen(context, builder, signature, args):
        ops = VectorOps(builder, 64)
        floats = ir.VectorType(ir.FloatType(), 16)
        seed = _seed_loader(context, builder, signature, args, ops.dwords)
        w = [seed(k) for k in range(WEIGHTS)]
        x = [seed(WEIGHTS + k) for k in range(ACTIVATIONS)]
        scale = builder.bitcast(seed(WEIGHTS), floats)
        n_int = MIXED_DOTS if mixed else 0
        n_float = MIXED_FMAS if mixed else ACCUMULATORS
        start = seed(WEIGHTS + ACTIVATIONS)

        def trip(accs):
            new_accs = []
            for i, acc in enumerate(accs):
                wi, xi = w[i % WEIGHTS], x[(i // WEIGHTS) % ACTIVATIONS]
                if i < n_int:
                    new_accs.append(ops.call("llvm.x86.avx512.vpdpbusd.512", ops.dwords, [acc, wi, xi]))
                elif mixed:  # acc * scale + scale: a chain per accumulator, one link a trip
                    new_accs.append(ops.call("llvm.fma.v16f32", floats, [acc, scale, scale]))
                else:
                    operands = [acc, builder.bitcast(wi, BF16_PAIRS), builder.bitcast(xi, BF16_PAIRS)]
                    new_accs.append(ops.call("llvm.x86.avx512bf16.dpbf16ps.512", floats, operands))
            return new_accs, _sum_as_int32(builder, new_accs, ops.dwords)

        firsts = [start] * n_int + [builder.bitcast(start, floats)] * n_float
        total = _emit_trips(builder, args[1], firsts, trip, start)
        out_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        builder.store(total, builder.bitcast(out_data, ops.dwords.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(seeds, types.intp, out, kind), codegen


def _make_float_loop(kind: int):
    @njit(parallel=True)
    def loop(seeds, trips, out):
        for thread in prange(seeds.shape[0]):
            _float_loop(seeds[thread], trips, out[thread], kind)

    return loop


def _make_loop(bits: int, vnni: int, words_only: int):
    @njit(parallel=True)
    def loop(seeds, trips, out):
        """Each row of seeds one thread's operands; out: its accumulators' sum."""
        for thread in prange(seeds.shape[0]):
            _dot_loop(seeds[thread], trips, out[thread], bits, vnni, words_only)

    return loop


FORMS = {"vpdpbusd": (1, 0), "vpmaddubsw+vpaddw": (0, 1), "vpmaddubsw+vpmaddwd": (0, 0)}  # form -> (vnni, words)
FLOAT_FORMS = {"vdpbf16ps": 0, "vpdpbusd+3 FMA": 1}  # form -> _float_loop's kind


def peak_gops(form: str, seconds: float = 0.2, rounds: int = 5, threads: int | None = None) -> float:
    """The best GOP/s (2 per int8 product) of `rounds` runs of one form's micro-kernel (FORMS) on `threads` threads
    (default: numba's)."""
    tier = cpu.TIER
    if form in FLOAT_FORMS:
        if form not in float_forms():
            raise ValueError(f"numba does not compile {form} for this CPU")
        loop = _make_float_loop(FLOAT_FORMS[form])
        bits = 512
    else:
        vnni, words_only = FORMS[form]
        if not tier.int8_dot or (vnni and not tier.has_vnni):
            raise ValueError(f"the {tier.name} tier has no {form}")
        bits = 512 if tier.vector_bits == 512 else 256
        loop = _make_loop(bits, vnni, words_only)
    n_threads = threads or numba.get_num_threads()
    seeds = np.random.default_rng(0).integers(0, 64, (n_threads, 144), dtype=np.int32)
    out = np.empty((n_threads, 16), np.int32)
    loop(seeds, 10, out)  # compile
    trips = 1000
    while True:  # trips for about `seconds` a run
        t0 = time.perf_counter()
        loop(seeds, trips, out)
        elapsed = time.perf_counter() - t0
        if elapsed > seconds / 4:
            break
        trips *= 4
    trips = max(1, int(trips * seconds / elapsed))
    best = min(_timed(lambda: loop(seeds, trips, out)) for _ in range(rounds))
    if form == "vdpbf16ps":
        per_trip = ACCUMULATORS * 32  # 16 lanes x 2 bfloat16 products
    elif form in FLOAT_FORMS:
        per_trip = MIXED_DOTS * 64  # the int8 products only: the FMAs are the block's float steps
    else:
        per_trip = ACCUMULATORS * bits // 8  # an int8 product per byte of a vector
    return 2 * n_threads * trips * per_trip / best / 1e9


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def peaks(seconds: float = 0.2, rounds: int = 5) -> dict[str, float]:
    """GOP/s by instruction form this tier has, its roofline first: "vpdpbusd" (VNNI tiers), then
    "vpmaddubsw+vpaddw" and "vpmaddubsw+vpmaddwd" (every int8 tier)."""
    return {form: peak_gops(form, seconds, rounds) for form in forms()}


def float_forms() -> list[str]:
    """vdpbf16ps and the mixed form where numba compiles for AVX512_BF16 and VNNI (a 512-bit VNNI tier)."""
    if cpu.TIER.name != "avx512-vnni" or "avx512bf16" not in cpu.compiled_features():
        return []
    return list(FLOAT_FORMS)


def forms() -> list[str]:
    """The forms this tier has, its roofline first."""
    if not cpu.TIER.int8_dot:
        return []
    return (["vpdpbusd"] if cpu.TIER.has_vnni else []) + ["vpmaddubsw+vpaddw", "vpmaddubsw+vpmaddwd"]


def main() -> None:
    import tiers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=5)
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, with_llama=False))
    for threads in sorted({1, numba.get_num_threads()}):
        for form in forms() + float_forms():
            print(f"{form:>20} {threads} thread(s): {peak_gops(form, args.seconds, args.rounds, threads):8.0f} GOP/s")


if __name__ == "__main__":
    main()
