"""Priorities in the engine, on a tiny random-weights model: a more urgent request takes the seat or the KV
blocks of the least urgent running one (preempted, recomputed later), and every output stays what it is alone."""

import numpy as np
import pytest

from miro.core import Engine, EngineConfig, SamplingParams

HIGH, NORMAL, LOW = -1, 0, 1
GREEDY = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    """Native weights: batch-invariant by construction, so greedy tokens must equal those of a run alone."""
    engine = Engine.from_model(tiny_model, num_kv_blocks=1, batch_invariant=True)
    return engine.model, engine.tokenizer


def make_engine(loaded, **options) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, EngineConfig.of({"num_kv_blocks": 64, "block_size": 16, **options}))


def prompts(n: int, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 250, size=int(rng.integers(6, 20))).tolist() for _ in range(n)]


def alone(loaded, prompt, params) -> list[int]:
    return make_engine(loaded).generate([prompt], params, use_tqdm=False)[0].token_ids


def run(engine, steps=None) -> dict:
    """Step until done (or `steps` steps); request id -> (step it finished, its token ids)."""
    finished, step = {}, 0
    while engine.has_unfinished_requests() and (steps is None or step < steps):
        step += 1
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = (step, out.token_ids)
    return finished


def state(engine, request_id) -> str:
    return engine.requests[request_id].seqs[0].status.value


def test_an_urgent_request_takes_the_seat_of_the_newest_least_urgent_one(loaded):
    engine = make_engine(loaded, max_num_seqs=3)
    low = prompts(3)
    for i, prompt in enumerate(low):
        engine.add_request(prompt, GREEDY, request_id=f"low{i}", priority=LOW)
    run(engine, steps=3)
    urgent = prompts(1, seed=9)[0]
    engine.add_request(urgent, SHORT, request_id="high", priority=HIGH)
    run(engine, steps=1)
    assert state(engine, "high") == "running"
    assert [state(engine, f"low{i}") for i in range(3)] == ["running", "running", "waiting"]
    assert engine.stats().preemptions == 1

    finished = run(engine)
    assert finished["high"][0] < min(finished[f"low{i}"][0] for i in range(3))
    assert finished["high"][1] == alone(loaded, urgent, SHORT)
    for i, prompt in enumerate(low):  # the preempted one too: recomputed, the same greedy tokens
        assert finished[f"low{i}"][1] == alone(loaded, prompt, GREEDY)


def test_an_urgent_request_takes_kv_blocks_when_every_seat_is_free_but_the_cache_is_full(loaded):
    engine = make_engine(loaded, num_kv_blocks=8, max_num_seqs=8)
    low = prompts(3)
    for i, prompt in enumerate(low):
        engine.add_request(prompt, GREEDY, request_id=f"low{i}", priority=LOW)
    urgent = prompts(1, seed=9)[0]
    while engine.block_manager.num_free_blocks >= engine.block_manager.blocks_needed(len(urgent)):
        assert not run(engine, steps=1), "the low requests should fill the cache before any finishes"
    engine.add_request(urgent, SHORT, request_id="high", priority=HIGH)
    run(engine, steps=1)
    assert state(engine, "high") == "running"
    assert engine.stats().preemptions >= 1

    finished = run(engine)
    assert finished["high"][0] < min(finished[f"low{i}"][0] for i in range(3))
    assert finished["high"][1] == alone(loaded, urgent, SHORT)
    for i, prompt in enumerate(low):
        assert finished[f"low{i}"][1] == alone(loaded, prompt, GREEDY)


@pytest.mark.parametrize("running, arriving", [(NORMAL, NORMAL), (HIGH, LOW)])
def test_a_request_no_more_urgent_than_the_running_ones_waits_for_a_seat(loaded, running, arriving):
    engine = make_engine(loaded, max_num_seqs=2)
    for i, prompt in enumerate(prompts(2)):
        engine.add_request(prompt, GREEDY, request_id=f"r{i}", priority=running)
    run(engine, steps=2)
    engine.add_request(prompts(1, seed=9)[0], SHORT, request_id="late", priority=arriving)
    run(engine, steps=2)
    assert state(engine, "late") == "waiting"
    assert engine.stats().preemptions == 0


def test_waiting_requests_are_admitted_most_urgent_first(loaded):
    engine = make_engine(loaded, max_num_seqs=1)
    for name, priority in (("low", LOW), ("normal", NORMAL), ("high", HIGH)):
        engine.add_request(prompts(1)[0], SHORT, request_id=name, priority=priority)
    finished = run(engine)
    assert sorted(finished, key=lambda r: finished[r][0]) == ["high", "normal", "low"]


def test_choices_of_an_urgent_request_keep_its_priority(loaded):
    engine = make_engine(loaded, max_num_seqs=3)
    for i, prompt in enumerate(prompts(3)):
        engine.add_request(prompt, GREEDY, request_id=f"low{i}", priority=LOW)
    run(engine, steps=2)
    engine.add_request(
        prompts(1, seed=9)[0],
        SamplingParams(n=2, max_tokens=4, temperature=0.8, seed=1),
        request_id="high",
        priority=HIGH,
    )
    run(engine, steps=2)
    assert [s.priority for s in engine.requests["high"].seqs] == [HIGH, HIGH]
    assert all(s.status.value == "running" for s in engine.requests["high"].seqs)


def test_an_urgent_prompt_is_prefilled_before_the_chunks_of_less_urgent_ones(loaded):
    engine = make_engine(loaded, max_num_batched_tokens=16, max_num_seqs=8)
    rng = np.random.default_rng(5)
    for i in range(3):  # 60-token prompts: 12 steps of 16-token chunks for the three
        engine.add_request(rng.integers(5, 250, size=60).tolist(), GREEDY, request_id=f"low{i}", priority=LOW)
    run(engine, steps=1)
    urgent = prompts(1, seed=9)[0]
    engine.add_request(urgent, SHORT, request_id="high", priority=HIGH)
    outputs = {out.request_id: out for out in engine.step()}
    assert len(outputs["high"].token_ids) == 1  # its whole prompt went through in this one step
    assert all(s.is_prefilling for i in range(3) for s in engine.requests[f"low{i}"].seqs)
    assert engine.stats().preemptions == 0  # seats and blocks were free: it only took the budget first
    assert run(engine)["high"][1] == alone(loaded, urgent, SHORT)
