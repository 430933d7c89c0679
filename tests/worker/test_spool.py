"""A batch's stored requests: every kind of request comes back from its chunk file as it went in, in order."""

from miro.worker.fleet.intake import spool
from miro.worker.fleet.records.payload import Request, ResponseEcho


def requests() -> list[Request]:
    return [
        Request(
            custom_id="c1",
            line=1,
            kind="chat",
            prompt=None,
            messages=[{"role": "user", "content": "hi é 😀"}],
            sampling={"max_tokens": 4, "stop": ["\n"], "temperature": 0.5},
            requested_model="m",
            form="openai",
            url="/v1/chat/completions",
        ),
        Request(
            custom_id="p2",
            line=2,
            kind="completion",
            prompt="once",
            messages=None,
            sampling={"max_tokens": None},
            requested_model=None,
            form="simple",
            url=None,
            extra={"category": "math", "score": 3},
        ),
        Request(
            custom_id="r3",
            line=4,
            kind="response",
            prompt=None,
            messages=[{"role": "system", "content": "x"}],
            sampling={},
            requested_model=None,
            form="openai",
            url="/v1/responses",
            response=ResponseEcho(instructions="be brief", metadata={"team": "a"}, text_format=None),
        ),
        Request(
            custom_id="e4",
            line=5,
            kind="embedding",
            prompt=None,
            messages=None,
            sampling={},
            requested_model=None,
            form="openai",
            url="/v1/embeddings",
            inputs=[[1, 2, 3], [4]],
            pooling={"normalize": False},
            encoding_format="base64",
        ),
    ]


def test_chunks_hold_every_kind_of_request_in_order(tmp_path):
    writer = spool.SpoolWriter(str(tmp_path), "batch_x", chunk_size=3)
    for request in requests():
        writer.add(request)
    assert writer.close() == 2 and writer.requests == 4
    assert spool.read_chunk(str(tmp_path), "batch_x", 0) + spool.read_chunk(str(tmp_path), "batch_x", 1) == requests()
    assert list(spool.requests_from(str(tmp_path), "batch_x", 1, 2)) == requests()[3:]
    spool.remove(str(tmp_path), "batch_x")
    assert not (tmp_path / "batch_x" / "_requests").exists()
