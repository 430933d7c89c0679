"""Which custom ids a dataset has used so far, and on which line first: miro-submit's duplicate check at 10M lines.

A dict of str -> line costs 100+ bytes an id (1 GB at 10,000,000 lines). `SeenIds` keeps 12 bytes a slot instead:
a 64-bit hash of the id (blake2b, digest_size=8, of its UTF-8 bytes) and its first line (uint32), in two numpy
arrays of one open-addressing table (linear probing, slot = hash % capacity, so the capacity need not be a
power of two; hash 0 marks an empty slot, a real 0 is taken as 1). At most 3/4 of the slots are used: about
16 bytes an id, 160 MB (153 MiB) at 10M; growing makes a table 1.5x as large and rehashes into it (old and new
coexist for that moment, 2.5x the old table: 10M ids grown from nothing peak at 426 MB more RSS, not 198), so
pre-size it with `expected` (see `estimated_lines`) where you can. numba itself adds RSS: ~60 MB at import and
~45 MB more at the first call (its LLVM runtime), compiled or loaded from the cache (benchmarks/seen_ids.py).

Exact enough: two different ids with the same 64-bit hash would be reported as a duplicate. With n distinct ids
the chance that any two collide is about n^2 / 2^65: 2.7e-6 at 10M ids, 2.7e-8 at 1M. That is accepted.
Lines are kept as uint32: a line number above 2**32 - 1 is refused (numpy's OverflowError), not a concern
for datasets of up to 10M lines.

Insertion runs in one numba function over a whole chunk (`_insert`, compiled once and cached on disk: ~0.35 s
the first time, ~0.15 s to load after); the hashing stays in Python (hashlib's blake2b, as fast as any of its
64-bit-or-more digests here), most of add's ~1.8M ids/s.
"""

from __future__ import annotations

import os
from hashlib import blake2b

import numba
import numpy as np

MAX_LOAD = 0.75
GROWTH = 1.5
MIN_CAPACITY = 16


@numba.njit(cache=True)
def _insert(keys, lines, hashes, chunk_lines, dup_index, dup_first):
    """Insert hashes[i] (line chunk_lines[i]) in order; a hash already present is a duplicate: its index and first
    line go to dup_index/dup_first and it is not inserted. Returns (duplicates found, ids inserted)."""
    capacity = np.uint64(keys.shape[0])
    found = 0
    inserted = 0
    for i in range(hashes.shape[0]):
        h = hashes[i]
        if h == 0:
            h = np.uint64(1)
        slot = h % capacity
        while True:
            k = keys[slot]
            if k == 0:
                keys[slot] = h
                lines[slot] = chunk_lines[i]
                inserted += 1
                break
            if k == h:
                dup_index[found] = i
                dup_first[found] = lines[slot]
                found += 1
                break
            slot += np.uint64(1)
            if slot == capacity:
                slot = np.uint64(0)
    return found, inserted


@numba.njit(cache=True)
def _rehash(old_keys, old_lines, keys, lines):
    """Put every used slot of the old table into the new, empty one (all keys distinct, so no comparing)."""
    capacity = np.uint64(keys.shape[0])
    for j in range(old_keys.shape[0]):
        h = old_keys[j]
        if h != 0:
            slot = h % capacity
            while keys[slot] != 0:
                slot += np.uint64(1)
                if slot == capacity:
                    slot = np.uint64(0)
            keys[slot] = h
            lines[slot] = old_lines[j]


def hash_ids(custom_ids: list[str]) -> np.ndarray:
    """The 64-bit hashes of the ids (blake2b digests read as native uint64s); a lone surrogate, which JSON allows,
    is hashed as its own bytes."""
    digests = b"".join([blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest() for i in custom_ids])
    return np.frombuffer(digests, dtype=np.uint64)


class SeenIds:
    """The custom ids seen so far, each with the line it was first used on. See the module's docstring."""

    def __init__(self, expected: int = 0):
        self._count = 0
        self._allocate(max(MIN_CAPACITY, -(-max(expected, 0) * 4 // 3) + 1))

    def _allocate(self, capacity: int) -> None:
        self._keys = np.zeros(capacity, dtype=np.uint64)
        self._lines = np.zeros(capacity, dtype=np.uint32)

    def _make_room(self, more: int) -> None:
        capacity = self._keys.shape[0]
        needed = self._count + more  # as if every id were new
        if needed <= MAX_LOAD * capacity:
            return
        old_keys, old_lines = self._keys, self._lines
        self._allocate(max(int(capacity * GROWTH), int(needed / MAX_LOAD) + 1))
        _rehash(old_keys, old_lines, self._keys, self._lines)

    def add(self, custom_ids: list[str], lines: list[int]) -> list[tuple[int, int]]:
        """Record a chunk of ids in order; return (index in the chunk, first line) for each id already seen (earlier
        chunk or earlier in this chunk). A duplicate is not recorded again (the first line stays)."""
        if len(custom_ids) != len(lines):
            raise ValueError(f"{len(custom_ids)} custom ids but {len(lines)} lines")
        if not custom_ids:
            return []
        self._make_room(len(custom_ids))
        n = len(custom_ids)
        dup_index, dup_first = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.uint32)
        found, inserted = _insert(self._keys, self._lines, hash_ids(custom_ids), np.asarray(lines, dtype=np.uint32),
                                  dup_index, dup_first)
        self._count += inserted
        return list(zip(dup_index[:found].tolist(), dup_first[:found].tolist()))

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays (not counting the moment of a growth, when the old ones are also held)."""
        return self._keys.nbytes + self._lines.nbytes


def estimated_lines(path, sample_lines: int = 1000) -> int:
    """About how many lines the file has: its size over the mean byte length of its first `sample_lines` lines
    (read once, without a pass over the whole file), for `SeenIds(expected=...)`. 0 for an empty file."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    count = length = 0
    with open(path, "rb") as f:
        for line in f:
            count, length = count + 1, length + len(line)
            if count >= sample_lines:
                break
    return max(1, round(size * count / length))
