"""core/kernels/cpu.py: the tier named from what numba compiles for, the per-type table, and the kernels of a
lower tier run for real under its emulation (CI's machine may expose AVX-512, and users' machines may not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from miro.core.errors import MiroError
from miro.core.kernels import cpu
from miro.core.kernels.weight_types import WEIGHT_TYPES

ROOT = Path(__file__).resolve().parents[2]

ZEN4_AVX512 = frozenset({"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"})
SKYLAKE_X = ZEN4_AVX512 - {"avx512vnni"}
ALDER_LAKE = frozenset({"avx", "avx2", "fma", "f16c", "avxvnni"})
ZEN4_AVX512_HIDDEN = frozenset(f[1:] for f in cpu.AVX2_FEATURES.split(",") if f.startswith("+"))
AARCH64 = frozenset({"neon", "fp-armv8", "dotprod"})


@pytest.mark.parametrize(
    "features,tier",
    [
        (ZEN4_AVX512, "avx512-vnni"),
        (SKYLAKE_X, "avx512"),
        (ALDER_LAKE, "avx-vnni"),
        (ZEN4_AVX512_HIDDEN, "avx2"),
        (AARCH64, "portable"),
        (frozenset(), "portable"),
        (frozenset({"avx", "avx2", "f16c"}), "portable"),  # AVX2 without FMA: the portable kernels
    ],
)
def test_tier_of_the_features(features, tier):
    assert cpu.tier_of(features).name == tier


def test_an_avx512_vnni_cpu_runs_every_tier_and_an_avx2_one_only_its_own():
    assert cpu.TIERS["avx512-vnni"].runs == tuple(cpu.TIERS)
    assert cpu.TIERS["avx2"].runs == ("avx2", "portable")
    assert cpu.TIERS["portable"].runs == ("portable",)


def test_the_table_tiles_every_quantized_type_wherever_a_tier_has_int8_dots():
    quantized = [row for row in WEIGHT_TYPES.values() if not row.is_float]
    assert {row.name for row in quantized} == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K"}
    for name, tier in cpu.TIERS.items():
        for row in quantized:
            assert row.plan(tier).layout == ("tiles" if tier.int8_dot else "rows"), name
        for row in WEIGHT_TYPES.values():
            if row.is_float:
                assert row.plan(tier).layout == "rows", name  # the file's rows, on every tier

    def plan(qtype, tier):
        return WEIGHT_TYPES[qtype].plan(cpu.TIERS[tier])

    assert plan(Q.Q4_0, "avx512-vnni").passes(64) == [8] * 8
    assert plan(Q.Q4_0, "avx512-vnni").passes(3) == [2, 1]  # no row padded
    assert plan(Q.Q4_0, "avx512-vnni").passes(1) == [1]
    assert plan(Q.Q4_0, "avx2").passes(5) == [2, 2, 1]
    assert plan(Q.Q4_K, "avx2").passes(64) == [16] * 4
    assert plan(Q.Q5_K, "avx512-vnni").passes(37) == [16, 16, 4, 1]  # 8 a pass before the values' order (8db1e0b)
    assert plan(Q.Q6_K, "avx512-vnni").passes(47) == [16, 16, 8, 4, 2, 1]
    assert plan(Q.Q6_K, "avx2").passes(15) == [8, 4, 2, 1]  # the K-quants' passes of 8 and 4, every tier
    assert plan(Q.Q4_0, "avx512-vnni").passes(15) == [8, 2, 2, 2, 1]  # the 32-value types': none
    assert plan(Q.Q4_K, "avx2").passes(37) == [16, 16, 4, 1]
    assert sum(plan(Q.Q6_K, "avx2").passes(0)) == 0
    assert plan(Q.Q4_K, "portable").lanes_from == 8


def test_a_tier_this_cpu_cannot_run_is_refused():
    with pytest.raises(ValueError, match="unknown CPU tier"):
        cpu.get("sse9")
    missing = [name for name in cpu.TIERS if name not in cpu.runnable()]
    for name in missing:
        with pytest.raises(ValueError, match="cannot run"):
            cpu.get(name)
    assert cpu.get(None) is cpu.TIER


def test_miro_cpu_tier_lowers_the_tier_or_says_why_not(monkeypatch):
    monkeypatch.setenv("MIRO_CPU_TIER", "portable")
    assert cpu._chosen().name == "portable"
    monkeypatch.setenv("MIRO_CPU_TIER", "avx3")
    with pytest.raises(MiroError, match=r"^MIRO_CPU_TIER='avx3' is not a tier; the tiers are avx512-vnni, .*\.$"):
        cpu._chosen()
    monkeypatch.delenv("MIRO_CPU_TIER")
    assert cpu._chosen() is cpu.COMPILED


def _run_under(tier: str, code: str) -> str:
    env = {**os.environ, **cpu.emulation_env(tier)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.skipif("avx2" not in cpu.runnable(), reason="the AVX2 emulation needs a CPU that runs AVX2")
def test_the_tier_follows_what_numba_compiles_for():
    """NUMBA_CPU_NAME / NUMBA_CPU_FEATURES as the AVX2 emulation sets them: the tier is avx2, not the host's."""
    out = _run_under(
        "avx2", "from miro.core.kernels import cpu; print(cpu.COMPILED.name, cpu.TIER.name, cpu.describe())"
    )
    assert out.split()[:2] == ["avx2", "avx2"]
    assert "NUMBA_CPU_*" in out


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu.runnable(), reason="the AVX2 emulation needs a CPU that runs AVX2")
def test_kernel_equality_tests_pass_when_numba_compiles_for_avx2():
    """The tests comparing every tier's kernels bit for bit, run by a pytest compiling for an AVX2-only CPU
    (machine code with 16 ymm registers, not the AVX-512 code of this process)."""
    env = {**os.environ, **cpu.emulation_env("avx2")}
    env.pop("MIRO_CPU_TIER")
    tests = [
        "tests/core/test_quant_linear.py::test_every_tiers_kernels_agree_bitwise",
        "tests/core/test_quant_linear.py::test_batch_invariance_bitwise",
        "tests/core/test_quant_linear.py::test_a_lone_row_quantized_in_the_kernel_has_the_two_calls_bits",
        "tests/core/test_gemm.py",
        "tests/core/test_attention.py",
        "tests/core/test_int16_gemm.py",
        "tests/core/test_grouped_experts.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout


_GREEDY = """
import json, sys
from miro.core import Engine, SamplingParams
from miro.core.kernels import cpu
prompts = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.", "1, 2, 3, 4,"]
params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
result = {"tier": cpu.TIER.name}
for weights in ("native", "f32"):
    engine = Engine.from_model(sys.argv[1], weights=weights, kv_cache_memory="64MiB")
    assert engine.model.batch_invariant
    outputs = engine.generate(prompts, params, use_tqdm=False)
    result[weights] = [out.outputs[0].token_ids for out in outputs]
print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu.runnable(), reason="the AVX2 emulation needs a CPU that runs AVX2")
def test_greedy_tokens_are_the_same_on_the_avx2_tier(smollm2_path):
    """The default model, native and batch-invariant f32 weights: the same greedy tokens compiled for this CPU and
    for an AVX2-only one (different kernels, different machine code, the same bits)."""
    import json

    def run(env):
        done = subprocess.run(
            [sys.executable, "-c", _GREEDY, str(smollm2_path)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    here = run(dict(os.environ))
    emulated = run({**os.environ, **cpu.emulation_env("avx2")})
    assert emulated["tier"] == "avx2"
    assert emulated["native"] == here["native"]
    assert emulated["f32"] == here["f32"]


_EMBED = """
import hashlib, json
from miro.core import Engine
from miro.core.kernels import cpu
texts = ["A sentence to embed.", "Another, a little longer, with numbers 1, 2, 3.", "Pack me " * 60]
result = {"tier": cpu.TIER.name}
for weights in ("i16", "f32"):
    vectors = Engine.from_model("all-minilm-l6-v2", weights=weights).embed(texts)
    result[weights] = hashlib.sha256(vectors.tobytes()).hexdigest()
print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.skipif("avx2" not in cpu.runnable(), reason="the AVX2 emulation needs a CPU that runs AVX2")
def test_embeddings_are_the_same_bits_on_the_avx2_tier():
    """all-MiniLM-L6-v2 with i16 weights (auto's choice on AVX2) and f32 ones: the same vectors, bit for bit,
    compiled for this CPU and for an AVX2-only one."""
    import json

    def run(env):
        done = subprocess.run(
            [sys.executable, "-c", _EMBED], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    here = run(dict(os.environ))
    emulated = run({**os.environ, **cpu.emulation_env("avx2")})
    assert emulated["tier"] == "avx2"
    assert emulated["i16"] == here["i16"] and emulated["f32"] == here["f32"]
