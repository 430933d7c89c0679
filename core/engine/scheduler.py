"""Scheduler: continuous batching with chunked prefill and preemption by recomputation.

Sequences are ordered by urgency: priority (lower is more urgent, as vLLM's), then arrival. Each step:
0. a waiting sequence more urgent than a running one that has no room (a seat under `max_num_seqs`, or the
   blocks its admission needs) takes it: the least urgent running sequence (lowest priority, newest) is
   preempted until it has room, for each such waiting sequence, most urgent first;
then, within `max_num_batched_tokens`:
1. one token of every running sequence that is decoding, most urgent first;
2. the next chunk of every running sequence still prefilling, most urgent first, each after the admission
   of the waiting sequences more urgent than it (so a high-priority prompt does not wait for low ones' prefill);
3. waiting sequences, admitted most urgent first while `max_num_seqs` and free blocks allow
   (with chunked prefill off, only while a whole prompt fits in what is left of the budget). Within a
   priority, with admission_order="prefix" (the default; SGLang's longest-prefix-match) the one whose prompt
   has the most blocks in the prefix cache goes first, among the next ADMISSION_LOOKAHEAD, so prompts that
   share a prefix run while it is cached instead of after it has been evicted; "arrival": the oldest.
When blocks run out, the least urgent running sequence not yet scheduled in the step is preempted.
A preempted sequence's blocks go back (they stay in the prefix cache) and it waits to be recomputed:
its tokens so far are kept, only their K/V are computed again.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from miro.core import defaults
from miro.core.engine.block_manager import BlockManager
from miro.core.errors import MiroError
from miro.core.engine.sequence import Sequence, SequenceStatus


def seats_for(cache_tokens: int) -> int:
    """max_num_seqs when none is given: a seat per TOKENS_PER_SEAT tokens of KV cache, within
    MAX_NUM_SEQS_RANGE (more seats than the cache can feed only preempt)."""
    low, high = defaults.MAX_NUM_SEQS_RANGE
    return max(low, min(high, cache_tokens // defaults.TOKENS_PER_SEAT))


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step: its tokens start .. start + num_new_tokens - 1 go through the model."""

    seq: Sequence
    start: int  # tokens already in the KV cache when scheduled: the position of the first new token
    num_new_tokens: int
    wants_logits: bool  # the chunk ends at the sequence's last token, so its next token is sampled

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.start + self.num_new_tokens]


@dataclass
class ScheduledBatch:
    """What one step runs (the role of vLLM's SchedulerOutput): the model runner's whole input."""

    seqs: list[ScheduledSequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst), before the step

    def add(self, seq: Sequence, n: int, copies: list[tuple[int, int]]) -> None:
        start = seq.num_computed_tokens
        self.seqs.append(ScheduledSequence(seq, start, n, wants_logits=start + n == seq.num_tokens))
        self.block_copies.extend(copies)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        admission_order: str = defaults.ADMISSION_ORDER,
    ):
        self.block_manager = block_manager
        if admission_order not in defaults.ADMISSION_ORDERS:
            raise MiroError(
                f"the admission order must be one of {', '.join(defaults.ADMISSION_ORDERS)}, not {admission_order!r}."
            )
        self.admission_order = admission_order  # "prefix" or "arrival", within a priority
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Without chunked prefill a prompt is only admitted when all of it fits in the step's budget.
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: list[Sequence] = []  # ordered by urgency: priority, then arrival
        self.running: list[Sequence] = []  # ordered by arrival
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.urgency)

    def add_running(self, seq: Sequence) -> None:
        """A forked sequence that already holds blocks joins the running set directly."""
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        self._preempt_for_urgent()
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        for seq in sorted(self.running, key=lambda s: (s.is_prefilling, s.urgency)):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop, for a more urgent or older sequence
            if seq.is_prefilling:  # waiting sequences more urgent than this one get the budget before its chunk
                budget = self._admit(batch, budget, more_urgent_than=seq.priority)
                if budget == 0:
                    break
            budget = self._continue(batch, seq, budget)
        self._admit(batch, budget)
        return batch

    def _continue(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        """Schedule a running sequence's next token or prefill chunk, preempting for its blocks if need be;
        returns the budget left."""
        bm = self.block_manager
        n = min(seq.num_uncomputed, budget)
        while bm.blocks_to_grow(seq, n) > bm.num_free_blocks:
            victim = self._least_urgent_unscheduled(batch)
            self.preempt(victim)
            if victim is seq:
                return budget
        self._schedule(batch, seq, n)
        return budget - n

    def _admit(self, batch: ScheduledBatch, budget: int, more_urgent_than: int | None = None) -> int:
        """Admit waiting sequences, most urgent first (only those of a priority below `more_urgent_than`, if
        given), while seats, blocks and the budget allow; returns the budget left."""
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._next_to_admit()
            if more_urgent_than is not None and seq.priority >= more_urgent_than:
                break
            if not self.enable_chunked_prefill and seq.num_tokens > budget and len(batch):
                break
            n = min(seq.num_tokens, budget)  # an upper bound: prefix-cache hits make it smaller
            if bm.admission_cost(seq, n) > bm.num_free_blocks:
                break
            self.waiting.remove(seq)
            bm.admit(seq)
            n = min(seq.num_uncomputed, budget)
            self._schedule(batch, seq, n)
            budget -= n
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.arrival)
        return budget

    def _next_to_admit(self) -> Sequence:
        """The most urgent waiting sequence; by prefix, of the next ADMISSION_LOOKAHEAD of its priority, the
        one with the most prompt blocks in the prefix cache (the oldest of those)."""
        head = self.waiting[0]
        if self.admission_order != "prefix":
            return head
        bm = self.block_manager
        best, most = head, bm.cached_prompt_blocks(head)
        for seq in self.waiting[1 : defaults.ADMISSION_LOOKAHEAD]:
            if seq.priority != head.priority:
                break
            cached = bm.cached_prompt_blocks(seq)
            if cached > most:
                best, most = seq, cached
        return best

    def _schedule(self, batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        copies = self.block_manager.grow(seq, n)
        self.block_manager.register_full_blocks(seq, seq.num_computed_tokens + n)
        batch.add(seq, n, copies)

    def _least_urgent_unscheduled(self, batch: ScheduledBatch) -> Sequence:
        scheduled = {id(s.seq) for s in batch.seqs}
        return max((s for s in self.running if id(s) not in scheduled), key=lambda s: s.urgency)

    def _preempt_for_urgent(self) -> None:
        """Step 0 of the module docstring. Each waiting sequence is counted as if the ones before it were
        admitted (their seats and admission blocks), so one step makes room for all that the running less
        urgent sequences can give; shared prefixes among them are counted once each, an upper bound."""
        if not self.waiting or self._less_urgent_running(self.waiting[0]) is None:
            return  # the usual case, decided without copying a long waiting list
        bm = self.block_manager
        seats = blocks = 0
        for seq in list(self.waiting):
            if self._less_urgent_running(seq) is None:
                return  # and none for the less urgent sequences after it either
            seats += 1
            blocks += bm.admission_cost(seq, min(seq.num_tokens, self.max_num_batched_tokens))
            while len(self.running) + seats > self.max_num_seqs or blocks > bm.num_free_blocks:
                victim = self._less_urgent_running(seq)
                if victim is None:
                    return
                self.preempt(victim)

    def _less_urgent_running(self, seq: Sequence) -> Sequence | None:
        """The least urgent running sequence (lowest priority, then newest), if its priority is below seq's."""
        victim = max(self.running, key=lambda s: s.urgency, default=None)
        return victim if victim is not None and victim.priority > seq.priority else None

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.release(seq)
        self.num_preemptions += 1
        self.add(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.release(seq)
        seq.status = SequenceStatus.FINISHED
