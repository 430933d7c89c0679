"""The continuous-batching engine on the default model: batch invariance, prefix caching, requests."""

import json

import numpy as np
import pytest
from fixture_files import FIXTURES

from miro.core import Engine, EngineConfig, RequestError, SamplingParams

CHAT_PROMPTS = [p["prompt_ids"] for p in json.loads((FIXTURES / "hf_reference.json").read_text())["prompts"]]


@pytest.fixture(scope="module")
def loaded(smollm2_path):
    """The model and tokenizer, loaded once; each test builds engines with its own cache settings."""
    engine = Engine.from_model(smollm2_path, num_kv_blocks=1)
    return engine.model, engine.tokenizer


def make_engine(loaded, **options) -> Engine:
    model, tokenizer = loaded
    options.setdefault("num_kv_blocks", 256)
    return Engine(model, tokenizer, EngineConfig.of(options))


def mixed_prompts(n: int) -> list[list[int]]:
    """Chat prompts (28-233 tokens) and random token runs (3-120 tokens), interleaved."""
    rng = np.random.default_rng(7)
    prompts = []
    for i in range(n):
        if i % 2 == 0:
            prompts.append(CHAT_PROMPTS[(i // 2) % len(CHAT_PROMPTS)])
        else:
            prompts.append(rng.integers(20, 40000, size=int(rng.integers(3, 120))).tolist())
    return prompts


@pytest.mark.slow
def test_batched_equals_alone_bit_for_bit(loaded):
    prompts = mixed_prompts(64)
    # half greedy, half seeded sampling with a different seed each
    params = [
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=1000 + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    batched = make_engine(loaded, num_kv_blocks=24, max_num_batched_tokens=40, batch_invariant=True)
    together = batched.generate(prompts, params)
    stats = batched.stats()
    assert stats.preemptions > 0, "the cache should have been small enough to force preemption"

    alone = make_engine(loaded, enable_prefix_caching=False, batch_invariant=True)
    for prompt, p, out in zip(prompts, params, together):
        assert alone.generate([prompt], p)[0].token_ids == out.token_ids


def test_prefix_cache_computes_shared_prefix_once(loaded, smollm2_path):
    rng = np.random.default_rng(1)
    system = rng.integers(100, 40000, size=400).tolist()
    # 12 prompts of ~420 tokens: more steps than one (512 tokens a step), each prompt after the first a hit
    n = 12
    prompts = [system + rng.integers(100, 40000, size=int(rng.integers(5, 30))).tolist() for _ in range(n)]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)

    cached = make_engine(loaded, num_kv_blocks=400)
    with_cache = cached.generate(prompts, params)
    stats = cached.stats()
    shared_tokens = 400 // 16 * 16  # full blocks of the shared prefix
    total = sum(len(p) for p in prompts)
    assert stats.prefix_cache_hits == cached.block_manager.prefix_hits == (n - 1) * shared_tokens
    assert stats.prefix_cache_queries == total
    assert stats.prefix_cache_hit_rate == pytest.approx((n - 1) * shared_tokens / total)

    plain = make_engine(loaded, num_kv_blocks=400, enable_prefix_caching=False)
    without = plain.generate(prompts, params)
    assert plain.stats().prefix_cache_hit_rate == 0
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in without]


def test_stats_and_blocks_freed(loaded):
    engine = make_engine(loaded, num_kv_blocks=64)
    for prompt in CHAT_PROMPTS[:4]:
        engine.add_request(prompt, SamplingParams(max_tokens=5, temperature=0))
    engine.step()
    mid = engine.stats()
    assert mid.running + mid.waiting == 4 and 0 < mid.kv_blocks_used <= 64
    assert mid.kv_usage == mid.kv_blocks_used / 64
    while engine.has_unfinished_requests():
        engine.step()
    end = engine.stats()
    assert end.running == end.waiting == 0 and end.kv_blocks_used == 0
    assert end.prompt_tokens_total + engine.block_manager.prefix_hits == sum(len(p) for p in CHAT_PROMPTS[:4])
    assert 4 <= end.generation_tokens_total <= 20 and end.generation_tokens_per_s > 0


def test_token_rates_cover_the_window_and_fall_to_zero_when_idle(loaded, monkeypatch):
    import time

    import miro.core.engine.stats as stats_module

    engine = make_engine(loaded, num_kv_blocks=64)
    engine.generate(CHAT_PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    before = time.monotonic()
    busy = engine.stats()
    after = time.monotonic()
    # the window starts when the first step began and ends at the call: 16 tokens over that span
    since_first_step = (before - engine.rates.first_step_at, after - engine.rates.first_step_at)
    assert 16 / since_first_step[1] <= busy.generation_tokens_per_s <= 16 / since_first_step[0]
    monkeypatch.setattr(stats_module, "STATS_WINDOW_S", 0.05)
    time.sleep(0.1)
    idle = engine.stats()
    assert idle.generation_tokens_per_s == idle.prompt_tokens_per_s == 0.0
    assert idle.generation_tokens_total == 16


def test_abort(loaded):
    engine = make_engine(loaded)
    keep = engine.add_request(CHAT_PROMPTS[0], SamplingParams(max_tokens=6, temperature=0))
    drop = engine.add_request(CHAT_PROMPTS[1], SamplingParams(max_tokens=50, temperature=0))
    engine.step()
    assert engine.abort(drop) and not engine.abort("nope")
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished[drop].finish_reason == "abort"
    assert finished[keep].finish_reason in ("stop", "length") and len(finished[keep].token_ids) <= 6
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ("", SamplingParams(), "empty"),
        ([5] * 3000, SamplingParams(max_tokens=8), "exceed the context length"),
        ("hi", dict(max_tokens=0), "max_tokens must be from 1 to"),
        ("hi", dict(max_tokens=-3), "max_tokens must be from 1 to"),
        ("hi", dict(temperature=-0.5), "temperature must be >= 0"),
        ("hi", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        ("hi", dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_request_is_refused_and_others_served(loaded, prompt, params, message):
    engine = make_engine(loaded, max_model_len=2048)
    with pytest.raises(RequestError, match=message):
        engine.add_request(prompt, params if isinstance(params, SamplingParams) else SamplingParams(**params))
    good = engine.add_request(CHAT_PROMPTS[2], SamplingParams(max_tokens=4, temperature=0))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outs] == [good] and len(outs[0].token_ids) == 4


def test_generate_reports_refused_prompts_in_place(loaded):
    engine = make_engine(loaded, max_model_len=2048)
    outs = engine.generate([CHAT_PROMPTS[0], "", [7] * 5000, CHAT_PROMPTS[1]], SamplingParams(max_tokens=3))
    assert outs[0].error is None and len(outs[0].token_ids) == 3
    assert "empty" in outs[1].error and "context length" in outs[2].error
    assert outs[3].error is None and len(outs[3].token_ids) == 3


def test_request_larger_than_cache_is_refused(loaded):
    engine = make_engine(loaded, num_kv_blocks=4)  # 64 tokens
    with pytest.raises(RequestError, match="more than the whole cache"):
        engine.add_request(CHAT_PROMPTS[0], SamplingParams(max_tokens=64))


def test_choices_that_cannot_all_fit_the_cache_are_refused_at_once(loaded):
    """n choices share the prompt's full blocks and each need their own for the rest: 20 tokens of prompt and
    12 of output take 2 blocks alone, so 8 blocks hold 7 choices (1 shared + 7 x 1) but not 8."""
    engine = make_engine(loaded, num_kv_blocks=8)
    prompt = list(range(100, 120))
    engine.add_request(prompt, SamplingParams(max_tokens=12, n=7, ignore_eos=True), request_id="fits")
    with pytest.raises(RequestError, match="each of its 8 choices.*more than the whole cache"):
        engine.add_request(prompt, SamplingParams(max_tokens=12, n=8), request_id="too-many")
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outs] == ["fits"] and [len(c.token_ids) for c in outs[0].outputs] == [12] * 7


def test_no_max_tokens_runs_to_the_end_of_the_context(loaded):
    """max_tokens=None (a request line without one, as OpenAI's default): the rest of the context."""
    engine = make_engine(loaded, max_model_len=48)
    prompt = list(range(100, 120))
    [out] = engine.generate([prompt], SamplingParams(max_tokens=None, ignore_eos=True, temperature=0), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 48 - 20 and out.outputs[0].finish_reason == "length"


def test_no_max_tokens_is_bounded_by_what_the_cache_holds_for_every_choice(loaded):
    """8 blocks of 16 and a 20-token prompt: 3 choices share its full block and take 7 // 3 = 2 blocks each
    beside it, so each may reach 48 tokens: 28 new."""
    engine = make_engine(loaded, num_kv_blocks=8)
    prompt = list(range(100, 120))
    [out] = engine.generate([prompt], SamplingParams(max_tokens=None, n=3, ignore_eos=True), use_tqdm=False)
    assert [len(c.token_ids) for c in out.outputs] == [28] * 3


def test_engine_options_are_one_config_and_an_unknown_one_is_refused_in_one_sentence():
    from miro.core import MiroError

    config = EngineConfig.of({"block_size": 32, "max_num_seqs": 5})
    assert (config.block_size, config.max_num_seqs, config.kv_cache_dtype) == (32, 5, EngineConfig().kv_cache_dtype)
    assert EngineConfig.of({"max_num_seqs": 7}, base=config) == EngineConfig(block_size=32, max_num_seqs=7)
    with pytest.raises(MiroError, match=r"^the engine has no option 'max_seqs' \(it takes .*max_num_seqs.*\)\.$"):
        Engine.from_model("no-such-model.gguf", max_seqs=4)  # refused before the file is looked at
