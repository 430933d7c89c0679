"""numba's on-disk cache and the kernels a factory makes once per weight type.

numba names a compiled function's environment (the Python objects it needs at run time, such as the
dtype of an array it returns) after the function's qualname, its argument types and a counter local to
the compiling process. Two weight types' kernels of one qualname, cached by two processes at the same
counter value, got the same name; a process loading both then ran one with the other's environment
and failed with "In 'NRT_adapt_ndarray_to_python', 'descr' is NULL" (seen with gemma3-270m, whose
Q4_K and Q6_K matrices share the lanes kernel). Each variant's qualname now names its weight type.

numba keys a cached kernel by its bytecode and the pickle of its closure values. A closure value whose pickle
differs from process to process (a numba dispatcher's carries an id of the process: 5af21ab's attention kernel,
reverted in 6a7e7cd) is a cache miss in every process: each load compiled attention again.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf import GGMLQuantizationType as Q

from numba.core.dispatcher import Dispatcher
from numba.core.extending import _Intrinsic

from miro.core.kernels import cache_key, cpu
from miro.core.kernels.weight_types import WEIGHT_TYPES


def test_each_weight_types_kernels_have_their_own_qualnames():
    qualnames = {}
    for qtype, row in WEIGHT_TYPES.items():
        if row.is_float or not row.native:
            continue
        kernels = row.kernels_on(cpu.TIER)
        for kernel in (kernels.lanes, kernels.rows, kernels.tiles):
            if kernel is not None:
                name = kernel.py_func.__qualname__
                assert Q(qtype).name in name
                assert name not in qualnames, f"{Q(qtype).name} and {qualnames.get(name)} share {name}"
                qualnames[name] = Q(qtype).name
    assert len(qualnames) >= 2 * 8


def test_every_tiers_factories_name_their_weight_type_and_tier():
    """The kernels of every tier, whatever this CPU runs; their factories are checked directly."""
    int8_tiers = [tier for tier in cpu.TIERS.values() if tier.int8_dot]
    names = set()
    expected = 0
    for qtype, row in WEIGHT_TYPES.items():
        if not row.native or row.kernels.tiles is None:
            continue
        factory = row.kernels.tiles
        for tier in int8_tiers:
            for tokens in {2, row.plan(tier).tile_tokens}:
                names.add(factory(int(qtype), tier, tokens).py_func.__qualname__)
                expected += 1
    assert len(names) == expected


# prints numba's cache key (less the signature) of every cached kernel the compile-ahead units name, by unit: every
# native weight type's Linear and experts, the bf16 GEMM, the pointwise kernels and every attention variant
_CACHE_KEYS = """
import json
from miro.core.engine.compile_ahead import Unit
from miro.core.kernels.weight_types import WEIGHT_TYPES
units = [Unit("pointwise"), Unit("linear", (0, "bf16"))]
units += [Unit("attention", ("float16", capped, sinks)) for capped in (False, True) for sinks in (False, True)]
for qtype, row in WEIGHT_TYPES.items():
    if row.native:
        units += [Unit("linear", (int(qtype), "native")), Unit("experts", (int(qtype), "swiglu_oai"))]
keys = {}
for unit in units:
    for i, kernel in enumerate(unit.dispatchers()):
        if hasattr(kernel._cache, "_index_key"):  # cache=True
            key = kernel._cache._index_key(None, kernel.targetctx.codegen())
            keys[f"{unit} {i} {kernel.py_func.__qualname__}"] = key[1:]
print(json.dumps(keys))
"""


def test_every_cached_kernel_has_the_same_cache_key_in_every_process():
    """Two processes compute the same key for each kernel, so the second finds what the first compiled. (numba's
    private caching API, as compile_ahead.cached_here uses it.)"""
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _CACHE_KEYS], capture_output=True, text=True, timeout=300, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    assert any("attend_scores" in name for name in runs[0]) and len(runs[0]) >= 12
    differ = [name for name in runs[0] if runs[0][name] != runs[1].get(name)]
    assert not differ, f"cache keys that change from process to process: {differ}"


# runs a Q4_K and a Q4_0 layer (the tile kernels, whose per-thread scratch is sized by the thread count) on 8 rows,
# saves the outputs, prints whether each kernel came from numba's cache
_THREADED_LAYERS = """
import sys
import numba
import numpy as np
from gguf import GGMLQuantizationType as Q
sys.path.insert(0, sys.argv[1])
from quant_reference import activations, random_tensor
from miro.core.layers.linear import Linear
hits = []
for qtype in (Q.Q4_K, Q.Q4_0):
    layer = Linear(random_tensor(qtype, 512, 1024))
    for _ in range(20):  # every thread takes tiles
        out = layer(activations(8, 1024))
    np.save(f"{sys.argv[2]}_{qtype.name}.npy", out)
    kernel = layer._kernels().tiles
    hits.append(sum(kernel.stats.cache_hits.values()))
print(numba.config.NUMBA_NUM_THREADS, *hits)
"""


@pytest.mark.slow  # two kernels compiled cold into a cache of its own, whatever the run's cache holds
def test_kernels_cached_by_a_process_of_fewer_threads_run_in_one_of_more(tmp_path):
    """The tile kernels size each thread's scratch when they run: a kernel compiled by a process of 1 thread and
    loaded from the cache by a process of 4 (a Docker image warmed on a small builder, run on a bigger machine)
    gives the same bits. With the pool size read at compile time, numba froze it into the cached code, and threads
    1-3 wrote past their scratch ("double free or corruption")."""
    cache = tmp_path / "numba-cache"
    runs = []
    for threads in (1, 4):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_NUM_THREADS": str(threads), "MIRO_AMX": "0"}
        done = subprocess.run(
            [sys.executable, "-c", _THREADED_LAYERS, str(Path(__file__).parent), str(tmp_path / f"t{threads}")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(done.stdout.split())
    assert runs[0] == ["1", "0", "0"], runs  # compiled by the first process
    assert runs[1][0] == "4" and int(runs[1][1]) > 0 and int(runs[1][2]) > 0, runs  # loaded by the second
    for name in ("Q4_K", "Q4_0"):
        assert np.array_equal(np.load(tmp_path / f"t1_{name}.npy"), np.load(tmp_path / f"t4_{name}.npy"))


def _numba_imports(path: Path):
    """(module, name) of each numba function or intrinsic `path` imports from another kernel module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("miro.core.kernels."):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if isinstance(getattr(module, alias.name), (Dispatcher, _Intrinsic)):
                    yield node.module.rsplit(".", 1)[1], alias.name


def test_every_module_whose_numba_functions_others_call_is_in_the_cache_key():
    """numba's cache key of a kernel covers its own file, not the njit functions and intrinsics it calls from
    other files: each module those come from must be one of cache_key's helper modules, whose bytes every cached
    kernel's key holds, or an edit to it leaves the cached kernels that inline it stale (tile_kernels.py's float
    steps, inlined by the AMX and grouped kernels, were not listed until split into tile_steps.py)."""
    core = Path(cache_key.__file__).parents[1]
    unlisted = {
        f"{module}.py ({path.name} imports {name})"
        for path in sorted(core.rglob("*.py"))
        for module, name in _numba_imports(path)
        if f"{module}.py" not in cache_key._HELPER_MODULES
    }
    assert not unlisted, sorted(unlisted)
