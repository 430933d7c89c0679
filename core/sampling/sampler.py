"""Sampler: logits of a step's sequences -> their next tokens (and logprobs).

Greedy rows are an argmax each, over the logits in place. Every other row is processed on
its own, with its own random generator, so a seeded request draws the same
token whatever else is in the batch.
"""

from __future__ import annotations

import numpy as np

from miro.core.sampling.token_mask import mask_rows
from miro.core.sampling.params import SamplingParams
from miro.core.engine.sequence import Sequence
from miro.core.sampling.structured_output import TokenMasks

# top-p looks for its nucleus among this many most likely tokens first and sorts
# the whole vocabulary only when they do not hold enough probability mass
TOP_P_CANDIDATES = 512


def apply_penalties(row: np.ndarray, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> None:
    """Repetition (prompt and output tokens, as vLLM), presence and frequency (output tokens) penalties, in place."""
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(prompt_ids + output_ids, dtype=np.int64))
        values = row[seen]
        row[seen] = np.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        row[ids] -= (params.frequency_penalty * counts + params.presence_penalty).astype(np.float32)


def _top_p_mask(probs: np.ndarray, top_p: float) -> None:
    """Zero every token outside the smallest set of most likely tokens whose mass reaches top_p."""
    target = top_p * probs.sum()
    candidates = (
        np.argpartition(-probs, TOP_P_CANDIDATES)[:TOP_P_CANDIDATES]
        if len(probs) > TOP_P_CANDIDATES
        else np.arange(len(probs))
    )
    if probs[candidates].sum() < target:
        candidates = np.arange(len(probs))
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, target)) + 1  # the top token always stays
    mask = np.zeros(len(probs), dtype=bool)
    mask[order[:keep]] = True
    probs[~mask] = 0.0


def sample_row(row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Draw one token from a processed logits row: temperature, top-k, min-p, top-p, then one uniform draw."""
    x = row.astype(np.float64) / params.temperature
    if 0 < params.top_k < len(x):
        kth = np.partition(x, -params.top_k)[-params.top_k]
        x[x < kth] = -np.inf
    probs = np.exp(x - x.max())
    if params.min_p > 0:
        probs[probs < params.min_p] = 0.0  # relative to the top token, whose prob here is exp(0) = 1
    if params.top_p < 1.0:
        _top_p_mask(probs, params.top_p)
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), len(probs) - 1))


def token_logprobs(raw_row: np.ndarray, token: int, top_n: int) -> dict:
    """The chosen token's log-probability and the top_n most likely tokens, from the model's raw logits."""
    x = raw_row.astype(np.float64)
    logprobs = x - x.max()
    logprobs -= np.log(np.exp(logprobs).sum())
    top = np.argsort(-logprobs, kind="stable")[:top_n] if top_n else np.array([], dtype=np.int64)
    return {"token_id": token, "logprob": float(logprobs[token]), "top": [(int(t), float(logprobs[t])) for t in top]}


def apply_token_masks(processed: np.ndarray, raw: np.ndarray, masks: TokenMasks) -> None:
    """Drop the tokens each constrained row's grammar does not allow. Where min_tokens banned all it allows
    (the grammar is complete and only ends), the grammar wins: the row is its raw logits under the mask."""
    rows = np.asarray(masks.rows, dtype=np.int64)
    emptied = np.zeros(len(rows), dtype=np.bool_)
    mask_rows(processed, rows, masks.bits, emptied)
    for j in np.flatnonzero(emptied):
        allowed = masks.allowed(j, processed.shape[1])
        processed[rows[j]] = np.where(allowed, raw[rows[j]], -np.inf)


def sample(
    logits: np.ndarray,
    seqs: list[Sequence],
    stop_ids: list[set[int]],
    masks: TokenMasks | None = None,
    faults: dict[int, Exception] | None = None,
) -> list[int | None]:
    """Next token for each sequence; `logits[i]` belongs to `seqs[i]`, `stop_ids[i]` are its stop tokens,
    and `masks` holds the allowed tokens of the rows under a structured-output constraint.

    Every row is processed on its own (its penalties, banned stop ids, mask, draw and logprobs touch only its
    row of the copy and its own generator), so a row's token is bitwise the same whatever the other rows are.
    With `faults` (a dict), a row whose processing raises gets its exception there and None as its token, and
    the other rows go on; without, the exception propagates. Rows already in `faults` are skipped."""
    isolated = faults is not None
    faults = {} if faults is None else faults
    tokens: list[int | None] = [None] * len(seqs)

    def guarded(i: int, work) -> None:
        if i in faults:
            return
        if not isolated:
            work()
            return
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - the row's fault, reported with its request
            faults[i] = exc

    processed = logits
    needs_processing = [
        i
        for i, s in enumerate(seqs)
        if s.params.repetition_penalty != 1.0
        or s.params.presence_penalty
        or s.params.frequency_penalty
        or len(s.output_token_ids) < s.params.min_tokens
    ]
    if needs_processing or masks:
        processed = logits.copy()
        for i in needs_processing:

            def penalise(i=i):
                s = seqs[i]
                apply_penalties(processed[i], s.params, s.prompt_token_ids, s.output_token_ids)
                if len(s.output_token_ids) < s.params.min_tokens and stop_ids[i]:
                    processed[i, list(stop_ids[i])] = -np.inf

            guarded(i, penalise)
        if masks:
            _mask(processed, logits, masks, guarded)

    for i, s in enumerate(seqs):

        def draw(i=i, s=s):
            if s.params.greedy:  # row by row: processed[greedy] would copy the logits (64 x 49152: 12.6 MB)
                token = int(processed[i].argmax())
            else:
                token = sample_row(processed[i], s.params, s.rng)
            if s.params.logprobs is not None:
                s.logprobs.append(token_logprobs(logits[i], token, s.params.logprobs))
            tokens[i] = token

        guarded(i, draw)
    return tokens


def _mask(processed: np.ndarray, raw: np.ndarray, masks: TokenMasks, guarded) -> None:
    """The constrained rows' masks, all at once; if that fails, row by row, so only the faulty row's fails (a
    row's mask touches that row alone, so either way each row gets the same bits)."""
    try:
        apply_token_masks(processed, raw, masks)
    except Exception:  # noqa: BLE001 - found again below, row by row
        for j, row in enumerate(masks.rows):
            guarded(
                row, lambda j=j, row=row: apply_token_masks(processed, raw, TokenMasks([row], masks.bits[j : j + 1]))
            )
