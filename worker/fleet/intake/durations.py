"""Durations as people write them: "24h" (OpenAI's completion window), "30m", "90s", "2d", or plain seconds; and a
job timeout (the same, or -1 for none)."""

from __future__ import annotations

import re

from miro.core import defaults
from miro.core.errors import MiroError

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 366 * 86400  # the longest completion window (a deadline a year out is as good as none)


def seconds(text: str) -> int | None:
    """The duration in seconds; None if `text` is not a whole number (of at most 12 digits) with an optional unit s,
    m, h or d."""
    match = re.fullmatch(r"(\d{1,12})\s*([smhd]?)", str(text).strip().lower())
    return int(match[1]) * UNITS[match[2]] if match else None


def completion_window(text: str) -> int:
    """A batch's completion window in seconds; MiroError in one sentence if it is not a positive duration."""
    value = seconds(text)
    shown = str(text) if len(str(text)) <= 40 else f"{str(text)[:20]}...{str(text)[-8:]}"
    if not value:
        raise MiroError(
            f"The completion window '{shown}' is not valid: give a duration such as 24h (OpenAI's), 30m, 90s or 2d."
        )
    if value > MAX_WINDOW_S:
        raise MiroError(f"The completion window '{shown}' is longer than the {MAX_WINDOW_S // 86400} days miro allows.")
    return value


def job_timeout(value: int | str | None) -> int:
    """A job's timeout in seconds (RQ's job_timeout; -1: none); the default for None; MiroError in one sentence if
    it is not a positive duration or -1."""
    if value is None:
        return defaults.JOB_TIMEOUT_S
    text = str(value).strip().lower()
    match = re.fullmatch(r"(-1|\d+)([smhd]?)", text)
    timeout_s = int(match[1]) * UNITS[match[2]] if match else 0
    if not match or timeout_s == 0 or (timeout_s == -1 and match[2]):
        raise MiroError(f"The job timeout '{value}' is not valid: give seconds (3600), or 30m, 2h, 1d, or -1 for none.")
    return timeout_s
