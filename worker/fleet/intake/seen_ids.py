"""Which custom ids a dataset has used so far, and on which line first: miro-submit's duplicate check at 10M lines.

A dict of str -> line costs 100+ bytes an id (1 GB at 10M lines). `SeenIds` keeps 12 bytes a slot: a 64-bit hash
of the id (blake2b, digest_size=8, of its UTF-8 bytes) and its first line (uint32), in two numpy arrays of one
open-addressing table (linear probing, slot = hash % capacity; hash 0 marks an empty slot, a real 0 is taken as 1).
At most 3/4 of the slots are used: about 16 bytes an id, 153 MiB at 10M. A growth (x1.5) copies the used entries
out compactly, frees the old arrays and re-inserts into the new ones: 1.5x + 0.75x the old table at its peak, not
2.5x; pre-size it with `expected` (see `estimated_lines`) where you can. Two ids with the same 64-bit hash would be
taken as one: at n distinct ids the chance is about n^2 / 2^65 (2.7e-6 at 10M), accepted. Lines are uint32s.

numpy and hashlib only, no compiled code: `add` hashes a chunk, folds its repeats with np.unique and probes for all
its distinct hashes at once in numpy (`_insert`); `first_line` and `in` probe for one id in a Python loop over
memoryviews of the same arrays. Speed and memory: benchmarks/seen_ids.py.
"""

from __future__ import annotations

import os
from hashlib import blake2b

import numpy as np

MAX_LOAD = 0.75
GROWTH = 1.5
MIN_CAPACITY = 16
WINDOW = 8  # slots looked at in _insert's first probing round, twice as many each next one
REHASH_BLOCK = 1 << 16  # entries put into a grown table per _insert call
_ORDER = "little" if np.little_endian else "big"  # hash_ids reads digests as native uint64s


def _insert(keys: np.ndarray, lines: np.ndarray, hashes: np.ndarray, new_lines: np.ndarray):
    """Look up distinct nonzero `hashes` in the table, inserting the absent ones with their `new_lines`. Returns
    (present: bool array, first: each hash's line in the table, its new line if it was absent)."""
    capacity = keys.shape[0]
    slot = (hashes % np.uint64(capacity)).astype(np.intp)
    present, first = np.zeros(hashes.shape[0], dtype=bool), new_lines.copy()
    active, width = np.arange(hashes.shape[0]), WINDOW
    while active.size:
        h, s = hashes[active], slot[active]
        idx = s[:, None] + np.arange(width := min(width, capacity))
        idx[idx >= capacity] -= capacity
        window = keys[idx]
        hit = (window == h[:, None]) | (window == 0)
        pos = hit.argmax(axis=1)
        at, k, found = idx[rows := np.arange(active.size), pos], window[rows, pos], hit[rows, pos]
        match, empty = found & (k != 0), found & (k == 0)
        present[active[match]], first[active[match]] = True, lines[at[match]]
        # absent hashes take their first empty slot; several wanting one slot: the last write wins, the rest go on
        e_at, e_h, won = at[empty], h[empty], np.zeros(active.size, dtype=bool)
        keys[e_at] = e_h
        won[empty] = keys[e_at] == e_h
        lines[at[won]] = new_lines[active[won]]
        slot[active] = np.where(found, at, s + width) % capacity
        active, width = active[~(match | won)], width * 2  # a long cluster takes log2(its length) rounds
    return present, first


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
        self._keys, self._lines = np.zeros(capacity, dtype=np.uint64), np.zeros(capacity, dtype=np.uint32)
        self._key_view, self._line_view = memoryview(self._keys), memoryview(self._lines)  # for the scalar probe
        self._limit = int(MAX_LOAD * capacity)  # ids it may hold before growing

    def _make_room(self, more: int) -> None:
        if (needed := self._count + more) <= self._limit:  # as if every id were new
            return
        capacity, n = self._keys.shape[0], 0
        used = np.empty(self._count, dtype=np.uint64), np.empty(self._count, dtype=np.uint32)
        for start in range(0, capacity, REHASH_BLOCK):  # compactly, without a capacity-long mask
            keys, lines = self._keys[start : start + REHASH_BLOCK], self._lines[start : start + REHASH_BLOCK]
            m = int(np.count_nonzero(mask := keys != 0))
            used[0][n : n + m], used[1][n : n + m] = keys[mask], lines[mask]
            n += m
        del keys, lines, mask
        self._keys = self._lines = self._key_view = self._line_view = None  # the old table is freed here
        self._allocate(max(int(capacity * GROWTH), int(needed / MAX_LOAD) + 1))
        for start in range(0, n, REHASH_BLOCK):
            _insert(
                self._keys, self._lines, used[0][start : start + REHASH_BLOCK], used[1][start : start + REHASH_BLOCK]
            )

    def add(self, custom_ids: list[str], lines: list[int]) -> list[tuple[int, int]]:
        """Record a chunk of ids in order; return (index in the chunk, first line) for each id already seen (earlier
        chunk or earlier in this chunk). A duplicate is not recorded again (the first line stays)."""
        if len(custom_ids) != len(lines):
            raise ValueError(f"{len(custom_ids)} custom ids but {len(lines)} lines")
        if not custom_ids:
            return []
        self._make_room(len(custom_ids))
        hashes = np.maximum(hash_ids(custom_ids), np.uint64(1))  # 0 marks an empty slot: taken as 1
        distinct, at, inverse = np.unique(hashes, return_index=True, return_inverse=True)  # at: first occurrences
        present, first = _insert(self._keys, self._lines, distinct, np.asarray(lines, dtype=np.uint32)[at])
        self._count += int(distinct.shape[0] - np.count_nonzero(present))
        duplicate = np.ones(hashes.shape[0], dtype=bool)
        duplicate[at[~present]] = False
        return list(zip((index := np.flatnonzero(duplicate)).tolist(), first[inverse[index]].tolist()))

    def first_line(self, custom_id: str, line: int, record: bool = True) -> int | None:
        """One id: record it at `line` and return None if new, else return the line it was first used on. A scalar
        linear probe over memoryviews of the table (hashed as hash_ids does, 0 taken as 1)."""
        keys = self._key_view
        h = int.from_bytes(blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), _ORDER) or 1
        slot = h % len(keys)
        while k := keys[slot]:
            if k == h:
                return self._line_view[slot]
            slot = slot + 1 if slot + 1 < len(keys) else 0
        if record:
            if not 0 <= line <= 0xFFFF_FFFF:
                raise OverflowError(f"line {line} does not fit in a uint32")
            if self._count >= self._limit:  # grown (its view of the old table let go first): probe the new one
                del keys
                self._make_room(1)
                return self.first_line(custom_id, line)
            keys[slot], self._line_view[slot] = h, line
            self._count += 1
        return None

    def __contains__(self, custom_id: str) -> bool:
        return self.first_line(custom_id, 0, record=False) is not None

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays (not counting the moment of a growth, when the old entries are also held)."""
        return self._keys.nbytes + self._lines.nbytes


SAMPLE_BYTES = 4 << 20  # what estimated_lines reads of a file at most


def estimated_lines(path, sample_lines: int = 1000) -> int:
    """About how many lines the file has: its size over the mean byte length of its first `sample_lines` lines, read
    from its first SAMPLE_BYTES at most (one block, never a whole line: a file of one 400 MB line costs 4 MiB here,
    and its line is refused by the scan, which reads it in bounded pieces), for `SeenIds(expected=...)`. 0 for an
    empty file; 1 when the first block holds no line ending."""
    if (size := os.path.getsize(path)) == 0:
        return 0
    with open(path, "rb") as f:
        block = f.read(min(size, SAMPLE_BYTES))
    ends, at, sampled = 0, -1, 0
    while ends < sample_lines and (at := block.find(b"\n", at + 1)) != -1:
        ends, sampled = ends + 1, at + 1
    if ends < sample_lines and len(block) == size:  # the whole file, fewer lines than the sample: its lines
        return ends + (not block.endswith(b"\n"))
    return max(1, round(size * ends / sampled)) if ends else 1
