"""kq transactions refuses bad flag combinations before reaching any
broker: exit 2 and a message naming the flags (no cluster is needed, none
is dialled: the bootstrap address is a closed port)."""

from __future__ import annotations

import pytest

from kq.cli import main
from kq.commands.common import CommandError
from kq.commands.transactions import parse_states

# Nothing listens there: a command that got past its checks would fail
# with a connection error (exit 1), not the usage status these expect.
BOOT = ["--bootstrap-server", "127.0.0.1:1", "--timeout-ms", "200"]
ABORT = ["--abort", "--topic", "t", "--partition", "0"]
EXPLICIT = ["--producer-id", "7", "--producer-epoch", "1", "--coordinator-epoch", "0"]


def run(argv: list[str]) -> int:
    try:
        return main(["transactions", *BOOT, *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give one action of --list --describe --describe-producers"),
        (["--list", "--describe"], "--list and --describe are exclusive"),
        (["--describe"], "--describe needs --transactional-id"),
        (["--describe", "--transactional-id", ""], "--describe needs --transactional-id"),
        (["--list", "--transactional-id", "x"], "--transactional-id does not go with --list"),
        (["--list", "--topic", "t", "--partition", "1"], "--topic, --partition do not go with"),
        (["--list", "--state", "Running"], "--state 'Running' is not a transaction state"),
        (["--describe-producers", "--topic", "t"], "--describe-producers needs --partition"),
        (["--describe-producers"], "needs --topic and --partition"),
        (["--describe-producers", "--topic", "t", "--partition", "0", "--broker-id", "1"],
         "--broker-id does not go with --describe-producers"),
        (["--find-hanging"], "--find-hanging needs --broker-id N or --topic T"),
        (["--find-hanging", "--broker-id", "1", "--topic", "t"], "one of them"),
        (["--find-hanging", "--broker-id", "1", "--partition", "0"], "--partition goes with"),
        (["--find-hanging", "--topic", ""], "--topic is empty"),
        (["--find-hanging", "--topic", "t", "--start-offset", "3"],
         "--start-offset does not go with --find-hanging"),
        (["--abort", "--start-offset", "3"], "--abort needs --topic and --partition"),
        (ABORT, "--abort needs --start-offset O, or --producer-id N"),
        ([*ABORT, "--start-offset", "3", "--producer-id", "7"],
         "--start-offset and --producer-id: give --start-offset O, or"),
        ([*ABORT, "--producer-id", "7"], "needs --producer-epoch and --coordinator-epoch too"),
        ([*ABORT, "--producer-id", "7", "--producer-epoch", "1"],
         "needs --coordinator-epoch too"),
        ([*ABORT, *EXPLICIT, "--producer-id", "8"], "takes one --producer-id, not 2"),
        ([*ABORT, *EXPLICIT[:2], "--producer-epoch", "40000", *EXPLICIT[4:]],
         "--producer-epoch must be at most 32767"),
        ([*ABORT, "--start-offset", "3", "--max-transaction-timeout", "5"],
         "--max-transaction-timeout does not go with --abort"),
        (["--list", "--timeout-ms", "0"], "--timeout-ms must be >= 1"),
        # argparse's own refusals of a value name the flag too.
        ([*ABORT, "--start-offset", "-1"], "an offset is >= 0, not -1"),
        (["--describe-producers", "--topic", "t", "--partition", "x"], "--partition"),
        (["--find-hanging", "--broker-id", "-2"], "a broker id is >= 0"),
        (["--list", "--producer-id", "one"], "not a producer id: 'one'"),
    ],
)  # fmt: skip
def test_bad_flags_are_refused_with_the_flags_named(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert says in err


def test_good_flags_get_past_the_checks_to_the_missing_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same checks pass a well-formed command on: it fails for want of
    a broker (exit 1), not for its flags."""
    for argv in (
        ["--list", "--state", "ongoing,PrepareAbort", "--producer-id", "3", "--producer-id", "4"],
        ["--describe", "--transactional-id", "tx"],
        [*ABORT, *EXPLICIT],
    ):
        assert run(argv) == 1
        assert "kq transactions:" in capsys.readouterr().err


def test_states_are_kafkas_names_in_any_case() -> None:
    assert parse_states(["ongoing", "PREPAREABORT,Ongoing", " CompleteCommit , "]) == [
        "Ongoing",
        "PrepareAbort",
        "CompleteCommit",
    ]
    with pytest.raises(CommandError, match="one of Empty, Ongoing"):
        parse_states(["Open"])
