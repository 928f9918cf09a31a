"""A follower's truncation after a leader change (KIP-101, KIP-279), step by
step as the replica fetcher runs it, on logs written by simulated replicas:
the known-bug scenarios of fast failovers, a random history property, and
the wrong rules the scenarios catch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import find, given, settings
from hypothesis import strategies as st

from partition_log.divergence import TruncationStep, epoch_to_request, truncation_step
from partition_log.epoch_cache import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    LeaderEpochCache,
    derive,
)

Rule = Callable[[LeaderEpochCache, int, int, EpochEndOffset], TruncationStep]


@dataclass
class Replica:
    """A replica's log as the epoch of each offset (one record per batch,
    so every offset is a batch boundary), and its cache kept as a log keeps
    it (including a new leader's entry at its end, KIP-279)."""

    log: list[int] = field(default_factory=list)
    cache: LeaderEpochCache = field(default_factory=LeaderEpochCache)

    def become_leader(self, epoch: int) -> None:
        self.cache = self.cache.assign(epoch, len(self.log))

    def write(self, epoch: int, count: int) -> None:
        for _ in range(count):
            self.cache = self.cache.assign(epoch, len(self.log))
            self.log.append(epoch)

    def truncate_to(self, offset: int) -> None:
        del self.log[offset:]
        self.cache = self.cache.truncate_from_end(len(self.log))

    def answer(self, requested: int) -> EpochEndOffset:
        """The leader's side of OffsetsForLeaderEpoch."""
        return self.cache.end_offset_for_epoch(requested, len(self.log))


def reconcile(
    follower: Replica, leader: Replica, rule: Rule = truncation_step, max_rounds: int = 50
) -> int:
    """Runs the fetcher's truncation rounds until one completes; the rounds."""
    for rounds in range(1, max_rounds + 1):
        answer = leader.answer(epoch_to_request(follower.cache))
        step = rule(follower.cache, len(follower.log), 0, answer)
        assert step.offset <= len(follower.log), "a truncation never moves the end forward"
        follower.truncate_to(step.offset)
        if step.completed:
            return rounds
    raise AssertionError(f"no agreement after {max_rounds} rounds")


def follow(follower: Replica, leader: Replica, rule: Rule = truncation_step) -> int:
    """Truncates the follower, then copies the leader's log past its end."""
    rounds = reconcile(follower, leader, rule)
    for epoch in leader.log[len(follower.log) :]:
        follower.write(epoch, 1)
    return rounds


def diverges(follower: Replica, leader: Replica) -> bool:
    return follower.log != leader.log[: len(follower.log)]


def common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


# The wrong rules the scenarios must catch.


def without_the_min(
    cache: LeaderEpochCache, leo: int, hw: int, answer: EpochEndOffset
) -> TruncationStep:
    """Truncates to the leader's end of a shared epoch, not to the smaller
    of the two ends."""
    step = truncation_step(cache, leo, hw, answer)
    mine = cache.end_offset_for_epoch(answer.epoch, leo)
    if step.completed and not answer.undefined and mine.epoch == answer.epoch:
        return TruncationStep(min(answer.end_offset, leo), completed=True)
    return step


def pre_kip_279(
    cache: LeaderEpochCache, leo: int, hw: int, answer: EpochEndOffset
) -> TruncationStep:
    """KIP-101 alone: the leader's end offset, in one round."""
    if answer.undefined:
        return TruncationStep(min(hw, leo), completed=True)
    return TruncationStep(min(answer.end_offset, leo), completed=True)


# -- the scenarios --


def fast_double_failover() -> tuple[Replica, Replica]:
    """brokers.md R3 (KIP-279, KAFKA-6361): A leads epoch 1 and its last
    records are not replicated; B leads epoch 2 and appends without
    replicating; A leads epoch 3 (it never saw epoch 2); B follows A."""
    a, b = Replica(), Replica()
    a.become_leader(0)
    a.write(0, 2)
    follow(b, a)
    a.become_leader(1)
    a.write(1, 2)  # offsets 2, 3 in epoch 1, never replicated
    b.become_leader(2)
    b.write(2, 3)  # offsets 2..4 in epoch 2, never replicated
    a.become_leader(3)
    a.write(3, 1)  # offset 4 in epoch 3
    return a, b


def test_fast_double_failover_truncates_in_two_rounds() -> None:
    a, b = fast_double_failover()
    # B asks about its epoch 2; A answers (1, 4): B never had epoch 1, so it
    # cuts to the end of its epoch 0 (offset 2) and asks about epoch 0; A
    # answers (0, 2), and B stops at 2.
    assert b.cache.latest_epoch == 2
    assert a.answer(2) == EpochEndOffset(1, 4)
    assert truncation_step(b.cache, 5, 0, EpochEndOffset(1, 4)) == TruncationStep(2, False)
    assert reconcile(b, a) == 2
    assert b.log == [0, 0]
    follow(b, a)
    assert b.log == a.log == [0, 0, 1, 1, 3]


def test_pre_kip_279_rule_diverges_on_the_fast_double_failover() -> None:
    a, b = fast_double_failover()
    follow(b, a, pre_kip_279)
    # B kept its epoch-2 records at offsets 2 and 3 where A holds epoch 1's.
    assert diverges(b, a)


def three_failovers() -> tuple[Replica, Replica]:
    """Epochs that alternate between two replicas without replication: the
    leader ends with epochs 0, 1, 3, 5 and the follower with 0, 2, 4; each
    answer names an epoch the follower never had."""
    a, b = Replica(), Replica()
    a.become_leader(0)
    a.write(0, 2)
    follow(b, a)
    for epoch in range(1, 6):
        replica = a if epoch % 2 else b
        replica.become_leader(epoch)
        replica.write(epoch, 2)
    return a, b


def test_multi_round_truncation_when_the_follower_never_had_the_leaders_epochs() -> None:
    a, b = three_failovers()
    assert [entry.epoch for entry in a.cache.entries] == [0, 1, 3, 5]
    assert [entry.epoch for entry in b.cache.entries] == [0, 2, 4]
    assert reconcile(b, a) == 3
    assert b.log == [0, 0]
    follow(b, a)
    assert b.log == a.log


def test_pre_kip_279_rule_diverges_on_three_failovers() -> None:
    a, b = three_failovers()
    follow(b, a, pre_kip_279)
    assert diverges(b, a)


def shorter_shared_epoch() -> tuple[Replica, Replica]:
    """The follower's epoch 0 ends earlier than the leader's: B copied two of
    A's epoch-0 records, led epoch 1 alone, then A led epoch 2."""
    a, b = Replica(), Replica()
    a.become_leader(0)
    a.write(0, 2)
    follow(b, a)
    a.write(0, 2)  # offsets 2, 3 in epoch 0, never replicated
    b.become_leader(1)
    b.write(1, 2)  # offsets 2, 3 in epoch 1
    a.become_leader(2)
    return a, b


def test_a_shared_epoch_is_cut_at_the_smaller_end() -> None:
    a, b = shorter_shared_epoch()
    # B asks about epoch 1; A answers (0, 4); B had epoch 0, ending at 2.
    assert a.answer(1) == EpochEndOffset(0, 4)
    assert reconcile(b, a) == 1
    assert b.log == [0, 0]


def test_truncating_to_the_leaders_end_without_the_min_diverges() -> None:
    a, b = shorter_shared_epoch()
    follow(b, a, without_the_min)
    assert diverges(b, a)


def test_a_follower_whose_epochs_start_after_the_leaders_answer() -> None:
    # The leader answers an epoch below every epoch of the follower's (its
    # start was deleted): the follower's cache answers that epoch with the
    # start of its first one, and the smaller end wins.
    follower = LeaderEpochCache().assign(3, 10).assign(4, 15)
    step = truncation_step(follower, 20, 0, EpochEndOffset(2, 12))
    assert step == TruncationStep(10, True)


def test_an_undefined_answer_sends_the_follower_to_its_high_watermark() -> None:
    cache = LeaderEpochCache().assign(1, 0)
    undefined = EpochEndOffset(UNDEFINED_EPOCH, -1)
    assert truncation_step(cache, 9, 4, undefined) == TruncationStep(4, True)
    assert truncation_step(cache, 3, 4, undefined) == TruncationStep(3, True)
    assert epoch_to_request(LeaderEpochCache()) == UNDEFINED_EPOCH


def test_an_empty_follower_cache_takes_the_leaders_end() -> None:
    assert truncation_step(LeaderEpochCache(), 9, 0, EpochEndOffset(2, 5)) == TruncationStep(
        5, True
    )
    assert truncation_step(LeaderEpochCache(), 3, 0, EpochEndOffset(2, 5)) == TruncationStep(
        3, True
    )


# -- the property: random histories of elections, writes and replication --

history = st.lists(
    st.one_of(
        st.tuples(st.just("elect"), st.integers(0, 2)),
        st.tuples(st.just("write"), st.integers(1, 3)),
        st.tuples(st.just("replicate"), st.integers(0, 2)),
    ),
    max_size=40,
)


def run_history(steps: list[tuple[str, int]], rule: Rule) -> tuple[list[Replica], bool]:
    """Replays ``steps`` on three replicas; whether some follower, after its
    truncation, kept a record its leader does not have at that offset."""
    replicas = [Replica() for _ in range(3)]
    leader, epoch = 0, 0
    replicas[0].become_leader(0)
    diverged = False
    for op, arg in steps:
        if op == "elect":
            # Any replica can be elected (clean or not): the truncation must
            # still leave no follower holding what the leader does not.
            epoch += 1
            leader = arg
            replicas[leader].become_leader(epoch)
        elif op == "write":
            replicas[leader].write(epoch, arg)
        elif arg != leader:
            follower = replicas[arg]
            agreed = common_prefix(follower.log, replicas[leader].log)
            reconcile(follower, replicas[leader], rule)
            if diverges(follower, replicas[leader]):
                diverged = True
            elif rule is truncation_step:
                # ... and it never cuts what both logs agree on.
                assert len(follower.log) == agreed
            follow(follower, replicas[leader], rule)
    return replicas, diverged


@settings(max_examples=300, deadline=None)
@given(history)
def test_after_truncation_a_follower_is_a_prefix_of_its_leader(
    steps: list[tuple[str, int]],
) -> None:
    replicas, diverged = run_history(steps, truncation_step)
    assert not diverged
    for replica in replicas:
        assert replica.cache.truncate_from_end(len(replica.log)) == derive(enumerate(replica.log))


def test_the_random_histories_catch_the_wrong_rules() -> None:
    # The property is not vacuous: it finds a divergence for each wrong rule.
    for rule in (pre_kip_279, without_the_min):
        found = find(
            history,
            lambda steps, rule=rule: run_history(steps, rule)[1],  # type: ignore[misc]
            settings=settings(max_examples=5000, database=None, deadline=None),
        )
        assert run_history(found, rule)[1]
