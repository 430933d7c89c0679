"""The checks a request passes before the engine queues it (core/engine/request_checks.py), without a model: the
room max_tokens=None gets is exactly what fits (the context, or the KV cache shared by n choices), and each refusal
is one sentence naming the numbers."""

from types import SimpleNamespace

import pytest

from miro.core import RequestError, SamplingParams
from miro.core.engine import request_checks
from miro.core.engine.block_manager import BlockManager


@pytest.mark.parametrize("num_blocks", [4, 7, 64])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("n_prompt", [1, 15, 16, 17, 40, 100])
@pytest.mark.parametrize("max_model_len", [64, 1000])
def test_room_for_is_the_most_that_fits(num_blocks, n, n_prompt, max_model_len):
    bm = BlockManager(num_blocks, 16)
    room = request_checks.room_for(n_prompt, n, bm, max_model_len)
    assert room >= 1

    def fits(max_tokens: int) -> bool:
        try:
            request_checks.check_fits(n_prompt, max_tokens, n, bm, max_model_len)
        except RequestError:
            return False
        return True

    if fits(1):  # a prompt with any room at all gets all of it, and not a token more
        assert fits(room) and not fits(room + 1)
    else:  # room 1, so that the request meets check_fits' error
        assert room == 1


def test_check_fits_says_what_does_not_fit():
    bm = BlockManager(4, 16)  # 64 tokens of KV cache
    with pytest.raises(RequestError, match="the prompt has 90 tokens and max_tokens is 20: together they exceed the "):
        request_checks.check_fits(90, 20, 1, bm, 100)
    with pytest.raises(RequestError, match="for each of its 3 choices: together they need 96 tokens of KV cache"):
        request_checks.check_fits(10, 20, 3, bm, 100)


def test_prompt_ids_and_token_ids_are_the_models():
    assert request_checks.prompt_ids([3, 0, 9], None, 10) == [3, 0, 9]
    with pytest.raises(RequestError, match="empty"):
        request_checks.prompt_ids([], None, 10)
    for bad in ([10], [-1]):
        with pytest.raises(RequestError, match=r"outside the vocabulary \(0..9\)"):
            request_checks.prompt_ids(bad, None, 10)
    request_checks.check_token_ids(SamplingParams(stop_token_ids=[9]), 10)
    with pytest.raises(RequestError, match=r"stop_token_ids has 10, outside the model's vocabulary \(0..9\)"):
        request_checks.check_token_ids(SamplingParams(stop_token_ids=[12, 10]), 10)


def test_task_refusal_names_the_model():
    config = SimpleNamespace(architecture="llama")
    assert request_checks.task_refusal("generate", ("generate",), config, "m") is None
    assert request_checks.task_refusal("embed", ("generate",), config, "m").startswith(
        "model 'm' cannot embed: it generates text, and its file names no pooling type (llama.pooling_type)"
    )
    assert request_checks.task_refusal("generate", ("embed",), config, "").startswith("the model is an embedding model")
