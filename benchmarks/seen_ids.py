"""Memory and speed of miro's SeenIds (worker/fleet/seen_ids.py) on ids like req-0000001, one case a process.

    python benchmarks/seen_ids.py [--ids 10000000] [--expected 10000000] [--chunk 1000] [--cold]

--expected 0 makes the table grow from its minimum size. --cold compiles the numba functions into a fresh cache
directory (NUMBA_CACHE_DIR) so that the first add's time is the compile time; without it the on-disk cache from an
earlier run is loaded. The ids are made chunk by chunk (not held), and only add's time is counted, hashing
included. Reported: RSS peaks (resource.getrusage ru_maxrss) after the imports, after the first add (numba compiled
or loaded) and at the end; the end peak minus the baseline after imports; the table's nbytes; ids/s of add.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=10_000_000)
    parser.add_argument("--expected", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--cold", action="store_true", help="compile numba's functions afresh (a new cache dir)")
    args = parser.parse_args()
    if args.cold:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="seen_ids_numba_")
    started = time.perf_counter()
    from miro.worker.fleet.seen_ids import SeenIds
    import_s, baseline = time.perf_counter() - started, peak_mb()

    seen = SeenIds(expected=args.expected)
    adding, duplicates, first_add_s = 0.0, 0, None
    for start in range(0, args.ids, args.chunk):
        stop = min(start + args.chunk, args.ids)
        ids, lines = [f"req-{i:07d}" for i in range(start + 1, stop + 1)], list(range(start + 1, stop + 1))
        t = time.perf_counter()
        duplicates += len(seen.add(ids, lines))
        took = time.perf_counter() - t
        if first_add_s is None:
            first_add_s, after_first = took, peak_mb()
        else:
            adding += took
    end = peak_mb()
    print(json.dumps({
        "ids": args.ids, "expected": args.expected, "chunk": args.chunk, "cold": args.cold, "len": len(seen),
        "duplicates": duplicates, "import_s": round(import_s, 3), "first_add_s": round(first_add_s, 3),
        "rss_after_imports_mb": round(baseline, 1), "rss_after_first_add_mb": round(after_first, 1),
        "rss_peak_mb": round(end, 1), "peak_minus_baseline_mb": round(end - baseline, 1),
        "peak_minus_after_first_add_mb": round(end - after_first, 1), "nbytes_mb": round(seen.nbytes / 2**20, 1),
        "ids_per_s_after_first_add": round((args.ids - min(args.chunk, args.ids)) / adding) if adding else None,
        "python": sys.version.split()[0],
    }))


if __name__ == "__main__":
    main()
