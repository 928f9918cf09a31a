"""The clients' timeouts of a chaos run (``RunConfig.op_timeout_s`` and
``client_timeout_s``) and its fault schedule's times (``fault_interval_s``,
``fault_period_s``, ``quiet_s``): ``kq chaos run`` flags, set by catalogue
recipes, and part of the run's replay command, which parsed back gives
them again (a catalogue run's whole configuration but its name)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

import bugs
from chaos.catalogue import RECIPES
from chaos.runner import RunConfig, _replay
from kq.cli import build_parser, main
from kq.commands import chaos as chaos_command
from kq.commands.chaos import _run_config

_RECIPE_BUGS = sorted(RECIPES, key=lambda b: b.id)


def _replayed(replay: str, monkeypatch: pytest.MonkeyPatch) -> RunConfig:
    """The configuration ``kq chaos run`` makes of a replay command: its
    leading variables (the bug switch) in the environment, its flags parsed."""
    words = shlex.split(replay)
    for key in (bugs.BUGS_VARIABLE, bugs.ACK_VARIABLE):
        monkeypatch.delenv(key, raising=False)
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(key, value)
    assert words[:3] == ["kq", "chaos", "run"], replay
    return _run_config(build_parser(words[1:]).parse_args(words[1:]))


def test_the_flags_reach_the_run_config() -> None:
    args = build_parser().parse_args(
        ["chaos", "run", "--op-timeout", "1.5", "--client-timeout", "0.25"]
    )
    config = _run_config(args)
    assert (config.op_timeout_s, config.client_timeout_s) == (1.5, 0.25)
    default = _run_config(build_parser().parse_args(["chaos", "run"]))
    assert (default.op_timeout_s, default.client_timeout_s) == (
        RunConfig().op_timeout_s,
        RunConfig().client_timeout_s,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--op-timeout", "0"], "--op-timeout: must be a positive number, got 0"),
        (["--op-timeout", "-1"], "--op-timeout: must be a positive number, got -1"),
        (["--op-timeout", "inf"], "--op-timeout: must be a positive number, got inf"),
        (["--op-timeout", "nan"], "--op-timeout: must be a positive number, got nan"),
        (["--op-timeout", "soon"], "--op-timeout: 'soon' is not a number"),
        (["--client-timeout", "0"], "--client-timeout: must be a positive number, got 0"),
        (["--client-timeout", "x"], "--client-timeout: 'x' is not a number"),
        (
            ["--op-timeout", "1", "--client-timeout", "1.5"],
            "--client-timeout (1.5 s) must not exceed --op-timeout (1 s)",
        ),
        # The default client timeout (2 s) is above a shorter op timeout.
        (["--op-timeout", "1"], "--client-timeout (2 s) must not exceed --op-timeout (1 s)"),
    ],
)
def test_bad_timeouts_are_usage_errors_naming_the_flag(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_run(*_: object) -> None:
        raise AssertionError("a run started with bad timeouts")

    # Without the check a bad pair would start a cluster: fail instead.
    monkeypatch.setattr(chaos_command, "run_chaos", no_run)
    code: int | str | None
    try:
        code = main(["chaos", "run", "--nemesis", "none", "--runs-dir", str(tmp_path), *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_equal_timeouts_are_allowed() -> None:
    args = build_parser().parse_args(["chaos", "run", "--op-timeout", "1", "--client-timeout", "1"])
    config = _run_config(args)
    assert (config.op_timeout_s, config.client_timeout_s) == (1.0, 1.0)


def test_a_configuration_built_in_code_is_checked_too() -> None:
    with pytest.raises(
        ValueError, match=r"client_timeout_s \(3 s\) must not exceed op_timeout_s \(2 s\)"
    ):
        RunConfig(op_timeout_s=2.0, client_timeout_s=3.0).check()
    RunConfig(op_timeout_s=2.0, client_timeout_s=2.0).check()


def test_the_replay_names_them_only_when_they_differ_from_the_defaults() -> None:
    plain = _replay(RunConfig(), 7)
    assert "--op-timeout" not in plain and "--client-timeout" not in plain
    only_op = _replay(RunConfig(op_timeout_s=3.0), 7)
    assert " --op-timeout 3 " in only_op + " " and "--client-timeout" not in only_op
    # A value %g would round is written whole.
    odd = _replay(RunConfig(op_timeout_s=4.1234567, client_timeout_s=0.5), 7)
    assert " --op-timeout 4.1234567 " in odd and " --client-timeout 0.5" in odd


@pytest.mark.parametrize(
    ("bug_id", "timeouts"),
    [("B18", (2.0, 1.0)), ("Q4", (1.0, 0.5))],
)
def test_a_recipe_with_short_timeouts_replays_them(
    bug_id: str, timeouts: tuple[float, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    bug = next(b for b in RECIPES if b.id == bug_id)
    recipe = RECIPES[bug]
    config = recipe.config(name="r", bugs=frozenset({bug}), seed=11, runs_dir="runs")
    config.check()
    assert (config.op_timeout_s, config.client_timeout_s) == timeouts
    replay = _replay(config, 11)
    words = shlex.split(replay)
    op, client = (words[words.index(flag) + 1] for flag in ("--op-timeout", "--client-timeout"))
    assert (op, client) == (f"{timeouts[0]:g}", f"{timeouts[1]:g}")
    again = _replayed(replay, monkeypatch)
    assert (again.op_timeout_s, again.client_timeout_s) == timeouts
    assert again.bugs == frozenset({bug})


def test_the_schedule_flags_reach_the_run_config() -> None:
    args = build_parser().parse_args(
        ["chaos", "run", "--fault-interval", "0.8", "--fault-period", "18", "--quiet-period", "0"]
    )
    config = _run_config(args)
    assert (config.fault_interval_s, config.fault_period_s, config.quiet_s) == (0.8, 18.0, 0.0)
    default = _run_config(build_parser().parse_args(["chaos", "run"]))
    assert (default.fault_interval_s, default.fault_period_s, default.quiet_s) == (
        RunConfig().fault_interval_s,
        RunConfig().fault_period_s,
        RunConfig().quiet_s,
    )
    plain = _replay(RunConfig(), 7)
    assert not any(f in plain for f in ("--fault-interval", "--fault-period", "--quiet-period"))
    only_quiet = _replay(RunConfig(quiet_s=0.0), 7)
    assert " --quiet-period 0" in only_quiet and "--fault-interval" not in only_quiet


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fault-interval", "0"], "--fault-interval: must be a positive number, got 0"),
        (["--fault-period", "-2"], "--fault-period: must be a positive number, got -2"),
        (["--fault-period", "long"], "--fault-period: 'long' is not a number"),
        (["--quiet-period", "-1"], "--quiet-period: must be 0 or a positive number, got -1"),
        (["--quiet-period", "inf"], "--quiet-period: must be 0 or a positive number, got inf"),
        (["--quiet-period", "nan"], "--quiet-period: must be 0 or a positive number, got nan"),
    ],
)
def test_bad_schedule_times_are_usage_errors_naming_the_flag(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["chaos", "run", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("bug", _RECIPE_BUGS, ids=[b.id for b in _RECIPE_BUGS])
def test_every_recipes_replay_gives_back_its_configuration(
    bug: bugs.Bug, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RECIPES[bug].config(name="r", bugs=frozenset({bug}), seed=5, runs_dir="runs")
    again = _replayed(_replay(config, 5), monkeypatch)
    assert (again.op_timeout_s, again.client_timeout_s) == (
        config.op_timeout_s,
        config.client_timeout_s,
    )
    assert (again.fault_interval_s, again.fault_period_s, again.quiet_s) == (
        config.fault_interval_s,
        config.fault_period_s,
        config.quiet_s,
    )
    # All of it but the name (only the run folder's); a register run has no
    # brokers, so its replay names no queue options (they are unused).
    expected = dataclasses.replace(
        config,
        name=again.name,
        queue=config.queue if config.brokers else again.queue,
    )
    assert again == expected
