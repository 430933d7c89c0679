"""A step's sequences in groups run at once (core/engine/step_groups.py): how they are split, that the outputs are
the bits of the step run whole, and when the default splits."""

import threading

import numba
import numpy as np
import pytest

from miro.core import Engine, EngineConfig, SamplingParams
from miro.core.engine import step_groups
from miro.core.engine.step_groups import StepGroups, split


def test_split_balances_costs_and_keeps_batch_order_within_a_group():
    groups = split([5.0, 1.0, 1.0, 4.0, 1.0, 2.0], 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(g == sorted(g) for g in groups)
    costs = [5.0, 1.0, 1.0, 4.0, 1.0, 2.0]
    assert sorted(sum(costs[i] for i in g) for g in groups) == [7.0, 7.0]


@pytest.mark.parametrize(
    "costs, n_groups",
    [
        ([1.0, 1.0], 1),  # one group asked for
        ([1.0], 2),  # fewer sequences than groups
        ([512.0, 1.0, 1.0, 1.0], 2),  # a long prefill chunk beside a few decodes: one group would hold 99%
    ],
)
def test_a_step_that_cannot_be_split_well_runs_whole(costs, n_groups):
    assert split(costs, n_groups) is None


def test_the_pool_gives_each_group_its_share_of_the_callers_threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs numba's pool of 2 threads or more")
    seen = []
    lock = threading.Lock()

    def forward(indices):
        with lock:
            seen.append((threading.current_thread().name, numba.get_num_threads()))
        return np.full((len(indices), 3), indices[0], np.float32)

    numba.set_num_threads(2)
    parts = StepGroups(2).run(forward, [[0, 2], [1]])
    assert [p[:, 0].tolist() for p in parts] == [[0.0, 0.0], [1.0]]
    assert all(name.startswith("miro-step-group") and threads == 1 for name, threads in seen)


@pytest.fixture(scope="module")
def loaded(smollm2_path):
    engine = Engine.from_model(smollm2_path, num_kv_blocks=1)
    return engine.model, engine.tokenizer


def generate(loaded, prompts, params, **options):
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, EngineConfig.of({"num_kv_blocks": 256} | options))
    return [out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)]


def test_groups_give_the_bits_of_the_step_run_whole(loaded):
    """Prompts of 3-200 tokens in 64-token chunks beside decodes, greedy and seeded sampling: the same tokens with
    the steps split in 2 and 3 groups as run whole (batch invariance carries it)."""
    rng = np.random.default_rng(11)
    prompts = [rng.integers(20, 40000, size=int(n)).tolist() for n in rng.integers(3, 200, size=12)]
    params = [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=100 + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    whole = generate(loaded, prompts, params, step_groups=1, max_num_batched_tokens=64)
    for n_groups in (2, 3):
        assert generate(loaded, prompts, params, step_groups=n_groups, max_num_batched_tokens=64) == whole


def test_the_default_splits_a_small_dense_invariant_model_only(loaded, monkeypatch):
    model, _ = loaded
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    assert step_groups.step_groups_for(model, None) == 2  # SmolLM2-135M, native weights (92 MiB): batch-invariant
    assert step_groups.step_groups_for(model, 3) == 3  # asked for
    monkeypatch.setattr(step_groups, "AUTO_MAX_WEIGHT_BYTES", 64 * 2**20)
    assert step_groups.step_groups_for(model, None) == 1  # weights past what the default splits
    monkeypatch.setattr(numba, "get_num_threads", lambda: 1)
    monkeypatch.setattr(step_groups, "AUTO_MAX_WEIGHT_BYTES", 128 * 2**20)
    assert step_groups.step_groups_for(model, None) == 1  # one thread: nothing to share


def test_the_default_leaves_gemma3_270m_whole(gemma3_path):
    """Its 262k-row head makes its weights 235 MiB: two groups reading them each ran 0.83-0.97x as fast."""
    engine = Engine.from_model(gemma3_path, num_kv_blocks=4)
    assert engine.runner.groups is None
