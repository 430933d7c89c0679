"""JobPayload: the job's kwargs as written by submit and read by the workers."""

import pytest

from miro.core.errors import MiroError
from miro.worker.fleet.records.payload import JobPayload


def test_round_trip_leaves_out_what_is_not_set():
    payload = JobPayload(
        batch_id="b",
        custom_id="q1",
        kind="chat",
        model="smollm2-135m",
        sampling={"max_tokens": None, "temperature": 0.0},
        messages=[{"role": "user", "content": "hi"}],
        line=3,
        extra={"category": "math"},
    )
    kwargs = payload.to_kwargs()
    assert "prompt" not in kwargs and "requested_model" not in kwargs
    assert JobPayload.from_kwargs(kwargs) == payload
    assert payload.sampling_params().max_tokens is None and payload.sampling_params().temperature == 0.0


def test_payloads_of_earlier_versions_still_read():
    """Before the dataclass, payloads carried form and url (read by nobody) and no line or extra."""
    old = {
        "batch_id": "b",
        "custom_id": "q1",
        "kind": "completion",
        "prompt": "hi",
        "sampling": {},
        "model": "m",
        "requested_model": None,
        "form": "simple",
        "url": None,
    }
    payload = JobPayload.from_kwargs(old)
    assert (payload.prompt, payload.line, payload.extra, payload.requested_model) == ("hi", None, None, None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x": 1}, "the job's payload lacks batch_id, custom_id, kind, model: it was not enqueued by miro submit"),
        (
            {"batch_id": "b", "custom_id": "q", "kind": "chat", "model": "m", "prompt": "p"},
            "the job's payload for 'q' is neither a chat, a completion, a Responses nor an embedding request",
        ),
    ],
)
def test_a_payload_miro_did_not_write_is_one_sentence(kwargs, message):
    with pytest.raises(MiroError) as err:
        JobPayload.from_kwargs(kwargs)
    assert str(err.value) == message
