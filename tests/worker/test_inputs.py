"""miro.worker.fleet.intake.inputs: valid lines of JSONL datasets for miro-submit, both line forms, normalised to Requests.
Errors are test_input_errors.py's."""

import pytest

from miro.core.sampling.params import SamplingParams
from miro.worker.fleet.intake.dataset import parse_dataset
from miro.worker.fleet.records.payload import Request
from input_lines import CHAT, COMPLETIONS, openai, parse


# ---- valid lines -----------------------------------------------------------------------------------


def test_simple_prompt_line(tmp_path):
    result = parse(tmp_path, {"id": "q1", "prompt": "Say hi."})
    assert result.ok and result.errors == [] and result.file_error is None
    assert result.requests == [
        Request(
            custom_id="q1",
            line=1,
            kind="completion",
            prompt="Say hi.",
            messages=None,
            sampling={"max_tokens": None},
            requested_model=None,
            form="simple",
            url=None,
        )
    ]


def test_simple_messages_line_keeps_role_and_content_only(tmp_path):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": ""},
    ]
    (request,) = parse(tmp_path, {"id": "q1", "messages": messages}).requests
    assert request.kind == "chat" and request.prompt is None and request.form == "simple"
    assert request.messages == [{"role": m["role"], "content": m["content"]} for m in messages]


def test_custom_id_spelling_int_id_and_default_ids_count_physical_lines(tmp_path):
    result = parse(
        tmp_path,
        "",
        {"prompt": "a"},
        "   ",
        {"custom_id": "x", "prompt": "b"},
        {"id": 7, "prompt": "c"},
        {"messages": [{"role": "user", "content": "d"}]},
    )
    assert result.errors == []
    assert [(r.custom_id, r.line) for r in result.requests] == [("line-2", 2), ("x", 4), ("7", 5), ("line-6", 6)]


def test_simple_sampling_fields_map_to_vllm_names_and_merge_over_defaults(tmp_path):
    line = {
        "id": "q",
        "prompt": "p",
        "max_tokens": 50,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 3,
        "stop": "\n\n",
        "n": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "logprobs": 5,
        "stop_token_ids": [2, 7],
    }
    defaults = {"max_tokens": 16, "temperature": 0.0, "skip_special_tokens": False}
    (request,) = parse(tmp_path, line, defaults=defaults).requests
    expected = {k: v for k, v in line.items() if k not in ("id", "prompt")}
    expected["stop"] = ["\n\n"]
    expected["skip_special_tokens"] = False
    assert request.sampling == expected
    params = SamplingParams(**request.sampling)
    assert params.n == 2 and params.stop == ["\n\n"] and params.logprobs == 5


def test_defaults_apply_where_a_line_is_silent_or_null(tmp_path):
    defaults = {"max_tokens": 64, "temperature": 0.0, "stop": ["END"]}
    result = parse(tmp_path, {"prompt": "a"}, {"prompt": "b", "temperature": None, "max_tokens": 8}, defaults=defaults)
    assert [r.sampling for r in result.requests] == [
        {"max_tokens": 64, "temperature": 0.0, "stop": ["END"]},
        {"max_tokens": 8, "temperature": 0.0, "stop": ["END"]},
    ]
    # each request owns its lists: changing one does not change another or the caller's defaults
    result.requests[0].sampling["stop"].append("X")
    assert result.requests[1].sampling["stop"] == ["END"] and defaults["stop"] == ["END"]


def test_openai_chat_line(tmp_path):
    line = openai(
        "req-1",
        CHAT,
        model="gpt-4o-mini",
        max_completion_tokens=9,
        temperature=0.2,
        top_p=0.5,
        n=1,
        seed=42,
        stop=["x", "y"],
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logprobs=True,
        top_logprobs=3,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.2,
        ignore_eos=False,
        user="someone",
        response_format={"type": "text"},
        stream=False,
        tools=None,  # ignored
    )
    (request,) = parse(tmp_path, line).requests
    assert request == Request(
        custom_id="req-1",
        line=1,
        kind="chat",
        prompt=None,
        messages=[{"role": "user", "content": "hi"}],
        sampling={
            "max_tokens": 9,
            "temperature": 0.2,
            "top_p": 0.5,
            "n": 1,
            "seed": 42,
            "stop": ["x", "y"],
            "presence_penalty": 0.1,
            "frequency_penalty": 0.2,
            "logprobs": 3,
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "ignore_eos": False,
        },
        requested_model="gpt-4o-mini",
        form="openai",
        url=CHAT,
    )


@pytest.mark.parametrize(
    "body, logprobs",
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 4}, 4)],
)
def test_openai_chat_logprobs_mapping(tmp_path, body, logprobs):
    (request,) = parse(tmp_path, openai(**body)).requests
    assert request.sampling.get("logprobs") == logprobs


def test_openai_completion_line(tmp_path):
    line = openai("c9", COMPLETIONS, prompt="Once upon", max_tokens=20, logprobs=2, echo=False, best_of=None)
    (request,) = parse(tmp_path, line).requests
    assert request == Request(
        custom_id="c9",
        line=1,
        kind="completion",
        prompt="Once upon",
        messages=None,
        sampling={"max_tokens": 20, "logprobs": 2},
        requested_model=None,
        form="openai",
        url=COMPLETIONS,
    )


def test_max_tokens_and_max_completion_tokens_agreeing_is_fine(tmp_path):
    (request,) = parse(tmp_path, openai(max_tokens=5, max_completion_tokens=5)).requests
    assert request.sampling == {"max_tokens": 5}


def test_mixed_file_keeps_order_forms_and_lines(tmp_path):
    result = parse(
        tmp_path,
        {"id": "s1", "prompt": "one", "max_tokens": 4},
        openai("o1", CHAT, max_tokens=3),
        "",
        {"id": "s2", "messages": [{"role": "user", "content": "two"}]},
        openai("o2", COMPLETIONS, prompt="three", temperature=0),
        defaults={"max_tokens": 32},
    )
    assert result.ok
    got = [(r.custom_id, r.line, r.form, r.kind, r.url, r.sampling) for r in result.requests]
    assert got == [
        ("s1", 1, "simple", "completion", None, {"max_tokens": 4}),
        ("o1", 2, "openai", "chat", CHAT, {"max_tokens": 3}),
        ("s2", 4, "simple", "chat", None, {"max_tokens": 32}),
        ("o2", 5, "openai", "completion", COMPLETIONS, {"max_tokens": 32, "temperature": 0}),
    ]
    for r in result.requests:
        SamplingParams(**r.sampling)


def test_bom_and_crlf_are_accepted(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "x"}\r\n{"id": "b", "prompt": "y"}\r\n')
    result = parse_dataset(path)
    assert result.ok and [r.custom_id for r in result.requests] == ["a", "b"]


def test_twenty_thousand_lines(tmp_path):
    lines = []
    for i in range(20_000):
        if i % 2:
            lines.append({"id": f"q{i}", "prompt": f"question {i}", "max_tokens": 8, "temperature": 0.5})
        else:
            lines.append(openai(f"q{i}", CHAT, messages=[{"role": "user", "content": f"question {i}"}], seed=i))
    result = parse(tmp_path, *lines, defaults={"max_tokens": 16})
    assert result.ok and len(result.requests) == 20_000
    assert result.requests[-1].custom_id == "q19999" and result.requests[-1].line == 20_000


def test_lines_without_max_tokens_run_to_a_natural_stop(tmp_path):
    """OpenAI's default, not vLLM's 16: max_tokens None reaches the engine (the rest of the context)."""
    result = parse(tmp_path, {"prompt": "a"}, openai("o", CHAT), {"prompt": "b", "max_tokens": 7})
    assert [r.sampling.get("max_tokens", "absent") for r in result.requests] == [None, None, 7]
    assert [
        r.sampling["max_tokens"] for r in parse(tmp_path, {"prompt": "a"}, defaults={"max_tokens": 5}).requests
    ] == [5]


def test_developer_role_and_text_content_parts_are_accepted(tmp_path):
    parts = [{"type": "text", "text": "Say hi"}, {"type": "text", "text": "politely."}]
    result = parse(
        tmp_path,
        openai("o", CHAT, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}]),
        {
            "id": "s",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "x"}]},
                {"role": "user", "content": "y"},
            ],
        },
    )
    assert result.ok
    assert result.requests[0].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi\npolitely."},
    ]
    assert result.requests[1].messages[0] == {"role": "system", "content": "x"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("tools", []),
        ("tool_choice", "none"),
        ("response_format", {"type": "text"}),
        ("logit_bias", {}),
        ("stream", False),
        ("user", "u1"),
    ],
)
def test_those_fields_switched_off_are_fine(tmp_path, field, value):
    assert parse(tmp_path, openai("o", CHAT, **{field: value})).ok


def test_a_simple_lines_own_fields_are_carried_for_the_results(tmp_path):
    """As Ray Data keeps a dataset's other columns: "category" and "meta" ride along with the request."""
    result = parse(
        tmp_path,
        {"id": "q1", "prompt": "x", "category": "math", "meta": {"source": "a", "n": 2}},
        {"id": "q2", "prompt": "y"},
    )
    assert [r.extra for r in result.requests] == [{"category": "math", "meta": {"source": "a", "n": 2}}, None]


PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_constraints_arrive_as_structured_outputs(tmp_path):
    """OpenAI's response_format (json_schema, json_object, text) and vLLM's structured_outputs, on both line forms."""
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    result = parse(
        tmp_path,
        openai("a", CHAT, response_format=schema_format),
        openai("b", CHAT, response_format={"type": "json_object"}),
        openai("c", COMPLETIONS, prompt="x", response_format={"type": "text"}),
        openai("d", COMPLETIONS, prompt="x", structured_outputs={"regex": "[0-9]+"}),
        {"id": "e", "prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}},
        {"id": "f", "messages": [{"role": "user", "content": "x"}], "structured_outputs": {"grammar": 'start: "a"'}},
    )
    assert result.ok
    assert [r.sampling.get("structured_outputs") for r in result.requests] == [
        {"json": PERSON},
        {"json_object": True},
        None,
        {"regex": "[0-9]+"},
        {"choice": ["yes", "no"]},
        {"grammar": 'start: "a"'},
    ]


def test_a_default_constraint_applies_to_lines_without_one(tmp_path):
    result = parse(
        tmp_path,
        {"id": "a", "prompt": "x"},
        {"id": "b", "prompt": "y", "structured_outputs": {"regex": "b"}},
        defaults={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert [r.sampling["structured_outputs"] for r in result.requests] == [{"choice": ["yes", "no"]}, {"regex": "b"}]
