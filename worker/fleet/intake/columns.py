"""Which of a dataset's columns make a request: `--prompt-column`, `--messages-column`, `--input-column` (an
embedding), or `--template "Summarise: {text}"` over columns, `--id-column`, `--chat`.

A row becomes the object a simple JSONL line would be (`InputColumns.line_object`), which inputs.parse_object then
validates exactly as it validates a line: the chosen column under `prompt`, `messages` or `input`, the id column
under `id`, a column named as one of a simple line's fields (max_tokens, temperature, seed, ...) as that field, and
every other column as the line's own field, which comes back as a column of the results. Whatever the dataset's
format, the names are checked once against its columns (`check`), so a missing or clashing column is one sentence,
not an error on every row.
"""

from __future__ import annotations

import difflib
import functools
import re
import string
from dataclasses import dataclass
from typing import Any

from miro.core.errors import MiroError

from miro.worker.fleet.intake.inputs import MAX_FIELD_NAME, LineProblem, own_field_problem
from miro.worker.fleet.intake.line_forms import SimpleLine, short_text

INPUT_FIELDS = ("prompt", "messages", "input")  # what a simple line asks for: one of them
ID_FIELDS = ("id", "custom_id")
LINE_FIELDS = frozenset(SimpleLine.model_fields)
OPENAI_FIELDS = (
    "url",
    "method",
    "body",
)  # a line with one of these is an OpenAI Batch line (inputs.parse_object)  # a column of one of these names is read as that field


@functools.lru_cache(maxsize=16)
def template_fields(template: str) -> tuple[str, ...]:
    """The column names a template's `{name}` placeholders use, in order; MiroError for anything else in braces."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise MiroError(
            f"The template {short_text(template, 60)!r} is not valid ({e}); write a column as {{name}} "
            "and a brace as {{ or }}."
        ) from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or spec or conversion or re.search(r"[.\[\]]", name):
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise MiroError(
                f"The template's placeholder {short_text(shown, 60)!r} is not a column name: write a "
                "column as {name}, nothing else inside the braces."
            )
        names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class InputColumns:
    """The column options; None everywhere is a dataset whose columns are named as a simple line's fields."""

    prompt: str | None = None  # --prompt-column: a completion prompt (a user message with chat)
    messages: str | None = None  # --messages-column: a chat (a list of {role, content})
    input: str | None = None  # --input-column: an embedding input (a text, or a list of texts or token ids)
    template: str | None = None  # --template: a prompt made of columns (a user message with chat)
    id: str | None = None  # --id-column: the custom id (else an `id` or `custom_id` column, else line-N)
    chat: bool = False  # --chat: the prompt or the filled template as one user message of the chat template

    def __post_init__(self):
        given = [
            flag
            for flag, value in (
                ("--prompt-column", self.prompt),
                ("--messages-column", self.messages),
                ("--input-column", self.input),
                ("--template", self.template),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise MiroError(f"Give one of {given[0]} and {given[1]}: a request is made of one of them.")
        if self.chat and self.prompt is None and self.template is None:
            raise MiroError("--chat wraps --prompt-column or --template as a user message: give one of them.")
        if self.template is not None:
            template_fields(self.template)  # a placeholder that is no column name is refused before any row

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.prompt, self.messages, self.input, self.template, self.id))

    def _mapped(self) -> dict[str, str]:
        """column -> the simple line's field it is read as (the chosen input and id columns)."""
        mapped = {}
        for column, target in (
            (self.prompt, "prompt"),
            (self.messages, "messages"),
            (self.input, "input"),
            (self.id, "id"),
        ):
            if column is not None:
                mapped[column] = target
        return mapped

    def check(self, columns: list[str]) -> None:
        """MiroError in one sentence if the dataset's `columns` do not fit the options: a column they name is
        missing, a column would be read twice as the request's input or id, or a column kept for the results
        clashes with a results column or looks like a misspelt field (as a JSONL line's own field would)."""
        present = set(columns)
        listed = ", ".join(short_text(c, 40) for c in columns[:12]) + (", ..." if len(columns) > 12 else "")
        for flag, column in (
            ("--prompt-column", self.prompt),
            ("--messages-column", self.messages),
            ("--input-column", self.input),
            ("--id-column", self.id),
        ):
            if column is not None and column not in present:
                raise MiroError(
                    f"The dataset has no column {short_text(column, 60)!r} ({flag}); its columns are {listed}."
                )
        for name in template_fields(self.template) if self.template is not None else ():
            if name not in present:
                guess = difflib.get_close_matches(name, columns, n=1)
                hint = f" (did you mean {guess[0]!r}?)" if guess else f"; its columns are {listed}"
                raise MiroError(
                    f"The template names the column {short_text(name, 60)!r}, which the dataset does not have{hint}."
                )
        mapped = self._mapped()
        targets = set(mapped.values()) | ({"prompt"} if self.template is not None else set())
        for column in columns:
            if column in mapped:
                continue
            if column in INPUT_FIELDS and targets & set(INPUT_FIELDS):
                raise MiroError(
                    f"The dataset has a column {column!r} besides the request's input "
                    f"({self._input_option()}): rename or drop it, so that a row asks for one thing."
                )
            if column in ID_FIELDS and "id" in targets:
                raise MiroError(
                    f"The dataset has a column {column!r} besides --id-column {self.id!r}: rename or drop "
                    "it, so that a row has one id."
                )
            if column in LINE_FIELDS:
                continue
            if len(column) > MAX_FIELD_NAME:
                raise MiroError(
                    f"The column {short_text(column, 60)!r} has a name of {len(column):,} characters, "
                    f"too long for a column of the results (at most {MAX_FIELD_NAME})."
                )
            if column in OPENAI_FIELDS:
                raise MiroError(
                    f"The dataset has a column {column!r}, which would make each row an OpenAI Batch line: rename it."
                )
            problem = own_field_problem(column)
            if problem is not None:
                raise MiroError(
                    f"The dataset's column {short_text(column, 60)!r} cannot be kept as a column of the "
                    f"results ({problem})."
                )

    def _input_option(self) -> str:
        for flag, value in (
            ("--prompt-column", self.prompt),
            ("--messages-column", self.messages),
            ("--input-column", self.input),
            ("--template", self.template),
        ):
            if value is not None:
                return f"{flag} {value!r}"
        return "none"

    def line_object(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as the object of a simple JSONL line (LineProblem for a template column that is null)."""
        mapped = self._mapped()
        obj = {mapped.get(column, column): value for column, value in row.items()}
        for column, target in mapped.items():
            if target != "id" and row.get(column) is None:
                raise LineProblem(f"column {short_text(column, 60)!r} is null, and it is the request's {target}")
        if self.template is not None:
            obj["prompt"] = self._fill(row)
        if self.chat and isinstance(obj.get("prompt"), str):
            obj["messages"] = [{"role": "user", "content": obj.pop("prompt")}]
        return obj

    def _fill(self, row: dict[str, Any]) -> str:
        values = {}
        for name in template_fields(self.template):
            value = row.get(name)
            if value is None:
                raise LineProblem(f"column {short_text(name, 60)!r} is null, and the template needs it")
            values[name] = value if isinstance(value, str) else str(value)
        return self.template.format_map(values)

    def described(self, message: str) -> str:
        """A row's problem with the fields named as the user's columns (field 'prompt' -> column 'text')."""
        for column, target in self._mapped().items():
            message = message.replace(f"field '{target}", f"column '{short_text(column, 60)}")
        if self.template is not None and not self.chat:
            message = message.replace("field 'prompt'", "the filled template")
        return message
