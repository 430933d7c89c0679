"""`miro serve`: the OpenAI Batch API over HTTP (worker/api), with uvicorn. Without an API key it serves this
machine only: it listens on loopback and answers only requests addressed to a loopback name (or an --allowed-host)
from no web page but its own. Keys come from --api-key (seen by anyone who can run `ps` here), --api-key-file
(env MIRO_API_KEY_FILE) or MIRO_API_KEYS."""

from __future__ import annotations

import ipaddress
import os
import socket

import click

from miro.core import defaults
from miro.core.errors import MiroError

from miro.cli.common import MiroCommand, log_to_stderr, redis_url_option


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api_keys(given: tuple[str, ...], key_file: str | None = None) -> tuple[str, ...]:
    """The keys given as options and in the key file (one a line; blank lines and # comments skipped), else those
    in MIRO_API_KEYS (comma separated)."""
    keys = list(given)
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                in_file = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        except (OSError, UnicodeDecodeError) as err:
            raise MiroError(
                f"Cannot read the API key file '{key_file}': {getattr(err, 'strerror', None) or err}."
            ) from None
        if not in_file:
            raise MiroError(f"The API key file '{key_file}' holds no key (one a line).")
        keys += in_file
    if not keys:
        keys = os.environ.get("MIRO_API_KEYS", "").split(",")
    return tuple(dict.fromkeys(key.strip() for key in keys if key.strip()))


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port or an unknown host is one sentence."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except socket.gaierror as err:
        raise MiroError(f"Cannot listen on {host}: {err.strerror}.") from None
    except OSError as err:
        raise MiroError(f"Cannot listen on {host}:{port}: {err.strerror or err}.") from None
    sock.listen(2048)
    return sock


@click.command("serve", cls=MiroCommand)
@redis_url_option()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback needs an API key.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--storage",
    default=defaults.OUTPUT,
    show_default=True,
    help="Folder or URL (s3://bucket/prefix) for uploaded files, part files and results; the workers "
    "must reach it too.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="A key clients send as 'Authorization: Bearer KEY' (repeatable; anyone here sees it in `ps`: "
    "prefer --api-key-file or env MIRO_API_KEYS, comma separated).",
)
@click.option(
    "--api-key-file",
    envvar="MIRO_API_KEY_FILE",
    type=click.Path(dir_okay=False),
    help="A file of API keys, one a line (env MIRO_API_KEY_FILE).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="With no API key, a Host name served besides localhost, 127.0.0.1 and [::1] (repeatable).",
)
@click.option(
    "--max-upload-mib",
    type=click.IntRange(min=1),
    help="The largest file POST /v1/files takes, in MiB (default 512, OpenAI's limit).",
)
@click.option(
    "--wait-for-redis",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="Seconds to keep trying to reach Redis at start-up (when it starts beside the server).",
)
def serve_command(
    redis_url, host, port, storage, api_keys, api_key_file, allowed_hosts, max_upload_mib, wait_for_redis
):
    """Serve the OpenAI Batch API (files, batches) and a live page of the fleet over HTTP."""
    import uvicorn

    from miro.worker.api import ServerConfig, create_app, limits
    from miro.worker.fleet.observe.urls import redacted
    from miro.worker.fleet.records.connection import connect

    keys = _api_keys(api_keys, api_key_file)
    if not keys and not _is_loopback(host):
        raise MiroError(
            f"Refusing to listen on {host} without an API key: give --api-key-file (or --api-key, "
            "MIRO_API_KEYS), or listen on 127.0.0.1."
        )
    conn = connect(redis_url, wait_s=wait_for_redis, log=log_to_stderr)
    app = create_app(
        ServerConfig(
            redis_url=redis_url,
            storage=storage,
            api_keys=keys,
            allowed_hosts=allowed_hosts,
            max_upload_bytes=(max_upload_mib or 0) * limits.MIB or limits.UPLOAD_BYTES,
        ),
        conn,
    )
    sock = _listen(host, port)
    address = f"http://{host}:{sock.getsockname()[1]}"
    access = (
        f"{len(keys)} API key{'s' if len(keys) != 1 else ''}"
        if keys
        else "no API key, so only this machine can reach it"
    )
    log_to_stderr(
        f"miro serve: the OpenAI Batch API at {address}/v1 and the live page at {address}/ "
        f"({access}); Redis {redacted(redis_url)}, storage {redacted(storage)}."
    )
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
