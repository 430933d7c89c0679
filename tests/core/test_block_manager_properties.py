"""BlockManager: ref counting, prefix caching, LRU eviction and copy-on-write.

The state machine drives the BlockManager the way the scheduler and engine do (capacity checks with
`admission_cost` / `blocks_to_grow`, then `admit`, `grow`, `register_full_blocks`, the step's writes,
`num_computed_tokens += n`, appended tokens, `fork`, `release`) and keeps its own model of what every
physical block really holds: slot j of a block holds the K/V of one position p of one sequence, which
depends on all tokens up to p, so the model records `tuple(token_ids[:p + 1])` there. Any sharing that
mixes sequences, any write into a block someone else still reads, any copy-on-write done wrong shows up
as a live sequence whose computed positions do not hold its own tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from block_helpers import make_seq

import miro.core.engine.block_manager as block_manager_module
from miro.core.engine.block_manager import NO_HASH, BlockManager
from miro.core.engine.sequence import Sequence

MAX_LIVE = 8  # live sequences at once
MAX_WAITING = 4  # preempted sequences waiting to be admitted again
MAX_TOKENS = 48  # a sequence stops growing past this


# ---------------------------------------------------------------------------------------------------
# State machine
# ---------------------------------------------------------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.live: list[Sequence] = []  # hold blocks
        self.waiting: list[Sequence] = []  # preempted, hold none
        self.history: list[list[int]] = [[0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]]
        self.next_id = 0

    @initialize(
        num_blocks=st.integers(8, 24),
        block_size=st.sampled_from([2, 4, 16]),
        caching=st.sampled_from([True, True, True, False]),
    )
    def setup(self, num_blocks, block_size, caching):
        self.bs = block_size
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        # content[b][j]: the prefix whose last token's K/V slot j of block b holds (None: never written)
        self.content: list[list[tuple | None]] = [[None] * block_size for _ in range(num_blocks)]

    # -- one scheduler step ------------------------------------------------------------------------
    #
    # Like Scheduler.schedule + Engine.step: every scheduled sequence grows and has its blocks keyed
    # (num_computed_tokens unchanged meanwhile, so a sequence admitted later in the step may share blocks
    # an earlier one is about to fill); then the copy-on-write copies; then the forward pass writes every
    # new K/V (each layer writes all before any attention reads); then num_computed_tokens += n.

    def _begin_step(self) -> None:
        self.scheduled: list[tuple[Sequence, int, int]] = []  # (seq, first position, n)
        self.step_copies: list[tuple[int, int]] = []

    def _holders(self, block_id: int) -> list[Sequence]:
        return [s for s in self.live if block_id in s.block_table]

    def _schedule(self, seq: Sequence, n: int) -> None:
        """grow + register_full_blocks, checking what grow takes and the copy-on-write pair it returns."""
        bm, bs = self.bm, self.bs
        need = bm.blocks_to_grow(seq, n)
        assert need <= bm.num_free_blocks, "callers check capacity first"
        free_before = bm.num_free_blocks
        old_table = list(seq.block_table)
        was_cached = set(bm.cached.values())
        last_shared_partial = (
            bool(old_table) and seq.num_computed_tokens % bs != 0 and bm.blocks[old_table[-1]].ref_count > 1
        )
        copies = bm.grow(seq, n)
        table = seq.block_table
        assert free_before - bm.num_free_blocks == need, "blocks_to_grow must be exactly what grow takes"
        assert len(table) == bm.blocks_needed(seq.num_computed_tokens + n)

        if last_shared_partial:
            assert len(copies) == 1, f"a shared partial last block must be copied once, got {copies}"
            ((src, dst),) = copies
            assert src == old_table[-1]
            assert table[: len(old_table) - 1] == old_table[:-1]
            assert table[len(old_table) - 1] == dst
            # src is still read by someone else; dst belongs to the writer alone
            assert bm.blocks[src].ref_count >= 1
            assert [s for s in self._holders(src) if s is not seq], "copied from a block nobody else holds"
            assert seq not in self._holders(src)
            assert bm.blocks[dst].ref_count == 1 and self._holders(dst) == [seq]
            assert dst not in old_table
            # the copy runs before the forward pass: src must not be filled by this very step
            for other, start, m in self.scheduled:
                written = {other.block_table[p // bs] for p in range(start, start + m)}
                assert src not in written or all(
                    self.content[src][p % bs] == tuple(other.token_ids[: p + 1])
                    for p in range(start, start + m)
                    if other.block_table[p // bs] == src
                ), f"copy-on-write copies block {src} before this step's forward pass fills it"
            self.step_copies.append((src, dst))
            event("copy-on-write")
        else:
            assert copies == [], f"unexpected copy-on-write {copies}"
            assert table[: len(old_table)] == old_table
        for block_id in table[len(old_table) :]:  # fresh from the free list
            assert bm.blocks[block_id].ref_count == 1 and self._holders(block_id) == [seq]
            assert bm.blocks[block_id].hash == NO_HASH
            self.content[block_id] = [None] * bs
            if block_id in was_cached:
                event("evicted a cached block")

        bm.register_full_blocks(seq, seq.num_computed_tokens + n)
        self.scheduled.append((seq, seq.num_computed_tokens, n))

    def _finish_step(self) -> None:
        """The copies, the forward pass's K/V writes, then the engine's num_computed_tokens += n."""
        for src, dst in self.step_copies:
            self.content[dst] = list(self.content[src])
        for seq, start, n in self.scheduled:
            tokens = seq.token_ids
            for p in range(start, start + n):
                self.content[seq.block_table[p // self.bs]][p % self.bs] = tuple(tokens[: p + 1])
        for seq, start, n in self.scheduled:
            assert seq.num_computed_tokens == start
            seq.num_computed_tokens += n
        # a write that changed K/V another sequence reads shows up in every_live_sequence_sees_its_own_kv

    def _try_admit(self, seq: Sequence, budget: int) -> int:
        """The scheduler's admission: `admission_cost` for an upper bound of the chunk, admit, schedule.

        Returns the tokens scheduled (0: not admitted)."""
        bm, bs = self.bm, self.bs
        n_upper = min(seq.num_tokens, budget)
        cost = bm.admission_cost(seq, n_upper)
        if cost > bm.num_free_blocks:
            event("admission refused: no room")
            return 0
        free_before = bm.num_free_blocks
        tokens = seq.token_ids
        bm.admit(seq)
        hits = list(seq.block_table)
        self.live.append(seq)
        if not bm.enable_prefix_caching:
            assert hits == []
        for i, block_id in enumerate(hits):
            # (what the hit blocks hold is checked once this step's writes are done: they may be in flight)
            block = bm.blocks[block_id]
            assert block.hash != NO_HASH
            assert block.token_ids == tuple(tokens[i * bs : (i + 1) * bs]), (
                f"prefix hit {i} is block {block_id} keyed for other tokens"
            )
            assert block.parent_id == (hits[i - 1] if i else -1), "prefix hit's parent chain differs"
        assert len(set(hits)) == len(hits)
        assert seq.num_computed_tokens == min(len(hits) * bs, len(tokens) - 1)
        assert seq.num_cached_tokens == seq.num_computed_tokens
        if hits:
            event("prefix hit")
            if seq.num_computed_tokens == len(tokens) - 1:
                event("whole prompt cached")
            if any(h in other.block_table[start // bs :] for other, start, _ in self.scheduled for h in hits):
                event("prefix hit on a block filled in the same step")

        n = min(seq.num_uncomputed, budget)
        assert bm.blocks_to_grow(seq, n) <= bm.num_free_blocks, (
            f"admission_cost({n_upper}) = {cost} fit in {free_before} free blocks, but after admit the first "
            f"chunk of {n} needs {bm.blocks_to_grow(seq, n)} with {bm.num_free_blocks} free"
        )
        self._schedule(seq, n)
        assert free_before - bm.num_free_blocks <= cost, "admission took more blocks than admission_cost said"
        return n

    def _new_prompt(self, stem: int, cut: int, suffix: list[int]) -> list[int]:
        """Usually a prefix of an earlier prompt plus a few tokens from a 3-letter alphabet."""
        prompt = (self.history[stem % len(self.history)][:cut] + suffix)[: MAX_TOKENS - 8]
        if not prompt:
            prompt = [suffix[0] if suffix else 0]
        self.history.append(prompt)
        self.next_id += 1
        return prompt

    def _runnable(self) -> list[Sequence]:
        scheduled = {id(s) for s, _, _ in getattr(self, "scheduled", [])}
        return [s for s in self.live if s.num_uncomputed > 0 and id(s) not in scheduled]

    def _run_op(self, op: tuple, budget: int) -> int:
        """One entry of a step: ("admit", stem, cut, suffix) | ("twin", i, cut, suffix) | ("readmit", i) |
        ("run", i, n). Returns the tokens scheduled."""
        if op[0] == "twin":  # a prompt starting like one this step computes (or any live one): same system prompt
            pool = [s for s, _, _ in self.scheduled] or self.live
            if not pool:
                return 0
            self.history.append(pool[op[1] % len(pool)].token_ids)
            op = ("admit", len(self.history) - 1, *op[2:])
        if op[0] == "admit":
            if len(self.live) >= MAX_LIVE:
                return 0
            return self._try_admit(make_seq(self._new_prompt(*op[1:]), f"r{self.next_id}"), budget)
        if op[0] == "readmit":
            if not self.waiting or len(self.live) >= MAX_LIVE:
                return 0
            seq = self.waiting[op[1] % len(self.waiting)]
            n = self._try_admit(seq, budget)
            if n:
                self.waiting.remove(seq)
            return n
        runnable = self._runnable()
        if not runnable:
            return 0
        seq = runnable[op[1] % len(runnable)]
        n = min(op[2], seq.num_uncomputed, budget)
        if self.bm.blocks_to_grow(seq, n) > self.bm.num_free_blocks:
            return 0
        self._schedule(seq, n)
        return n

    # -- rules --------------------------------------------------------------------------------------

    PROMPTS = dict(
        stem=st.integers(0, 1 << 16), cut=st.integers(0, 40), suffix=st.lists(st.integers(0, 2), max_size=10)
    )

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(**PROMPTS, budget=st.integers(1, 48))
    def admit_new(self, stem, cut, suffix, budget):
        """A new prompt is admitted (alone in its step) and its first chunk computed."""
        self._begin_step()
        self._run_op(("admit", stem, cut, suffix), budget)
        self._finish_step()

    @precondition(lambda self: self.waiting and len(self.live) < MAX_LIVE)
    @rule(i=st.integers(0, 1 << 16), budget=st.integers(1, 48))
    def readmit(self, i, budget):
        """A preempted sequence (prompt + its outputs so far) is admitted again."""
        self._begin_step()
        self._run_op(("readmit", i), budget)
        self._finish_step()

    @precondition(lambda self: any(s.num_uncomputed > 0 for s in self.live))
    @rule(i=st.integers(0, 1 << 16), n=st.integers(1, 20))
    def compute_chunk(self, i, n):
        """The next prefill chunk (or the one decode token) of a running sequence, if blocks allow."""
        self._begin_step()
        self._run_op(("run", i, n), n)
        self._finish_step()

    @rule(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("admit"), *PROMPTS.values()),
                st.tuples(st.just("twin"), *PROMPTS.values()),
                st.tuples(st.just("readmit"), st.integers(0, 1 << 16)),
                st.tuples(st.just("run"), st.integers(0, 1 << 16), st.integers(1, 20)),
            ),
            min_size=2,
            max_size=5,
        ),
        budget=st.integers(2, 64),
    )
    def batched_step(self, ops, budget):
        """Several sequences in one step, within a token budget; runs first, admissions after, as scheduled."""
        self._begin_step()
        for op in sorted(ops, key=lambda op: op[0] != "run"):  # stable: admissions keep their order
            if budget == 0:
                break
            budget -= self._run_op(op, budget)
        self._finish_step()

    @precondition(lambda self: any(s.num_uncomputed == 0 and s.num_tokens < MAX_TOKENS for s in self.live))
    @rule(i=st.integers(0, 1 << 16), token=st.integers(0, 2))
    def append_token(self, i, token):
        """A sampled token is appended to a sequence whose every token is computed."""
        seqs = [s for s in self.live if s.num_uncomputed == 0 and s.num_tokens < MAX_TOKENS]
        seqs[i % len(seqs)].output_token_ids.append(token)

    @precondition(lambda self: self.live and len(self.live) < MAX_LIVE)
    @rule(i=st.integers(0, 1 << 16))
    def fork(self, i):
        """n > 1: a child with the same tokens shares every block of its parent."""
        parent = self.live[i % len(self.live)]
        child = make_seq(parent.prompt_token_ids, parent.request_id, parent.index + 1, parent.output_token_ids)
        free_before = self.bm.num_free_blocks
        self.bm.fork(parent, child)
        assert self.bm.num_free_blocks == free_before
        assert child.block_table == parent.block_table and child.block_table is not parent.block_table
        assert child.num_computed_tokens == parent.num_computed_tokens
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 16), preempt=st.booleans())
    def release(self, i, preempt):
        """A sequence finishes or is aborted (gone), or is preempted (waits to be recomputed)."""
        seq = self.live[i % len(self.live)]
        self.live.remove(seq)
        self.bm.release(seq)
        assert seq.block_table == [] and seq.num_computed_tokens == 0
        if preempt and len(self.waiting) < MAX_WAITING:
            self.waiting.append(seq)

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def accounting(self):
        bm = self.bm
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        counts = [0] * bm.num_blocks
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table), f"block twice in {seq.block_table}"
            assert len(seq.block_table) == bm.blocks_needed(seq.num_computed_tokens)
            for block_id in seq.block_table:
                counts[block_id] += 1
        for seq in self.waiting:
            assert seq.block_table == []
        assert [b.ref_count for b in bm.blocks] == counts, "ref counts differ from the block tables"
        assert set(bm.free) == {i for i, c in enumerate(counts) if c == 0}, "free list != blocks with ref 0"
        assert len(bm.free) == len(set(bm.free))

    @invariant()
    def prefix_cache_is_consistent(self):
        """Every cached key points at a block keyed so, whose recorded tokens and parent are what it holds."""
        bm, bs = self.bm, self.bs
        for key, block_id in bm.cached.items():
            block = bm.blocks[block_id]
            assert block.hash == key
            held = self.content[block_id]
            assert all(v is not None for v in held), f"cached block {block_id} not fully written"
            assert tuple(v[-1] for v in held) == block.token_ids
            prefix = held[0][:-1]  # the tokens before this block, in the sequence it was filled for
            assert all(held[j][:-1] == prefix + block.token_ids[:j] for j in range(bs))
            if block.parent_id == -1:
                assert prefix == ()
            else:
                assert self.content[block.parent_id][-1] == prefix, (
                    f"cached block {block_id} names parent {block.parent_id}, which now holds other tokens"
                )

    @invariant()
    def every_live_sequence_sees_its_own_kv(self):
        for seq in self.live:
            tokens = seq.token_ids
            for p in range(seq.num_computed_tokens):
                held = self.content[seq.block_table[p // self.bs]][p % self.bs]
                assert held == tuple(tokens[: p + 1]), f"position {p} of {seq.request_id} holds other K/V"

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in self.live:
            self.bm.release(seq)
        assert self.bm.num_free_blocks == self.bm.num_blocks, "blocks leaked"
        assert all(b.ref_count == 0 for b in self.bm.blocks)
        assert set(self.bm.free) == set(range(self.bm.num_blocks))


STATE_MACHINE_SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_block_manager_state_machine():
    run_state_machine_as_test(BlockManagerMachine, settings=STATE_MACHINE_SETTINGS)


@pytest.mark.parametrize(
    "weak_hash",
    [
        pytest.param(lambda parent, tokens: 0, id="constant"),
        pytest.param(lambda parent, tokens: hash(tokens), id="ignores-parent"),
        pytest.param(lambda parent, tokens: sum(tokens) % 3, id="token-sum-mod-3"),
    ],
)
def test_block_manager_state_machine_with_colliding_hashes(monkeypatch, weak_hash):
    """With a hash that collides all the time, sharing may get rarer but must never mix sequences."""
    monkeypatch.setattr(block_manager_module, "block_hash", weak_hash)
    run_state_machine_as_test(BlockManagerMachine, settings=settings(STATE_MACHINE_SETTINGS, max_examples=60))
