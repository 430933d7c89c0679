"""Deploy pieces: `miro redis`, the Procfile under honcho, the compose file, the Kubernetes manifests, the systemd units."""

import configparser
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml

from polling import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
SHUTDOWN_GRACE_S = 30  # miro worker's default --shutdown-grace


@pytest.fixture
def miro_redis(tmp_path):
    """Start `miro redis --port <free> --dir <tmp>/data [args]`; yields (process, port, data dir)."""
    procs = []

    def start(*args):
        port = free_port()
        data = tmp_path / "data"
        proc = subprocess.Popen(
            [BIN / "miro", "redis", "--port", str(port), "--dir", str(data), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc, port, data

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_miro_redis_keeps_an_append_only_file_and_stops_cleanly_on_sigterm(miro_redis):
    proc, port, data = miro_redis()
    client = redis.Redis(port=port, socket_connect_timeout=1)
    assert wait_for(client.ping, 10), "timed out waiting for miro redis to answer PING"
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert client.config_get("dir") == {"dir": str(data)}

    client.set("deploy-test-key", "kept")
    # Redis 6 writes appendonly.aof, Redis 7 files under appendonlydir/.
    assert wait_for(
        lambda: any(b"deploy-test-key" in f.read_bytes() for f in data.rglob("appendonly*") if f.is_file()), 3
    ), "the key never reached the append-only file"
    client.close()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert "use --redis-url redis://127.0.0.1:" in proc.stderr.read()


def test_miro_redis_password_is_required(miro_redis):
    proc, port, _ = miro_redis("--password", "s3cret")
    authed = redis.Redis(port=port, password="s3cret", socket_connect_timeout=1)
    assert wait_for(authed.ping, 10), "timed out waiting for miro redis to answer PING"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:  # redis-py would retry for seconds
        plain.sendall(b"PING\r\n")
        assert plain.recv(100).startswith(b"-NOAUTH")
    wrong, needed = (
        f"Error: Redis at redis://:***@127.0.0.1:{port}/0 refused the credentials: the password (or user) is wrong.",
        f"Error: Redis at redis://127.0.0.1:{port}/0 refused the credentials: it needs "
        "a password, given in the URL as redis://:PASSWORD@host:port/db.",
    )
    for url, said in ((f"redis://:hunter2@127.0.0.1:{port}/0", wrong), (f"redis://127.0.0.1:{port}/0", needed)):
        status = subprocess.run(
            [BIN / "miro", "status", "--redis-url", url], capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 1 and status.stderr.strip() == said
    authed.close()
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    stderr = proc.stderr.read()
    assert "redis://:***@127.0.0.1:" in stderr and "s3cret" not in stderr


def _miro_redis_error(*args) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [BIN / "miro", "redis", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "MIRO_REDIS_PASSWORD": ""},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done


def test_miro_redis_port_in_use_is_one_sentence(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _miro_redis_error("--port", str(port), "--dir", str(tmp_path))
    assert (
        done.stderr == f"Error: Port {port} on 127.0.0.1 is already in use; stop what runs there or pick another "
        "with --port.\n"
    )


def test_miro_redis_unusable_dir_and_open_bind_without_password_are_one_sentence(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    done = _miro_redis_error("--port", str(free_port()), "--dir", str(not_a_dir / "data"))
    assert done.stderr.startswith(f"Error: Cannot use {not_a_dir / 'data'} as the Redis data folder")
    done = _miro_redis_error("--bind", "0.0.0.0", "--dir", str(tmp_path))
    assert "--password" in done.stderr


def test_procfile_passes_honcho_check():
    done = subprocess.run(
        [BIN / "honcho", "-f", "Procfile", "check"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "(redis, worker, serve)" in done.stderr


@pytest.mark.slow
def test_honcho_start_runs_redis_and_a_worker_and_stops_on_sigterm(smollm2_path, tmp_path):
    import rq

    port = free_port()
    env = {
        **os.environ,
        "REDIS_PORT": str(port),
        "SERVE_PORT": str(free_port()),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    # Run in tmp_path so that miro redis's ./miro-redis lands there, not in the repo.
    log = tmp_path / "honcho.log"
    with open(log, "wb") as out:
        honcho = subprocess.Popen(
            [BIN / "honcho", "-f", ROOT / "Procfile", "start"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        client = redis.Redis(port=port, socket_connect_timeout=1)
        assert wait_for(client.ping, 20), "timed out waiting for Redis under honcho"
        assert wait_for(lambda: rq.Worker.all(connection=client), 60), (
            "timed out waiting for a miro worker registered in Redis"
        )
        assert (tmp_path / "miro-redis" / "miro-redis.conf").exists()
        assert wait_for(lambda: _answers(f"http://127.0.0.1:{env['SERVE_PORT']}/v1/batches"), 30), (
            "timed out waiting for miro serve under honcho"
        )
        client.close()
        honcho.send_signal(signal.SIGTERM)
        honcho.wait(timeout=40)
        assert b"SIGKILL" not in log.read_bytes()  # every process ended on SIGTERM, before honcho's 5 s ran out
        # Everything honcho started is gone, Redis included: the port is free again.
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
    finally:
        try:
            os.killpg(honcho.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        honcho.wait()
        print(log.read_text())  # shown when the test fails


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def _compose_command():
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) and subprocess.run([*command, "version"], capture_output=True).returncode == 0:
            return command
    return None


def test_docker_compose_file():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    redis_service, worker = services["redis"], services["worker"]
    assert "--appendonly" in redis_service["command"] and "yes" in redis_service["command"]
    assert any(v.endswith(":/data") for v in redis_service["volumes"])
    assert "redis-cli" in redis_service["healthcheck"]["test"]

    assert worker["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert (DEPLOY / "Dockerfile").exists()
    assert worker["environment"]["MIRO_REDIS_URL"] == "redis://redis:6379/0"
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "results:/results" in worker["volumes"] and "results" in compose["volumes"]
    # Scalable with --scale: no fixed name, no host ports.
    assert "container_name" not in worker and "ports" not in worker
    assert int(worker["stop_grace_period"].removesuffix("s")) > SHUTDOWN_GRACE_S
    assert_worker_command_parses(worker["command"])


def test_docker_compose_serve_service():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    serve = compose["services"]["serve"]
    assert serve["build"] == compose["services"]["worker"]["build"]
    assert serve["environment"]["MIRO_REDIS_URL"] == "redis://redis:6379/0" and "MIRO_API_KEYS" in serve["environment"]
    assert "results:/results" in serve["volumes"] and serve["ports"] == ["8000:8000"]
    command = serve["command"]
    assert command[command.index("--storage") + 1] == "/results" and command[command.index("--port") + 1] == "8000"
    assert_serve_command_parses(command)


def test_docker_compose_config_accepts_the_file():
    command = _compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    done = subprocess.run(
        [*command, "-f", DEPLOY / "docker-compose.yml", "config", "--quiet"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_kubernetes_manifests():
    redis_docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "redis.yaml").read_text()))
    worker_docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "worker.yaml").read_text()))
    by_kind = {}
    for doc in redis_docs + worker_docs:
        by_kind.setdefault(doc["kind"], []).append(doc)

    service = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "redis")
    redis_deployment = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "redis")
    assert "--appendonly" in redis_deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    claims = {c["metadata"]["name"]: c for c in by_kind["PersistentVolumeClaim"]}
    assert redis_deployment["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] in claims

    worker = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "miro-worker")
    pod = worker["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > SHUTDOWN_GRACE_S
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MIRO_REDIS_URL"] == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    results_claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claims[results_claim]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {"name": pod["volumes"][0]["name"], "mountPath": "/results"} in container["volumeMounts"]
    # metrics: the port the worker serves is the one declared and annotated for Prometheus
    command = container["command"]
    port = command[command.index("--metrics-port") + 1]
    assert {"name": "metrics", "containerPort": int(port)} in container["ports"]
    assert worker["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == port
    assert_worker_command_parses(command)


def test_kubernetes_serve_manifest():
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "k8s" / "serve.yaml").read_text())}
    worker = next(
        d for d in yaml.safe_load_all((DEPLOY / "k8s" / "worker.yaml").read_text()) if d["kind"] == "Deployment"
    )
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MIRO_REDIS_URL"]["value"] == worker["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]
    assert env["MIRO_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "miro-api-keys"
    # the same results volume as the workers, mounted where --storage points
    assert pod["volumes"] == worker["spec"]["template"]["spec"]["volumes"]
    command = container["command"]
    assert {"name": "results", "mountPath": command[command.index("--storage") + 1]} in container["volumeMounts"]
    port = int(command[command.index("--port") + 1])
    assert {"name": "http", "containerPort": port} in container["ports"]
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert_serve_command_parses(command)


def assert_serve_command_parses(command: list[str]) -> None:
    """The deploy file's `miro serve ...` is one the CLI accepts (parsed, not run)."""
    from miro.cli.serve import serve_command

    assert command[:2] == ["miro", "serve"]
    serve_command.make_context("serve", list(command[2:]))


def assert_worker_command_parses(command: list[str]) -> None:
    """The deploy file's `miro worker ...` is one the CLI accepts (parsed, not run)."""
    from miro.cli.worker import worker_command as worker

    assert command[:2] == ["miro", "worker"]
    worker.make_context("worker", list(command[2:]))


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(path)
    return parser


@pytest.mark.parametrize("name", ["miro-worker@.service", "miro-redis.service"])
def test_systemd_units(name, tmp_path):
    unit = DEPLOY / "systemd" / name
    service = _unit(unit)["Service"]
    assert service["ExecStart"].startswith("/opt/miro/venv/bin/miro ")
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert int(service["TimeoutStopSec"]) > SHUTDOWN_GRACE_S
    assert service["User"] == "miro"
    if shutil.which("systemd-analyze") is None:
        return
    # verify insists that ExecStart exists: point it at this venv's miro in a copy.
    copy = tmp_path / name
    copy.write_text(unit.read_text().replace("/opt/miro/venv/bin/miro", str(BIN / "miro")))
    done = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_systemd_worker_env_example_sets_the_redis_url():
    lines = (DEPLOY / "systemd" / "worker.env.example").read_text().splitlines()
    keys = {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}
    assert {"MIRO_REDIS_URL", "MIRO_HOME", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"} <= keys
