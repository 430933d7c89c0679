"""Embedding lines of a dataset: every form of OpenAI's /v1/embeddings `input` and a simple line's `input` (or its
prompt under --task embed) become one embedding Request; bad ones are one sentence naming the line and field;
a batch embeds or generates, never both. No Redis, no model."""

import json

import pytest

from miro.core.errors import MiroError
from miro.worker.fleet.intake.dataset import parse_dataset
from miro.worker.fleet.records.payload import JobPayload
from miro.worker.fleet.intake.job_writer import payload
from input_lines import CHAT, parse, write

EMBEDDINGS = "/v1/embeddings"


def embeddings(custom_id="e1", **body):
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS, "body": body}


@pytest.mark.parametrize(
    "given, inputs",
    [
        ("hello world", ["hello world"]),
        (["one", "two"], ["one", "two"]),
        ([101, 7592, 102], [[101, 7592, 102]]),
        ([[101, 7592, 102], [101, 102]], [[101, 7592, 102], [101, 102]]),
    ],
)
def test_every_input_form_of_a_line_is_a_list_of_inputs(tmp_path, given, inputs):
    result = parse(tmp_path, embeddings(input=given, model="all-minilm-l6-v2"), {"id": "s", "input": given})
    assert result.errors == [] and result.task == "embed"
    openai_request, simple_request = result.requests
    assert (openai_request.kind, openai_request.inputs, openai_request.requested_model) == (
        "embedding",
        inputs,
        "all-minilm-l6-v2",
    )
    assert (simple_request.kind, simple_request.inputs, simple_request.form) == ("embedding", inputs, "simple")
    assert openai_request.sampling == {} and openai_request.encoding_format == "float"


def test_options_of_a_body_and_a_simple_line_are_pooling_params_and_own_fields_stay(tmp_path):
    result = parse(
        tmp_path,
        embeddings(input="a", dimensions=64, encoding_format="base64", user="u-1", truncate_prompt_tokens=8),
        {"id": "s", "input": "b", "dimensions": 32, "normalize": False, "topic": "cats"},
    )
    body_request, simple_request = result.requests
    assert body_request.pooling == {"dimensions": 64, "truncate_prompt_tokens": 8}
    assert body_request.encoding_format == "base64"
    assert simple_request.pooling == {"dimensions": 32, "normalize": False}
    assert simple_request.extra == {"topic": "cats"}


def test_task_embed_embeds_a_simple_prompt_and_truncate_is_a_default_a_line_overrides(tmp_path):
    lines = [{"id": "p", "prompt": "embed me"}, {"id": "q", "input": "x", "truncate_prompt_tokens": 5}]
    result = parse(tmp_path, *lines, task="embed", pooling_defaults={"truncate_prompt_tokens": -1})
    assert result.errors == [] and result.task == "embed"
    assert [(r.inputs, r.pooling) for r in result.requests] == [
        (["embed me"], {"truncate_prompt_tokens": -1}),
        (["x"], {"truncate_prompt_tokens": 5}),
    ]
    generated = parse(tmp_path, {"id": "p", "prompt": "complete me"})
    assert generated.task == "generate" and generated.requests[0].kind == "completion"


def test_the_payload_of_an_embedding_round_trips_through_the_jobs_kwargs(tmp_path):
    [request] = parse(tmp_path, {"id": "s", "input": [[1, 2], [3]], "dimensions": 8, "topic": "t"}).requests
    job = payload(request, "batch_x", "all-minilm-l6-v2")
    kwargs = json.loads(json.dumps(job.to_kwargs()))  # as RQ's JSON serializer stores it
    assert "prompt" not in kwargs and "messages" not in kwargs
    again = JobPayload.from_kwargs(kwargs)
    assert again == job and again.task == "embed" and again.pooling_params().dimensions == 8
    with pytest.raises(MiroError, match="neither a chat, a completion, a Responses nor an embedding request"):
        JobPayload.from_kwargs({**kwargs, "prompt": "also"})


LINE_ERRORS = [
    ({"input": ""}, "line 1: field 'input': input 0 is an empty string."),
    ({"input": []}, "line 1: field 'input': should not be an empty list."),
    ({"input": ["ok", ""]}, "line 1: field 'input': input 1 is an empty string."),
    ({"input": [[]]}, "line 1: field 'input': input 0 is an empty list of token ids."),
    (
        {"input": 3},
        "line 1: field 'input': should be a string, a list of strings, a list of token ids or a list of "
        "lists of token ids.",
    ),
    (
        {"input": {"text": "a"}},
        "line 1: field 'input': should be a string, a list of strings, a list of token ids "
        "or a list of lists of token ids.",
    ),
    ({"input": ["a", 5]}, "line 1: field 'input': input 1 is a number, not a string or a list of token ids."),
    ({"input": ["a", None]}, "line 1: field 'input': input 1 is null, not a string or a list of token ids."),
    ({"input": ["a", [1]]}, "line 1: field 'input': mixes strings and lists of token ids: give one kind."),
    (
        {"input": [5, -1]},
        "line 1: field 'input': input 0: token 1 is a negative number, and token ids are integers from 0.",
    ),
    (
        {"input": [1.5]},
        "line 1: field 'input': input 0: token 0 is a number with a fraction, and token ids are integers from 0.",
    ),
    (
        {"input": [[1], [True]]},
        "line 1: field 'input': input 1: token 0 is true or false, and token ids are integers from 0.",
    ),
    (
        {"input": ["a"] * 2049},
        "line 1: field 'input': has 2,049 inputs, more than the 2,048 one request may hold: "
        "split it over several lines.",
    ),
    ({"input": "a", "prompt": "b"}, "line 1: the line has both 'prompt' and 'input', give only one."),
    (
        {"input": "a", "max_tokens": 5},
        "line 1: field 'max_tokens': a sampling option, and an embedding line generates nothing.",
    ),
    (
        {"prompt": "a", "dimensions": 5},
        "line 1: field 'dimensions': only an embedding line takes it (one with "
        "'input', or a 'prompt' under --task embed).",
    ),
    ({"input": "a", "dimensions": 0}, "line 1: field 'dimensions': Input should be greater than or equal to 1."),
    ({"input": "a", "dimensions": "8"}, "line 1: field 'dimensions': Input should be a valid integer."),
    (
        {"input": "a", "truncate_prompt_tokens": 0},
        "line 1: truncate_prompt_tokens must be a positive integer or -1 (the model's context), got 0.",
    ),
    (embeddings(input="a", dimension=8), "line 1: field 'body.dimension': unknown field (did you mean 'dimensions'?)."),
    (
        embeddings(input="a", encoding_format="hex"),
        "line 1: field 'body.encoding_format': Input should be 'float' or 'base64'.",
    ),
    (
        embeddings(inputs="a"),
        "line 1: field 'body.input': Field required; field 'body.inputs': unknown field (did you mean 'input'?).",
    ),
    (
        embeddings(input=[0, 1.0]),
        "line 1: field 'body.input': input 0: token 1 is a number with a fraction, and token ids are integers from 0.",
    ),
    ('{"id": "n", "input": "a", "dimensions": NaN}', "line 1: not valid JSON (NaN is not a JSON number)."),
    ('{"id": "n", "input": [1, NaN]}', "line 1: not valid JSON (NaN is not a JSON number)."),
]


@pytest.mark.parametrize("line, message", LINE_ERRORS, ids=[str(i) for i in range(len(LINE_ERRORS))])
def test_a_bad_embedding_line_is_one_sentence_naming_the_line_and_field(tmp_path, line, message):
    result = parse(tmp_path, line)
    assert [e.message for e in result.errors] == [message]


def test_a_batch_embeds_or_generates_and_a_line_of_the_other_task_is_its_error(tmp_path):
    chat = {"custom_id": "c", "method": "POST", "url": CHAT, "body": {"messages": [{"role": "user", "content": "x"}]}}
    result = parse(tmp_path, {"id": "e", "input": "a"}, {"id": "p", "prompt": "b"}, chat)
    assert result.task == "embed" and [r.custom_id for r in result.requests] == ["e"]
    assert [(e.line, e.code, e.message) for e in result.errors] == [
        (
            2,
            "task_mismatch",
            "line 2: a generation request, but the batch embeds (as line 1 does); a batch runs on "
            "one model, which either embeds or generates: put the two kinds in two files.",
        ),
        (
            3,
            "task_mismatch",
            "line 3: a generation request, but the batch embeds (as line 1 does); a batch runs on "
            "one model, which either embeds or generates: put the two kinds in two files.",
        ),
    ]
    told = parse(tmp_path, {"id": "m", "messages": [{"role": "user", "content": "x"}]}, task="embed")
    assert told.errors[0].message == (
        "line 1: a generation request, but the batch embeds (--task embed); a batch "
        "runs on one model, which either embeds or generates: put the two kinds in two "
        "files."
    )
    generating = parse(tmp_path, {"id": "e", "input": "a"}, task="generate")
    assert generating.errors[0].message.startswith(
        "line 1: an embedding request, but the batch generates (--task generate);"
    )


def test_an_embeddings_batch_of_the_api_takes_only_embeddings_lines(tmp_path):
    result = parse_dataset(
        write(tmp_path / "d.jsonl", embeddings(input="a"), {"id": "s", "input": "b"}), endpoint=EMBEDDINGS
    )
    assert [r.custom_id for r in result.requests] == ["e1"]
    assert result.errors[0].message == "line 2: no url (a simple line), but the batch's endpoint is '/v1/embeddings'."


@pytest.mark.parametrize(
    "pooling_defaults, message",
    [
        ({"dimension": 3}, "Default pooling options dimension are not PoolingParams fields."),
        (
            {"truncate_prompt_tokens": -5},
            "Default pooling options are invalid (truncate_prompt_tokens must be a positive "
            "integer or -1 (the model's context), got -5).",
        ),
    ],
)
def test_bad_pooling_defaults_are_one_sentence(tmp_path, pooling_defaults, message):
    with pytest.raises(MiroError) as err:
        parse(tmp_path, {"input": "a"}, pooling_defaults=pooling_defaults)
    assert str(err.value) == message
