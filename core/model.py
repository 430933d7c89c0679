"""The llama forward pass over one packed batch of tokens (prefill chunks and decode tokens together).

Each linear layer is one float32 GEMM over every token of the step; RMSNorm,
RoPE, the KV-cache write, SiLU-gate and attention are numba kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels
from .config import ModelConfig
from .kv_cache import KVCache
from .weights import ModelWeights

def linear_blas(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w through OpenBLAS: fast, but a row's rounding can depend on the row count and position."""
    return x @ w


def linear_invariant(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w with every row computed the same way whatever else is in the batch (numba, slower)."""
    return kernels.matmul_invariant(np.ascontiguousarray(x), w, np.empty((x.shape[0], w.shape[1]), np.float32))


@dataclass
class StepInput:
    """Everything the forward pass needs for one step, as flat arrays."""

    token_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int32
    slots: np.ndarray  # (T,) int64: block * block_size + offset where each token's K/V goes
    block_tables: np.ndarray  # (S, max_blocks) int32
    attn_items: np.ndarray  # (W, 4) int32: (seq, kv_head, t_begin, t_end)
    logit_rows: np.ndarray  # (R,) int64: the token rows whose next-token logits are wanted


ATTN_TILE = 16  # query tokens per attention work item


def build_step_input(
    chunks: list[tuple[list[int], int, list[int]]], block_size: int, n_kv_heads: int, want_logits: list[bool]
) -> StepInput:
    """Pack per-sequence chunks (new token ids, position of the first one, block table) into a StepInput."""
    token_ids, positions, slots, items, logit_rows = [], [], [], [], []
    max_blocks = max(len(table) for _, _, table in chunks)
    block_tables = np.full((len(chunks), max_blocks), -1, dtype=np.int32)
    for seq, ((ids, start, table), wants) in enumerate(zip(chunks, want_logits)):
        first_row = len(token_ids)
        pos = np.arange(start, start + len(ids))
        token_ids.extend(ids)
        positions.extend(pos)
        slots.extend(np.asarray(table, dtype=np.int64)[pos // block_size] * block_size + pos % block_size)
        block_tables[seq, : len(table)] = table
        for t0 in range(first_row, first_row + len(ids), ATTN_TILE):
            t1 = min(t0 + ATTN_TILE, first_row + len(ids))
            items.extend((seq, h, t0, t1) for h in range(n_kv_heads))
        if wants:
            logit_rows.append(len(token_ids) - 1)
    return StepInput(
        token_ids=np.asarray(token_ids, dtype=np.int64),
        positions=np.asarray(positions, dtype=np.int32),
        slots=np.asarray(slots, dtype=np.int64),
        block_tables=block_tables,
        attn_items=np.asarray(items, dtype=np.int32).reshape(-1, 4),
        logit_rows=np.asarray(logit_rows, dtype=np.int64),
    )


ROPE_CHUNK = 1024  # positions of the RoPE tables computed at a time


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights):
        self.config = config
        self.weights = weights
        # RoPE cos/sin rows for the positions seen so far: a file's context_length is only a claim
        self.cos = self.sin = np.empty((0, config.head_dim // 2), dtype=np.float32)
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))

    def rope_tables(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin rows covering positions 0..n_positions-1, extended by whole chunks when needed.

        A chunk's values never depend on when it was added, so outputs do not depend on what ran before.
        """
        have = len(self.cos)
        if n_positions > have:
            stop = -(-n_positions // ROPE_CHUNK) * ROPE_CHUNK
            chunks = [kernels.rope_tables(self.config.head_dim, self.config.rope_theta, start, start + ROPE_CHUNK)
                      for start in range(have, stop, ROPE_CHUNK)]
            self.cos = np.concatenate([self.cos, *(cos for cos, _ in chunks)])
            self.sin = np.concatenate([self.sin, *(sin for _, sin in chunks)])
        return self.cos, self.sin

    def forward(self, step: StepInput, cache: KVCache, batch_invariant: bool = False) -> np.ndarray:
        """Run one step: write the new tokens' K/V into `cache`; return logits (R, vocab) for step.logit_rows.

        OpenBLAS's sgemm may round a row differently depending on how many rows the call has and where
        the row sits (it does with its Haswell/Zen kernels), so a token's logits can depend on its batch.
        With batch_invariant the GEMMs run in numba, every row computed identically, at a throughput cost.
        """
        cfg, w = self.config, self.weights
        linear = linear_invariant if batch_invariant else linear_blas
        n_tokens = len(step.token_ids)
        cos, sin = self.rope_tables(int(step.positions.max()) + 1 if n_tokens else 0)
        x = w.token_embd[step.token_ids]
        normed = np.empty_like(x)
        attn_out = np.empty((n_tokens, cfg.n_heads, cfg.head_dim), dtype=np.float32)
        act = np.empty((n_tokens, cfg.ffn_dim), dtype=np.float32)
        for i, layer in enumerate(w.layers):
            kernels.rmsnorm(x, layer.attn_norm, cfg.rms_eps, normed)
            qkv = linear(normed, layer.wqkv)
            kernels.rope_and_store_kv(
                qkv, step.positions, cos, sin, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                step.slots, cache.k[i], cache.v[i],
            )
            # a contiguous copy: numba's code for strided views is several times slower
            q = np.ascontiguousarray(qkv[:, : cfg.q_dim]).reshape(n_tokens, cfg.n_heads, cfg.head_dim)
            kernels.paged_attention(
                q, cache.k[i], cache.v[i], step.block_tables, step.positions, step.attn_items, self.scale, attn_out
            )
            x += linear(attn_out.reshape(n_tokens, cfg.q_dim), layer.wo)
            kernels.rmsnorm(x, layer.ffn_norm, cfg.rms_eps, normed)
            kernels.silu_mul(linear(normed, layer.w_gate_up), act)
            x += linear(act, layer.w_down)
        last = x[step.logit_rows]
        kernels.rmsnorm(last, w.output_norm, cfg.rms_eps, last)
        return linear(last, w.lm_head)
