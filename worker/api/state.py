"""What the server holds for every request: its configuration, one Redis connection and the file store."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from .file_store import FileStore


@dataclass(frozen=True)
class ServerConfig:
    redis_url: str
    storage: str  # a folder or an object-store URL (s3://bucket/prefix) the whole fleet reaches
    api_keys: tuple[str, ...] = ()  # none: anyone who reaches the server (cli/serve.py binds loopback then)


@dataclass
class ServerState:
    config: ServerConfig
    conn: redis.Redis
    store: FileStore
