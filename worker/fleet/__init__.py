"""miro.worker.fleet: the control-plane library that `miro`'s commands, `miro serve` and the worker process
call. It imports miro.core and nothing of miro.worker.process, miro.worker.api or miro.cli
(tests/test_import_graph.py)."""

import os

# pyarrow's allocator (mimalloc 3) advises transparent huge pages for its arenas; where the kernel compacts memory to
# fault one in (THP defrag "madvise", its default), each fault cost some 0.2 ms of system time: 3.7 of the 14 CPU
# seconds of a 100,000-line `miro run --reuse` (benchmarks/rerun_reuse.py, docs/benchmarks.md). Read when pyarrow
# loads, which this package's modules do after this line; a value set outside is kept.
os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
