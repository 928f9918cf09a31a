"""What a coordinator's decision is, for every coordinator built the
controller's way (decide, then replay: the group coordinator of
``broker.group``, the transaction coordinator of ``broker.txn``; Kafka's
``CoordinatorResult`` in its coordinator-common module).

Pure: a handler returns a :class:`CoordinatorResult`, the records to write
and the answer to give once they have committed, or raises a
:class:`CoordinatorRefusal`; it changes nothing itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from broker.errors import Errors

__all__ = ["CoordinatorRefusal", "CoordinatorResult"]

R = TypeVar("R")
T = TypeVar("T")


class CoordinatorRefusal(Exception):
    """A refusal of a whole request: ``code`` and a message naming why."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CoordinatorResult(Generic[R, T]):
    """A decision: the records to write (in order) and the answer to give
    once they have committed.  Deciding changes nothing."""

    records: tuple[R, ...]
    response: T
