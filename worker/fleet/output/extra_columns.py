"""The columns that a batch's lines' own fields (the `extra` column, JSON) become in its merged results, decided
before the first slice is written (results.spread_extra does the spreading).

A field's column is of the type pyarrow infers from all of its values, or its values' JSON text where pyarrow
cannot hold them in one type (a number here, text there). `ExtraColumns.add` sees the batch a slice at a time
and keeps, per field, one value of each shape (`_shape`: what inference looks at), so the inference over those
few gives the type that inference over every value would.
"""

from __future__ import annotations

import json

import pyarrow as pa

_INT64 = range(-(2**63), 2**63)


def _shape(value) -> object:
    """Values of equal shape look alike to pyarrow's type inference: kind, a dict's keys in order, and down."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if value in _INT64 else "big int"  # the latter: pyarrow refuses it
    if isinstance(value, list):
        return "list", frozenset(_shape(item) for item in value)
    if isinstance(value, dict):
        return "dict", tuple((key, _shape(item)) for key, item in value.items())
    return type(value).__name__


def inferred_array(values: list) -> pa.Array:
    """The values as pyarrow infers them, or as their JSON text if it cannot hold them in one type."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return json_text(values)


def json_text(values: list) -> pa.Array:
    return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string())


class ExtraColumns:
    """The fields of a batch's lines in the order they first appear, each with its column's type."""

    def __init__(self):
        self._samples: dict[str, dict[object, object]] = {}  # field -> shape -> its first value
        self._types: dict[str, pa.DataType | None] | None = None  # None: the field's JSON text

    def add(self, values: list[dict]) -> None:
        """The next slice's lines' fields (in output order)."""
        for row in values:
            for name, value in row.items():
                if value is not None:
                    self._samples.setdefault(name, {}).setdefault(_shape(value), value)
                else:
                    self._samples.setdefault(name, {})

    @property
    def names(self) -> list[str]:
        return list(self._samples)

    def array(self, name: str, values: list) -> pa.Array:
        """A slice's values of the field as its column."""
        if self._types is None:
            self._types = {field: self._type(list(samples.values())) for field, samples in self._samples.items()}
        kind = self._types[name]
        return json_text(values) if kind is None else pa.array(values, kind)

    @staticmethod
    def _type(samples: list) -> pa.DataType | None:
        try:
            return pa.array(samples).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
