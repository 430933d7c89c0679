"""Durations as people write them: "24h" (OpenAI's completion window), "30m", "90s", "2d", or plain seconds."""

from __future__ import annotations

import re

from miro.core.errors import MiroError

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> int | None:
    """The duration in seconds; None if `text` is not a whole number with an optional unit s, m, h or d."""
    match = re.fullmatch(r"(\d+)\s*([smhd]?)", str(text).strip().lower())
    return int(match[1]) * UNITS[match[2]] if match else None


def completion_window(text: str) -> int:
    """A batch's completion window in seconds; MiroError in one sentence if it is not a positive duration."""
    value = seconds(text)
    if not value:
        raise MiroError(f"The completion window '{text}' is not valid: give a duration such as 24h (OpenAI's), "
                        "30m, 90s or 2d.")
    return value
