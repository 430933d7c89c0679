"""Options given from outside as typed config fields: each field of a config dataclass (EngineConfig, the worker's
WorkerConfig) carries its help text, the values it takes and its CLI flag, so the `miro` commands' options
(cli/common.config_options) and the MIRO_* environment variables (`from_env`) are generated from the one record."""

from __future__ import annotations

import os
from dataclasses import Field, field, fields
from typing import Mapping

from miro.core.errors import MiroError


def option(
    default,
    help: str,
    *,
    kind: type = str,
    choices: tuple[str, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    flag: str | None = None,
):
    """A config field: its default and how it is given from outside. `kind` is str, int, float, bool or tuple (a
    repeatable option; in the environment, values separated by commas); `flag` the CLI's when not `--{name}`."""
    metadata = {"help": help, "kind": kind, "choices": choices, "min": min, "max": max, "flag": flag}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def env_name(f: Field) -> str:
    return f"MIRO_{f.name.upper()}"


def from_env(config_class, environ: Mapping[str, str] | None = None) -> dict:
    """The options of `config_class` set in the environment (MIRO_{NAME}), parsed, by field name."""
    environ = os.environ if environ is None else environ
    return {f.name: parse(f, raw.strip()) for f in fields(config_class) if (raw := environ.get(env_name(f)))}


_FALSE, _TRUE = ("0", "false", "no", "off"), ("1", "true", "yes", "on")


def parse(f: Field, raw: str):
    """An environment value as the field's kind, or MiroError in one sentence naming the variable."""
    meta = f.metadata
    kind, choices, low, high = meta["kind"], meta["choices"], meta["min"], meta["max"]
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.lower() not in _FALSE + _TRUE:
            raise MiroError(f"{env_name(f)}={raw!r}: give one of {', '.join(_TRUE + _FALSE)}.")
        return raw.lower() in _TRUE
    if kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            raise MiroError(f"{env_name(f)}={raw!r}: give {'a whole number' if kind is int else 'a number'}.") from None
        if low is not None and value < low:
            raise MiroError(f"{env_name(f)}={raw!r}: give a number of at least {low}.")
        if high is not None and value > high:
            raise MiroError(f"{env_name(f)}={raw!r}: give a number of at most {high}.")
        return value
    if choices and raw not in choices:
        raise MiroError(f"{env_name(f)}={raw!r}: give one of {', '.join(choices)}.")
    return raw
