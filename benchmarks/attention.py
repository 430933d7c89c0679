"""Paged attention kernel speed: miro's numba kernel (float32 and float16 caches, both scores shapes) against
naive numpy and torch SDPA.

    python benchmarks/attention.py [--repeats 7] [--threads N] [--no-torch] [--heads 9,3,64]

Uses the default model's attention dims (SmolLM2-135M: 9 query heads, 3 KV
heads, head_dim 64; --heads sets others) and block size 16, on decode shapes
(64 sequences x 1 new token over contexts of 150, 300 and 1000) and prefill
shapes (1 x 512 new tokens from position 0; 8 x 64 from position 0; 1 x 512
from position 1536, a 2,048-token document's last chunk).

- numba: miro.core.layers.attention.paged_attention on a packed batch over a
  paged cache with shuffled block tables (items from build_step_input), with
  the cache in float32 and in float16 (the same values rounded), with the CPU tier's scores shape
  (queries per key load: attention.SCORE_QUERIES, 4 on 512-bit tiers, 2 on 256-bit ones); the float16
  cache also with the other shape, whose output must be the same bits.
- numpy: per sequence, gather K/V from the blocks, scores matrix, causal
  mask, softmax, weighted sum (float32).
- torch: torch.nn.functional.scaled_dot_product_attention on contiguous
  per-sequence K/V (already gathered, batched over the sequences since they
  share a length), enable_gqa=True, causal for prefill. Skipped when torch
  does not import.

Prints ms per call (median of --repeats runs after one warm-up call), the
ratios numba/numpy, numba/torch (below 1 means numba is faster), numba
float16 / float32 and the other scores shape / the tier's (float16), and the
max-abs difference of the numpy and torch outputs from numba's as a sanity
check. Nothing is asserted but the two shapes' bits. Under
the AVX2 emulation (`cpu.emulation_env("avx2")`, benchmarks/tiers.py) it measures the 256-bit tier.

Timings are only meaningful on an otherwise idle machine: the load average
is printed with the table. On a busy machine OpenBLAS's worker threads (used
by the numpy baseline's small batched matmuls) can slow it down by 100x;
OPENBLAS_NUM_THREADS=1 avoids that.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from miro.core.kernels import cpu
from miro.core.layers.attention import SCORE_QUERIES, paged_attention
from miro.core.engine.step_input import build_step_input

N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16

# (name, number of sequences, new tokens per sequence, start position of the new tokens)
SHAPES = [
    ("decode 64x1 ctx 150", 64, 1, 149),
    ("decode 64x1 ctx 300", 64, 1, 299),
    ("decode 64x1 ctx 1000", 64, 1, 999),
    ("prefill 1x512", 1, 512, 0),
    ("prefill 8x64", 8, 64, 0),
    ("prefill 1x512 at 1536", 1, 512, 1536),  # a long document's last chunk
]


def make_case(rng, n_seqs, n_new, start):
    ctx = start + n_new
    blocks_per_seq = -(-ctx // BLOCK_SIZE)
    num_blocks = n_seqs * blocks_per_seq
    perm = rng.permutation(num_blocks)
    tables = [[int(b) for b in perm[i * blocks_per_seq : (i + 1) * blocks_per_seq]] for i in range(n_seqs)]
    shape = (num_blocks, N_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
    k_cache = rng.standard_normal(shape).astype(np.float32)  # (block, head, position, d), as numpy and torch read it
    v_cache = rng.standard_normal(shape).astype(np.float32)
    step = build_step_input([([0] * n_new, start, t) for t in tables], BLOCK_SIZE, N_KV_HEADS, [True] * n_seqs)
    q = rng.standard_normal((n_seqs * n_new, N_HEADS, HEAD_DIM)).astype(np.float32)
    return q, k_cache, v_cache, step, tables


def kernel_caches(k_cache, v_cache, dtype):
    """The caches in the kernel's layout (K transposed within a block), as float32 or as float16 bits."""
    k = np.ascontiguousarray(k_cache.transpose(0, 1, 3, 2))
    if dtype == "float16":
        return k.astype(np.float16).view(np.uint16), v_cache.astype(np.float16).view(np.uint16)
    return k, v_cache


def numpy_attention(q, k_cache, v_cache, tables, n_new, start, scale):
    """Naive per-sequence attention: gather, full scores matrix, softmax, weighted sum."""
    group = N_HEADS // N_KV_HEADS
    ctx = start + n_new
    pos = np.arange(ctx)
    offsets = pos % BLOCK_SIZE
    mask = pos[None, :] > np.arange(start, ctx)[:, None]  # (n_new, ctx) True where masked
    out = np.empty_like(q)
    for s, table in enumerate(tables):
        blocks = np.asarray(table)[pos // BLOCK_SIZE]
        k = k_cache[blocks, :, offsets, :].transpose(1, 0, 2)  # (n_kv, ctx, hd)
        v = v_cache[blocks, :, offsets, :].transpose(1, 0, 2)
        qs = q[s * n_new : (s + 1) * n_new].reshape(n_new, N_KV_HEADS, group, HEAD_DIM)
        qs = qs.transpose(1, 0, 2, 3).reshape(N_KV_HEADS, n_new * group, HEAD_DIM)
        scores = (qs @ k.transpose(0, 2, 1)) * scale  # (n_kv, n_new * group, ctx)
        scores = scores.reshape(N_KV_HEADS, n_new, group, ctx)
        if n_new > 1:
            scores = np.where(mask[None, :, None, :], np.float32(-np.inf), scores)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = p.reshape(N_KV_HEADS, n_new * group, ctx) @ v  # (n_kv, n_new * group, hd)
        out[s * n_new : (s + 1) * n_new] = (
            o.reshape(N_KV_HEADS, n_new, group, HEAD_DIM).transpose(1, 0, 2, 3).reshape(n_new, N_HEADS, HEAD_DIM)
        )
    return out


def torch_inputs(torch, q, k_cache, v_cache, tables, n_new, start):
    """Contiguous (B, heads, len, hd) tensors: the gather is done here, outside the timed call."""
    ctx = start + n_new
    pos = np.arange(ctx)
    ks, vs = [], []
    for table in tables:
        blocks = np.asarray(table)[pos // BLOCK_SIZE]
        ks.append(k_cache[blocks, :, pos % BLOCK_SIZE, :].transpose(1, 0, 2))
        vs.append(v_cache[blocks, :, pos % BLOCK_SIZE, :].transpose(1, 0, 2))
    tq = torch.from_numpy(np.ascontiguousarray(q.reshape(len(tables), n_new, N_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)))
    tk = torch.from_numpy(np.ascontiguousarray(np.stack(ks)))
    tv = torch.from_numpy(np.ascontiguousarray(np.stack(vs)))
    return tq, tk, tv


def median_ms(fn, repeats):
    fn()  # warm-up (and numba compile on the first shape)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def main() -> None:
    global N_HEADS, N_KV_HEADS, HEAD_DIM
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="numba and torch thread count (default: theirs)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch SDPA")
    parser.add_argument(
        "--heads",
        default=f"{N_HEADS},{N_KV_HEADS},{HEAD_DIM}",
        help="query heads, KV heads, head_dim (default: SmolLM2-135M's; 32,8,64 is Llama-3.2-1B's)",
    )
    args = parser.parse_args()
    N_HEADS, N_KV_HEADS, HEAD_DIM = (int(n) for n in args.heads.split(","))

    import numba

    torch = None
    if not args.no_torch:
        try:
            import torch
            import torch.nn.functional as F
        except ImportError:
            pass
    if args.threads:
        numba.set_num_threads(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    scale = np.float32(1.0 / np.sqrt(HEAD_DIM))
    other = 6 - SCORE_QUERIES  # the other scores shape: 2 or 4
    print(
        f"cpu tier {cpu.TIER.name}, {SCORE_QUERIES} queries per key load (other shape: {other}); "
        f"n_heads {N_HEADS}, n_kv_heads {N_KV_HEADS}, head_dim {HEAD_DIM}, block_size {BLOCK_SIZE}; "
        f"numba threads {numba.get_num_threads()}"
        + (
            f", torch {torch.__version__} threads {torch.get_num_threads()}"
            if torch is not None
            else ", torch: not importable"
        )
        + f"; median of {args.repeats} runs; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    header = (
        f"{'shape':<22} {'numba ms':>9} {'f16 ms':>9} {f'f16 sq{other}':>9} {'numpy ms':>9} {'torch ms':>9} "
        f"{'numba/numpy':>12} {'numba/torch':>12} {'f16/f32':>8} {f'sq{other}/sq{SCORE_QUERIES}':>8} "
        f"{'max|diff|':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, n_seqs, n_new, start in SHAPES:
        q, k_cache, v_cache, step, tables = make_case(rng, n_seqs, n_new, start)
        out = np.empty_like(q)
        caches = {dtype: kernel_caches(k_cache, v_cache, dtype) for dtype in ("float32", "float16")}

        def run_numba(dtype="float32", score_queries=None, into=out):
            kt, v = caches[dtype]
            paged_attention(
                q, kt, v, step.block_tables, step.positions, step.attn_items, scale, into, score_queries=score_queries
            )

        def run_numpy():
            return numpy_attention(q, k_cache, v_cache, tables, n_new, start, scale)

        out_other = np.empty_like(q)
        t_other = median_ms(lambda: run_numba("float16", other, out_other), args.repeats)
        t_f16 = median_ms(lambda: run_numba("float16"), args.repeats)
        assert np.array_equal(out.view(np.uint32), out_other.view(np.uint32)), "the two scores shapes differ"
        t_numba = median_ms(run_numba, args.repeats)
        t_numpy = median_ms(run_numpy, args.repeats)
        diff = float(np.abs(run_numpy() - out).max())
        t_torch = None
        if torch is not None:
            tq, tk, tv = torch_inputs(torch, q, k_cache, v_cache, tables, n_new, start)
            causal = n_new > 1  # prefill from position 0: square causal mask; decode: the token sees everything

            def run_torch():
                with torch.inference_mode():
                    return F.scaled_dot_product_attention(
                        tq, tk, tv, is_causal=causal, scale=float(scale), enable_gqa=True
                    )

            t_torch = median_ms(run_torch, args.repeats)
            t_out = run_torch().numpy().transpose(0, 2, 1, 3).reshape(q.shape)
            diff = max(diff, float(np.abs(t_out - out).max()))
        torch_ms = f"{t_torch:9.3f}" if t_torch is not None else f"{'-':>9}"
        torch_ratio = f"{t_numba / t_torch:12.2f}" if t_torch is not None else f"{'-':>12}"
        print(
            f"{name:<22} {t_numba:9.3f} {t_f16:9.3f} {t_other:9.3f} {t_numpy:9.3f} {torch_ms} {t_numba / t_numpy:12.2f} "
            f"{torch_ratio} {t_f16 / t_numba:8.2f} {t_other / t_f16:8.2f} {diff:10.1e}"
        )


if __name__ == "__main__":
    main()
