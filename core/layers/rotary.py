"""RoPE cos/sin tables, grown with the positions a model has seen (a file's context_length is only a claim)."""

from __future__ import annotations

import numpy as np

ROPE_CHUNK = 1024  # positions of the RoPE tables computed at a time


def rope_tables(head_dim: int, theta: float, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for positions start..stop-1, (stop - start, head_dim // 2) float32, computed in float32
    as HF transformers does."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(theta), exponents, dtype=np.float32)
    angles = np.outer(np.arange(start, stop).astype(np.float32), inv_freq).astype(np.float32)
    return np.cos(angles), np.sin(angles)


def empty_rope_tables(head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    empty = np.empty((0, head_dim // 2), dtype=np.float32)
    return empty, empty


def extend_rope_tables(
    cos: np.ndarray, sin: np.ndarray, n_positions: int, head_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin rows covering positions 0..n_positions-1, extended by whole chunks when needed.

    A chunk's values never depend on when it was added, so outputs do not depend on what ran before.
    """
    have = len(cos)
    if n_positions <= have:
        return cos, sin
    stop = -(-n_positions // ROPE_CHUNK) * ROPE_CHUNK
    chunks = [rope_tables(head_dim, theta, start, start + ROPE_CHUNK)
              for start in range(have, stop, ROPE_CHUNK)]
    return np.concatenate([cos, *(c for c, _ in chunks)]), np.concatenate([sin, *(s for _, s in chunks)])


class RopeTable:
    """The cos/sin tables of one RoPE base (theta), grown with the positions a step needs."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim, self.theta = head_dim, theta
        self.cos, self.sin = empty_rope_tables(head_dim)

    def upto(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin covering every position in `positions`."""
        n_positions = int(positions.max()) + 1 if len(positions) else 0
        self.cos, self.sin = extend_rope_tables(self.cos, self.sin, n_positions, self.head_dim, self.theta)
        return self.cos, self.sin
