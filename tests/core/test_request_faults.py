"""A request's failure is that request's alone: a fault in one request's part of Engine.step() (its sampling, stop
ids, constraint, logprobs, detokenisation, stop strings, n > 1 fork; an embedding's pooling) ends that request with
an error, frees its blocks, and leaves every other request's tokens bitwise as they would have been without it.

The tiny llama GGUF, native weights (batch-invariant), no mocks of the model: faults are injected through hostile
objects on one request's sequence (its generator, logprobs list, detokenizer, stop strings, matcher), through the
two poisoned lines of issue 37 with the engine's and submit's checks bypassed, and through one request's fork."""

import numpy as np
import pytest

from miro.core import Engine, RequestError, SamplingParams
from miro.core.engine import request_checks
from miro.core.sampling import constraint
from miro.core.engine.outputs import EmbeddingRequestOutput

POISON_GRAMMAR = 'start: "a"{60000}'  # compiles; llguidance refuses it at its first token ("Too many items")


@pytest.fixture(scope="module")
def engine(tiny_model):
    # 64 blocks of 16 tokens: too few for 64 requests at once, so the fuzz preempts too
    return Engine.from_model(tiny_model, weights="native", num_kv_blocks=64, max_num_batched_tokens=96)


@pytest.fixture
def unchecked(monkeypatch, engine):
    """The checks that refuse the poisoned lines up front turned off, so the step meets them."""
    monkeypatch.setattr(request_checks, "check_token_ids", lambda params, vocab_size: None)
    monkeypatch.setattr(constraint, "_check_first_token", lambda grammar: None)
    constraint._compiled.cache_clear()
    yield
    constraint._compiled.cache_clear()


def test_the_two_poisoned_lines_are_refused_before_they_run(engine):
    vocab = engine.config.vocab_size
    with pytest.raises(RequestError, match="outside the model's vocabulary"):
        engine.add_request("hello", SamplingParams(min_tokens=1, stop_token_ids=[vocab]))
    with pytest.raises(RequestError, match="structured_outputs.grammar cannot run: .*Too many items"):
        SamplingParams(structured_outputs={"grammar": POISON_GRAMMAR})
    assert not engine.has_unfinished_requests()


def test_the_two_poisoned_lines_fail_alone_in_the_step(engine, unchecked):
    vocab = engine.config.vocab_size
    good = [
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=8, seed=3, temperature=0.8, logprobs=2, ignore_eos=True),
    ]
    alone = engine.generate(["hello a", "hello b"], good, use_tqdm=False)
    outs = engine.generate(
        ["hello a", "x", "y", "hello b"],
        [
            good[0],
            SamplingParams(min_tokens=1, stop_token_ids=[vocab + 48880], max_tokens=4),
            SamplingParams(max_tokens=4, structured_outputs={"grammar": POISON_GRAMMAR}),
            good[1],
        ],
        use_tqdm=False,
    )
    assert outs[1].finished and "IndexError" in outs[1].error and "sampling" in outs[1].error
    assert outs[2].finished and "Too many items" in outs[2].error
    assert [o.error for o in (outs[0], outs[3])] == [None, None]
    assert [o.token_ids for o in (outs[0], outs[3])] == [o.token_ids for o in alone]
    assert engine.block_manager.num_used_blocks == 0 and not engine.requests


class Fault(Exception):
    """The injected fault."""


class _Trigger:
    def __init__(self, seq, at: int):
        self.seq, self.at = seq, at

    def due(self) -> bool:
        return len(self.seq.output_token_ids) >= self.at


class HostileRng(_Trigger):
    def __init__(self, seq, at):
        super().__init__(seq, at)
        self.rng = seq.rng

    def random(self, *args):
        if self.due():
            raise Fault("injected: the generator")
        return self.rng.random(*args)


class HostileLogprobs(list):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def append(self, entry):
        if len(self) >= self.at:
            raise Fault("injected: logprobs")
        super().append(entry)


class HostileDetokenizer(_Trigger):
    def __init__(self, seq, at):
        super().__init__(seq, at)
        self.real = seq.detokenizer

    def add(self, token):
        if self.due():
            raise Fault("injected: detokenisation")
        return self.real.add(token)

    def flush(self):
        return self.real.flush()


class HostileStops(list):
    def __init__(self, seq, at):
        super().__init__(["\x00never"])
        self.trigger = _Trigger(seq, at)

    def __iter__(self):
        if self.trigger.due():
            raise Fault("injected: stop strings")
        return super().__iter__()


class HostileMatcher:
    """Not a matcher at all: the step's masks, computed for all constrained rows at once, fail on it."""


STAGES = ("generator", "logprobs", "detokenizer", "stop_strings", "mask", "fork", "stop_id", "grammar")


def _params(k: int, stage: str | None, vocab: int) -> SamplingParams:
    """Request k's parameters; those of a request faulted at `stage` carry what that stage needs."""
    kind = k % 4
    common = dict(max_tokens=10, ignore_eos=True)
    if stage == "stop_id":
        return SamplingParams(min_tokens=2, stop_token_ids=[vocab + k], **common)
    if stage == "grammar":
        return SamplingParams(temperature=0, structured_outputs={"grammar": POISON_GRAMMAR}, **common)
    if stage in ("generator", "fork"):
        return SamplingParams(temperature=0.8, top_p=0.9, seed=k, n=2 if stage == "fork" else 1, **common)
    if stage == "logprobs":
        return SamplingParams(temperature=0, logprobs=2, **common)
    if kind == 0:
        return SamplingParams(temperature=0, **common)
    if kind == 1:
        return SamplingParams(temperature=0.8, top_p=0.9, seed=k, n=1 + (k % 8 == 1), **common)
    if kind == 2:
        return SamplingParams(temperature=0, logprobs=2, repetition_penalty=1.2, **common)
    return SamplingParams(temperature=0, structured_outputs={"regex": "[a-z ]+"}, **common)


def _run(engine, prompts, params, faults: dict[int, tuple[str, int]]) -> list:
    ids = [f"fuzz-{k}" for k in range(len(prompts))]
    forks = {ids[k] for k, (stage, _) in faults.items() if stage == "fork"}
    real_new_sequence = engine._new_sequence

    def new_sequence(request_id, index, *args, **kwargs):
        if request_id in forks and index >= 1:
            raise Fault("injected: fork")
        return real_new_sequence(request_id, index, *args, **kwargs)

    engine._new_sequence = new_sequence
    try:
        return _steps(engine, prompts, params, faults, ids)
    finally:
        del engine._new_sequence


def _steps(engine, prompts, params, faults, ids) -> list:
    for k, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(prompt, p, ids[k])
        seq = engine.requests[ids[k]].seqs[0]
        stage, at = faults.get(k, (None, 0))
        if stage == "generator":
            seq.rng = HostileRng(seq, at)
        elif stage == "logprobs":
            seq.logprobs = HostileLogprobs(at)
        elif stage == "detokenizer":
            seq.detokenizer = HostileDetokenizer(seq, at)
        elif stage == "stop_strings":
            seq.params.stop = HostileStops(seq, at)
        elif stage == "mask":
            seq.matcher = HostileMatcher()
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


def test_fuzz_64_requests_with_faults_at_every_stage(engine, unchecked, monkeypatch):
    rng = np.random.default_rng(37)
    vocab = engine.config.vocab_size
    prompts = [f"hello {k} " + "ab" * int(rng.integers(0, 12)) for k in range(64)]
    faulted = rng.choice(64, size=24, replace=False)
    faults = {int(k): (STAGES[j % len(STAGES)], int(rng.integers(0, 6))) for j, k in enumerate(faulted)}
    preempted = engine.scheduler.num_preemptions
    clean = _run(engine, prompts, [_params(k, None, vocab) for k in range(64)], {})
    assert all(out.error is None for out in clean)
    assert engine.scheduler.num_preemptions > preempted  # the cache is small enough to preempt
    assert engine.block_manager.num_used_blocks == 0

    faulty = _run(engine, prompts, [_params(k, faults.get(k, (None,))[0], vocab) for k in range(64)], faults)
    for k, out in enumerate(faulty):
        assert out.finished
        if k in faults:
            assert out.error and out.error.startswith("the engine failed on this request while"), (faults[k], out)
        else:
            assert out.error is None
            assert [c.token_ids for c in out.outputs] == [c.token_ids for c in clean[k].outputs], (k, faults)
            assert [c.logprobs for c in out.outputs] == [c.logprobs for c in clean[k].outputs]
    assert {stage for stage, _ in faults.values()} == set(STAGES)
    assert engine.block_manager.num_used_blocks == 0 and not engine.requests


def test_reset_drops_every_request_and_frees_the_cache(engine):
    for k in range(5):
        engine.add_request(f"hello {k}", SamplingParams(max_tokens=20, ignore_eos=True), f"r{k}")
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert sorted(engine.reset()) == [f"r{k}" for k in range(5)]
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
    assert engine.generate(["hello"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)[0].error is None


def test_a_fault_in_one_embedding_s_pooling_fails_that_input_alone(minilm_path):
    from miro.core.layers.pooling import PoolingParams

    embedder = Engine.from_model(minilm_path)
    expected = embedder.embed(["one", "two", "three"])
    embedder.add_request("one", PoolingParams(), "e0")
    embedder.add_request("two", PoolingParams(), "e1")
    embedder.add_request("three", PoolingParams(), "e2")
    embedder.embedding_requests["e1"].params = None  # its pooling reads its params: AttributeError
    outs = {out.request_id: out for out in embedder.step()}
    assert isinstance(outs["e1"], EmbeddingRequestOutput) and "pooling" in outs["e1"].error
    assert np.array_equal(outs["e0"].embedding, expected[0]) and np.array_equal(outs["e2"].embedding, expected[2])
