"""Table tests for quorum.majority, read from testdata/majority.txt."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from quorum.majority import VoteResult, committed_offset, vote_result

TABLE = Path(__file__).resolve().parent / "testdata" / "majority.txt"

_LINE = re.compile(r"^(?P<kind>committed|vote)\s+(?P<args>.*?)\s*->\s*(?P<want>\S+)$")
_FIELD = re.compile(r"(\w+)=\(([^)]*)\)")


@dataclass(frozen=True)
class Case:
    line: int
    kind: str
    fields: dict[str, str]
    want: str

    @property
    def id(self) -> str:
        return f"L{self.line}"


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _acked(text: str) -> dict[int, int]:
    pairs = (item.split(":") for item in text.split(",") if item.strip())
    return {int(node): int(offset) for node, offset in pairs}


def load_table(path: Path = TABLE) -> list[Case]:
    cases = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"{path.name}:{number}: cannot parse {raw!r}")
        fields = dict(_FIELD.findall(m["args"]))
        expected = {"committed": {"voters", "acked"}, "vote": {"voters", "granted", "rejected"}}
        if set(fields) != expected[m["kind"]]:
            raise ValueError(f"{path.name}:{number}: fields {sorted(fields)} in {raw!r}")
        cases.append(Case(number, m["kind"], fields, m["want"]))
    return cases


CASES = load_table()
COMMITTED = [pytest.param(c, id=c.id) for c in CASES if c.kind == "committed"]
VOTES = [pytest.param(c, id=c.id) for c in CASES if c.kind == "vote"]


def test_table_covers_every_voter_count_and_result() -> None:
    """The table itself: guards against a file that silently lost its cases."""
    committed_sizes = {len(_ids(c.fields["voters"])) for c in CASES if c.kind == "committed"}
    vote_sizes = {len(_ids(c.fields["voters"])) for c in CASES if c.kind == "vote"}
    assert {0, 1, 2, 3, 4, 5} <= committed_sizes
    assert {1, 2, 3, 4, 5} <= vote_sizes
    for n in (1, 2, 3, 4, 5):
        results = {c.want for c in CASES if c.kind == "vote" and len(_ids(c.fields["voters"])) == n}
        assert results == {"WON", "LOST", "PENDING"}, f"{n} voters: {results}"


def test_malformed_table_line_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("committed voters=(1,2) -> 3\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        load_table(bad)


@pytest.mark.parametrize("case", COMMITTED)
def test_committed_offset(case: Case) -> None:
    voters = _ids(case.fields["voters"])
    acked = _acked(case.fields["acked"])
    if case.want == "error":
        with pytest.raises(ValueError):
            committed_offset(voters, acked)
        return
    assert committed_offset(voters, acked) == int(case.want)
    # Neither the order of the voters nor that of acked matters.
    assert committed_offset(reversed(voters), dict(reversed(list(acked.items())))) == int(case.want)


@pytest.mark.parametrize("case", VOTES)
def test_vote_result(case: Case) -> None:
    voters = _ids(case.fields["voters"])
    granted = _ids(case.fields["granted"])
    rejected = _ids(case.fields["rejected"])
    assert vote_result(voters, granted, rejected) is VoteResult[case.want]
    assert vote_result(set(voters), set(granted), set(rejected)) is VoteResult[case.want]
    assert vote_result(iter(voters), granted, rejected) is VoteResult[case.want]


def _overlap_decides(case: Case) -> bool:
    """A voter is both granted and refused, and the result is not WON."""
    both = set(_ids(case.fields["granted"])) & set(_ids(case.fields["rejected"]))
    return bool(both) and case.want != "WON"


OVERLAPPING = [pytest.param(c, id=c.id) for c in CASES if c.kind == "vote" and _overlap_decides(c)]


def test_table_has_overlapping_cases() -> None:
    assert len(OVERLAPPING) >= 2


@pytest.mark.parametrize("case", OVERLAPPING)
def test_vote_result_with_single_use_iterables(case: Case) -> None:
    granted = _ids(case.fields["granted"])
    rejected = _ids(case.fields["rejected"])
    voters = _ids(case.fields["voters"])
    got = vote_result(iter(voters), iter(granted), iter(rejected))
    assert got is VoteResult[case.want]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_vote_result_boundaries(n: int) -> None:
    """Exactly a majority of grants wins, one fewer does not; exactly enough
    refusals that a majority is out of reach loses, one fewer does not."""
    voters = list(range(1, n + 1))
    need = n // 2 + 1
    assert vote_result(voters, voters[:need], []) is VoteResult.WON
    assert vote_result(voters, voters[: need - 1], []) is VoteResult.PENDING
    lose = n - need + 1  # refusals that leave fewer than `need` possible grants
    assert vote_result(voters, [], voters[n - lose :]) is VoteResult.LOST
    assert vote_result(voters, [], voters[n - lose + 1 :]) is VoteResult.PENDING


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_committed_offset_is_reached_by_a_majority(n: int) -> None:
    """The answer is the largest offset that at least a majority has reached."""
    voters = list(range(1, n + 1))
    acked = {v: 10 * v for v in voters}
    got = committed_offset(voters, acked)
    reached = sum(1 for v in voters if acked[v] >= got)
    assert reached >= n // 2 + 1
    assert sum(1 for v in voters if acked[v] >= got + 1) < n // 2 + 1
