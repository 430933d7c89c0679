"""The cases benchmarks/grammar_engines.py runs every engine on: the constraints (each with a text that follows
it) and the JSON Schema coverage table (each feature with a valid and an invalid instance)."""

from __future__ import annotations

import json

from grammar_adapters import Constraint

# ---------------------------------------------------------------- constraints

FLAT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "member": {"type": "boolean"},
        "tier": {"enum": ["free", "pro", "team"]},
    },
    "required": ["name", "age", "height", "member", "tier"],
}
NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                    "color": {"enum": ["red", "green", "blue"]},
                },
                "required": ["sku", "qty", "price", "color"],
                "additionalProperties": False,
            },
        },
        "status": {"enum": ["open", "paid", "shipped"]},
    },
    "required": ["order_id", "items", "status"],
    "additionalProperties": False,
}
DATE_REGEX = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
CHOICES = ["positive", "negative", "neutral"]
SQL_LARK = r"""
start: "SELECT " cols " FROM " NAME (" WHERE " cond)? ";"
cols: NAME (", " NAME)*
cond: NAME OP NUMBER
OP: " > " | " < " | " = "
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /[0-9]+/
"""
SQL_GBNF = r"""
root ::= "SELECT " cols " FROM " name (" WHERE " cond)? ";"
cols ::= name (", " name)*
cond ::= name (" > " | " < " | " = ") number
name ::= [a-z_] [a-z0-9_]*
number ::= [0-9]+
"""


CONSTRAINTS = [
    Constraint(
        "flat schema",
        "json_schema",
        FLAT_SCHEMA,
        json.dumps(
            {"name": "Zoë Müller", "age": 42, "height": 1.68, "member": True, "tier": "pro"}, ensure_ascii=False
        ),
    ),
    Constraint(
        "nested schema",
        "json_schema",
        NESTED_SCHEMA,
        json.dumps(
            {
                "order_id": "A-1001",
                "items": [
                    {"sku": "tea-ø1", "qty": 2, "price": 3.5, "color": "green"},
                    {"sku": "mug", "qty": 1, "price": 12.0, "color": "blue"},
                ],
                "status": "paid",
            },
            ensure_ascii=False,
        ),
    ),
    Constraint(
        "any JSON object",
        "json_schema",
        {"type": "object"},
        json.dumps(
            {"id": 7, "tags": ["a", "b"], "meta": {"ok": False, "score": None, "note": "café"}}, ensure_ascii=False
        ),
    ),
    Constraint("date regex", "regex", DATE_REGEX, "2024-03-15"),
    Constraint("choice of 3", "choice", CHOICES, "neutral"),
    Constraint("Lark grammar", "grammar", {"lark": SQL_LARK}, "SELECT name, age FROM users WHERE age > 30;"),
    Constraint("GBNF grammar", "grammar", {"gbnf": SQL_GBNF}, "SELECT name, age FROM users WHERE age > 30;"),
]


# ---------------------------------------------------------------- JSON Schema coverage


def obj(props: dict, **extra) -> dict:
    return {"type": "object", "properties": props, "required": list(props), **extra}


# (feature, schema, a valid instance, an invalid instance); instances follow the schema's property order
COVERAGE = [
    (
        "$ref/$defs",
        {"$defs": {"pt": obj({"x": {"type": "integer"}})}, **obj({"p": {"$ref": "#/$defs/pt"}})},
        {"p": {"x": 1}},
        {"p": {"x": "1"}},
    ),
    (
        "recursive $ref",
        {
            "$defs": {
                "node": obj({"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}})
            },
            "$ref": "#/$defs/node",
        },
        {"v": 1, "kids": [{"v": 2, "kids": []}]},
        {"v": 1, "kids": [{"v": "2", "kids": []}]},
    ),
    ("anyOf", obj({"v": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}), {"v": "a"}, {"v": True}),
    ("oneOf", obj({"v": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}}), {"v": True}, {"v": "a"}),
    ("allOf", {"allOf": [obj({"a": {"type": "integer"}}), {"properties": {"a": {"minimum": 5}}}]}, {"a": 7}, {"a": 3}),
    ("enum (mixed)", obj({"v": {"enum": ["a", 1, None]}}), {"v": 1}, {"v": "b"}),
    ("const", obj({"v": {"const": "fixed"}}), {"v": "fixed"}, {"v": "other"}),
    (
        "minLength/maxLength",
        obj({"v": {"type": "string", "minLength": 2, "maxLength": 4}}),
        {"v": "abc"},
        {"v": "abcdef"},
    ),
    ("pattern", obj({"v": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}), {"v": "ABC-12"}, {"v": "ab-12"}),
    ("minimum/maximum", obj({"v": {"type": "integer", "minimum": 10, "maximum": 20}}), {"v": 15}, {"v": 25}),
    ("exclusiveMinimum", obj({"v": {"type": "number", "exclusiveMinimum": 0}}), {"v": 0.5}, {"v": -1}),
    (
        "minItems/maxItems",
        obj({"v": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}}),
        {"v": [1, 2]},
        {"v": [1, 2, 3]},
    ),
    (
        "format: date-time",
        obj({"v": {"type": "string", "format": "date-time"}}),
        {"v": "2024-03-15T10:20:30Z"},
        {"v": "yesterday"},
    ),
    (
        "additionalProperties: false",
        obj({"a": {"type": "integer"}}, additionalProperties=False),
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    (
        "additionalProperties: schema",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"x": 1, "y": 2},
        {"x": "1"},
    ),
    ("extra property, no keyword", obj({"a": {"type": "integer"}}), {"a": 1, "b": 2}, {"a": "1"}),
    (
        "nested arrays",
        obj({"m": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}),
        {"m": [[1, 2.5], []]},
        {"m": [1, 2]},
    ),
    ("type: [..] union", obj({"v": {"type": ["string", "null"]}}), {"v": None}, {"v": 3}),
    (
        "optional property omitted",
        {**obj({"a": {"type": "integer"}, "b": {"type": "integer"}}), "required": ["a"]},
        {"a": 1},
        {"b": 2},
    ),
    ("free-form object, 5 deep", {"type": "object"}, {"a": {"b": {"c": {"d": {"e": 1}}}}}, [1, 2]),
    (
        "uniqueItems",
        obj({"v": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}),
        {"v": [1, 2]},
        {"v": [1, 1]},
    ),
]
