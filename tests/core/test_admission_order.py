"""admission_order="prefix" (the default): among waiting requests of one priority, the one whose prompt has the
longest prefix in the prefix cache is admitted first; priority still comes first, and every output is what it is
alone. And max_num_seqs's default, derived from the KV cache's size."""

import numpy as np
import pytest

from miro.core import Engine, EngineConfig, MiroError, SamplingParams
from miro.core.engine.scheduler import seats_for

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
DOCUMENT = list(range(10, 74))  # 64 tokens: four full blocks every prompt that starts with it shares


@pytest.fixture(scope="module")
def loaded(tiny_model):
    engine = Engine.from_model(tiny_model, num_kv_blocks=1)
    return engine.model, engine.tokenizer


def make_engine(loaded, **options) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, EngineConfig.of({"num_kv_blocks": 64, **options}))


def other(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(80, 250, size=70).tolist()


def admitted_after_the_document_is_cached(loaded, order: str, priorities=(0, 0)) -> str:
    """One seat: the document's first request runs to the end (its prompt blocks stay cached); then an
    unrelated request and, after it, another on the same document wait; which is admitted first?"""
    engine = make_engine(loaded, max_num_seqs=1, admission_order=order)
    engine.add_request(DOCUMENT + [1, 2, 3], GREEDY, request_id="first")
    engine.add_request(other(1), GREEDY, request_id="unrelated", priority=priorities[0])
    engine.add_request(DOCUMENT + [4, 5, 6], GREEDY, request_id="same-document", priority=priorities[1])
    while "first" in engine.requests:
        engine.step()
    engine.step()
    (running,) = [seq.request_id for seq in engine.scheduler.running]
    return running


def test_arrival_order_takes_the_oldest(loaded):
    assert admitted_after_the_document_is_cached(loaded, "arrival") == "unrelated"


def test_prefix_order_takes_the_one_whose_prefix_is_cached(loaded):
    assert admitted_after_the_document_is_cached(loaded, "prefix") == "same-document"


def test_priority_comes_before_the_prefix(loaded):
    assert (
        admitted_after_the_document_is_cached(loaded, "prefix", priorities=(0, 1)) == "unrelated"
    )  # the document one less urgent


def test_prefix_order_computes_fewer_prompt_tokens_and_changes_no_output(loaded):
    """Requests on three documents, interleaved, into a cache that holds about one document's worth: by
    prefix, each document's requests run while it is cached."""
    documents = [list(range(10 + 64 * d, 74 + 64 * d)) for d in range(3)]
    prompts = [documents[d] + other(10 * q + d)[:8] for q in range(6) for d in range(3)]
    runs = {}
    for order in ("arrival", "prefix"):
        engine = make_engine(loaded, num_kv_blocks=12, max_num_seqs=4, admission_order=order)
        outputs = engine.generate(prompts, GREEDY, use_tqdm=False)
        runs[order] = ([o.token_ids for o in outputs], engine.rates.prompt_tokens_total)
    alone = [make_engine(loaded).generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in prompts]
    assert runs["arrival"][0] == alone and runs["prefix"][0] == alone
    print(f"prompt tokens computed: arrival {runs['arrival'][1]}, prefix {runs['prefix'][1]}")
    assert runs["prefix"][1] < runs["arrival"][1]


def test_an_unknown_order_is_one_sentence(loaded):
    with pytest.raises(MiroError, match=r"^the admission order must be one of prefix, arrival, not 'lpm'\.$"):
        make_engine(loaded, admission_order="lpm")


def test_the_default_order_is_by_prefix_and_seats_follow_the_cache(loaded):
    small, large = make_engine(loaded, num_kv_blocks=64), make_engine(loaded, num_kv_blocks=4096)
    assert small.scheduler.admission_order == "prefix"
    assert small.scheduler.max_num_seqs == 64  # 1,024 tokens: the fewest seats
    assert large.scheduler.max_num_seqs == 128  # 65,536 tokens: one per 256 would be 256, over the most
    assert seats_for(100 * 256) == 100
    assert make_engine(loaded, num_kv_blocks=64, max_num_seqs=3).scheduler.max_num_seqs == 3
