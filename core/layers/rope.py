"""RoPE cos/sin tables, grown with the positions a model has seen (a file's context_length is only a claim).

The tables are llama.cpp's rope cache (ggml-cpu's ggml_rope_cache_init and rope_yarn) laid out as
(position, n_rot / 2): the attention kernel rotates as many pairs as the table has columns, so the
dimensions past `n_rot` (partial rotary) pass through unrotated. Every scaling llama.cpp applies to a
llama-family file is a change of the angles or of their magnitude, so it lives here and nowhere else:

- frequency factors (Llama 3's `rope_freqs.weight`): pair i's angle divided by factor i;
- linear scaling: every angle times `freq_scale` (1 / rope.scaling.factor);
- YaRN: pair i's angle mixed between the scaled and the unscaled one by a ramp over the pairs whose
  wavelengths sit between beta_fast and beta_slow turns in the original context, and cos/sin multiplied
  by the attention factor llama.cpp derives (1 + 0.1 ln(factor)), times the file's attn_factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_CHUNK = 1024  # positions of the RoPE tables computed at a time
YARN_BETA_FAST = 32.0  # llama.cpp's defaults; of miro's architectures only mistral3 reads others from the file
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True)
class RopeParams:
    """How one layer rotates: llama.cpp's rope parameters after its context set-up (llama-context.cpp)."""

    theta: float  # rope.freq_base
    n_rot: int  # dimensions rotated (rope.dimension_count): even, at most head_dim
    freq_scale: float = 1.0  # 1 / rope.scaling.factor for linear and yarn; 1 otherwise
    yarn: bool = False  # llama.cpp's ext_factor 1: the YaRN ramp and magnitude
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (yarn), else the context length
    attn_factor: float = 1.0  # cos and sin are multiplied by it (yarn: times 1 + 0.1 ln(1 / freq_scale))
    beta_fast: float = YARN_BETA_FAST  # YaRN's ramp: pairs turning more than beta_fast times in n_ctx_orig
    beta_slow: float = YARN_BETA_SLOW  # keep their angle, fewer than beta_slow times are scaled

    @property
    def mscale(self) -> float:
        """What cos and sin are multiplied by, as rope_yarn() arrives at it."""
        if not self.yarn:
            return self.attn_factor
        return self.attn_factor * (1.0 + 0.1 * math.log(1.0 / self.freq_scale))


def yarn_attn_factor(factor: float, file_attn_factor: float, log_mul: float = 0.0) -> float:
    """llama.cpp's cparams.yarn_attn_factor: get_mscale(factor), or with a log multiplier (mistral3's
    rope.scaling.yarn_log_multiplier, HF's mscale_all_dim) get_mscale(factor, 1) / get_mscale(factor, log_mul);
    cancelled by the 1 + 0.1 ln(factor) rope_yarn() applies again, times rope.scaling.attn_factor."""

    def get_mscale(mscale: float) -> float:
        return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0

    base = get_mscale(1.0) / get_mscale(log_mul) if log_mul != 0.0 else get_mscale(1.0)
    return base / (1.0 + 0.1 * math.log(factor)) * file_attn_factor


def yarn_corr_dims(params: RopeParams) -> tuple[float, float]:
    """The first and last pair index of YaRN's ramp (ggml_rope_yarn_corr_dims)."""

    def corr_dim(n_turns: float) -> float:
        return params.n_rot * math.log(params.n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(params.theta))

    start = math.floor(corr_dim(params.beta_fast))
    end = math.ceil(corr_dim(params.beta_slow))
    return max(0.0, start), min(params.n_rot - 1.0, end)


def rope_tables(
    params: RopeParams, freq_factors: np.ndarray | None, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for positions start..stop-1, (stop - start, n_rot // 2) float32, computed in float32
    as HF transformers does for the unscaled case."""
    n_rot = params.n_rot
    exponents = np.arange(0, n_rot, 2, dtype=np.int64).astype(np.float32) / np.float32(n_rot)
    inv_freq = np.float32(1.0) / np.power(np.float32(params.theta), exponents, dtype=np.float32)
    if freq_factors is not None:
        inv_freq = (inv_freq / freq_factors.astype(np.float32)).astype(np.float32)
    extrapolated = np.outer(np.arange(start, stop).astype(np.float32), inv_freq).astype(np.float32)
    angles = extrapolated
    if params.freq_scale != 1.0:
        angles = (extrapolated * np.float32(params.freq_scale)).astype(np.float32)
    if params.yarn:
        low, high = yarn_corr_dims(params)
        pair = np.arange(n_rot // 2, dtype=np.float32)
        ramp = (1.0 - np.clip((pair - low) / max(0.001, high - low), 0.0, 1.0)).astype(np.float32)
        angles = (angles * (1.0 - ramp) + extrapolated * ramp).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    if params.mscale != 1.0:
        cos, sin = cos * np.float32(params.mscale), sin * np.float32(params.mscale)
    return cos, sin


def extend_rope_tables(
    cos: np.ndarray, sin: np.ndarray, n_positions: int, params: RopeParams, freq_factors: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin rows covering positions 0..n_positions-1, extended by whole chunks when needed.

    A chunk's values never depend on when it was added, so outputs do not depend on what ran before.
    """
    have = len(cos)
    if n_positions <= have:
        return cos, sin
    stop = -(-n_positions // ROPE_CHUNK) * ROPE_CHUNK
    chunks = [rope_tables(params, freq_factors, start, start + ROPE_CHUNK) for start in range(have, stop, ROPE_CHUNK)]
    return np.concatenate([cos, *(c for c, _ in chunks)]), np.concatenate([sin, *(s for _, s in chunks)])


class RopeTable:
    """The cos/sin tables of one layer kind's RoPE, grown with the positions a step needs."""

    def __init__(self, params: RopeParams, freq_factors: np.ndarray | None = None):
        self.params = params
        self.freq_factors = None if freq_factors is None else np.ascontiguousarray(freq_factors, dtype=np.float32)
        self.cos = self.sin = np.empty((0, params.n_rot // 2), dtype=np.float32)

    def upto(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin covering every position in `positions`."""
        n_positions = int(positions.max()) + 1 if len(positions) else 0
        self.cos, self.sin = extend_rope_tables(self.cos, self.sin, n_positions, self.params, self.freq_factors)
        return self.cos, self.sin
