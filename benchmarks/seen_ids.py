"""Memory and speed of miro's SeenIds (worker/fleet/intake/seen_ids.py) on ids like req-0000001, one case a process.

    python benchmarks/seen_ids.py [--ids 10000000] [--expected 10000000] [--chunk 1000] [--api add|first_line]
                                  [--baseline miro.worker.fleet.intake.submit] [--repeat-every 0]

--api add feeds the ids to add() a chunk at a time; --api first_line makes the same chunks but feeds them one by
one to first_line() (a caller streaming lines), so its time includes that Python loop. --expected 0 makes the
table grow from its minimum size. --baseline is imported first (default miro-submit's module, the realistic
process: the RSS it costs is not SeenIds'); "" imports nothing but seen_ids. --repeat-every N makes every Nth id
repeat an earlier one (0: all distinct). The ids are made chunk by chunk (not held), and only add's / first_line's
time is counted, hashing included. Reported: RSS peaks (resource.getrusage ru_maxrss) after the imports and at the
end, the end peak minus the baseline after imports, the table's nbytes, ids/s.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import sys
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=10_000_000)
    parser.add_argument("--expected", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--api", choices=["add", "first_line"], default="add")
    parser.add_argument("--baseline", default="miro.worker.fleet.intake.submit", help="module imported first ('' none)")
    parser.add_argument("--repeat-every", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.baseline:
        importlib.import_module(args.baseline)
    from miro.worker.fleet.intake.seen_ids import SeenIds

    import_s, baseline = time.perf_counter() - started, peak_mb()

    def name(i: int) -> str:
        return f"req-{i // 2 if args.repeat_every and i % args.repeat_every == 0 else i:07d}"

    seen = SeenIds(expected=args.expected)
    took, duplicates = 0.0, 0
    for start in range(0, args.ids, args.chunk):
        stop = min(start + args.chunk, args.ids)
        ids, lines = [name(i) for i in range(start + 1, stop + 1)], list(range(start + 1, stop + 1))
        if args.api == "add":
            t = time.perf_counter()
            duplicates += len(seen.add(ids, lines))
        else:
            first_line = seen.first_line
            t = time.perf_counter()
            for cid, line in zip(ids, lines):
                if first_line(cid, line) is not None:
                    duplicates += 1
        took += time.perf_counter() - t
    end = peak_mb()
    print(
        json.dumps(
            {
                "api": args.api,
                "ids": args.ids,
                "expected": args.expected,
                "chunk": args.chunk,
                "baseline": args.baseline,
                "repeat_every": args.repeat_every,
                "len": len(seen),
                "duplicates": duplicates,
                "import_s": round(import_s, 3),
                "rss_after_imports_mb": round(baseline, 1),
                "rss_peak_mb": round(end, 1),
                "peak_minus_baseline_mb": round(end - baseline, 1),
                "nbytes_mb": round(seen.nbytes / 2**20, 1),
                "seconds": round(took, 2),
                "ids_per_s": round(args.ids / took) if took else None,
                "numba_imported": "numba" in sys.modules,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
