"""A /v1/responses request's result row as OpenAI's Response object (openai.types.responses.Response): one
assistant message with its output_text, the usage in the Responses API's names, and what the request asked for
given back (instructions, metadata, text format, max_output_tokens, temperature, top_p).

A Responses request runs as a chat request; its row is a chat row whose `sampling` JSON also holds, under
RESPONSE_ECHO, what the Response object gives back of the request (rows.py writes it there).
"""

from __future__ import annotations

import json

from miro.core.sampling.params import SamplingParams

RESPONSE_ECHO = "response"  # the key of a Responses request's echo in its row's `sampling` JSON
_DEFAULTS = SamplingParams()


def _epoch(moment) -> int:
    return int(moment.timestamp()) if moment is not None else 0


def response_object(row: dict, logprobs: list[dict] | None = None) -> dict:
    """The Response of one finished row; `logprobs` is OpenAI's per-token list (as chat's `logprobs.content`),
    when the request asked for them."""
    options = json.loads(row["sampling"] or "{}")
    echo = options.pop(RESPONSE_ECHO, None) or {}
    cut = row["finish_reason"] == "length"
    status = "incomplete" if cut else "completed"
    text = {"type": "output_text", "text": row["output"], "annotations": []}
    if logprobs is not None:
        text["logprobs"] = logprobs
    prompt_tokens, output_tokens = row["prompt_tokens"] or 0, row["completion_tokens"] or 0
    return {
        "id": f"resp_{row['job_id']}",
        "object": "response",
        "created_at": _epoch(row["started_at"]),
        "completed_at": None if cut else _epoch(row["finished_at"]),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": echo.get("instructions"),
        "metadata": echo.get("metadata") or {},
        "model": row["model"],
        "output": [
            {"type": "message", "id": f"msg_{row['job_id']}", "status": status, "role": "assistant", "content": [text]}
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "max_output_tokens": options.get("max_tokens"),
        "temperature": options.get("temperature", _DEFAULTS.temperature),
        "top_p": options.get("top_p", _DEFAULTS.top_p),
        "text": {"format": echo.get("text_format") or {"type": "text"}},
        "truncation": "disabled",
        # cache_write_tokens counts OpenAI's paid cache writes (prompt_cache_retention): miro's prefix cache has none
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": row["cached_tokens"] or 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        },
    }
