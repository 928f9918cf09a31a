"""The Spark job words each vote-durability anomaly as the reference does.

``spark_verify`` imports nothing of kq (it goes to a Spark cluster alone,
``docs/architecture.md``), so ``spark_verify.votes.vote_message`` is a copy
of ``history.votes.vote_message``; this test, which needs no Spark, holds
the two to the same sentence on the same inputs, every branch of each."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from history.votes import VOTE_KINDS
from history.votes import vote_message as reference
from spark_verify.votes import vote_message as job
from tests.history.vote_exports import line

VOTES = [line(1, 1, "grant", 4, 2), line(1, 1, "candidate", 4)]
RESTORED = [
    line(1, 2, "start", 4, None, 2),
    line(1, 2, "start", 3, 3, 3),
    line(1, 3, "stored", 4, 3, None),
    line(1, 3, "stored", 2, None, None),
]


@pytest.mark.parametrize(
    ("kind", "vote", "restored"),
    [
        *(("double-vote", v, None) for v in VOTES),
        *(
            (kind, v, r)
            for kind, v, r in itertools.product(
                ("vote-forgotten", "epoch-forgotten"), VOTES, RESTORED
            )
        ),
    ],
)
def test_the_job_words_each_anomaly_as_the_reference(
    kind: str, vote: dict[str, Any], restored: dict[str, Any] | None
) -> None:
    assert kind in VOTE_KINDS
    assert job(kind, 1, vote, restored) == reference(kind, 1, vote, restored)


def test_every_kind_is_compared() -> None:
    assert set(VOTE_KINDS) == {"double-vote", "vote-forgotten", "epoch-forgotten"}
