"""The kernels a model will call, compiled ahead into numba's on-disk cache by other processes while this one
loads the model; and `warm_up`, the whole cache filled for a model before any run (`miro warmup`).

numba compiles a kernel on its first call (20-30 CPU seconds for a model's kernels, the attention kernel
nearly half of it) and keeps it in its on-disk cache (NUMBA_CACHE_DIR, else the __pycache__ folders beside
the sources), keyed by the kernel's code, its argument types and the CPU it was compiled for. One process
compiles one kernel at a time: numba holds a lock over every compilation and most of it holds the GIL, so
threads cannot share the work. Processes can: each compiles a part and saves it to the cache, and the
loading process's first call of a kernel then reads it from there.

A `Unit` is one part: a kernel family called on tiny inputs through the same code a forward pass runs
(a `Linear` of one weight type at 1 and 17 activation rows, so every loop shape a row count picks; a
mixture's experts of one type through `run_experts`: its grouped kernel (or per-expert layers), the routing and
the combining; RoPE and attention over a tiny paged cache of the run's KV dtype; the norms, the gate and the
structured-output mask), so the argument types, and with them the cached entries, are the run's own. `plan` lists a model's units; `start` hands those the
cache lacks for this CPU to as many processes as there are CPUs (longest first, each to the least loaded);
`wait` joins them before the first forward step. A kernel no unit covers compiles on first use, as before;
a unit that fails costs only its time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType

from miro.core.errors import MiroError
from miro.core.kernels import cpu
from miro.core.kernels.weight_types import WEIGHT_TYPES

# Processes compiling ahead: MIRO_COMPILE_WORKERS (0: none, every kernel compiled on first use), else one per CPU
WORKERS_ENV = "MIRO_COMPILE_WORKERS"
# CPU seconds a unit took on the avx512-vnni tier (2 cores, benchmarks/cold_start.py): the order units are dealt in
_COST = {"attention": 12.0, "experts": 8.0, "linear": 6.0, "pointwise": 1.0}
_ROWS = (1, 33)  # activation rows a unit's Linear is called with: one decode row; past every tile pass's rows
#                  (and AMX's 16 a tile, amx_tiles.py, from each type's amx_from rows, at most 32)


@dataclass(frozen=True)
class Unit:
    """One part of the compiling: kind "linear" (qtype, fmt), "experts" (qtype, activation: the name of the
    pointwise gate of core/layers/pointwise.py), "attention" (kv dtype, softcapped, with sinks) or "pointwise"."""

    kind: str
    args: tuple = ()

    @property
    def cost(self) -> float:
        return _COST[self.kind]

    def dispatchers(self) -> list:
        """The numba dispatchers whose cache entries say whether this unit is compiled for this CPU."""
        if self.kind == "linear" and self.args[1] == "bf16":  # the bfloat16 GEMM: AMX's where it runs
            from miro.core.kernels import amx_bf16, bf16_gemm

            return [amx_bf16._matmul if amx_bf16.ready() else bf16_gemm._matmul, bf16_gemm.to_bf16_pairs]
        if self.kind == "linear":
            row = WEIGHT_TYPES[GGMLQuantizationType(self.args[0])]
            kernels = row.kernels_on(cpu.TIER)  # the loop shapes its layout on this tier calls
            names = ("tiles",) if row.plan(cpu.TIER).layout == "tiles" else ("rows", "lanes")
            found = [getattr(kernels, name, None) for name in names]
            if names == ("tiles",):  # and AMX's dots for 16 rows at a time where they run (amx_kernels.kernel)
                from miro.core.kernels import amx_kernels, amx_tiles

                if amx_tiles.usable(self.args[0], cpu.TIER):
                    found.append(amx_kernels.kernel(int(self.args[0]), cpu.TIER.name))
            return [k for k in found if k is not None and hasattr(k, "_cache")]
        if self.kind == "experts":
            from miro.core.layers import moe, pointwise

            row = WEIGHT_TYPES[GGMLQuantizationType(self.args[0])]
            own = (
                [row.kernels_on(cpu.TIER).grouped]
                if row.grouped_on(cpu.TIER)
                else Unit("linear", (self.args[0], "native")).dispatchers()  # one Linear per expert
            )
            activation = {"silu_mul": pointwise._silu_mul, "swiglu_oai": pointwise._swiglu_oai}[self.args[1]]
            return [*own, moe.route, moe.combine, activation]
        if self.kind == "attention":
            from miro.core.layers import attention

            return [attention.rope_and_store_kv, attention._attend_kernel(attention.SCORE_QUERIES, *self.args[1:])]
        from miro.core.layers import pointwise
        from miro.core.sampling.token_mask import mask_rows

        return [pointwise._rmsnorm, pointwise._add_rmsnorm, pointwise._head_rmsnorm, pointwise._silu_mul, mask_rows]


def plan(gguf, config, weight_format: str, kv_cache_dtype: str) -> list[Unit]:
    """The units of a model file (GGUFFile) with this ModelConfig, loaded in this weight format (native: each
    matrix type its own kernels; bf16: its one GEMM; f32's and i16's kernels compile on first use) and KV cache dtype. A
    mixture's experts and routers run on the file's own types whatever the format (core/layers/moe.py): a unit
    per type of its 3-D expert tensors, a native Linear unit per type of its routers."""
    from miro.core.loading.weight_format import matmul_tensors

    if not config.causal:  # an encoder's kernels (encoder.py, its GEMM's epilogues) compile on first use
        return []
    sinks = any(".attn_sinks." in name for name in gguf.tensors)  # gpt-oss's: the attention kernel's variant
    units = [Unit("attention", (kv_cache_dtype, config.attn_logit_softcap > 0, sinks)), Unit("pointwise")]
    expert_types = {t.type for t in gguf.tensors.values() if len(t.shape) == 3 and "_exps." in t.name}
    activation = "swiglu_oai" if config.architecture == "gpt-oss" else "silu_mul"
    units += [Unit("experts", (int(t), activation)) for t in sorted(expert_types) if WEIGHT_TYPES.get(t) is not None]
    types = {t.type for t in gguf.tensors.values() if "ffn_gate_inp." in t.name and len(t.shape) == 2}
    if weight_format == "native":
        types |= {t.type for t in matmul_tensors(gguf)}
    units += [
        Unit("linear", (int(t), "native"))
        for t in sorted(types)
        if WEIGHT_TYPES.get(t) is not None and WEIGHT_TYPES[t].native
    ]
    if weight_format == "bf16":  # every matrix in bfloat16, whatever its type: one GEMM (AMX's where it runs)
        units.append(Unit("linear", (int(GGMLQuantizationType.F32), "bf16")))
    return units


def cached_here(dispatcher) -> bool:
    """Whether numba's on-disk cache holds this kernel's current code compiled for this CPU (any argument types).
    numba's index key is (signature, (triple, CPU name, CPU features), (bytecode hash, closure hash)): another
    CPU, or an edited kernel, is a miss that compiles once and adds its entry. (numba's private caching API,
    used here only.)"""
    cache = getattr(dispatcher, "_cache", None)
    index_file = getattr(cache, "_cache_file", None)
    if index_file is None:
        return False
    wanted = cache._index_key(None, dispatcher.targetctx.codegen())
    return any(key[1:] == wanted[1:] for key in index_file._load_index())


def cold(units: list[Unit]) -> list[Unit]:
    """The units with a kernel the cache lacks for this CPU."""
    return [u for u in units if not all(cached_here(d) for d in u.dispatchers())]


def worker_count(n_units: int) -> int:
    asked = os.environ.get(WORKERS_ENV, "").strip()
    if asked:
        if not asked.isdigit():
            raise MiroError(f"{WORKERS_ENV}={asked!r} is not a number of processes (0 turns compiling ahead off).")
        return min(int(asked), n_units)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, n_units) if cpus > 1 else 0  # one CPU: nothing to share it with


def deal(units: list[Unit], n: int) -> list[list[Unit]]:
    """Longest first, each to the least loaded of n processes."""
    shares: list[list[Unit]] = [[] for _ in range(n)]
    for unit in sorted(units, key=lambda u: -u.cost):
        min(shares, key=lambda share: sum(u.cost for u in share)).append(unit)
    return [share for share in shares if share]


class Ahead:
    """The processes compiling ahead; wait() before the first forward step."""

    def __init__(self, processes: list[subprocess.Popen], units: int, log: Callable[[str], None]):
        self.processes, self.units, self.log = processes, units, log
        self.started = time.perf_counter()

    def wait(self) -> None:
        failed = [p for p in self.processes if p.wait() not in (0, -9)]
        for process in failed:  # its kernels compile on first use instead
            self.log(f"compiling ahead: a process failed ({process.stderr.read().strip().splitlines()[-1:]})")
        for process in self.processes:
            process.stderr.close()
        self.processes = []

    def stop(self) -> None:
        """End the processes (the load failed): what they saved stays in the cache."""
        for process in self.processes:
            process.kill()
        self.wait()


def start(units: list[Unit], log: Callable[[str], None] = lambda m: None) -> Ahead:
    """Processes compiling the units the cache lacks for this CPU, started now; nothing when it has them all."""
    n = worker_count(len(units))
    todo = cold(units) if n else []
    shares = deal(todo, worker_count(len(todo))) if todo else []
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "miro.core.engine.compile_ahead",
                json.dumps([[u.kind, list(u.args)] for u in share]),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    if processes:
        log(
            f"compiling {len(todo)} kernel families ahead in {len(processes)} processes (numba's cache lacks them "
            f"for this CPU; `miro warmup` fills it before a run)"
        )
    return Ahead(processes, len(todo), log)


# ---------------------------------------------------------------- miro warmup


class CompileCounter:
    """The numba compilations this process starts (outermost ones: a kernel read from the cache is none),
    by the kernel's qualname."""

    def __init__(self):
        from numba.core import event

        self.names: list[str] = []
        self._depth = 0
        outer = self

        class Listener(event.Listener):
            def on_start(self, ev):
                outer._depth += 1

            def on_end(self, ev):
                outer._depth -= 1
                if outer._depth == 0:
                    outer.names.append(ev.data["dispatcher"].py_func.__qualname__)

        self._listener = Listener()
        event.register("numba:compile", self._listener)

    def close(self) -> None:
        from numba.core import event

        event.unregister("numba:compile", self._listener)


# ---------------------------------------------------------------- what a process compiling ahead runs


def compile_unit(unit: Unit) -> None:
    """Call the unit's kernels on tiny inputs through the code a forward pass runs, so numba compiles them for
    the run's argument types and saves them to its cache."""
    if unit.kind == "linear":
        _linear(GGMLQuantizationType(unit.args[0]), unit.args[1])
    elif unit.kind == "experts":
        _experts(GGMLQuantizationType(unit.args[0]), unit.args[1])
    elif unit.kind == "attention":
        _attention(*unit.args)
    else:
        from miro.core.layers import pointwise
        from miro.core.sampling.token_mask import mask_rows

        x = np.ones((2, 64), np.float32)
        pointwise.rmsnorm(x, np.ones(64, np.float32), 1e-5, np.empty_like(x))  # eps: a Python float, as configs hold
        pointwise.add_rmsnorm(x, np.zeros_like(x), np.ones(64, np.float32), 1e-5, np.empty_like(x))
        pointwise.head_rmsnorm(x, 0, 2, 32, np.ones(32, np.float32), 1e-5)  # qwen3's and olmo2's q/k norms
        pointwise.silu_mul(np.ones((2, 128), np.float32), np.empty((2, 64), np.float32))
        # sampler.apply_token_masks' arguments: the processed logits, the rows, TokenMasks.bits, the emptied flags
        mask_rows(x, np.array([0], np.int64), np.full((1, 2), -1, np.int32), np.zeros(1, np.bool_))


def _linear(qtype: GGMLQuantizationType, fmt: str) -> None:
    from miro.core.layers.linear import Linear
    from miro.core.loading.gguf_file import TensorInfo

    row = WEIGHT_TYPES[qtype]
    shape = (32, 256)  # two 16-row tiles; one K-quant super-block per row
    data = np.zeros(shape[0] * shape[1] // row.block_values * row.block_bytes, np.uint8)
    data.flags.writeable = False  # as a view of the file's memory map is
    layer = Linear(TensorInfo(name="ahead", shape=shape, type=qtype, data=data), fmt)
    for rows in _ROWS:
        layer(np.zeros((rows, shape[1]), np.float32))


def _experts(qtype: GGMLQuantizationType, activation: str) -> None:
    """Two experts of this type (a router of float32 as llama.cpp's quantizer leaves it) run through run_experts
    at 1 and 33 rows, both experts chosen for every row."""
    from miro.core.layers import pointwise
    from miro.core.layers.moe import Experts, Routing, run_experts
    from miro.core.loading.gguf_file import TensorInfo

    row = WEIGHT_TYPES[qtype]
    n_expert, width, dim = 2, 256, 256  # one K-quant super-block per row; whole 16-row tiles

    def tensor(name, shape, qtype, row_bytes):
        data = np.zeros(int(np.prod(shape[:-1])) * row_bytes, np.uint8)
        data.flags.writeable = False  # as a view of the file's memory map is
        return TensorInfo(name=name, shape=shape, type=qtype, data=data)

    row_bytes = dim // row.block_values * row.block_bytes
    experts = Experts(
        tensor("ahead.router", (n_expert, dim), GGMLQuantizationType.F32, 4 * dim),
        tensor("ahead.gate", (n_expert, width, dim), qtype, row_bytes),
        tensor("ahead.up", (n_expert, width, dim), qtype, row_bytes),
        tensor("ahead.down", (n_expert, dim, width), qtype, width // row.block_values * row.block_bytes),
    )
    for rows in _ROWS:
        run_experts(np.zeros((rows, dim), np.float32), experts, Routing(n_expert), getattr(pointwise, activation))


def _attention(kv_cache_dtype: str, softcap: bool, sinks: bool) -> None:
    from types import SimpleNamespace

    from miro.core.engine.kv_cache import KV_STORAGE
    from miro.core.models.common import attention

    n_heads, n_kv_heads, head_dim, block_size, n_tokens = 2, 1, 16, 16, 2
    config = SimpleNamespace(
        n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, q_dim=n_heads * head_dim, rope_neox=False
    )
    storage = KV_STORAGE[kv_cache_dtype]
    cache = SimpleNamespace(
        k=np.zeros((1, 2, n_kv_heads, head_dim, block_size), storage),
        v=np.zeros((1, 2, n_kv_heads, block_size, head_dim), storage),
    )
    # the dtypes of step_input.build_step_input's arrays
    step = SimpleNamespace(
        positions=np.arange(n_tokens, dtype=np.int32),
        slots=np.arange(n_tokens, dtype=np.int64),
        block_tables=np.zeros((1, 2), np.int32),
        attn_items=np.array([[0, 0, 0, n_tokens]], np.int32),
    )
    qkv = np.zeros((n_tokens, (n_heads + 2 * n_kv_heads) * head_dim), np.float32)
    rope = (np.ones((n_tokens, head_dim // 2), np.float32), np.zeros((n_tokens, head_dim // 2), np.float32))
    out = np.empty((n_tokens, n_heads, head_dim), np.float32)
    attention(
        qkv,
        0,
        step,
        cache,
        config,
        rope,
        np.float32(0.25),
        out,
        softcap=30.0 if softcap else 0.0,
        sinks=np.zeros(n_heads, np.float32) if sinks else None,
    )


def main(argv: list[str]) -> None:
    for kind, args in json.loads(argv[0]):
        compile_unit(Unit(kind, tuple(args)))


if __name__ == "__main__":
    main(sys.argv[1:])
