"""Errors a user can cause; the CLI prints their message as one sentence and exits non-zero."""


class MiroError(Exception):
    """A problem the user can fix: the message says what and where."""


class ModelFileError(MiroError):
    """A model file that cannot be read or is not supported."""


class RequestError(MiroError):
    """A request the engine cannot serve (bad parameters, prompt too long)."""
