"""Errors meant for the person running kq, with the exit status a command
ends with (the commands in :mod:`kq.commands` print them)."""

from __future__ import annotations

__all__ = ["EXIT_FAILURE", "EXIT_INDETERMINATE", "EXIT_OK", "EXIT_USAGE", "UserError"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INDETERMINATE = 3


class UserError(Exception):
    """Ends a command with ``message`` on stderr and exit status ``status``
    (a bad flag or file is :data:`EXIT_USAGE`)."""

    def __init__(self, message: str, status: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.status = status
