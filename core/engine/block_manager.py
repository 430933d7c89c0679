"""BlockManager: which KV-cache blocks each sequence owns, with automatic prefix caching and copy-on-write.

A full block is keyed by a hash of its token ids chained with its parent
block's key, so equal prefixes map to the same blocks. A block whose last
owner leaves keeps its key and contents in a LRU free list until its memory
is needed again, so a later request with the same prefix can still reuse it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from miro.core.engine.sequence import Sequence

NO_HASH = -1


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    token_ids: tuple[int, ...] = field(default_factory=tuple)
    parent_id: int = -1  # the block before it in the sequence it was keyed for


def block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks, least recently freed first; values unused
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found

    # -- accounting --------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- internal ----------------------------------------------------------------------------------

    def _take_free_block(self) -> Block:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]  # its contents are about to be overwritten
        block.hash, block.token_ids, block.parent_id, block.ref_count = NO_HASH, (), -1, 1
        return block

    def _ref(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free[block.block_id]
        block.ref_count += 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block_id] = None

    def _chained_keys(self, token_ids: list[int]):
        """(tokens, key) of each full block of `token_ids`, each key chained with the one before it."""
        key = NO_HASH
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            chunk = tuple(token_ids[start : start + self.block_size])
            key = block_hash(key, chunk)
            yield chunk, key

    def _cached_prefix(self, token_ids: list[int]) -> list[Block]:
        """The longest run of full blocks of `token_ids` present in the cache (tokens compared, not just hashes)."""
        hits, parent_id = [], -1
        for chunk, key in self._chained_keys(token_ids):
            block = self.blocks[self.cached[key]] if key in self.cached else None
            # tokens and parent block checked too: by induction the whole prefix is equal, never just its hash
            if block is None or block.token_ids != chunk or block.parent_id != parent_id:
                break
            hits.append(block)
            parent_id = block.block_id
        return hits

    def cached_prompt_blocks(self, seq: Sequence) -> int:
        """How many of the prompt's leading full blocks the cache holds, by key alone: the scheduler's hint
        for admission by shared prefix (admit() checks the tokens too). The keys are worked out once per
        sequence."""
        if not self.enable_prefix_caching:
            return 0
        if seq.prompt_block_hashes is None:
            seq.prompt_block_hashes = [key for _, key in self._chained_keys(seq.prompt_token_ids)]
        n = 0
        for key in seq.prompt_block_hashes:
            if key not in self.cached:
                break
            n += 1
        return n

    # -- admission -----------------------------------------------------------------------------------

    def admit(self, seq: Sequence) -> None:
        """Give a waiting sequence the cached blocks of its longest cached prefix."""
        assert not seq.block_table
        tokens = seq.token_ids
        hits = self._usable_hits(tokens)
        for block in hits:
            self._ref(block)
        seq.block_table = [b.block_id for b in hits]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        self.prefix_queries += len(tokens)
        self.prefix_hits += seq.num_cached_tokens

    def _usable_hits(self, token_ids: list[int]) -> list[Block]:
        """Cached prefix blocks a new sequence may take. At least the last token must be computed, to
        produce the next-token logits; when every block is cached, the last one is recomputed into a block
        of the sequence's own rather than written while others may read it."""
        if not self.enable_prefix_caching:
            return []
        hits = self._cached_prefix(token_ids)
        if hits and len(hits) * self.block_size >= len(token_ids):
            hits = hits[:-1]
        return hits

    def admission_cost(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks that admitting `seq` and computing `num_new_tokens` of it would take."""
        hits = self._usable_hits(seq.token_ids)
        from_free_list = sum(1 for b in hits if b.ref_count == 0)
        cached_tokens = len(hits) * self.block_size
        new_blocks = max(0, self.blocks_needed(cached_tokens + num_new_tokens) - len(hits))
        return from_free_list + new_blocks

    # -- growth ---------------------------------------------------------------------------------------

    def blocks_to_grow(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks needed to hold `num_new_tokens` more computed tokens (copy-on-write included)."""
        total = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        needed = max(0, total - len(seq.block_table))
        if self._last_block_is_shared_partial(seq):
            needed += 1
        return needed

    def _last_block_is_shared_partial(self, seq: Sequence) -> bool:
        if not seq.block_table or seq.num_computed_tokens % self.block_size == 0:
            return False
        return self.blocks[seq.block_table[-1]].ref_count > 1

    def grow(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for `num_new_tokens` more tokens; return (src, dst) block copies to do first (copy-on-write)."""
        copies = []
        if self._last_block_is_shared_partial(seq):
            old = seq.block_table[-1]
            new = self._take_free_block().block_id
            self._unref(old)
            seq.block_table[-1] = new
            copies.append((old, new))
        while len(seq.block_table) < self.blocks_needed(seq.num_computed_tokens + num_new_tokens):
            seq.block_table.append(self._take_free_block().block_id)
        return copies

    def register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Key every block of `seq` that its first `num_tokens` tokens fill, so other prompts can share it.

        The scheduler calls this for the tokens a step is about to compute: a prompt admitted later in the
        same step may then share those blocks, since each layer writes all new K/V before any attention reads.
        """
        if not self.enable_prefix_caching:
            return
        tokens = seq.token_ids
        key, parent_id = NO_HASH, -1
        for i in range(num_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.hash == NO_HASH:
                chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
                block.hash, block.token_ids, block.parent_id = block_hash(key, chunk), chunk, parent_id
                self.cached.setdefault(block.hash, block.block_id)
            key, parent_id = block.hash, block.block_id

    # -- release ----------------------------------------------------------------------------------------

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent; the first write to a shared partial block copies it."""
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        for block_id in child.block_table:
            self._ref(self.blocks[block_id])

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's blocks (finished, aborted or preempted)."""
        for block_id in reversed(seq.block_table):
            self._unref(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
