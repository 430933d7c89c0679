"""Files over HTTP with the openai SDK against a real `miro serve` and redis-server: upload, retrieve, list,
content, delete; concurrent and 200 MB uploads streamed into storage; API keys."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from serve_process import chat_line, jsonl

from miro.cli.serve import _api_keys


def test_a_file_goes_up_comes_back_and_goes_away(serve, redis_url):
    server = serve(redis_url)
    client = server.client()
    data = jsonl([chat_line(i) for i in range(3)])
    uploaded = client.files.create(file=("lines.jsonl", data), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.bytes == len(data) and uploaded.filename == "lines.jsonl"
    assert uploaded.purpose == "batch" and abs(uploaded.created_at - time.time()) < 60
    assert client.files.retrieve(uploaded.id) == uploaded
    assert client.files.content(uploaded.id).content == data
    second = client.files.create(file=("two.jsonl", data), purpose="batch")
    assert [f.id for f in client.files.list()] == [second.id, uploaded.id]  # newest first
    assert [f.id for f in client.files.list(order="asc")] == [uploaded.id, second.id]
    page = client.files.list(limit=1)
    assert [f.id for f in page.data] == [second.id] and page.has_more
    assert [f.id for f in client.files.list(after=second.id)] == [uploaded.id]
    assert list(client.files.list(purpose="batch_output")) == []

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.deleted) == (uploaded.id, True)
    with pytest.raises(openai.NotFoundError) as err:
        client.files.retrieve(uploaded.id)
    assert err.value.body == {
        "message": f"No file with id '{uploaded.id}' on this server.",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
        "request_id": err.value.request_id,
    }
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)
    assert [f.id for f in client.files.list()] == [second.id]
    (server.storage / "files" / second.id).unlink()  # storage lost the bytes the record names
    with pytest.raises(openai.NotFoundError) as err:
        client.files.content(second.id)
    assert "missing from the storage location" in err.value.body["message"]


def test_a_wrong_purpose_or_a_missing_file_is_refused_and_nothing_is_kept(serve, redis_url):
    server = serve(redis_url)
    client = server.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert err.value.body["param"] == "purpose" and "'fine-tune'" in err.value.body["message"]
    assert list(client.files.list()) == []
    assert [p.name for p in (server.storage / "files").iterdir()] == []
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/files", body={"purpose": "batch"}, cast_to=object)
    assert "multipart/form-data" in err.value.body["message"]
    broken = urllib.request.Request(
        server.url + "/v1/files",
        method="POST",
        data=b"--b\r\nno headers end",
        headers={"Content-Type": "multipart/form-data; boundary=zz"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(broken, timeout=30)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"]["message"].startswith("The upload is not valid multipart")
    assert [p.name for p in (server.storage / "files").iterdir()] == []


def test_two_uploads_at_once_each_keep_their_bytes(serve, redis_url, tmp_path):
    client = serve(redis_url).client()
    files = {}
    for name, fill in (("a.jsonl", b"a"), ("b.jsonl", b"b")):
        path = tmp_path / name
        path.write_bytes((b'{"x": "' + fill * 1000 + b'"}\n') * 8000)  # 8 MB each
        files[name] = path
    uploaded = {}

    def upload(name):
        with open(files[name], "rb") as f:
            uploaded[name] = client.files.create(file=(name, f), purpose="batch")

    threads = [threading.Thread(target=upload, args=(name,)) for name in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert uploaded["a.jsonl"].id != uploaded["b.jsonl"].id
    for name, path in files.items():
        assert uploaded[name].bytes == path.stat().st_size
        assert client.files.content(uploaded[name].id).content == path.read_bytes()


def _memory(pid: int, field: str) -> int:
    """VmRSS (resident memory now) or VmHWM (its peak so far) of a process, in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_a_200_mb_upload_streams_to_storage_without_growing_the_server(serve, redis_url, tmp_path):
    server = serve(redis_url)
    client = server.client()
    client.files.list()
    before = _memory(server.process.pid, "VmRSS")
    path = tmp_path / "big.jsonl"
    line = (json.dumps(chat_line(0, content="x" * 1000)) + "\n").encode()
    with open(path, "wb") as f:
        for _ in range(200 * 2**20 // len(line) + 1):
            f.write(line)
    started = time.monotonic()
    with open(path, "rb") as f:
        uploaded = client.files.create(file=("big.jsonl", f), purpose="batch")
    seconds = time.monotonic() - started
    growth = _memory(server.process.pid, "VmHWM") - before  # the peak during the upload, over the RSS before it
    print(f"200 MB upload: {seconds:.1f} s, server peak RSS {growth / 2**20:.1f} MiB over its RSS before")
    assert uploaded.bytes == path.stat().st_size > 200 * 2**20
    stored = server.storage / "files" / uploaded.id
    assert _sha256(stored) == _sha256(path)
    assert growth < 32 * 2**20


def test_without_a_key_the_server_says_it_serves_this_machine_only(serve, redis_url):
    server = serve(redis_url)
    assert "(no API key, so only this machine can reach it)" in server.stop()


def test_api_keys_are_checked_and_a_refusal_has_openais_shape(serve, redis_url):
    server = serve(redis_url, "--api-key", "k1", "--api-key", "k2")
    assert list(server.client("k2").files.list()) == []
    with pytest.raises(openai.AuthenticationError) as err:
        server.client("wrong").files.list()
    assert err.value.status_code == 401
    assert err.value.body == {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
        "request_id": err.value.request_id,
    }
    for path in ("/v1/files", "/v1/batches", "/v1/workers", "/v1/fleet", "/metrics"):
        status, body = server.get(path)
        assert status == 401, path
        assert json.loads(body)["error"]["code"] == "missing_api_key"
    assert server.get("/")[0] == 200  # the page holds no data; it asks for the key
    assert "(2 API keys)" in server.stop()


def test_api_keys_from_the_environment_are_comma_separated(monkeypatch):
    monkeypatch.setenv("MIRO_API_KEYS", " k1, k2,,")
    assert _api_keys(()) == ("k1", "k2")
    assert _api_keys(("given",)) == ("given",)
