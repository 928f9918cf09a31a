"""The catalogue's table and its verdict, on fake runs and fake verdicts
(no cluster, no Spark): every bug has a recipe that makes a valid run, a
bug is caught at the first run where a check fires, a bug no check caught
is a finding, and a clean run where a check fired (or that gave no
verdict) is a false alarm that fails the catalogue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import bugs
from broker.group.placement import OFFSETS_TOPIC
from bugs import Bug
from chaos.backend import ClusterBackend
from chaos.catalogue import (
    HARNESS_FINAL_CHECK,
    RECIPE_IDS,
    RECIPES,
    BugResult,
    Catalogue,
    Recipe,
    RunOutcome,
    default_bugs,
    fired_checks,
    recipe_table,
    render_table,
    run_catalogue,
)
from chaos.runner import (
    BACKENDS,
    NEMESES,
    WORKLOADS,
    BackendSpec,
    RunConfig,
    RunResult,
    bug_environment,
    expand_nemesis,
    fault_topics,
    run_chaos,
)
from chaos.workloads.queue_setup import GROUP_ID
from history.runs import RunDir
from kq.cli import main
from tests.chaos.test_runner import BrokenBackend


def test_every_bug_has_a_recipe_and_every_recipe_names_a_bug() -> None:
    assert set(RECIPES) == set(Bug), sorted(b.id for b in set(Bug) - set(RECIPES))
    assert {b.id for b in Bug} >= RECIPE_IDS


@pytest.mark.parametrize("bug", list(Bug), ids=lambda b: b.id)
def test_each_recipe_makes_a_run_the_runner_accepts(bug: Bug) -> None:
    recipe = RECIPES[bug]
    assert recipe.workload in WORKLOADS and set(recipe.nemesis) <= set(NEMESES)
    assert (recipe.expected or recipe.benign) and recipe.budget >= 1 and recipe.note
    config = recipe.config(name=f"catalogue-{bug.id}", bugs=frozenset({bug}), seed=1, runs_dir="r")
    config.check()  # raises naming what is wrong
    assert config.bugs == frozenset({bug}) and config.faults
    if recipe.workload == "queue":
        assert config.brokers == recipe.brokers and config.queue.replica_lag_ms <= 2_000


def test_group_recipes_aim_partition_faults_at_the_offsets_topic_too() -> None:
    grouped = [b for b in Bug if RECIPES[b].group]
    assert {b.id for b in grouped} == {"B17", "B19", "B20"}
    for bug in grouped:
        config = RECIPES[bug].config(name="g", bugs=frozenset({bug}), seed=1, runs_dir="r")
        assert config.queue.group == GROUP_ID
        assert fault_topics(config.queue) == ["queue", OFFSETS_TOPIC]
    plain = RECIPES[Bug.HW_AT_LEADER_LEO].config(name="p", bugs=frozenset(), seed=1, runs_dir="r")
    assert fault_topics(plain.queue) == ["queue"]


# -- fake runs ---------------------------------------------------------------------------


class FakeCluster:
    """Runs that fire the checks a test says, per bug and per run."""

    def __init__(
        self,
        tmp: Path,
        fires: Mapping[str, list[tuple[str, ...]]],
        *,
        incomplete: frozenset[str] = frozenset(),
        final_fails: frozenset[str] = frozenset(),
    ) -> None:
        self.tmp = tmp
        self.fires = {k: list(v) for k, v in fires.items()}
        self.incomplete = incomplete
        self.final_fails = final_fails
        self.configs: list[RunConfig] = []
        self.active_during_runs: list[frozenset[Bug]] = []
        self.verified: list[Path] = []

    def key(self, config: RunConfig) -> str:
        return ",".join(sorted(b.id for b in config.bugs)) or "clean"

    async def run(self, config: RunConfig) -> RunResult:
        self.configs.append(config)
        path = self.tmp / f"run-{len(self.configs)}"
        path.mkdir()
        key = self.key(config)
        (path / "key").write_text(key)
        done = key not in self.incomplete
        final_ok = key not in self.final_fails
        final: dict[str, Any] = {"ok": final_ok, "problems": []}
        return RunResult(
            path,
            completed=done,
            recovered=done,
            error=None if done else "RuntimeError: boom",
            summary={"final_check": final},
            final_ok=final_ok,
            final_check=final,
        )

    def verify(self, path: Path) -> Mapping[str, Any]:
        self.verified.append(path)
        key = (path / "key").read_text()
        queue = self.fires.get(key, [])
        fired = queue.pop(0) if queue else ()
        checks: dict[str, dict[str, Any]] = {
            name: {"valid": name not in fired, "count": int(name in fired)}
            for name in ("lost-write", "G1a", "duplicate", "no-loss", *fired)
        }
        checks["linearizable"] = {"valid": None, "count": 0}  # unknown is no anomaly
        return {"verdict": "invalid" if fired else "valid", "checks": checks}


def _run(cluster: FakeCluster, bugs_: list[Bug], **kw: Any) -> Catalogue:
    return asyncio.run(
        run_catalogue(bugs_, cluster.verify, run=cluster.run, seed=7, runs_dir="runs", **kw)
    )


def test_a_bug_is_caught_at_the_first_run_where_a_check_fires(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {"B5": [(), ("lost-write", "no-loss")], "B18": [("G1a",)]})
    result = _run(cluster, [Bug.HARNESS_NOT_LEADER_AS_FAIL, Bug.HW_AT_LEADER_LEO], clean_runs=2)
    b5, b18 = result.bugs  # in id order
    assert b5.bug is Bug.HW_AT_LEADER_LEO and b5.caught and b5.status == "caught"
    assert b5.first_detection == 2 and b5.fired == ("lost-write", "no-loss")
    assert len(b5.runs) == 2 and b5.budget == RECIPES[Bug.HW_AT_LEADER_LEO].budget
    assert b18.first_detection == 1 and b18.fired == ("G1a",)
    # Each bug's runs had exactly that bug on, with the recipe's faults.
    assert [cluster.key(c) for c in cluster.configs] == ["B5", "B5", "B18", "clean", "clean"]
    recipe = RECIPES[Bug.HW_AT_LEADER_LEO]
    assert cluster.configs[0].faults == tuple(expand_nemesis(recipe.nemesis, 3))
    assert cluster.configs[0].nodes == recipe.controllers == 1
    assert cluster.configs[0].time_limit_s == recipe.time_limit_s
    assert len({c.seed for c in cluster.configs}) == len(cluster.configs)
    # The clean runs go over the chosen bugs' recipes in turn, with no bug.
    assert [c.recipe for c in result.clean] == [
        RECIPES[Bug.HW_AT_LEADER_LEO],
        RECIPES[Bug.HARNESS_NOT_LEADER_AS_FAIL],
    ]
    assert all(c.status == "clean" for c in result.clean)
    assert result.ok and result.findings == () and result.false_alarms == ()
    text = render_table(result)
    assert text.splitlines()[0].split() == [
        "BUG", "RECIPE", "CHECKS", "FIRED", "RUNS", "TIME", "RESULT"
    ]  # fmt: skip
    b5_line = next(line for line in text.splitlines() if line.startswith("B5 "))
    assert "lost-write, no-loss" in b5_line and " 2/3 " in b5_line and b5_line.endswith("caught")
    assert "2/2 bugs caught; 2/2 clean runs clean" in text
    assert "finding" not in text and "false alarm" not in text
    data = result.to_json()
    assert data["ok"] is True and data["findings"] == [] and data["false_alarms"] == []
    assert data["bugs"][0]["bug"] == "B5" and data["bugs"][0]["runs_until_detection"] == 2
    json.dumps(data)


def test_a_bug_no_check_caught_is_a_finding_listed_in_the_table(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {"B16": [(), (), ()]})
    result = _run(cluster, [Bug.COMPACTION_RENUMBERS], clean_runs=1)
    (b16,) = result.bugs
    assert not b16.caught and b16.status == "NOT CAUGHT" and b16.first_detection is None
    assert len(b16.runs) == RECIPES[Bug.COMPACTION_RENUMBERS].budget == 3
    assert result.findings == (b16,) and not result.ok
    text = render_table(result)
    line = next(x for x in text.splitlines() if x.startswith("B16 "))
    assert " -/3 " in line and line.endswith("NOT CAUGHT")
    assert "finding: B16 compaction-renumbers not caught in 3 run(s)" in text
    assert result.to_json()["findings"] == ["B16"]


def _dir(parent: Path, name: str) -> Path:
    (parent / name).mkdir()
    return parent / name


def test_a_benign_bug_is_a_negative_control(tmp_path: Path) -> None:
    b3 = Bug.NO_EPOCH_START_ENTRY
    assert RECIPES[b3].benign and RECIPES[b3].expected == ()
    # Left out unless named; every other bug runs by default.
    assert b3 not in default_bugs() and set(default_bugs()) == set(Bug) - {b3}
    quiet = _run(FakeCluster(_dir(tmp_path, "b3-quiet"), {}), [b3], runs=2, clean_runs=0)
    (result,) = quiet.bugs
    assert len(result.runs) == 2 and result.status == "benign" and not result.finding
    assert quiet.ok and quiet.findings == ()
    text = render_table(quiet)
    assert text.splitlines()[1].endswith("benign")
    assert "1/1 benign bugs raised nothing" in text and "bugs caught" not in text
    assert quiet.to_json()["bugs"][0]["benign"] == RECIPES[b3].benign
    # A check firing on it says the analysis (or the check) is wrong.
    fired = _run(FakeCluster(_dir(tmp_path, "b3-fired"), {"B3": [(), ("duplicate",)]}), [b3])
    (result,) = fired.bugs
    assert result.status == "FIRED" and result.first_detection == 2 and len(result.runs) == 2
    assert fired.findings == (result,) and not fired.ok
    assert "finding: benign B3 no-epoch-start-entry fired: duplicate" in render_table(fired)
    # And so does a run that gave no verdict.
    broken = _run(FakeCluster(_dir(tmp_path, "b3-broken"), {}, incomplete=frozenset({"B3"})), [b3])
    assert broken.bugs[0].status == "NO VERDICT" and not broken.ok
    assert "finding: benign B3 no-epoch-start-entry gave no verdict" in render_table(broken)


def test_a_recipe_names_its_expected_checks_or_why_it_is_benign() -> None:
    with pytest.raises(ValueError, match="checks expected to fire, or why it is benign"):
        Recipe("queue", ("kill",), ())
    with pytest.raises(ValueError, match="checks expected to fire, or why it is benign"):
        Recipe("queue", ("kill",), ("lost-write",), benign="it loses nothing")


def test_runs_overrides_the_budget(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {})
    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], runs=1, clean_runs=0)
    assert len(result.bugs[0].runs) == 1 and result.bugs[0].budget == 1
    assert "-/1" in render_table(result)


def test_runs_zero_makes_only_the_clean_runs_of_the_chosen_recipes(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {})
    chosen = [Bug.NO_DEDUP_WINDOW, Bug.COMMIT_WITHOUT_MAJORITY]
    result = _run(cluster, chosen, runs=0, clean_runs=3)
    assert result.bugs == () and result.ok
    assert [c.recipe for c in result.clean] == [
        RECIPES[Bug.COMMIT_WITHOUT_MAJORITY],
        RECIPES[Bug.NO_DEDUP_WINDOW],
        RECIPES[Bug.COMMIT_WITHOUT_MAJORITY],
    ]
    assert all(c.bugs == frozenset() for c in cluster.configs)
    text = render_table(result)
    assert "bugs caught" not in text and "3/3 clean runs clean" in text
    with pytest.raises(ValueError, match="runs must not be negative, got -1"):
        _run(cluster, chosen, runs=-1)


def test_clean_runs_verified_together_give_each_run_its_own_verdict(tmp_path: Path) -> None:
    """One job verifies every clean run after the last: each run's outcome is
    its own row's (valid: clean; invalid: a false alarm naming its checks;
    unknown, or no row: no verdict), and a run that did not complete is not
    verified."""
    cluster = FakeCluster(tmp_path, {})
    batches: list[list[Path]] = []
    rows = {
        "run-1": ("valid", []),
        "run-2": ("invalid", ["no-loss", "duplicate"]),
        "run-3": ("unknown", ["no-loss"]),
    }

    def together(paths: Sequence[Path]) -> Mapping[str, Any]:
        batches.append(list(paths))
        assert cluster.verified == []  # no run verified alone
        return {
            "verdict": "invalid",
            "runs": [
                {"path": str(p), "verdict": rows[p.name][0], "failed": rows[p.name][1]}
                for p in paths
                if p.name in rows
            ],
        }

    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], runs=0, clean_runs=4, verify_together=together)
    assert [len(b) for b in batches] == [4]
    statuses = [c.status for c in result.clean]
    assert statuses == ["clean", "FALSE ALARM", "NO VERDICT", "NO VERDICT"]
    assert result.clean[1].fired == ("no-loss", "duplicate")
    assert result.clean[2].runs[0].error == "the verdict is unknown"
    assert result.clean[3].runs[0].error == "the verification has no verdict for it"
    assert not result.ok

    # A run that did not complete gives nothing to verify; a failed job
    # leaves every run without a verdict.
    cluster = FakeCluster(tmp_path / "again", {}, incomplete=frozenset({"clean"}))
    (tmp_path / "again").mkdir()
    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], runs=0, clean_runs=2, verify_together=together)
    assert [c.status for c in result.clean] == ["NO VERDICT", "NO VERDICT"]
    assert len(batches) == 1

    def broken(paths: Sequence[Path]) -> Mapping[str, Any]:
        raise RuntimeError("no Java")

    cluster = FakeCluster(_dir(tmp_path, "b3-broken"), {})
    (tmp_path / "broken").mkdir()
    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], runs=0, clean_runs=2, verify_together=broken)
    assert {c.runs[0].error for c in result.clean} == {"verification: RuntimeError: no Java"}


def test_a_clean_run_where_a_check_fires_is_a_false_alarm(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {"B11": [("duplicate",)], "clean": [(), ("duplicate",)]})
    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], clean_runs=2)
    assert result.bugs[0].caught and result.findings == ()
    first, second = result.clean
    assert first.status == "clean" and second.status == "FALSE ALARM"
    assert result.false_alarms == (second,) and not result.ok
    text = render_table(result)
    assert "1/2 clean runs clean" in text
    assert f"false alarm: clean {RECIPES[Bug.NO_DEDUP_WINDOW].describe()}: duplicate" in text
    assert result.to_json()["false_alarms"] == [
        {"recipe": RECIPES[Bug.NO_DEDUP_WINDOW].describe(), "fired": ["duplicate"]}
    ]


def test_a_clean_run_without_a_verdict_fails_the_catalogue_too(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {"B11": [("duplicate",)]}, incomplete=frozenset({"clean"}))
    result = _run(cluster, [Bug.NO_DEDUP_WINDOW], clean_runs=1)
    (clean,) = result.clean
    assert clean.status == "NO VERDICT" and not clean.caught
    assert clean.runs[0].error == "the run did not complete: RuntimeError: boom"
    assert not result.ok
    assert "no verdict: clean" in render_table(result)


def test_a_bug_run_that_did_not_complete_is_not_a_detection(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {}, incomplete=frozenset({"B5"}))
    result = _run(cluster, [Bug.HW_AT_LEADER_LEO], clean_runs=0)
    (b5,) = result.bugs
    assert not b5.caught and all(r.error for r in b5.runs) and len(b5.runs) == 3


def test_a_failed_verification_is_no_verdict(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {})

    def broken(path: Path) -> Mapping[str, Any]:
        raise RuntimeError("no Java")

    result = asyncio.run(
        run_catalogue([Bug.NO_DEDUP_WINDOW], broken, run=cluster.run, runs=1, clean_runs=1)
    )
    assert result.clean[0].status == "NO VERDICT"
    assert result.clean[0].runs[0].error == "verification: RuntimeError: no Java"


def test_the_harness_final_check_counts_as_a_check(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, {}, final_fails=frozenset({"B1"}))
    result = _run(cluster, [Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER], clean_runs=0)
    assert result.bugs[0].fired == (HARNESS_FINAL_CHECK,)


def test_fired_checks_are_the_invalid_ones_and_a_failed_final_check() -> None:
    verdict = {
        "checks": {
            "G1a": {"valid": False},
            "linearizable": {"valid": None},
            "duplicate": {"valid": True},
            "lost-write": {"valid": False},
        }
    }
    assert fired_checks(verdict, None) == ("G1a", "lost-write")
    assert fired_checks(verdict, {"final_check": {"ok": False}}) == (
        "G1a",
        "lost-write",
        HARNESS_FINAL_CHECK,
    )
    assert fired_checks({"checks": {}}, {"final_check": None}) == ()


def test_a_bug_without_a_recipe_is_refused() -> None:
    with pytest.raises(ValueError, match="no recipe for B5"):
        asyncio.run(
            run_catalogue(
                [Bug.HW_AT_LEADER_LEO], lambda p: {}, recipes={}, run=FakeCluster(Path(), {}).run
            )
        )


def test_the_table_of_a_hand_made_catalogue() -> None:
    recipe = Recipe("queue", ("kill",), ("lost-write",), budget=2)
    caught = BugResult(
        Bug.HW_AT_LEADER_LEO,
        recipe,
        (RunOutcome(None, 1, (), 10.0), RunOutcome(None, 2, ("lost-write",), 12.5)),
        budget=2,
    )
    clean = BugResult(None, recipe, (RunOutcome(None, 3, (), 9.0),))
    text = render_table(Catalogue((caught,), (clean,), 31.5))
    lines = text.splitlines()
    assert lines[1].split() == [
        "B5", "hw-at-leader-leo", "queue", "kill", "acks=all", "rf=3", "min-isr=2",
        "lag=1.5s", "30/s", "15s", "x2", "lost-write", "2/2", "22s", "caught",
    ]  # fmt: skip
    assert lines[2].split()[0] == "clean" and lines[2].split()[-3:] == ["-/1", "9s", "clean"]
    assert lines[3] == "1/1 bugs caught; 1/1 clean runs clean; 32 s"


# -- the command -------------------------------------------------------------------------


def test_catalogue_list_prints_every_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "catalogue", "--list"]) == 0
    out = capsys.readouterr().out
    for bug in Bug:
        assert f"{bug.id} {bug.title}" in out
    assert recipe_table([Bug.HW_AT_LEADER_LEO]).splitlines()[1].endswith("lost-write, no-loss")
    b3 = recipe_table([Bug.NO_EPOCH_START_ENTRY]).splitlines()[1]
    assert b3.endswith("none (benign: a negative control)")
    assert main(["chaos", "catalogue", "--list", "--bugs", "B5,q1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["Q1", "B5"]


def test_catalogue_refuses_unknown_bugs_and_an_inherited_switch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["chaos", "catalogue", "--bugs", "B99"])
    assert exc.value.code == 2
    assert "unknown bug 'B99'" in capsys.readouterr().err
    monkeypatch.setenv(bugs.BUGS_VARIABLE, "B5")
    assert main(["chaos", "catalogue", "--bugs", "B5"]) == 2
    assert "KQ_INJECT_BUGS is set" in capsys.readouterr().err


def test_chaos_run_refuses_bugs_without_the_acknowledgement(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(bugs.BUGS_VARIABLE, "B5")
    monkeypatch.delenv(bugs.ACK_VARIABLE, raising=False)
    code = main(["chaos", "run", "--runs-dir", str(tmp_path), "--time-limit", "1"])
    assert code == 2
    assert "refusing to start unless KQ_INJECT_BUGS_ACK" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- the bugs reach the run ------------------------------------------------------------


class _SeeingBackend(BrokenBackend):
    """Fails to start, after noting which bugs were on in this process."""

    seen: list[frozenset[Bug]] = []

    async def start(self) -> None:
        _SeeingBackend.seen.append(bugs.active())
        await super().start()


def _run_with_bugs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: frozenset[Bug]
) -> tuple[Mapping[str, str] | None, RunResult]:
    given: list[Mapping[str, str] | None] = []

    def make(
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> ClusterBackend:
        given.append(env)
        return _SeeingBackend(nodes)

    monkeypatch.setitem(BACKENDS, "seeing", BackendSpec(make, "test"))
    config = RunConfig(name="b", backend="seeing", runs_dir=str(tmp_path), seed=1, bugs=on)
    result = asyncio.run(run_chaos(config))
    assert len(given) == 1
    return given[0], result


def test_a_run_passes_its_bugs_to_the_nodes_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _SeeingBackend.seen.clear()
    on = frozenset({Bug.HW_AT_LEADER_LEO, Bug.HARNESS_NOT_LEADER_AS_FAIL})
    env, result = _run_with_bugs(tmp_path, monkeypatch, on)
    assert env == {bugs.BUGS_VARIABLE: "B5,B18", bugs.ACK_VARIABLE: bugs.ACKNOWLEDGEMENT}
    assert bugs.from_environment(env) == on
    # The chaos client's own bug is on in this process during the run only.
    assert _SeeingBackend.seen == [frozenset({Bug.HARNESS_NOT_LEADER_AS_FAIL})]
    assert bugs.active() == frozenset()
    run = RunDir(result.path)
    assert json.loads(run.config.read_text())["bugs"] == ["B5", "B18"]
    assert json.loads(run.summary.read_text())["bugs"] == ["B5", "B18"]
    replay = json.loads(run.config.read_text())["replay"]
    assert replay.startswith(
        "KQ_INJECT_BUGS=B5,B18 KQ_INJECT_BUGS_ACK=this-build-loses-data kq chaos run "
    )
    assert "deliberate bugs on" in (run.logs / "harness.log").read_text()


def test_a_run_without_bugs_never_inherits_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, result = _run_with_bugs(tmp_path, monkeypatch, frozenset())
    assert env is None  # nothing to override: the nodes inherit no switch
    assert json.loads(RunDir(result.path).summary.read_text())["bugs"] == []
    monkeypatch.setenv(bugs.BUGS_VARIABLE, "B5")
    monkeypatch.setenv(bugs.ACK_VARIABLE, bugs.ACKNOWLEDGEMENT)
    env, _ = _run_with_bugs(tmp_path, monkeypatch, frozenset())
    assert env == bug_environment(frozenset()) == {bugs.BUGS_VARIABLE: "", bugs.ACK_VARIABLE: ""}
    assert env is not None and bugs.from_environment(env) == frozenset()
