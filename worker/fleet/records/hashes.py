"""Redis hashes to and from dataclasses: how the records miro keeps in Redis (batches.BatchRecord,
workers.WorkerRecord) are written and read back.

Redis holds strings. A record's field types say how to read them: int, float, str, or a list of str (written
comma separated). A field the hash lacks keeps its default (a record written before the field existed); a
field the record lacks is ignored.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import fields
from typing import Any, Mapping


def decoded(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A hash as Redis returns it (bytes, or str on a decode_responses connection) with str keys and values."""
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def field_values(cls, values: Mapping[str, str]) -> dict[str, Any]:
    """The dataclass `cls`'s fields found in `values`, each converted to its field's type."""
    return {name: _typed(hint, values[name]) for name, hint in _field_types(cls).items() if name in values}


@functools.cache
def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _typed(hint, value: str) -> Any:
    if isinstance(hint, types.UnionType):  # `int | None`: the hash holds the value only when there is one
        (hint,) = (arg for arg in hint.__args__ if arg is not type(None))
    if typing.get_origin(hint) is list:
        return [item for item in value.split(",") if item]
    return hint(value)


def hash_values(record) -> dict[str, str | int | float]:
    """The dataclass's fields of plain values (str, int, float, lists of str comma separated) as a hash
    mapping; None is left out, and so are nested values (a dict, another dataclass), which the record writes."""
    out = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, list):
            out[f.name] = ",".join(value)
        elif isinstance(value, (str, int, float)):
            out[f.name] = value
    return out
