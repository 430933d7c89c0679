"""Structured output: constraints on what a request may generate (a JSON schema, any JSON object, a regex,
a choice of strings, a Lark grammar), enforced token by token.

    StructuredOutputsParams (on SamplingParams) -> grammar, compiled and checked once per distinct constraint
    -> a matcher per constrained sequence (llguidance's LLMatcher, fed every token the sequence takes)
    -> each step: StructuredOutputs.start_masks() while the forward pass runs -> TokenMasks -> the sampler
       sets every token the grammar does not allow to -inf, on constrained rows only

The grammar engine is llguidance: benchmarks/grammar_engines.py measured it against xgrammar and
outlines-core on the default model's vocabulary. Its mask computation releases the GIL, so the masks of
a step are computed on a helper thread while numba runs the forward pass.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from miro.core.sampling.constraint import StructuredOutputsParams, first_line
from miro.core.errors import RequestError

if TYPE_CHECKING:
    from miro.core.engine.sequence import Sequence
    from miro.core.tokenizers.tokenizer import Tokenizer

MAX_CACHED_GRAMMARS = 256  # compiled grammars an engine keeps (a batch usually has one or a few schemas)


@dataclass
class TokenMasks:
    """The allowed tokens of a step's constrained rows: bits[j] is the packed mask of logits row rows[j]."""

    rows: list[int]
    bits: np.ndarray  # (len(rows), ceil(vocab / 32)) int32, bit t of the row set if token t is allowed

    def allowed(self, j: int, vocab: int) -> np.ndarray:
        """Row rows[j]'s allowed tokens as a boolean array of the logits' width."""
        return np.unpackbits(self.bits[j].view(np.uint8), bitorder="little", count=vocab).astype(bool)


class StructuredOutputs:
    """The engine's side of structured output: the vocabulary as llguidance sees it, a matcher per constrained
    sequence, and the masks of each step."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width (a vocabulary may be padded past its tokens)
        self._ll_tokenizer = None
        self._fresh: dict[str, Any] = {}  # grammar -> a matcher at its start, deep-copied for each sequence
        self._executor = None
        self._thread: ThreadPoolExecutor | None = None

    def _llguidance(self):
        """llguidance's tokenizer and executor, built on first use (about 0.1 s for a 49,152-token vocabulary)."""
        if self._ll_tokenizer is None:
            import llguidance

            self._ll_tokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Vocabulary(self.tokenizer, self.vocab_size)),
                n_vocab=self.vocab_size,
                eos_token=sorted(self.tokenizer.eog_ids),
            )
            self._executor = llguidance.LLExecutor(1)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="miro-masks")
        return self._ll_tokenizer

    def new_matcher(self, params: StructuredOutputsParams):
        """A matcher at the start of the constraint; RequestError if it cannot run on this vocabulary."""
        import llguidance

        grammar = params.grammar_text()
        fresh = self._fresh.get(grammar)
        if fresh is None:
            fresh = llguidance.LLMatcher(self._llguidance(), grammar, log_level=0)
            if fresh.is_error():
                raise RequestError(
                    f"structured_outputs cannot run on this model's vocabulary: {first_line(fresh.get_error())}."
                )
            if len(self._fresh) >= MAX_CACHED_GRAMMARS:
                self._fresh.pop(next(iter(self._fresh)))
            self._fresh[grammar] = fresh
        return fresh.deep_copy()

    def start_masks(self, seqs: list[Sequence]) -> Future | None:
        """Begin computing the masks of the constrained sequences among `seqs` (the rows of the coming logits)
        on a helper thread; None when none is constrained, so unconstrained steps pay nothing."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return None
        matchers = [seqs[i].matcher for i in rows]
        return self._thread.submit(self.masks, matchers, rows)

    def step_masks(
        self, pending: Future | None, seqs: list[Sequence], faults: dict[int, Exception]
    ) -> TokenMasks | None:
        """The masks start_masks began (None if it began none). Should computing them fail, they are computed again
        one matcher at a time, and a row whose own matcher fails, or is in error after its mask, gets its
        exception in `faults` (the engine fails that request alone)."""
        if pending is None:
            return None
        try:
            masks = pending.result()
        except Exception:  # noqa: BLE001 - one matcher's fault: found below, one at a time
            rows, bits = [], []
            for i, seq in enumerate(seqs):
                if seq.matcher is None:
                    continue
                try:
                    bits.append(self.masks([seq.matcher], [i]).bits[0])
                    rows.append(i)
                except Exception as exc:  # noqa: BLE001 - that row's request's fault
                    faults[i] = exc
            masks = TokenMasks(rows, np.stack(bits)) if rows else None
        for i in masks.rows if masks is not None else ():
            matcher = seqs[i].matcher
            if i not in faults and matcher.is_error():
                faults[i] = RequestError(f"structured output: the grammar failed ({first_line(matcher.get_error())})")
        return masks

    def masks(self, matchers: list, rows: list[int]) -> TokenMasks:
        """The masks of `matchers`, one per logits row in `rows`."""
        self._llguidance()
        bits = np.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr(
            [(m, j) for j, m in enumerate(matchers)], bits.ctypes.data, bits.shape[1] * 4, len(rows)
        )
        return TokenMasks(rows, bits)


class _Vocabulary:
    """miro's tokenizer in the shape llguidance.TokenizerWrapper reads: every token's bytes, special tokens
    marked with a leading 0xFF byte (so a grammar never produces them), and an encode function."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        special = tokenizer.special_ids | tokenizer.eog_ids
        self.special_token_ids = sorted(special)
        self.tokens = [
            b"\xff" + tokenizer.id_to_token(i).encode("utf-8") if i in special else tokenizer.token_bytes(i)
            for i in range(tokenizer.vocab_size)
        ]
        self.tokens += [b""] * (vocab_size - len(self.tokens))

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"))
