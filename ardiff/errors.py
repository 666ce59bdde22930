"""The one base class for errors a user can act on.

Every component raises subclasses with a stable `code`; the CLI prints `error: <code>: <message>` without a
traceback, the worker maps them to its JSON envelope, the operator to a status reason.
"""

from __future__ import annotations


class ArdiffError(Exception):
    """An error with a stable machine-readable code and a human message."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)
