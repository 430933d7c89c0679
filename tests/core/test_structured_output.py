"""Structured output in the engine: every output that stops satisfies its constraint, whatever the model wants.

The tiny model has random weights, so without the grammar it would write noise: each stopped output
that validates is the constraint at work. Validity is checked independently of llguidance (jsonschema,
Python's re, the list of choices).
"""

import json
import re

import jsonschema
import numpy as np
import pytest

from miro.core import Engine, RequestError, SamplingParams
from miro.core.sampling.sampler import apply_token_masks
from miro.core.sampling.constraint import StructuredOutputsParams, parsed_json
from miro.core.sampling.structured_output import TokenMasks

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
LABELS = ["positive", "negative", "neutral"]
GRAMMAR = 'start: "x=" NUMBER ";"\nNUMBER: /[1-9][0-9]?/'


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine.from_model(tiny_model, num_kv_blocks=64, batch_invariant=True)


def generate(engine, constraint, n_prompts=8, **options):
    options = {"max_tokens": 100, "temperature": 1.0, **options}
    params = [SamplingParams(seed=i, structured_outputs=constraint, **options) for i in range(n_prompts)]
    return [o.outputs for o in engine.generate([f"prompt {i}" for i in range(n_prompts)], params, use_tqdm=False)]


def stopped_texts(results) -> list[str]:
    texts = [c.text for choices in results for c in choices if c.finish_reason == "stop"]
    assert len(texts) >= len(results) // 2, "too few outputs finished to test anything"
    return texts


def test_json_schema_outputs_validate(engine):
    results = generate(engine, {"json": PERSON})
    for text in stopped_texts(results):
        jsonschema.validate(json.loads(text), PERSON)
    for choice in (c for choices in results for c in choices):  # the engine's parsed output, as the rows carry it
        assert choice.parsed == parsed_json(StructuredOutputsParams(json=PERSON), choice.text, choice.finish_reason)
    assert any(c.parsed for choices in results for c in choices)


def test_json_object_outputs_are_objects(engine):
    for text in stopped_texts(generate(engine, {"json_object": True}, max_tokens=110)):
        assert isinstance(json.loads(text), dict)


def test_regex_outputs_match(engine):
    for text in stopped_texts(generate(engine, {"regex": DATE})):
        assert re.fullmatch(DATE, text)


def test_choice_outputs_are_a_choice(engine):
    texts = stopped_texts(generate(engine, {"choice": LABELS}))
    assert set(texts) <= set(LABELS) and len(texts) == 8


def test_lark_grammar_outputs_match(engine):
    for text in stopped_texts(generate(engine, {"grammar": GRAMMAR})):
        assert re.fullmatch(r"x=[1-9][0-9]?;", text)


def test_greedy_constrained_output_ends_without_an_extra_step(engine):
    """A choice is complete once its text is: the sequence stops there, with no EOS token to sample."""
    out = generate(engine, {"choice": ["yes"]}, n_prompts=1, temperature=0)[0][0]
    assert (out.text, out.finish_reason) == ("yes", "stop")
    assert engine.tokenizer.decode(out.token_ids) == "yes"


def test_cut_by_max_tokens_says_length_and_parses_to_nothing(engine):
    out = generate(engine, {"json": PERSON}, n_prompts=1, max_tokens=3)[0][0]
    assert out.finish_reason == "length"
    assert parsed_json(StructuredOutputsParams(json=PERSON), out.text, out.finish_reason) is None
    assert out.parsed is None


def test_n_choices_each_follow_the_constraint(engine):
    results = generate(engine, {"regex": DATE}, n_prompts=2, n=4)
    assert all(len(choices) == 4 for choices in results)
    for text in stopped_texts(results):
        assert re.fullmatch(DATE, text)


def test_constrained_and_free_requests_are_the_same_alone_and_together(engine):
    """Masks are per row: a constrained request beside free ones (and the free ones beside it) give the tokens
    they give alone, seeded sampling included."""
    constrained = SamplingParams(max_tokens=40, temperature=1.0, seed=5, structured_outputs={"json": PERSON})
    free = SamplingParams(max_tokens=40, temperature=1.0, seed=9)
    alone = [
        engine.generate(["a b c"], [constrained], use_tqdm=False)[0],
        engine.generate(["d e f"], [free], use_tqdm=False)[0],
    ]
    together = engine.generate(["a b c", "d e f", "g h"], [constrained, free, free], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in together[:2]] == [o.outputs[0].token_ids for o in alone]


def test_min_tokens_gives_way_to_a_complete_constraint(engine):
    out = generate(engine, {"choice": ["ok"]}, n_prompts=1, min_tokens=5, temperature=0)[0][0]
    assert (out.text, out.finish_reason) == ("ok", "stop")


def test_a_prefix_cached_prompt_gives_the_same_constrained_output(engine):
    params = SamplingParams(max_tokens=60, temperature=0.7, seed=2, structured_outputs={"json": PERSON})
    prompt = "the same long prompt " * 3
    first = engine.generate([prompt], [params], use_tqdm=False)[0]
    second = engine.generate([prompt], [params], use_tqdm=False)[0]
    assert second.num_cached_tokens > 0
    assert first.outputs[0].token_ids == second.outputs[0].token_ids


@pytest.mark.parametrize(
    "constraint, message",
    [
        ({"regex": "(ab"}, "structured_outputs.regex does not compile: "),
        ({"json": {"type": "no-such-type"}}, "structured_outputs.json does not compile: "),
        ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
        ({"grammar": "start: missing_rule"}, "structured_outputs.grammar does not compile: "),
        ({"choice": []}, "structured_outputs.choice must be a non-empty list"),
        (
            {"regex": "a", "choice": ["a"]},
            "exactly one of json, regex, choice, grammar and json_object, got regex, choice",
        ),
        ({}, "got none"),
        ({"schema": {}}, "structured_outputs has no field 'schema'"),
    ],
)
def test_a_constraint_that_cannot_compile_is_refused_in_one_sentence(constraint, message):
    with pytest.raises(RequestError, match=re.escape(message)) as err:
        SamplingParams(structured_outputs=constraint)
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


def test_stop_strings_are_refused_beside_a_constraint():
    with pytest.raises(RequestError, match="stop strings cannot be combined with structured_outputs"):
        SamplingParams(stop=["}"], structured_outputs={"json_object": True})


def test_json_schema_keeps_its_property_order(engine):
    schema = {
        "type": "object",
        "properties": {"z": {"const": 1}, "a": {"const": 2}},
        "required": ["z", "a"],
        "additionalProperties": False,
    }
    out = generate(engine, {"json": schema}, n_prompts=1, temperature=0)[0][0]
    assert (out.text, out.finish_reason) == ('{"z":1,"a":2}', "stop")


def test_masks_leave_unconstrained_rows_alone():
    logits = np.arange(12, dtype=np.float32).reshape(2, 6)
    bits = np.zeros((1, 1), dtype=np.int32)
    bits[0, 0] = 0b100101  # tokens 0, 2 and 5
    processed = logits.copy()
    apply_token_masks(processed, logits, TokenMasks([1], bits))
    assert np.array_equal(processed[0], logits[0])
    assert np.array_equal(np.isfinite(processed[1]), [True, False, True, False, False, True])


def test_parsed_json_is_compact_text_of_a_stopped_json_output():
    json_params = StructuredOutputsParams(json_object=True)
    assert parsed_json(json_params, '{"a": [1, 2]}', "stop") == '{"a":[1,2]}'
    assert parsed_json(StructuredOutputsParams(regex="a"), "a", "stop") is None
    assert parsed_json(None, "{}", "stop") is None


def test_a_grammar_that_allows_only_banned_tokens_wins_over_min_tokens():
    """min_tokens bans the stop tokens; if they are all a row's grammar allows, the row keeps them (raw logits)."""
    raw = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    processed = raw.copy()
    processed[0, 2] = -np.inf  # min_tokens banned token 2
    bits = np.array([[0b0100]], dtype=np.int32)  # the grammar allows token 2 only
    apply_token_masks(processed, raw, TokenMasks([0], bits))
    assert processed[0].tolist() == [-np.inf, -np.inf, 3.0, -np.inf]
