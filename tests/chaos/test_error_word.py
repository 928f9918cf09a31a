"""The histories' error words (chaos.workloads.error_word): the queue
workload's Kafka error names and the topics and register workloads' error
codes are written the same way, by one function."""

from __future__ import annotations

from chaos.workloads import error_word, queue, register, topics
from metadata.errors import Errors


def test_a_code_is_written_as_its_name() -> None:
    assert error_word(Errors.TOPIC_ALREADY_EXISTS) == "topic-already-exists"
    assert error_word(Errors.TOPIC_ALREADY_EXISTS.name) == "topic-already-exists"
    assert error_word(" NOT_LEADER_OR_FOLLOWER ") == "not-leader-or-follower"
    assert error_word("") == "unknown"


def test_every_workload_uses_the_one_function() -> None:
    assert queue.error_word is topics.error_word is register.error_word is error_word
