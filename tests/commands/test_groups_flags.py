"""kq groups refuses bad flag combinations before reaching any broker:
exit 2 and a message naming the flags (no cluster is needed, none is
dialled: the bootstrap address is a closed port)."""

from __future__ import annotations

import pytest

from kq.cli import main
from kq.commands.common import CommandError
from kq.commands.groups import parse_datetime, parse_topic_partitions

# Nothing listens there: a command that got past its checks would fail
# with a connection error (exit 1), not the usage status these expect.
BOOT = ["--bootstrap-server", "127.0.0.1:1", "--timeout-ms", "200"]


def run(argv: list[str]) -> int:
    try:
        return main(["groups", *BOOT, *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


RESET = ["--reset-offsets", "--group", "g", "--topic", "t"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give one action of --list --describe"),
        (["--list", "--describe", "--group", "g"], "--list and --describe are exclusive"),
        (["--describe"], "--describe needs --group"),
        (["--list", "--group", "g"], "--list takes no --group"),
        (["--delete", "--group", ""], "--group is empty"),
        ([*RESET, "--to-earliest"], "needs --dry-run (print the plan) or --execute"),
        ([*RESET, "--to-earliest", "--dry-run", "--execute"], "needs --dry-run"),
        ([*RESET, "--dry-run"], "--reset-offsets needs a strategy"),
        (
            [*RESET, "--to-earliest", "--to-latest", "--execute"],
            "--to-earliest and --to-latest: give one reset strategy",
        ),
        (
            [*RESET, "--to-offset", "3", "--shift-by", "-1", "--execute"],
            "--to-offset and --shift-by: give one reset strategy",
        ),
        ([*RESET, "--to-offset", "-1", "--execute"], "--to-offset must be >= 0, not -1"),
        (
            ["--reset-offsets", "--group", "g", "--to-latest", "--execute"],
            "needs --topic T[:P,P] ... or --all-topics",
        ),
        ([*RESET, "--all-topics", "--to-latest", "--execute"], "or --all-topics, one of them"),
        ([*RESET, "--group", "h", "--to-latest", "--execute"], "takes one --group, not 2"),
        ([*RESET, "--to-datetime", "yesterday", "--dry-run"], "--to-datetime 'yesterday'"),
        ([*RESET, "--to-datetime", "1969-12-31T00:00:00+00:00", "--dry-run"], "before 1970"),
        (["--describe", "--group", "g", "--members", "--offsets"], "--offsets and --members"),
        (["--describe", "--group", "g", "--members", "--state"], "--members and --state"),
        (["--describe", "--group", "g", "--verbose"], "--verbose goes with --describe --members"),
        (["--describe", "--group", "g", "--state", "Stable"], "--describe --state takes no"),
        (["--list", "--members"], "--members go with --describe, not --list"),
        (["--delete", "--group", "g", "--to-earliest"], "--to-earliest go with --reset-offsets"),
        (["--describe", "--group", "g", "--execute"], "--execute go with --reset-offsets"),
        (["--delete", "--group", "g", "--state"], "--state go with --describe"),
        (["--delete-offsets", "--group", "g"], "--delete-offsets needs --topic"),
        (["--delete", "--group", "g", "--topic", "t"], "--topic does not go with --delete"),
        (["--describe", "--group", "g", "--timeout-ms", "0"], "--timeout-ms must be >= 1"),
        ([*RESET[:-1], "t:x", "--to-latest", "--execute"], "--topic 't:x'"),
        ([*RESET[:-1], "t:-1", "--to-latest", "--execute"], "a partition is >= 0"),
        ([*RESET[:-1], ":0", "--to-latest", "--execute"], "the topic name is empty"),
    ],
)
def test_bad_flags_are_refused_with_the_flags_named(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert says in err


def test_a_good_command_gets_past_the_checks_to_the_brokers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The control for the cases above: valid flags reach the (absent)
    # brokers and fail there, exit 1, naming no flag.
    status = run([*RESET, "--to-earliest", "--dry-run"])
    err = capsys.readouterr().err
    assert status == 1, err
    assert err.startswith("kq groups: ")


def test_topic_partitions_and_datetimes_parse() -> None:
    assert parse_topic_partitions("t") == ("t", None)
    assert parse_topic_partitions("t:2,0,2") == ("t", (0, 2))
    with pytest.raises(CommandError, match="expected T or T:P,P"):
        parse_topic_partitions("a:b:1")
    assert parse_datetime("1970-01-01T00:00:01.500+00:00") == 1500
    assert parse_datetime("2026-01-31T12:00:00Z") == 1_769_860_800_000
    with pytest.raises(CommandError):
        parse_datetime("31/01/2026")
