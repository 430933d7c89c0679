"""miro.worker.fleet.intake.inputs: what is wrong with a line or a file, in one clean sentence each, naming the line and field."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miro.core.errors import MiroError
from miro.core.sampling.params import SamplingParams
from miro.worker.fleet.intake.dataset import ParseResult, parse_dataset
from input_lines import CHAT, COMPLETIONS, only_error, openai, parse, write
from line_errors import LINE_ERRORS


# ---- errors, one sentence each --------------------------------------------------------------------


@pytest.mark.parametrize("line, message", LINE_ERRORS, ids=[str(i) for i in range(len(LINE_ERRORS))])
def test_line_error_messages(tmp_path, line, message):
    error = only_error(tmp_path, line)
    assert error.line == 1
    assert error.message == message


def test_multiple_field_errors_in_one_sentence(tmp_path):
    error = only_error(tmp_path, {"prompt": 1, "max_tokens": "a", "top_k": "b", "seed": "c", "n": "d"})
    assert error.message.startswith("line 1: field '")
    assert error.message.count("; field '") == 2
    assert "field 'max_tokens': Input should be a valid integer" in error.message
    assert error.message.endswith(" (and 2 more problems).")


def test_error_carries_custom_id_when_the_line_has_one(tmp_path):
    result = parse(
        tmp_path,
        {"id": "q1", "prompt": "x", "temperature": -1},
        {"prompt": 3},
        {**openai("c7"), "method": "GET"},
        "{broken",
    )
    assert [(e.line, e.custom_id) for e in result.errors] == [(1, "q1"), (2, None), (3, "c7"), (4, None)]


def test_good_lines_survive_bad_ones(tmp_path):
    result = parse(tmp_path, {"id": "a", "prompt": "x"}, "{bad", {"id": "b", "prompt": "y"}, "[1]")
    assert not result.ok
    assert [r.custom_id for r in result.requests] == ["a", "b"]
    assert [e.line for e in result.errors] == [2, 4]


def test_duplicate_custom_id_second_occurrence_is_the_error(tmp_path):
    result = parse(
        tmp_path,
        {"id": "q1", "prompt": "x"},
        {"prompt": "y"},
        openai("q1"),
        {"id": "line-2", "prompt": "z"},
    )
    assert [r.line for r in result.requests] == [1, 2]
    assert [(e.line, e.custom_id, e.message) for e in result.errors] == [
        (3, "q1", "line 3: duplicate custom id 'q1' (first used on line 1)."),
        (4, "line-2", "line 4: duplicate custom id 'line-2' (first used on line 2)."),
    ]


def test_invalid_utf8_names_the_byte(tmp_path):
    error = only_error(tmp_path, {"id": "a", "prompt": "ok"}, b'{"prompt": "caf\xe9"}')
    assert error.line == 2
    assert error.message == "line 2: not valid UTF-8 (byte 0xe9 at byte 16 of the line)."


def test_line_over_the_limit_gives_its_size_not_its_content(tmp_path):
    long_prompt = "A" * 230
    result = parse(
        tmp_path,
        {"id": "a", "prompt": "short"},
        {"id": "b", "prompt": long_prompt},
        {"id": "c", "prompt": "short again"},
        max_line_bytes=100,
    )
    size = len(json.dumps({"id": "b", "prompt": long_prompt}))
    assert [r.custom_id for r in result.requests] == ["a", "c"]
    (error,) = result.errors
    assert error.line == 2
    assert error.message == f"line 2: the line is {size:,} bytes, over the limit of 100 bytes."
    assert "AAAA" not in error.message


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_line_limit_boundary(tmp_path, ending):
    at_limit = b'{"prompt": "' + b"x" * 88 + b'"}'  # 102 bytes
    over = b'{"prompt": "' + b"x" * 89 + b'"}'  # 103 bytes
    path = tmp_path / "data.jsonl"
    path.write_bytes(at_limit + ending + (over + ending if ending else b""))
    result = parse_dataset(path, max_line_bytes=102)
    assert len(result.requests) == 1
    if ending:
        assert [e.message for e in result.errors] == ["line 2: the line is 103 bytes, over the limit of 102 bytes."]
    path.write_bytes(over + b"x" * 5000 + ending + at_limit + ending)
    result = parse_dataset(path, max_line_bytes=102)
    size = "5,103" if ending else "5,205"  # without line endings it is all one line
    assert [e.message for e in result.errors] == [f"line 1: the line is {size} bytes, over the limit of 102 bytes."]
    assert len(result.requests) == (1 if ending else 0)


def test_huge_line_with_default_limit(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "' + b"y" * 3_000_000 + b'"}\n{"prompt": "fine"}\n')
    result = parse_dataset(path)
    assert [r.line for r in result.requests] == [2]
    expected = "line 1: the line is 3,000,014 bytes, over the limit of 1,000,000 bytes."
    assert [e.message for e in result.errors] == [expected]


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\r\n"])
def test_empty_file_is_a_file_error(tmp_path, content):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    result = parse_dataset(path)
    assert result.requests == [] and result.errors == [] and not result.ok
    assert result.file_error == f"Dataset file '{path}' is empty: it has no request lines."


def test_missing_file_and_directory_raise_miro_error(tmp_path):
    with pytest.raises(MiroError, match=r"^Dataset file '.*nope\.jsonl' does not exist\.$"):
        parse_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(MiroError, match=r"^The folder '.*' is no dataset saved by Hugging Face datasets"):
        parse_dataset(tmp_path)  # a folder is read as one (tables.py)
    with pytest.raises(MiroError, match=r"^Dataset path '.*' is a directory, not a JSONL file\.$"):
        parse_dataset(tmp_path, input_format="jsonl")


def test_bad_defaults_raise_miro_error(tmp_path):
    path = write(tmp_path / "data.jsonl", {"prompt": "x"})
    with pytest.raises(MiroError, match=r"^Default sampling options are invalid \(temperature must be >= 0"):
        parse_dataset(path, defaults={"temperature": -1})
    with pytest.raises(MiroError, match=r"^Default sampling options bogus are not SamplingParams fields\.$"):
        parse_dataset(path, defaults={"bogus": 1})
    assert parse_dataset(path, defaults={"stop": "END"}).requests[0].sampling == {"max_tokens": None, "stop": ["END"]}


# ---- every error message is one clean sentence ---------------------------------------------------


def assert_clean(result: ParseResult):
    for error in result.errors:
        message = error.message
        assert message.startswith(f"line {error.line}: "), message
        assert message.endswith("."), message
        assert "\n" not in message and "\r" not in message, message
        assert len(message) < 600, message
        for bad in ("Traceback", 'File "', "Error(", "pydantic", "errors.pydantic.dev", "For further information"):
            assert bad not in message, message
        assert error.custom_id is None or isinstance(error.custom_id, str)


def test_all_listed_errors_are_clean_in_one_file(tmp_path):
    result = parse(tmp_path, *[line for line, _ in LINE_ERRORS])
    assert result.requests == [] and len(result.errors) == len(LINE_ERRORS)
    assert [e.line for e in result.errors] == list(range(1, len(LINE_ERRORS) + 1))
    assert_clean(result)


def test_huge_values_do_not_end_up_in_messages(tmp_path):
    big = "k" * 200_000
    result = parse(
        tmp_path,
        {"prompt": "x", big: 1},
        {"id": big, "prompt": "x"},
        {"id": big, "prompt": "y"},
        {"prompt": "x", "temperature": big},
        {"messages": [{"role": big, "content": "x"}]},
    )
    assert len(result.errors) == 5  # lines 2 and 3: a custom id over MAX_CUSTOM_ID
    assert_clean(result)
    assert all(len(e.message) < 300 for e in result.errors)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
known_keys = st.sampled_from(
    [
        "id",
        "custom_id",
        "prompt",
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "logprobs",
        "stop_token_ids",
        "method",
        "url",
        "body",
        "role",
        "content",
        "model",
        "max_completion_tokens",
        "top_logprobs",
    ]
)
line_objects = st.recursive(
    json_values,
    lambda inner: st.dictionaries(known_keys, inner | st.sampled_from([CHAT, COMPLETIONS, "POST", "user"]), max_size=6),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line_objects.map(json.dumps) | st.binary(max_size=40), min_size=1, max_size=8))
def test_fuzz_every_line_is_a_request_or_one_clean_error(tmp_path, lines):
    path = tmp_path / "fuzz.jsonl"
    encoded = [
        line.encode() if isinstance(line, str) else line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines
    ]
    path.write_bytes(b"\n".join(encoded) + b"\n")
    result = parse_dataset(path)
    assert_clean(result)
    bom = b"\xef\xbb\xbf"
    stripped = [line[3:] if i == 0 and line.startswith(bom) else line for i, line in enumerate(encoded)]
    non_blank = [i + 1 for i, line in enumerate(stripped) if line.strip()]
    assert sorted([r.line for r in result.requests] + [e.line for e in result.errors]) == non_blank
    for request in result.requests:
        SamplingParams(**request.sampling)  # never raises RequestError for an accepted line
        assert request.kind == ("chat" if request.messages is not None else "completion")
        assert (request.prompt is None) != (request.messages is None)


def test_non_text_content_parts_are_refused_by_type(tmp_path):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    result = parse(tmp_path, openai("o", CHAT, messages=[{"role": "user", "content": [image]}]))
    [error] = result.errors
    assert "content parts of type 'image_url' are not supported (text only)" in error.message


@pytest.mark.parametrize(
    "field, value",
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("logit_bias", {"50256": -100}),
        ("stream", True),
    ],
)
def test_fields_miro_cannot_honour_are_refused_by_name_not_ignored(tmp_path, field, value):
    result = parse(tmp_path, openai("o", CHAT, **{field: value}))
    [error] = result.errors
    assert f"'{field}' is not supported by miro yet" in error.message


def test_a_json_array_or_csv_file_is_one_sentence_about_the_file(tmp_path):
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"id": "q1", "prompt": "a"}, {"id": "q2", "prompt": "b"}], indent=1))
    assert parse_dataset(array).file_error == (
        f"Dataset file '{array}' holds a JSON array: miro reads JSON Lines, one request object per line, "
        'e.g. {"id": "q1", "prompt": "..."}.'
    )
    csv = tmp_path / "a.txt"  # a .csv file is read as CSV (tables.py)
    csv.write_text("id,prompt\nq1,hello\nq2,world\n")
    assert (
        "looks like CSV (its first line is 'id,prompt'): give it a .csv name or --input-format csv"
        in parse_dataset(csv).file_error
    )
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"id": "q1", "prompt": "a"}\nid,prompt\n')  # one good line: the per-line errors stand
    assert parse_dataset(mixed).file_error is None


@pytest.mark.parametrize(
    "line, message",
    [
        (
            {"id": "q", "prompt": "x", "structured_outputs": {"regex": "(ab"}},
            "line 1: structured_outputs.regex does not compile: ",
        ),
        (
            {"id": "q", "prompt": "x", "structured_outputs": {"json": {"type": "bogus"}}},
            "line 1: structured_outputs.json does not compile: Invalid type: bogus.",
        ),
        (
            {"id": "q", "prompt": "x", "structured_outputs": {"grammar": "start: nowhere"}},
            "line 1: structured_outputs.grammar does not compile: ",
        ),
        (
            {"id": "q", "prompt": "x", "structured_outputs": {"choice": "yes"}},
            "line 1: structured_outputs.choice must be a non-empty list of non-empty strings.",
        ),
        (
            {"id": "q", "prompt": "x", "structured_outputs": "json"},
            "line 1: field 'structured_outputs': Input should be a valid dictionary.",
        ),
        (
            {"id": "q", "prompt": "x", "structured_outputs": {"json_object": True}, "stop": "}"},
            "line 1: stop strings cannot be combined with structured_outputs",
        ),
        (
            openai(
                "o",
                CHAT,
                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "x"}}},
            ),
            "line 1: field 'body.response_format.json_schema.schema' does not compile: Invalid type: x.",
        ),
        (
            openai("o", CHAT, response_format={"type": "json_schema"}),
            "line 1: field 'body.response_format': 'json_schema' goes with type 'json_schema', and only there.",
        ),
        (
            openai("o", CHAT, response_format={"type": "xml"}),
            "line 1: field 'body.response_format.type': Input should be 'text', 'json_object' or 'json_schema'.",
        ),
        (
            openai("o", CHAT, response_format={"type": "json_object"}, structured_outputs={"regex": "a"}),
            "line 1: field 'body.response_format': give it or 'body.structured_outputs', not both.",
        ),
    ],
)
def test_a_constraint_that_cannot_compile_is_its_lines_error(tmp_path, line, message):
    """Submit compiles every schema, regex and grammar: one that fails is that line's error, and nothing is
    enqueued."""
    error = only_error(tmp_path, line)
    assert error.message.startswith(message) and error.message.endswith(".") and "\n" not in error.message


def test_a_line_with_no_end_over_the_limit_is_read_in_bounded_pieces(tmp_path):
    """A 50 MB file that is one line with no newline: one error in one sentence, and the scan's memory is a piece's,
    not the line's (tracemalloc's peak), so a bigger file costs no more."""
    import tracemalloc

    from miro.worker.fleet.intake.dataset import scan_dataset

    path = tmp_path / "one_line.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"prompt": "')
        for _ in range(50):
            f.write(b"y" * (1 << 20))
    tracemalloc.start()
    try:
        items = list(scan_dataset(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    assert [e.message for e in items] == [f"line 1: the line is {size:,} bytes, over the limit of 1,000,000 bytes."]
    assert peak < 4 << 20


def test_custom_id_over_the_limit_is_refused_without_keeping_it(tmp_path):
    from miro.worker.fleet.intake.inputs import MAX_CUSTOM_ID

    long_id = "k" * (MAX_CUSTOM_ID + 1)
    result = parse(
        tmp_path,
        {"id": "a" * MAX_CUSTOM_ID, "prompt": "at the limit"},
        {"id": long_id, "prompt": "x"},
        {
            "custom_id": long_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "x"}]},
        },
    )
    assert [r.custom_id for r in result.requests] == ["a" * MAX_CUSTOM_ID]
    assert [(e.line, e.custom_id, e.message) for e in result.errors] == [
        (
            2,
            None,
            f"line 2: field 'id': a custom id of {MAX_CUSTOM_ID + 1:,} characters is too long (at most "
            f"{MAX_CUSTOM_ID:,}).",
        ),
        (
            3,
            None,
            f"line 3: field 'custom_id': a custom id of {MAX_CUSTOM_ID + 1:,} characters is too long (at most "
            f"{MAX_CUSTOM_ID:,}).",
        ),
    ]
    digits = parse(tmp_path, '{"id": ' + "7" * (MAX_CUSTOM_ID + 1) + ', "prompt": "x"}')  # a number's digits count
    assert [(e.custom_id, e.message.split(":")[1]) for e in digits.errors] == [(None, " field 'id'")]
