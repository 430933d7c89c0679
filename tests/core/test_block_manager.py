"""BlockManager unit tests: prefix hits, LRU eviction, hash collisions, copy-on-write, fully cached prompts."""

from __future__ import annotations

import pytest
from block_helpers import make_seq, prefill, run_chunk

import miro.core.engine.block_manager as block_manager_module
from miro.core.engine.block_manager import BlockManager

# ---------------------------------------------------------------------------------------------------
# Unit tests
# ---------------------------------------------------------------------------------------------------


def test_second_prompt_gets_the_first_two_full_blocks():
    bm = BlockManager(16, 4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "a")
    prefill(bm, a)
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13], "b")
    assert bm.admission_cost(b, 3) == 1  # 2 blocks shared, 1 new for tokens 8..10
    assert bm.admission_cost(b, b.num_tokens) == 3  # the scheduler's upper bound: 8 + 11 tokens
    bm.admit(b)
    assert b.block_table == a.block_table[:2]
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert bm.prefix_cache_hit_rate == pytest.approx(8 / (10 + 11))
    run_chunk(bm, b, b.num_uncomputed)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    # a prompt sharing only the first block's tokens, then differing, shares exactly one block
    c = make_seq([1, 2, 3, 4, 5, 6, 0, 8, 9], "c")
    bm.admit(c)
    assert c.block_table == a.block_table[:1] and c.num_computed_tokens == 4
    assert bm.prefix_cache_hit_rate == pytest.approx((8 + 4) / (10 + 11 + 9))


def test_prefix_caching_disabled_shares_nothing():
    bm = BlockManager(16, 4, enable_prefix_caching=False)
    a = make_seq(range(10), "a")
    prefill(bm, a)
    b = make_seq(range(10), "b")
    bm.admit(b)
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert bm.cached == {} and bm.prefix_cache_hit_rate == 0.0


def test_released_blocks_stay_cached_until_their_memory_is_needed():
    bm = BlockManager(8, 4)
    prompt = [5, 6, 7, 8, 1, 2, 3, 4, 9]
    a = make_seq(prompt, "a")
    prefill(bm, a)
    a_blocks = list(a.block_table)
    full = a_blocks[:2]
    bm.release(a)
    assert bm.num_free_blocks == 8
    assert set(full) <= set(bm.cached.values())

    # other work that fits in the never-used blocks leaves them alone (least recently freed go first)
    other = make_seq([0] * 16, "other")  # 4 blocks of the 5 never used
    prefill(bm, other)
    assert not set(other.block_table) & set(a_blocks)
    bm.release(other)

    b = make_seq(prompt, "b")
    assert bm.admission_cost(b, 1) == 3  # 2 cached blocks come off the free list, 1 new for token 8
    bm.admit(b)
    assert b.block_table == full and b.num_computed_tokens == 8
    run_chunk(bm, b, 1)
    bm.release(b)

    # now fill the whole pool with other tokens: a's blocks are evicted and no key points at them
    fillers = []
    for k in range(4):
        s = make_seq([100 + k] * 8, f"f{k}")
        prefill(bm, s)
        fillers.append(s)
    assert bm.num_free_blocks == 0
    for block_id in full:
        assert bm.blocks[block_id].token_ids != tuple(prompt[:4]) and bm.blocks[block_id].token_ids != tuple(
            prompt[4:8]
        )
    for key, block_id in bm.cached.items():
        assert bm.blocks[block_id].hash == key
        assert bm.blocks[block_id].token_ids in {(100 + k,) * 4 for k in range(4)}
    for s in fillers:
        bm.release(s)
    c = make_seq(prompt, "c")
    bm.admit(c)
    assert c.block_table == [] and c.num_computed_tokens == 0


def test_lru_evicts_least_recently_freed_first():
    bm = BlockManager(4, 2)
    a = make_seq([1, 1, 2, 2], "a")  # 2 full blocks, no spare
    b = make_seq([3, 3], "b")
    prefill(bm, a)
    prefill(bm, b)
    a_first, a_second = a.block_table
    (b_block,) = b.block_table
    bm.release(a)  # freed: a's 2nd block, then a's 1st
    bm.release(b)  # then b's block
    c = make_seq([9, 9], "c")  # takes the never-used block (freed at start), not a cached one
    prefill(bm, c)
    assert c.block_table not in ([a_first], [a_second], [b_block])
    d = make_seq([8, 8], "d")  # needs one more: a's 2nd block, the least recently freed cached one
    prefill(bm, d)
    assert d.block_table == [a_second]
    assert bm.blocks[a_second].token_ids == (8, 8)  # re-keyed for d: the key for [1, 1, 2, 2] is gone
    assert all(bm.blocks[b].token_ids != (2, 2) for b in bm.cached.values())
    assert a_first in bm.cached.values()
    # a's first block is still there for a prompt with the same start; its second block is gone
    e = make_seq([1, 1, 2, 2], "e")
    bm.admit(e)
    assert e.block_table == [a_first] and e.num_computed_tokens == 2


@pytest.mark.parametrize(
    "weak_hash",
    [
        pytest.param(lambda parent, tokens: 0, id="constant"),
        pytest.param(lambda parent, tokens: hash(tokens), id="ignores-parent"),
    ],
)
def test_hash_collisions_never_mix_sequences(monkeypatch, weak_hash):
    monkeypatch.setattr(block_manager_module, "block_hash", weak_hash)
    bm = BlockManager(32, 4)
    a = make_seq([1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0], "a")
    prefill(bm, a)
    # different first block: no hit at all, whatever the hash says
    b = make_seq([7, 7, 7, 7, 2, 2, 2, 2, 3, 3, 3, 3, 0], "b")
    bm.admit(b)
    assert b.block_table == [] and b.num_computed_tokens == 0
    run_chunk(bm, b, b.num_uncomputed)
    assert not set(b.block_table) & set(a.block_table)
    # b's 2nd and 3rd blocks hold 2222 and 3333 after 7777: a prompt starting 7777 may share b's first
    # block but never a's 2nd/3rd (same tokens, other prefix)
    c = make_seq([7, 7, 7, 7, 2, 2, 2, 2, 3, 3, 3, 3, 0], "c")
    bm.admit(c)
    assert set(c.block_table) <= set(b.block_table)
    assert c.block_table == b.block_table[: len(c.block_table)]
    # a prompt equal to a's except in its last full block gets a's first blocks only
    d = make_seq([1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 9, 0], "d")
    bm.admit(d)
    assert d.block_table == a.block_table[: len(d.block_table)] and len(d.block_table) <= 2
    for seq in (a, b, c, d):
        bm.release(seq)
    assert bm.num_free_blocks == 32


def test_fork_shares_all_blocks_and_first_write_to_partial_block_copies_once():
    bm = BlockManager(16, 4)
    parent = make_seq([1, 2, 3, 4, 5, 6], "p")
    prefill(bm, parent)
    child = make_seq(parent.prompt_token_ids, "p", 1)
    free_before = bm.num_free_blocks
    bm.fork(parent, child)
    assert bm.num_free_blocks == free_before
    assert child.block_table == parent.block_table and child.num_computed_tokens == 6
    assert all(bm.blocks[b].ref_count == 2 for b in parent.block_table)
    parent.output_token_ids.append(10)
    child.output_token_ids.append(11)

    shared_last = parent.block_table[-1]
    assert bm.blocks_to_grow(parent, 1) == 1
    copies = run_chunk(bm, parent, 1)
    new_last = parent.block_table[-1]
    assert copies == [(shared_last, new_last)] and new_last != shared_last
    assert bm.blocks[shared_last].ref_count == 1 and bm.blocks[new_last].ref_count == 1
    assert parent.block_table[0] == child.block_table[0] and bm.blocks[parent.block_table[0]].ref_count == 2
    # the other holder now owns the old block alone: it writes in place
    assert bm.blocks_to_grow(child, 1) == 0
    assert run_chunk(bm, child, 1) == []
    assert child.block_table[-1] == shared_last
    # later writes copy nothing
    parent.output_token_ids.append(12)
    assert run_chunk(bm, parent, 1) == []
    bm.release(parent)
    bm.release(child)
    assert bm.num_free_blocks == 16 and all(b.ref_count == 0 for b in bm.blocks)


def test_fork_at_block_boundary_copies_nothing():
    bm = BlockManager(16, 4)
    parent = make_seq([1, 2, 3, 4, 5, 6, 7, 8], "p")
    prefill(bm, parent)
    child = make_seq(parent.prompt_token_ids, "p", 1)
    bm.fork(parent, child)
    parent.output_token_ids.append(1)
    child.output_token_ids.append(2)
    assert run_chunk(bm, parent, 1) == [] and run_chunk(bm, child, 1) == []
    assert parent.block_table[:2] == child.block_table[:2] and parent.block_table[2] != child.block_table[2]


def test_whole_prompt_cached_recomputes_its_last_block():
    bm = BlockManager(16, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    a = make_seq(prompt, "a")
    prefill(bm, a)
    a_blocks = list(a.block_table)
    bm.release(a)
    b = make_seq(prompt, "b")
    bm.admit(b)
    # the last token must be computed for the logits: its block is recomputed into a block of b's own
    assert b.block_table == a_blocks[:1]
    assert b.num_computed_tokens == len(prompt) - 4 == b.num_cached_tokens
    assert bm.blocks_to_grow(b, b.num_uncomputed) == 1
    assert run_chunk(bm, b, b.num_uncomputed) == []  # no copy-on-write
    # a prompt one token longer than the cached blocks reuses them all and computes only its tail
    c = make_seq(prompt + [9], "c")
    bm.admit(c)
    assert c.num_computed_tokens == 8 and c.block_table == a_blocks  # a's last block is still cached


def test_admission_cost_counts_the_recomputed_last_block():
    bm = BlockManager(3, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    a = make_seq(prompt, "a")
    prefill(bm, a)  # a holds two blocks and keeps running; one block is free
    b = make_seq(prompt, "b")
    cost = bm.admission_cost(b, 1)
    assert cost == 1  # the last block is recomputed into a fresh block
    free_before = bm.num_free_blocks
    bm.admit(b)
    assert run_chunk(bm, b, b.num_uncomputed) == []
    assert free_before - bm.num_free_blocks == cost
    c = make_seq(prompt, "c")
    assert bm.admission_cost(c, 1) == 1 > bm.num_free_blocks  # the scheduler would refuse c now


def test_copy_on_write_never_copies_a_block_filled_in_the_same_step():
    bm = BlockManager(16, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    a, b = make_seq(prompt, "a"), make_seq(prompt, "b")
    # one scheduler step: a is admitted and scheduled to fill its 2 blocks, then b with the same prompt
    bm.admit(a)
    bm.grow(a, 8)
    bm.register_full_blocks(a, 8)
    assert bm.admission_cost(b, 8) <= bm.num_free_blocks
    bm.admit(b)  # shares both of a's blocks (in flight), num_computed_tokens == 7
    copies = bm.grow(b, b.num_uncomputed)
    # the engine runs the copies before the forward pass, which is what writes a's blocks: b would attend
    # to garbage at positions 4..6
    assert not {src for src, _ in copies} & set(a.block_table), f"copies {copies} read a's unwritten blocks"
