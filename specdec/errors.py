"""User-facing errors.

Anything a user can cause (unknown model, corrupt file, bad parameter) raises a
SpecdecError with a one-line message; the CLI prints it and exits non-zero
instead of showing a traceback.
"""


class SpecdecError(Exception):
    """An error caused by input or environment, reported to the user in one line."""


class UnknownModelError(SpecdecError):
    pass


class UnsupportedModelError(SpecdecError):
    pass


class CorruptModelError(SpecdecError):
    pass


class InvalidParameterError(SpecdecError):
    pass


class ContextLengthError(SpecdecError):
    pass


class PeerError(SpecdecError):
    """A program a benchmark compares against (llama.cpp) failed, or printed what we cannot read."""
