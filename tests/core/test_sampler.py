"""One test per sampling parameter: unit tests on logits rows, end-to-end ones on the default model."""

import json

import numpy as np
import pytest
from fixture_files import FIXTURES

from miro.core import Engine, SamplingParams
from miro.core.sampling.sampler import apply_penalties, sample_row

PROMPTS = [p["prompt_ids"] for p in json.loads((FIXTURES / "hf_reference.json").read_text())["prompts"]]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    return Engine.from_model(smollm2_path, num_kv_blocks=256)


def draws(row, params, n=400):
    rng = np.random.default_rng(0)
    return {sample_row(row.copy(), params, rng) for _ in range(n)}


def probs_row(probs):
    return np.log(np.asarray(probs, dtype=np.float32))


def test_top_k_limits_choices():
    row = np.linspace(0, 1, 50, dtype=np.float32)
    assert draws(row, SamplingParams(temperature=5.0, top_k=3)) == {47, 48, 49}


def test_top_p_keeps_smallest_nucleus():
    row = probs_row([0.5, 0.3, 0.1, 0.05, 0.05])
    assert draws(row, SamplingParams(top_p=0.75)) == {0, 1}
    assert draws(row, SamplingParams(top_p=0.85)) == {0, 1, 2}
    assert draws(row, SamplingParams(top_p=1.0)) == {0, 1, 2, 3, 4}


def test_top_p_over_a_large_vocabulary():
    rng = np.random.default_rng(3)
    row = rng.normal(size=49152).astype(np.float32)  # flat: the nucleus is far beyond the candidate shortlist
    probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    order = np.argsort(-probs)
    allowed = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.3)) + 1].tolist())
    assert draws(row, SamplingParams(top_p=0.3), n=300) <= allowed


def test_min_p_masks_unlikely_tokens():
    row = probs_row([0.4, 0.3, 0.19, 0.11])
    assert draws(row, SamplingParams(min_p=0.5)) == {0, 1}  # 0.19 < 0.5 * 0.4


def test_repetition_penalty():
    row = np.array([2.0, -2.0, 2.0, -2.0], dtype=np.float32)
    apply_penalties(row, SamplingParams(repetition_penalty=2.0), prompt_ids=[0], output_ids=[1])
    assert row.tolist() == [1.0, -4.0, 2.0, -2.0]


def test_presence_and_frequency_penalties():
    row = np.zeros(4, dtype=np.float32)
    apply_penalties(row, SamplingParams(presence_penalty=0.5), prompt_ids=[3], output_ids=[1, 1, 2])
    assert row.tolist() == [0.0, -0.5, -0.5, 0.0]
    row = np.zeros(4, dtype=np.float32)
    apply_penalties(row, SamplingParams(frequency_penalty=0.25), prompt_ids=[3], output_ids=[1, 1, 2])
    assert row.tolist() == [0.0, -0.5, -0.25, 0.0]


def test_repetition_penalty_changes_generation(engine):
    plain = engine.generate([PROMPTS[3]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    penalised = engine.generate(
        [PROMPTS[3]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=1.8)
    )[0]
    assert penalised.token_ids != plain.token_ids
    assert len(set(penalised.token_ids)) >= len(set(plain.token_ids))


def test_top_k_1_equals_greedy(engine):
    greedy = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    top1 = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=12, temperature=1.3, top_k=1, ignore_eos=True))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_seed_repeats_and_differs(engine):
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 1, 2)]
    a, b, c = engine.generate([PROMPTS[4]] * 3, params)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_stop_string_spanning_tokens(engine):
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    full = engine.generate([PROMPTS[5]], params)[0]
    pieces = [engine.tokenizer.decode(full.token_ids[: i + 1]) for i in range(len(full.token_ids))]
    # a stop string made of the end of one token's text and the start of the next
    i = next(
        i
        for i in range(4, len(pieces) - 1)
        if len(pieces[i]) - len(pieces[i - 1]) >= 2 and len(pieces[i + 1]) - len(pieces[i]) >= 2
    )
    stop = pieces[i][-2:] + pieces[i + 1][len(pieces[i]) : len(pieces[i]) + 2]
    out = engine.generate([PROMPTS[5]], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == full.text[: full.text.index(stop)]
    assert stop not in out.text


def test_stop_token_ids_and_min_tokens(engine):
    base = engine.generate([PROMPTS[6]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    third = base.token_ids[2]
    stopped = engine.generate([PROMPTS[6]], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[third]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == base.token_ids[:3]
    first = base.token_ids[0]
    held = engine.generate(
        [PROMPTS[6]], SamplingParams(max_tokens=8, min_tokens=3, temperature=0, stop_token_ids=[first])
    )[0]
    assert held.token_ids[0] != first


def test_max_tokens_gives_length(engine):
    out = engine.generate([PROMPTS[7]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_logprobs_match_softmax_of_logits(engine):
    out = engine.generate([PROMPTS[8]], SamplingParams(max_tokens=3, temperature=0.7, seed=5, logprobs=5))[0]
    first = out.outputs[0].logprobs[0]
    logits = engine.logits(PROMPTS[8]).astype(np.float64)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert first.token_id == out.token_ids[0]
    assert first.bytes == engine.tokenizer.token_bytes(first.token_id) and first.token == first.bytes.decode()
    assert first.logprob == pytest.approx(expected[out.token_ids[0]], abs=1e-5)
    assert [t.token_id for t in first.top_logprobs] == np.argsort(-expected)[:5].tolist()
    assert np.exp([t.logprob for t in first.top_logprobs]).sum() <= 1.0
    assert len(out.outputs[0].logprobs) == len(out.token_ids)


def test_n_choices_share_prompt_blocks(engine):
    prompt = PROMPTS[9]
    engine.add_request(prompt, SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=3, ignore_eos=True), "fork")
    engine.step()  # prefill the prompt once, then fork 3 more choices
    seqs = engine.requests["fork"].seqs
    full_blocks = len(prompt) // engine.block_size
    assert len(seqs) == 4
    assert all(s.block_table[:full_blocks] == seqs[0].block_table[:full_blocks] for s in seqs)
    assert engine.stats().kv_blocks_used == engine.block_manager.blocks_needed(len(prompt))
    result = None
    while engine.has_unfinished_requests():
        result = next((o for o in engine.step() if o.finished), result)
    assert [len(c.token_ids) for c in result.outputs] == [12] * 4
    assert len({tuple(c.token_ids) for c in result.outputs}) > 1
    assert engine.block_manager.num_used_blocks == 0
