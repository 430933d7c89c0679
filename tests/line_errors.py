"""Dataset lines the intake refuses, each with the one sentence it must give (test_input_errors.py): malformed JSON,
wrong shapes and types, fields out of range or unsupported, in both the plain and the OpenAI Batch line formats."""

from input_lines import CHAT, COMPLETIONS, openai

LINE_ERRORS = [
    # malformed JSON and not-objects
    ('{"id": "q1" "prompt": "x"}', "line 1: not valid JSON (Expecting ',' delimiter at column 13)."),
    (
        '{"id": "q1", "prompt": "x",}',
        "line 1: not valid JSON (Expecting property name enclosed in double quotes at column 28).",
    ),
    ("[1, 2]", "line 1: expected a JSON object, got an array."),
    ('"just text"', "line 1: expected a JSON object, got a string."),
    ("42", "line 1: expected a JSON object, got a number."),
    ("null", "line 1: expected a JSON object, got null."),
    ("true", "line 1: expected a JSON object, got true or false."),
    ('{"prompt": "a", "prompt": "b"}', "line 1: key 'prompt' appears twice in one JSON object."),
    ("[" * 100_000, "line 1: not valid JSON (a number is too long or the nesting too deep)."),
    (
        '{"prompt": "a", "seed": ' + "9" * 5000 + "}",
        "line 1: not valid JSON (a number is too long or the nesting too deep).",
    ),
    # simple form: prompt / messages
    ({"id": "q1"}, "line 1: the line needs a 'prompt', 'messages' or 'input' field."),
    ({"id": "q1", "prompt": None}, "line 1: the line needs a 'prompt', 'messages' or 'input' field."),
    (
        {"id": "q1", "prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        "line 1: the line has both 'prompt' and 'messages', give only one.",
    ),
    ({"id": "a", "custom_id": "b", "prompt": "x"}, "line 1: give the id as 'id' or as 'custom_id', not both."),
    # simple form: wrong types
    (
        {"messages": [{"role": "user", "content": 5}]},
        "line 1: field 'messages.0.content': Input should be a valid string.",
    ),
    (
        {"messages": [{"role": "tool", "content": "x"}]},
        "line 1: field 'messages.0.role': Input should be 'system', 'developer', 'user' or 'assistant'.",
    ),
    ({"messages": [{"content": "x"}]}, "line 1: field 'messages.0.role': Field required."),
    ({"messages": "hello"}, "line 1: field 'messages': Input should be a valid list."),
    ({"messages": []}, "line 1: field 'messages': List should have at least 1 item after validation, not 0."),
    ({"prompt": 5}, "line 1: field 'prompt': Input should be a valid string."),
    ({"prompt": ""}, "line 1: field 'prompt': String should have at least 1 character."),
    ({"id": True, "prompt": "x"}, "line 1: field 'id': Input should be a valid string."),
    ({"id": "", "prompt": "x"}, "line 1: field 'id': String should have at least 1 character."),
    ({"prompt": "x", "max_tokens": "100"}, "line 1: field 'max_tokens': Input should be a valid integer."),
    ({"prompt": "x", "max_tokens": 1.5}, "line 1: field 'max_tokens': Input should be a valid integer."),
    ({"prompt": "x", "max_tokens": True}, "line 1: field 'max_tokens': Input should be a valid integer."),
    ({"prompt": "x", "temperature": "hot"}, "line 1: field 'temperature': Input should be a valid number."),
    ('{"prompt": "x", "temperature": NaN}', "line 1: not valid JSON (NaN is not a JSON number)."),
    ('{"prompt": "x", "top_p": Infinity}', "line 1: not valid JSON (Infinity is not a JSON number)."),
    # anywhere in the line, even in fields miro does not read (OpenAI's API refuses them too)
    (
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "metadata": {"k": NaN}}}',
        "line 1: not valid JSON (NaN is not a JSON number).",
    ),
    (
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "user": -Infinity}}',
        "line 1: not valid JSON (-Infinity is not a JSON number).",
    ),
    (
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", '
        '"logit_bias": {"5": Infinity}}}',
        "line 1: not valid JSON (Infinity is not a JSON number).",
    ),
    ({"prompt": "x", "ignore_eos": 1}, "line 1: field 'ignore_eos': Input should be a valid boolean."),
    ({"prompt": "x", "stop": 5}, "line 1: field 'stop': Input should be a string or a list of strings."),
    ({"prompt": "x", "stop": ["a", 5]}, "line 1: field 'stop.1': Input should be a valid string."),
    (
        {"prompt": "x", "stop_token_ids": [-1]},
        "line 1: field 'stop_token_ids.0': Input should be greater than or equal to 0.",
    ),
    ({"prompt": "x", "seed": -1}, "line 1: field 'seed': Input should be greater than or equal to 0."),
    ({"prompt": "x", "logprobs": True}, "line 1: field 'logprobs': Input should be a valid integer."),
    # simple form: unknown fields are errors, with a hint for typos
    ({"prompt": "x", "temprature": 0.5}, "line 1: field 'temprature': unknown field (did you mean 'temperature'?)."),
    ({"prompt": "x", "temprature": 0.5}, "line 1: field 'temprature': unknown field (did you mean 'temperature'?)."),
    ({"prompt": "x", "output": "y"}, "line 1: field 'output': the results have a column of that name, rename it."),
    (
        {"prompt": "x", "model": "m"},
        "line 1: field 'model': a simple line cannot choose its model: give --model, or use OpenAI lines (body.model).",
    ),
    # sampling values out of range: SamplingParams' own sentence
    (
        {"prompt": "x", "max_tokens": 0},
        "line 1: max_tokens must be from 1 to 4,194,304 (longer than any supported context), got 0.",
    ),
    ({"prompt": "x", "temperature": -1}, "line 1: temperature must be >= 0, got -1.0."),
    ({"prompt": "x", "top_p": 0}, "line 1: top_p must be in (0, 1], got 0.0."),
    ({"prompt": "x", "top_p": 1.5}, "line 1: top_p must be in (0, 1], got 1.5."),
    ({"prompt": "x", "top_k": -2}, "line 1: top_k must be -1, 0 (off) or a positive integer, got -2."),
    ({"prompt": "x", "min_p": 2}, "line 1: min_p must be in [0, 1], got 2.0."),
    ({"prompt": "x", "n": 0}, "line 1: n must be an integer from 1 to 128, got 0."),
    ({"prompt": "x", "n": 1000000}, "line 1: n must be an integer from 1 to 128, got 1000000."),
    (
        {"prompt": "x", "max_tokens": 10**25},
        "line 1: max_tokens must be from 1 to 4,194,304 (longer than any supported context), got "
        "10000000000000000000000000.",
    ),
    ({"prompt": "x", "repetition_penalty": 0}, "line 1: repetition_penalty must be > 0, got 0.0."),
    ({"prompt": "x", "presence_penalty": 3}, "line 1: presence_penalty and frequency_penalty must be in [-2, 2]."),
    ({"prompt": "x", "logprobs": 21}, "line 1: logprobs must be between 0 and 20, got 21."),
    ({"prompt": "x", "stop": [""]}, "line 1: stop strings must not be empty."),
    (
        {"prompt": "x", "min_tokens": 20, "max_tokens": 10},
        "line 1: min_tokens must be between 0 and max_tokens (10), got 20.",
    ),
    # OpenAI form: envelope
    (
        {**openai(), "url": "/v1/moderations"},
        "line 1: field 'url': Input should be '/v1/chat/completions', '/v1/completions', '/v1/embeddings' or "
        "'/v1/responses'.",
    ),
    ({**openai(), "method": "GET"}, "line 1: field 'method': Input should be 'POST'."),
    ({"custom_id": "c1", "method": "POST", "url": CHAT}, "line 1: field 'body': Field required."),
    (
        {"custom_id": "c1", "method": "POST", "url": CHAT, "body": "hi"},
        "line 1: field 'body': Input should be a valid dictionary.",
    ),
    (
        {"method": "POST", "url": CHAT, "body": {"messages": [{"role": "user", "content": "x"}]}},
        "line 1: field 'custom_id': Field required.",
    ),
    (
        {"custom_id": 5, "method": "POST", "url": COMPLETIONS, "body": {"prompt": "x"}},
        "line 1: field 'custom_id': Input should be a valid string.",
    ),
    ({**openai(), "extra": 1}, "line 1: field 'extra': unknown field."),
    ({**openai(), "bodi": {}}, "line 1: field 'bodi': unknown field (did you mean 'body'?)."),
    # OpenAI form: bodies
    (openai(url=CHAT, prompt="x"), "line 1: field 'body.messages': Field required."),
    (
        openai(url=COMPLETIONS, messages=[{"role": "user", "content": "x"}]),
        "line 1: field 'body.prompt': Field required.",
    ),
    (
        openai(url=COMPLETIONS, prompt=["a", "b"]),
        "line 1: field 'body.prompt': arrays of prompts are not supported, put each prompt on its own line.",
    ),
    (
        openai(url=COMPLETIONS, prompt=[1, 2, 3]),
        "line 1: field 'body.prompt': arrays of prompts are not supported, put each prompt on its own line.",
    ),
    (
        openai(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
        "line 1: field 'body.messages.0.content': content parts of type 'image_url' are not supported (text only).",
    ),
    (
        openai(messages=[{"role": "user", "content": []}]),
        "line 1: field 'body.messages.0.content': a list of content parts must not be empty.",
    ),
    (
        openai(tools=[{"type": "function"}]),
        "line 1: field 'body': 'tools' is not supported by miro yet, and ignoring "
        "it would change the answer: remove it or set it to null.",
    ),
    (openai(top_logprobs=2), "line 1: field 'body.top_logprobs': needs 'logprobs' set to true."),
    (openai(logprobs=3), "line 1: field 'body.logprobs': Input should be a valid boolean."),
    (openai(url=COMPLETIONS, logprobs=True), "line 1: field 'body.logprobs': Input should be a valid integer."),
    (
        openai(max_tokens=5, max_completion_tokens=6),
        "line 1: field 'body.max_completion_tokens': differs from 'body.max_tokens', give only one.",
    ),
    (
        openai(max_completion_tokens=0),
        "line 1: max_tokens must be from 1 to 4,194,304 (longer than any supported context), got 0.",
    ),
    (openai(temperature=-0.5), "line 1: temperature must be >= 0, got -0.5."),
    (openai(model=3), "line 1: field 'body.model': Input should be a valid string."),
]
