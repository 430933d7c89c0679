"""Errors a user can cause; the CLI prints their message as one sentence and exits non-zero."""


class MiroError(Exception):
    """A problem the user can fix: the message says what and where."""


class ModelFileError(MiroError):
    """A model file that cannot be read or is not supported."""


class RequestError(MiroError):
    """A request the engine cannot serve (bad parameters, prompt too long)."""


class LLMError(MiroError, ValueError):
    """An option, field or input the vLLM-compatible API (llm.py) refuses: a ValueError, as vLLM raises, and a
    MiroError (the CLI's one-sentence errors)."""


FAULT_MESSAGE_CHARS = 300  # what went wrong in a request's fault, as its error says it, is cut to this


def request_fault(stage: str, exc: BaseException) -> str:
    """A request's own fault in an engine step, as that request's error in one sentence: the stage, and what went
    wrong (a MiroError's own sentence; otherwise the exception's type and the first line of its message)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = lines[0].rstrip(".") if lines else ""
    what = (
        message
        if isinstance(exc, MiroError) and message
        else (f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    )
    if len(what) > FAULT_MESSAGE_CHARS:
        what = what[: FAULT_MESSAGE_CHARS - 3] + "..."
    return f"the engine failed on this request while {stage}: {what}."
