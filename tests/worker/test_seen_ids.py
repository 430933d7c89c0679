"""miro.worker.fleet.seen_ids: the hash table of custom ids miro-submit checks duplicates with, and estimated_lines."""

import random

import numpy as np
import pytest

from miro.worker.fleet.seen_ids import MIN_CAPACITY, SeenIds, _insert, estimated_lines, hash_ids


def test_duplicates_across_chunks_keep_the_first_line():
    seen = SeenIds()
    assert seen.add(["a", "b", "c"], [1, 2, 3]) == []
    assert seen.add(["d", "b", "e", "a"], [4, 5, 6, 7]) == [(1, 2), (3, 1)]
    assert seen.add(["b"], [8]) == [(0, 2)]  # line 5's "b" was not recorded over line 2's
    assert len(seen) == 5


def test_duplicates_within_one_chunk():
    seen = SeenIds()
    assert seen.add(["x", "y", "x", "x", "z", "y"], [10, 11, 12, 13, 14, 15]) == [(2, 10), (3, 10), (5, 11)]
    assert len(seen) == 3
    assert seen.add(["z"], [16]) == [(0, 14)]


def test_empty_chunk_and_mismatched_lengths():
    seen = SeenIds()
    assert seen.add([], []) == [] and len(seen) == 0
    with pytest.raises(ValueError):
        seen.add(["a", "b"], [1])


def test_empty_string_unicode_and_lone_surrogate_ids():
    ids = ["", "é", "e\u0301", "日本語", "🙂", "\ud800", "\udfff", "\x00", " "]
    seen = SeenIds()
    assert seen.add(ids, list(range(1, len(ids) + 1))) == []  # all different ("é" precomposed or not included)
    assert seen.add(list(reversed(ids)), list(range(100, 100 + len(ids)))) == [
        (i, len(ids) - i) for i in range(len(ids))]


def test_ids_that_differ_only_slightly():
    base = "req-0000001"
    near = [base, base + " ", " " + base, "Req-0000001", "req-0000002", "req-00000010", "req-000001",
            "a" * 1000, "a" * 999 + "b", "a" * 1001, "req\t0000001"]
    seen = SeenIds()
    assert seen.add(near, list(range(1, len(near) + 1))) == []
    assert len(seen) == len(near)
    assert seen.add([base, "a" * 999 + "b"], [50, 51]) == [(0, 1), (1, 9)]


def test_growth_from_tiny_through_many_rehashes_keeps_every_id():
    seen = SeenIds(expected=0)
    sizes = [seen.nbytes]
    ids = [f"id-{i}" for i in range(60_000)]
    for start in range(0, len(ids), 7):
        chunk = ids[start:start + 7]
        assert seen.add(chunk, list(range(start + 1, start + 1 + len(chunk)))) == []
        if seen.nbytes != sizes[-1]:
            sizes.append(seen.nbytes)
    assert len(seen) == len(ids)
    assert len(sizes) >= 15  # 16 slots to at least 80,000: many rehashes
    assert all(1.4 < b / a <= 2.1 for a, b in zip(sizes, sizes[1:]))
    assert seen.nbytes <= 12 * (len(ids) / 0.75) * 1.5 + 12 * 1000
    # every id from every earlier table is still found, with its own first line, in any order
    order = list(range(len(ids)))
    random.Random(3).shuffle(order)
    for start in range(0, len(order), 1000):
        chunk = order[start:start + 1000]
        assert seen.add([ids[i] for i in chunk], [999_999] * len(chunk)) == [(k, i + 1) for k, i in enumerate(chunk)]
    assert len(seen) == len(ids)


def test_presized_table_does_not_grow():
    seen = SeenIds(expected=10_000)
    nbytes = seen.nbytes
    assert nbytes <= 12 * (10_000 / 0.75 + 2)
    for start in range(0, 10_000, 1000):
        seen.add([f"r{i}" for i in range(start, start + 1000)], list(range(start, start + 1000)))
    assert seen.nbytes == nbytes and len(seen) == 10_000


def test_random_200k_run_against_a_dict():
    rng = random.Random(12345)
    pool = [f"req-{rng.getrandbits(40):x}" for _ in range(120_000)] + ["", "ü", "🙂"]
    stream = [rng.choice(pool) for _ in range(200_000)]  # about 1 in 3 lines repeats an earlier id
    seen, oracle = SeenIds(expected=rng.choice([0, 1000])), {}
    line = 1
    while line <= len(stream):
        size = rng.choice([1, 3, 100, 1000, 4096])
        chunk, lines = stream[line - 1:line - 1 + size], list(range(line, min(line + size, len(stream) + 1)))
        expected = []
        for k, (cid, n) in enumerate(zip(chunk, lines)):
            if cid in oracle:
                expected.append((k, oracle[cid]))
            else:
                oracle[cid] = n
        assert seen.add(chunk, lines) == expected
        line += size
    assert len(seen) == len(oracle)
    assert 50_000 < len(oracle) < 190_000  # the run had many duplicates and many new ids


def test_hash_zero_is_stored_as_one_and_probing_wraps_around():
    keys, lines = np.zeros(8, dtype=np.uint64), np.zeros(8, dtype=np.uint32)
    # 0 and 1 are the same key (0 marks an empty slot); 7, 15, 23 all start at the last slot: 7 stays, 15 wraps to 0, 23 to 2
    hashes = np.array([0, 7, 15, 23, 1, 23, 0], dtype=np.uint64)
    dup_index, dup_first = np.empty(7, dtype=np.int64), np.empty(7, dtype=np.uint32)
    found, inserted = _insert(keys, lines, hashes, np.arange(1, 8, dtype=np.uint32), dup_index, dup_first)
    assert (found, inserted) == (3, 4)
    assert dup_index[:found].tolist() == [4, 5, 6] and dup_first[:found].tolist() == [1, 4, 1]
    assert keys.tolist() == [15, 1, 23, 0, 0, 0, 0, 7]


def test_hashes_are_64_bit_and_stable():
    h = hash_ids(["req-0000001", "req-0000001", "req-0000002", ""])
    assert h.dtype == np.uint64 and h.shape == (4,)
    assert h[0] == h[1] and len({int(x) for x in h}) == 3


def test_minimum_capacity():
    assert SeenIds().nbytes == 12 * (MIN_CAPACITY)


def test_estimated_lines(tmp_path):
    uniform = tmp_path / "uniform.jsonl"
    uniform.write_bytes(b'{"custom_id": "req-0000001"}\n' * 50_000)
    assert estimated_lines(uniform) == 50_000
    assert estimated_lines(uniform, sample_lines=10) == 50_000
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"a\n" * 500 + b"bbbb\n" * 500 + b"bbbb\n" * 9_000)  # the sample's mean is 3.5 bytes, not 5
    assert estimated_lines(mixed) == round(mixed.stat().st_size / 3.5)
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"abc\nde\nfghij")  # fewer lines than the sample, no final newline
    assert estimated_lines(short) == 3
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert estimated_lines(empty) == 0
