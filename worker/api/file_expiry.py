"""OpenAI's file expiry policy, `{"anchor": "created_at", "seconds": N}`: given on upload as `expires_after` (the
SDK sends it as the form fields `expires_after[anchor]` and `expires_after[seconds]`) and on batch creation as
`output_expires_after` for the batch's result files. N runs from 3,600 (an hour) to 2,592,000 (30 days)."""

from __future__ import annotations

from miro.core.defaults import FILE_EXPIRY_RANGE_S

from miro.worker.api.errors import bad_request


def seconds(anchor: str | None, seconds_given: str | int | None, param: str) -> int | None:
    """The policy's seconds (None when no policy was given); a 400 in one sentence naming `param` if it is not one."""
    if anchor is None and seconds_given is None:
        return None
    if anchor != "created_at":
        raise bad_request(f"{param}.anchor must be 'created_at', not {anchor!r}.", param=f"{param}.anchor")
    low, high = FILE_EXPIRY_RANGE_S
    try:
        value = int(seconds_given)
    except (TypeError, ValueError):
        value = None
    if value is None or not low <= value <= high:
        raise bad_request(
            f"{param}.seconds must be a whole number of seconds from {low:,} (1 hour) to {high:,} "
            f"(30 days), not {seconds_given!r}.",
            param=f"{param}.seconds",
        )
    return value


def from_form(fields: dict[str, str]) -> int | None:
    """The upload's `expires_after`, from its form fields."""
    return seconds(fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]"), "expires_after")
