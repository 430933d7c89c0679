"""Kernels compiled ahead (core/engine/compile_ahead.py) and `miro warmup`: numba's on-disk cache filled for a
model, so that the next process loads every kernel instead of compiling it.

Compilations are counted by numba's own "numba:compile" events (a kernel read from the cache raises none),
never timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from miro.core.engine import compile_ahead
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_config import ModelConfig
from miro.core.loading.weight_format import choose_for_file
from miro.core.models import read_config
from gguf_factory import write_tiny_llama

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from moe_files import write_moe_model  # noqa: E402

# a process that loads MODEL and generates from a short and a long prompt, printing what it compiled
_LOAD_AND_GENERATE = """
import json, sys
from miro.core.engine.compile_ahead import CompileCounter
counter = CompileCounter()
from miro.core import Engine, SamplingParams
engine = Engine.from_model(sys.argv[1])
engine.generate([[1, 2], [1 + i % 60 for i in range(40)]], SamplingParams(max_tokens=3, temperature=0),
                use_tqdm=False)
print(json.dumps({"compiled": counter.names, "ahead": engine.compiled_ahead}))
"""


def _run(args: list[str], cache, **env) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "NUMBA_CACHE_DIR": str(cache), **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-q8.gguf", tensor_type="Q8_0")["path"])


@pytest.mark.slow  # two cold compiles of every kernel (warmup's processes, then its rehearsal): the fast tier's longest test
def test_warmup_fills_an_empty_cache_and_the_next_process_compiles_nothing(tmp_path, tiny_q8):
    cache = tmp_path / "numba"
    cache.mkdir()
    warmed = _run(
        ["-c", "from miro.cli.main import cli; cli()", "warmup", "--model", tiny_q8], cache, MIRO_COMPILE_WORKERS="2"
    )
    assert "kernel families compiled ahead" in warmed.stderr
    assert any(cache.rglob("*.nbi")), "the warmup left numba's cache empty"

    loaded = json.loads(_run(["-c", _LOAD_AND_GENERATE, tiny_q8], cache).stdout.strip().splitlines()[-1])
    assert loaded == {"compiled": [], "ahead": 0}


@pytest.mark.slow  # a cold compile of every kernel of the model by design: a fifth of the fast tier's CPU time
def test_units_cover_the_forward_pass_kernels(tmp_path, tiny_q8):
    """The units alone (no rehearsal) leave a load and a generation nothing to compile but what no unit covers."""
    cache = tmp_path / "numba"
    gguf = GGUFFile(tiny_q8)
    weight_format = choose_for_file(gguf, "auto", None, encoder=False).format  # bf16 where AMX runs it, else native
    units = compile_ahead.plan(gguf, ModelConfig.from_gguf(gguf), weight_format, "float16")
    assert {u.kind for u in units} == {"attention", "pointwise", "linear"}
    _run(["-m", "miro.core.engine.compile_ahead", json.dumps([[u.kind, list(u.args)] for u in units])], cache)

    loaded = json.loads(
        _run(["-c", _LOAD_AND_GENERATE, tiny_q8], cache, MIRO_COMPILE_WORKERS="0").stdout.strip().splitlines()[-1]
    )
    assert loaded["compiled"] == []


def test_bf16_weights_have_one_linear_unit_whatever_the_files_types(tiny_q8):
    gguf = GGUFFile(tiny_q8)
    units = compile_ahead.plan(gguf, ModelConfig.from_gguf(gguf), "bf16", "float16")
    assert [u for u in units if u.kind == "linear"] == [compile_ahead.Unit("linear", (int(Q.F32), "bf16"))]
    kernels = compile_ahead.Unit("linear", (int(Q.F32), "bf16")).dispatchers()
    assert [k.py_func.__name__ for k in kernels] == ["matmul", "to_bf16_pairs"]


def test_a_model_without_a_native_type_has_no_linear_unit(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny-f32.gguf", tensor_type="F32")["path"]
    gguf = GGUFFile(path)
    units = compile_ahead.plan(gguf, ModelConfig.from_gguf(gguf), "f32", "float32")
    assert [u.kind for u in units] == ["attention", "pointwise"]
    assert units[0].args == ("float32", False, False)


@pytest.fixture(scope="module")
def mixtures(tmp_path_factory):
    """qwen3moe (Q8_0 experts, silu gate) and gpt-oss (MXFP4 experts, its own gate, attention sinks): Q8_0 files."""
    folder = tmp_path_factory.mktemp("moe")
    return {v: str(write_moe_model(folder / f"{v}.gguf", v, "Q8_0")["path"]) for v in ("qwen3moe", "gpt-oss")}


def _plan(path: str, weight_format: str) -> list:
    gguf = GGUFFile(path)
    return compile_ahead.plan(gguf, read_config(gguf), weight_format, "float16")


def test_a_mixtures_experts_and_routers_are_units_in_every_weight_format(mixtures):
    """Experts and routers run on the file's types whatever the format (core/layers/moe.py): their units stay."""
    U = compile_ahead.Unit
    assert _plan(mixtures["qwen3moe"], "native") == [
        U("attention", ("float16", False, False)),
        U("pointwise"),
        U("experts", (int(Q.Q8_0), "silu_mul")),
        U("linear", (int(Q.F32), "native")),  # the routers, as llama.cpp's quantizer leaves them
        U("linear", (int(Q.Q8_0), "native")),
    ]
    assert _plan(mixtures["qwen3moe"], "f32")[2:] == [
        U("experts", (int(Q.Q8_0), "silu_mul")),
        U("linear", (int(Q.F32), "native")),
    ]
    gpt_oss = _plan(mixtures["gpt-oss"], "f32")
    assert gpt_oss[0] == U("attention", ("float16", False, True))  # the attention kernel's sinks variant
    assert U("experts", (int(Q.MXFP4), "swiglu_oai")) in gpt_oss


@pytest.mark.slow  # a cold compile of every kernel of two models by design
@pytest.mark.parametrize("variant", ["qwen3moe", "gpt-oss"])
def test_units_cover_a_mixtures_forward_pass_kernels(tmp_path, mixtures, variant):
    """A mixture's units (its grouped expert kernel, routing, gate; gpt-oss's sinks) leave nothing to compile."""
    cache = tmp_path / "numba"
    gguf = GGUFFile(mixtures[variant])
    units = _plan(mixtures[variant], choose_for_file(gguf, "auto", None, encoder=False).format)  # as the load takes
    _run(["-m", "miro.core.engine.compile_ahead", json.dumps([[u.kind, list(u.args)] for u in units])], cache)

    loaded = json.loads(
        _run(["-c", _LOAD_AND_GENERATE, mixtures[variant]], cache, MIRO_COMPILE_WORKERS="0")
        .stdout.strip()
        .splitlines()[-1]
    )
    assert loaded["compiled"] == []


def test_units_are_dealt_longest_first_to_the_least_loaded_process():
    units = [
        compile_ahead.Unit("pointwise"),
        compile_ahead.Unit("linear", (int(Q.Q4_1), "native")),
        compile_ahead.Unit("attention", ("float16", False, False)),
        compile_ahead.Unit("linear", (int(Q.Q8_0), "native")),
    ]
    shares = compile_ahead.deal(units, 2)
    assert [[u.kind for u in share] for share in shares] == [["attention", "pointwise"], ["linear", "linear"]]
    assert compile_ahead.deal(units[:1], 4) == [[units[0]]]


def test_compile_workers_setting(monkeypatch):
    monkeypatch.setenv(compile_ahead.WORKERS_ENV, "0")
    assert compile_ahead.worker_count(5) == 0
    monkeypatch.setenv(compile_ahead.WORKERS_ENV, "3")
    assert compile_ahead.worker_count(2) == 2
    monkeypatch.setenv(compile_ahead.WORKERS_ENV, "many")
    with pytest.raises(compile_ahead.MiroError, match="MIRO_COMPILE_WORKERS"):
        compile_ahead.worker_count(2)


_POINTWISE_UNIT = """
from miro.core.engine.compile_ahead import CompileCounter, Unit, compile_unit, cold
from miro.core.kernels import cpu
counter = CompileCounter()
was_cold = bool(cold([Unit("pointwise")]))
compile_unit(Unit("pointwise"))
print(cpu.TIER.name, was_cold, len(counter.names))
"""


@pytest.mark.slow  # the pointwise kernels compiled cold twice (this CPU, the AVX2 emulation) into a cache of its own
def test_another_cpu_compiles_once_for_its_own_into_the_same_cache(tmp_path):
    """numba keys a cached kernel by the CPU it was compiled for (name and features): a worker on another CPU
    (here the AVX2 emulation: another CPU name and feature set) misses the entries of this one, compiles its own
    once beside them, and neither evicts the other."""
    from miro.core.kernels import cpu

    if "avx2" not in cpu.runnable() or cpu.TIER.name == "avx2":
        pytest.skip("needs a CPU above the AVX2 tier to emulate another one")
    cache = tmp_path / "numba"
    here, avx2 = {}, cpu.emulation_env("avx2")
    runs = [_run(["-c", _POINTWISE_UNIT], cache, **env).stdout.split() for env in (here, avx2, here, avx2)]
    assert runs == [  # _rmsnorm, _add_rmsnorm, _head_rmsnorm, _silu_mul, mask_rows
        [cpu.TIER.name, "True", "5"],
        ["avx2", "True", "5"],
        [cpu.TIER.name, "False", "0"],
        ["avx2", "False", "0"],
    ]
