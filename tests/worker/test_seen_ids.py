"""miro.worker.fleet.intake.seen_ids: the hash table of custom ids miro-submit checks duplicates with, and estimated_lines."""

import random

import numpy as np
import pytest

from miro.worker.fleet.intake.seen_ids import MIN_CAPACITY, WINDOW, SeenIds, _insert, estimated_lines, hash_ids


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
        (i, len(ids) - i) for i in range(len(ids))
    ]


def test_ids_that_differ_only_slightly():
    base = "req-0000001"
    near = [
        base,
        base + " ",
        " " + base,
        "Req-0000001",
        "req-0000002",
        "req-00000010",
        "req-000001",
        "a" * 1000,
        "a" * 999 + "b",
        "a" * 1001,
        "req\t0000001",
    ]
    seen = SeenIds()
    assert seen.add(near, list(range(1, len(near) + 1))) == []
    assert len(seen) == len(near)
    assert seen.add([base, "a" * 999 + "b"], [50, 51]) == [(0, 1), (1, 9)]


def test_growth_from_tiny_through_many_rehashes_keeps_every_id():
    seen = SeenIds(expected=0)
    sizes = [seen.nbytes]
    ids = [f"id-{i}" for i in range(60_000)]
    for start in range(0, len(ids), 7):
        chunk = ids[start : start + 7]
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
        chunk = order[start : start + 1000]
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
        chunk, lines = stream[line - 1 : line - 1 + size], list(range(line, min(line + size, len(stream) + 1)))
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


def test_insert_probes_past_its_window_and_wraps_around():
    keys, lines = np.zeros(16, dtype=np.uint64), np.zeros(16, dtype=np.uint32)
    # 15, 31, 47 all start at the last slot: one takes it, the others wrap to slots 0 and 1; 3 takes slot 3
    present, first = _insert(keys, lines, np.array([15, 31, 47, 3], dtype=np.uint64), np.arange(1, 5, dtype=np.uint32))
    assert not present.any() and first.tolist() == [1, 2, 3, 4]
    assert {int(keys[i]) for i in (15, 0, 1)} == {15, 31, 47} and keys[3] == 3 and np.count_nonzero(keys) == 4
    assert all(lines[i] == {15: 1, 31: 2, 47: 3, 3: 4}[int(keys[i])] for i in np.flatnonzero(keys))
    present, first = _insert(keys, lines, np.array([47, 5, 31], dtype=np.uint64), np.array([7, 8, 9], dtype=np.uint32))
    assert present.tolist() == [True, False, True] and first.tolist() == [3, 8, 2] and keys[5] == 5
    # a cluster longer than one probing window: 20 hashes all wanting slot 2 of 32, one chunk and then one by one
    keys, lines = np.zeros(32, dtype=np.uint64), np.zeros(32, dtype=np.uint32)
    hashes = np.array([2 + 32 * k for k in range(1, 3 * WINDOW)], dtype=np.uint64)
    present, _ = _insert(keys, lines, hashes, np.arange(hashes.size, dtype=np.uint32))
    assert not present.any() and sorted(keys[2 : 2 + hashes.size].tolist()) == sorted(hashes.tolist())
    for h, n in zip(hashes.tolist(), range(hashes.size)):
        assert _insert(keys, lines, np.array([h], dtype=np.uint64), np.array([99], dtype=np.uint32))[1][0] == n


def test_hash_zero_is_taken_as_one(monkeypatch):
    seen = SeenIds()
    seen._keys[1] = 1  # as if an id hashing to 0 or 1 had been added at line 5
    seen._lines[1], seen._count = 5, 1
    assert "x" not in seen
    monkeypatch.setattr("miro.worker.fleet.intake.seen_ids.hash_ids", lambda ids: np.zeros(len(ids), dtype=np.uint64))
    assert seen.add(["zero", "zero"], [6, 7]) == [(0, 5), (1, 5)] and len(seen) == 1


def test_contains():
    seen = SeenIds()
    assert "a" not in seen
    seen.add(["a", "b"], [1, 2])
    assert "a" in seen and "b" in seen and "c" not in seen and "" not in seen
    seen.first_line("", 3)
    assert "" in seen and len(seen) == 3


def test_first_line_records_new_ids_and_keeps_the_first():
    seen = SeenIds()
    assert seen.first_line("a", 1) is None
    assert seen.first_line("b", 2) is None
    assert seen.first_line("a", 3) == 1
    assert seen.first_line("a", 4) == 1 and len(seen) == 2
    assert seen.first_line("\ud800", 5) is None and seen.first_line("\ud800", 6) == 5
    with pytest.raises(OverflowError):
        seen.first_line("big", 2**32)
    with pytest.raises(OverflowError):
        seen.first_line("negative", -1)
    assert "big" not in seen and len(seen) == 3
    with pytest.raises(OverflowError):
        seen.add(["big"], [2**32])


def test_first_line_and_add_share_one_table():
    seen = SeenIds()
    assert seen.add(["a", "b"], [1, 2]) == []
    assert seen.first_line("b", 3) == 2 and seen.first_line("c", 4) is None
    assert seen.add(["c", "d", "a", "d"], [5, 6, 7, 8]) == [(0, 4), (2, 1), (3, 6)]
    assert seen.first_line("d", 9) == 6 and len(seen) == 4


def test_first_line_grows_the_table_and_mixes_with_add_against_a_dict():
    rng = random.Random(7)
    pool = [f"id-{rng.getrandbits(32):x}" for _ in range(30_000)]
    seen, oracle, line, sizes = SeenIds(), {}, 1, set()
    while line <= 60_000:
        if rng.random() < 0.5:
            cid = rng.choice(pool)
            assert seen.first_line(cid, line) == oracle.get(cid)
            oracle.setdefault(cid, line)
            line += 1
        else:
            chunk = [rng.choice(pool) for _ in range(rng.choice([1, 5, 200]))]
            lines = list(range(line, line + len(chunk)))
            expected = []
            for k, (cid, n) in enumerate(zip(chunk, lines)):
                if cid in oracle:
                    expected.append((k, oracle[cid]))
                else:
                    oracle[cid] = n
            assert seen.add(chunk, lines) == expected
            line += len(chunk)
        sizes.add(seen.nbytes)
    assert len(seen) == len(oracle) and len(sizes) >= 10
    assert [cid in seen for cid in pool[:1000]] == [cid in oracle for cid in pool[:1000]]
    assert all(seen.first_line(cid, 0) == first for cid, first in oracle.items())


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


def test_estimated_lines_reads_a_bounded_block_of_a_line_with_no_end(tmp_path):
    """A file of one 50 MB line with no newline: the estimate reads a block of SAMPLE_BYTES, never the line."""
    import tracemalloc

    from miro.worker.fleet.intake.seen_ids import SAMPLE_BYTES

    one_line = tmp_path / "one_line.jsonl"
    with open(one_line, "wb") as f:
        for _ in range(50):
            f.write(b"x" * (1 << 20))
    tracemalloc.start()
    try:
        assert estimated_lines(one_line) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < SAMPLE_BYTES + (1 << 20)
