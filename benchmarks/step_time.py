"""One engine step taken apart, each part beside its floor: B=64 decode and a 512-token prefill.

    python benchmarks/step_time.py [--model smollm2-135m] [--steps 10] [--weights auto|f32|native]
                                   [--kv-cache-dtype float16|float32] [--no-batch-invariant] [--tier avx2]

The engine runs as configured (defaults: batch-invariant f32 weights). The parts are timed by wrapping, for
this script only, the functions the forward pass and the engine call:
- GEMMs: every Linear call, and in a mixture of experts every call of the grouped expert kernels (a step's
  chosen experts' gate and up in one call, their down in another: layers.moe.GroupedExperts.product, its FLOPs
  those of the rows each chosen expert takes, its weights the active experts'), against the float32 GEMM
  roofline: their FLOPs at numpy's sgemm peak (512x576 @ 576x3072, measured here), or the bytes of their
  weights at the memory bandwidth, whichever is longer;
- attention: `layers.attention.paged_attention`, against the bytes of K and V it must read at the memory bandwidth
  (a parallel numba sum over 1 GiB, measured here), or its FLOPs at the sgemm peak, whichever is longer;
- the sampler: `sampler.sample`;
- the rest (packing the step, norms, RoPE and the KV write, the scheduler, Python): the step's wall time
  less the parts above and less this script's own counting of their FLOPs and bytes (attention's, in Python,
  ~30 ms of a B=64 decode step on SmolLM2: not the engine's).
With native (quantized) weights, each GEMM of the step (its layers grouped by name: attn_q+k+v, attn_output,
ffn_gate+up, ffn_down, output; a mixture's ffn_gate_exps+ffn_up_exps and ffn_down_exps) is also set against the
int8 roofline: its 2 x T x in x out operations at this machine's int8 dot peak (int8_peak.py: vpdpbusd on VNNI
tiers, vpmaddubsw + vpaddw elsewhere, the kernels' own inner form there, measured here on every core), or its
weights' bytes at the read bandwidth, whichever is longer. The int8 peak is what the native kernels' integer dots
could reach; their float steps per block, the unpacking of 4- and 6-bit values and the
activations' quantization come on top, so no kernel meets it. Where numba compiles for AVX512_BF16 (Zen 4, Sapphire
Rapids) two more ceilings are printed (int8_peak.py's float forms): vdpbf16ps, the peak of a bfloat16 GEMM such as
vLLM's CPU backend runs, and vpdpbusd beside a Q4_1 block's 3 FMAs, the most a 32-value block type's tile kernel
could reach where the two share their pipes.
All figures come from this one process, in turn; the machine's load average is printed beside them. A ratio
under 1 beats the floor: the GEMM floor is OpenBLAS's best here, not the machine's.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import defaultdict

import numpy as np
from numba import njit, prange

from miro.core import Engine, SamplingParams
from miro.core.sampling import sampler
from miro.core.engine import engine as engine_module
from miro.core.layers import attention as attention_module
from miro.core.layers import linear as linear_module
from miro.core.layers import moe as moe_module
from miro.core.loading.registry import resolve_model

import int8_peak
import tiers

from throughput import gemm_peak_gflops


@njit(parallel=True, cache=True, fastmath=True)  # reassociation lets the sum vectorise: bandwidth-bound
def _sum(a):
    total = 0.0
    for i in prange(a.size):
        total += a[i]
    return total


def memory_bandwidth_gbs() -> float:
    """Read bandwidth: a parallel sum over 1 GiB of float32, best of 5."""
    a = np.ones(2**28, np.float32)
    _sum(a)
    best = min(_timed(lambda: _sum(a)) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


class PartTimer:
    """Seconds (and FLOPs, bytes) spent in the wrapped functions while `active`."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.gemm_flops = 0.0
        self.gemm_weight_bytes = 0.0
        self.kv_bytes = 0.0
        self.attention_flops = 0.0
        self.by_gemm = defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # group -> [seconds, flops, weight bytes, calls]
        self.native_gemms = set()  # the groups whose layers multiply native (integer-dot) weights
        self.active = False
        # seconds spent counting FLOPs and bytes (attention's walks every work item in Python: ~30 ms a step on
        # SmolLM2's B=64 decode), taken off the step's wall time so that it is not read as the engine's "rest"
        self.bookkeeping = 0.0

    def wrap_linear(self):
        timer, call = self, linear_module.Linear.__call__

        def timed_call(layer, x, *args, **kwargs):
            t0 = time.perf_counter()
            out = call(layer, x, *args, **kwargs)
            t1 = time.perf_counter()
            if timer.active:
                flops = 2.0 * x.shape[0] * layer.in_features * layer.out_features
                weight_bytes = layer.weight_bytes or layer.in_features * layer.out_features
                native = layer.fmt == "native" and layer.type.name not in ("F32", "F16", "BF16")
                timer.add_gemm(gemm_group(layer.name), t1 - t0, flops, weight_bytes, native)
                timer.bookkeeping += time.perf_counter() - t1
            return out

        linear_module.Linear.__call__ = timed_call

    def wrap_experts(self):
        """The grouped expert kernels' calls (a mixture of experts' gate+up, then down), as GEMMs of their own."""
        timer, product = self, moe_module.GroupedExperts.product

        def timed_product(experts, first, second, x, source, starts, active):
            t0 = time.perf_counter()
            out = product(experts, first, second, x, source, starts, active)
            t1 = time.perf_counter()
            seconds = t1 - t0
            if timer.active:
                parts = 1 if second is first else 2
                slots = len(source) if source is not None else x.shape[0]
                flops = 2.0 * slots * first.cols * first.rows * parts
                n_expert = len(starts) - 1
                weight_bytes = sum(m.tiles.nbytes for m in {first, second}) * len(active) / n_expert
                group = "ffn_gate_exps+ffn_up_exps" if parts == 2 else "ffn_down_exps"
                timer.add_gemm(group, seconds, flops, weight_bytes, True)
                timer.bookkeeping += time.perf_counter() - t1
            return out

        moe_module.GroupedExperts.product = timed_product

    def add_gemm(self, group: str, seconds: float, flops: float, weight_bytes: float, native: bool) -> None:
        self.seconds["gemm"] += seconds
        self.gemm_flops += flops
        self.gemm_weight_bytes += weight_bytes
        for i, value in enumerate((seconds, flops, weight_bytes, 1)):
            self.by_gemm[group][i] += value
        if native:
            self.native_gemms.add(group)

    def wrap_attention(self, config):
        timer, attend = self, attention_module.paged_attention

        def timed_attention(q, k_cache, v_cache, block_tables, positions, attn_items, scale, out, *args, **kwargs):
            t0 = time.perf_counter()
            result = attend(q, k_cache, v_cache, block_tables, positions, attn_items, scale, out, *args, **kwargs)
            t1 = time.perf_counter()
            if timer.active:
                timer.seconds["attention"] += t1 - t0
                values, flops = _attention_work(positions, attn_items, config)
                timer.kv_bytes += 2.0 * values * k_cache.itemsize
                timer.attention_flops += flops
                timer.bookkeeping += time.perf_counter() - t1
            return result

        attention_module.paged_attention = timed_attention  # the models read it from the module at each call

    def wrap_sampler(self):
        timer, sample = self, sampler.sample

        def timed_sample(*args, **kwargs):
            t0 = time.perf_counter()
            result = sample(*args, **kwargs)
            if timer.active:
                timer.seconds["sampler"] += time.perf_counter() - t0
            return result

        engine_module.sampler.sample = timed_sample


def gemm_group(name: str) -> str:
    """A layer's name without its block number and tensor suffixes: blk.3.ffn_gate.weight+blk.3.ffn_up.weight ->
    ffn_gate+ffn_up."""
    return "+".join(re.sub(r"^blk\.\d+\.", "", part).removesuffix(".weight") for part in name.split("+"))


def _attention_work(positions: np.ndarray, items: np.ndarray, config) -> tuple[int, float]:
    """(K or V values a step's attention must read at least once, its FLOPs). items: rows of (seq, kv_head,
    t_begin, t_end); each sequence and KV head reads every key up to its furthest query position, and each query
    head at position p does 4 * head_dim * (p + 1) FLOPs (q.k and p.v)."""
    furthest: dict[tuple[int, int], int] = {}
    flops = 0.0
    group = config.n_heads // config.n_kv_heads
    for seq, kv_head, t_begin, t_end in items.tolist():
        key = (seq, kv_head)
        furthest[key] = max(furthest.get(key, 0), int(positions[t_begin:t_end].max()) + 1)
        flops += 4.0 * config.head_dim * group * float((positions[t_begin:t_end] + 1).sum())
    return sum(furthest.values()) * config.head_dim, flops


def measure(engine: Engine, timer: PartTimer, steps: int) -> tuple:
    """Time `steps` engine steps: (wall seconds, part seconds, GEMM FLOPs, GEMM weight bytes, K/V bytes,
    attention FLOPs)."""
    timer.seconds.clear()
    timer.by_gemm.clear()
    timer.gemm_flops = timer.gemm_weight_bytes = timer.kv_bytes = timer.attention_flops = timer.bookkeeping = 0.0
    timer.active = True
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0 - timer.bookkeeping  # the engine's time, not this script's counting
    timer.active = False
    return (
        wall,
        dict(timer.seconds),
        timer.gemm_flops,
        timer.gemm_weight_bytes,
        timer.kv_bytes,
        timer.attention_flops,
        {group: list(values) for group, values in timer.by_gemm.items()},
    )


def table(
    title: str,
    steps: int,
    measured,
    peak_gflops: float,
    bandwidth_gbs: float,
    int8: tuple[str, float] | None = None,
    native_gemms: frozenset = frozenset(),
) -> None:
    wall, parts, flops, weight_bytes, kv_bytes, attention_flops, by_gemm = measured
    gemm_floor = max(flops / (peak_gflops * 1e9), weight_bytes / (bandwidth_gbs * 1e9))
    attention_floor = max(kv_bytes / (bandwidth_gbs * 1e9), attention_flops / (peak_gflops * 1e9))
    rest = wall - sum(parts.values())
    print(f"\n{title}: {wall / steps * 1e3:.1f} ms per step ({steps} steps)")
    print(f"  {'part':<10} {'ms/step':>8} {'floor':>8} {'x floor':>8}   floor from")
    rows = [
        (
            "gemm",
            parts.get("gemm", 0.0),
            gemm_floor,
            f"{flops / steps / 1e9:.1f} GFLOP at {peak_gflops:.0f} GFLOP/s, or {weight_bytes / steps / 1e6:.0f} MB "
            f"of weights at {bandwidth_gbs:.1f} GB/s",
        ),
        (
            "attention",
            parts.get("attention", 0.0),
            attention_floor,
            f"{kv_bytes / steps / 1e6:.1f} MB of K/V at {bandwidth_gbs:.1f} GB/s, or "
            f"{attention_flops / steps / 1e9:.1f} GFLOP at {peak_gflops:.0f} GFLOP/s",
        ),
        ("sampler", parts.get("sampler", 0.0), None, ""),
        ("rest", rest, None, "packing, norms, RoPE + KV write, scheduler, Python"),
    ]
    for name, seconds, floor, why in rows:
        ratio = f"{seconds / floor:8.2f}" if floor else f"{'':>8}"
        floor_ms = f"{floor / steps * 1e3:8.1f}" if floor else f"{'':>8}"
        print(f"  {name:<10} {seconds / steps * 1e3:8.1f} {floor_ms} {ratio}   {why}")
    if int8 and native_gemms:
        int8_table(steps, by_gemm, int8, bandwidth_gbs, native_gemms)


def int8_table(steps: int, by_gemm: dict, int8: tuple[str, float], bandwidth_gbs: float, native_gemms) -> None:
    """Each native GEMM group of the step against the int8 roofline: its operations at the int8 peak, or its weights'
    bytes at the read bandwidth, whichever is longer."""
    form, gops = int8
    print(
        f"  GEMMs against the int8 roofline ({form} peak {gops:.0f} GOP/s on every core, read {bandwidth_gbs:.1f} GB/s):"
    )
    print(
        f"    {'gemm':<28} {'ms/step':>8} {'int8 floor':>10} {'x floor':>8} {'GOP/s':>7} {'weights MB':>10}  bound by"
    )
    total = [0.0, 0.0]
    for group, (seconds, flops, weight_bytes, _) in sorted(by_gemm.items(), key=lambda item: -item[1][0]):
        if group not in native_gemms:
            continue
        compute, memory = flops / (gops * 1e9), weight_bytes / (bandwidth_gbs * 1e9)
        floor = max(compute, memory)
        total[0] += seconds
        total[1] += floor
        print(
            f"    {group:<28} {seconds / steps * 1e3:8.2f} {floor / steps * 1e3:10.2f} {seconds / floor:8.2f}"
            f" {flops / seconds / 1e9:7.0f} {weight_bytes / steps / 1e6:10.1f}  {'int8 dots' if compute >= memory else 'memory'}"
        )
    if total[1]:
        print(
            f"    {'all native GEMMs':<28} {total[0] / steps * 1e3:8.2f} {total[1] / steps * 1e3:10.2f}"
            f" {total[0] / total[1]:8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--kv-cache-dtype", default="float16")
    parser.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false")
    tiers.add_argument(parser)
    args = parser.parse_args()
    tiers.enter(args)
    print(tiers.header(args, with_llama=False))

    model_path = str(resolve_model(args.model))
    timer = PartTimer()
    timer.wrap_linear()
    timer.wrap_experts()
    timer.wrap_sampler()
    engine = Engine.from_model(
        model_path,
        weights=args.weights,
        batch_invariant=args.batch_invariant,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=64,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
    )
    timer.wrap_attention(engine.config)
    print(
        f"{args.model}: weights {engine.weight_format}, KV cache {engine.kv_cache_dtype}, "
        f"batch-invariant {engine.model.batch_invariant}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    peak, bandwidth = gemm_peak_gflops(), memory_bandwidth_gbs()
    int8_peaks = int8_peak.peaks() if engine.weight_format == "native" else {}
    int8 = next(iter(int8_peaks.items()), None)  # the tier's own form first: vpdpbusd where it has VNNI
    print(
        f"sgemm peak {peak:.0f} GFLOP/s, read bandwidth {bandwidth:.1f} GB/s"
        + "".join(f", int8 {form} peak {gops:.0f} GOP/s" for form, gops in int8_peaks.items())
    )
    if int8_peaks and int8_peak.float_forms():  # what a bf16 engine's GEMMs (vLLM's) and a block kernel could reach
        bf16, mixed = (int8_peak.peak_gops(form) for form in int8_peak.FLOAT_FORMS)
        print(
            f"bf16 vdpbf16ps peak {bf16:.0f} GOP/s (a bfloat16 GEMM's ceiling: vLLM's CPU backend in bf16); "
            f"vpdpbusd beside a Q4_1 block's 3 FMAs {mixed:.0f} GOP/s (a 32-value type's tile kernel's ceiling, "
            "its float steps on vpdpbusd's pipes where they share them)"
        )
    rng = np.random.default_rng(0)
    vocab = engine.config.vocab_size

    # B=64 decode: 64 prompts of 256 tokens, prefilled first, then decode steps only
    params = SamplingParams(max_tokens=args.steps + 64, temperature=0, ignore_eos=True)
    for i in range(64):
        engine.add_request(rng.integers(100, vocab - 1, 256).tolist(), params, request_id=f"d{i}")
    while any(seq.is_prefilling for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    engine.step()  # every kernel compiled for these shapes
    table(
        "B=64 decode (contexts of 256+ tokens)",
        args.steps,
        measure(engine, timer, args.steps),
        peak,
        bandwidth,
        int8,
        frozenset(timer.native_gemms),
    )
    for i in range(64):
        engine.abort(f"d{i}")

    # a 512-token prefill, one step
    prefill = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.add_request(rng.integers(100, vocab - 1, 512).tolist(), prefill, request_id="warm")
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(args.steps):
        engine.add_request(rng.integers(100, vocab - 1, 512).tolist(), prefill, request_id=f"p{i}")
    table(
        "512-token prefill",
        args.steps,
        measure(engine, timer, args.steps),
        peak,
        bandwidth,
        int8,
        frozenset(timer.native_gemms),
    )


if __name__ == "__main__":
    main()
