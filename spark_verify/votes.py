"""``vote-durability``: the votes a node granted survive its restarts.

The same check, with the same definitions, as the pure reference
``history.votes`` (``docs/verification.md``, "vote-durability"), over each
node's ``votes.jsonl`` (``docs/history-format.md``, node exports): the votes
it granted (``grant``) and its candidacies (``candidate``, a vote for
itself), the quorum state each start restored (``start``) and the one its
storage held at the end (``stored``).

- ``vote-forgotten`` and ``epoch-forgotten``: each restoring line joined
  with the node's vote lines of earlier lives, reduced to the highest epoch
  voted in and its first vote (``max`` of (epoch, -seq)); the line forgot
  the vote if it restores that epoch with another ``voted_for``, or an
  older epoch;
- ``double-vote``: a group-by of the vote lines over (run, node, epoch)
  whose least and greatest ``voted_for`` differ.

Raft keeps ``votedFor`` durable before the vote is answered (Ongaro's thesis,
§3.8); KRaft keeps it in the quorum-state file (KIP-595).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_verify.load import RunInput, _load_exports
from spark_verify.verdict import MAX_ANOMALIES, Anomaly, CheckResult, result_of

__all__ = [
    "VOTE_COLUMNS",
    "VOTE_DURABILITY",
    "check_vote_durability",
    "check_vote_runs",
    "load_vote_exports",
    "vote_message",
]

VOTE_DURABILITY: Final = "vote-durability"
VOTE_COLUMNS: Final = (
    ("node", "bigint"),
    ("time", "bigint"),
    ("life", "bigint"),
    ("event", "string"),
    ("epoch", "bigint"),
    ("voted_for", "bigint"),
    ("leader", "bigint"),
)
_NAMES: Final = ("run", "node", "seq", "time", "life", "event", "epoch", "voted_for", "leader")
# As history.votes (spark_verify reads the same files without importing it).
_VOTES: Final = ("grant", "candidate")
_RESTORES: Final = ("start", "stored")


def load_vote_exports(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """Every node's ``votes.jsonl``: ``run``, ``node``, ``seq`` (the 0-based
    line of the node's file), then the file's fields; a field absent or of
    the wrong type is NULL."""
    return _load_exports(spark, runs, "votes", VOTE_COLUMNS)


def check_vote_runs(spark: SparkSession, runs: Sequence[RunInput]) -> CheckResult:
    """The check over the runs that exported votes; not applicable (and no
    Spark job) when none did."""
    exported = [r for r in runs if any((f / "votes.jsonl").exists() for f in r.nodes.values())]
    if not exported:
        return result_of(
            VOTE_DURABILITY, [], detail={"applicable": False, "reason": "no vote exports"}
        )
    return check_vote_durability(load_vote_exports(spark, exported))


def vote_message(
    kind: str, node: int, vote: dict[str, Any], restored: dict[str, Any] | None
) -> str:
    """The sentence of one anomaly, worded as the reference's
    (``history.votes.vote_message``).  This package imports nothing of kq
    (``docs/architecture.md``): it goes to a Spark cluster alone, as the zip
    ``spark-submit --py-files`` takes (``spark_verify.package``), so it keeps
    its own copy of the wording, which ``tests/spark_verify/test_vote_messages.py``
    holds to the reference's for every kind and branch."""
    epoch = int(vote["epoch"])
    if kind == "double-vote":
        return (
            f"node {node} voted for two different candidates in epoch {epoch}: "
            f"votes are never changed within an epoch (Raft §3.4)"
        )
    assert restored is not None
    what = "its start" if restored["event"] == "start" else "its stored quorum state"
    voted = "nobody" if restored["voted_for"] is None else f"node {restored['voted_for']}"
    granted = "itself" if vote["event"] == "candidate" else f"node {vote['voted_for']}"
    if kind == "vote-forgotten":
        return (
            f"node {node} voted for {granted} in epoch {epoch}, but {what} "
            f"(life {restored['life']}) restored epoch {epoch} with a vote for {voted}: "
            f"votedFor must survive a restart (Raft §3.8, KIP-595's quorum-state file)"
        )
    return (
        f"node {node} voted for {granted} in epoch {epoch}, but {what} "
        f"(life {restored['life']}) restored epoch {restored['epoch']}, an older one: "
        f"the epoch and vote must survive a restart (Raft §3.8)"
    )


def check_vote_durability(votes: DataFrame) -> CheckResult:
    """``vote-durability`` over VOTES rows (the module's docstring)."""
    missing = [c for c in _NAMES if c not in votes.columns]
    if missing:
        raise ValueError(f"VOTES lacks column(s) {', '.join(missing)} (has {votes.columns})")
    cast = votes.select(*_NAMES)
    voted = cast.where(F.col("event").isin(list(_VOTES)) & F.col("voted_for").isNotNull())
    restored = cast.where(F.col("event").isin(list(_RESTORES)))

    v = voted.select(
        "run",
        "node",
        F.col("life").alias("v_life"),
        F.struct(F.col("epoch"), (-F.col("seq")).alias("neg_seq"), F.col("seq")).alias("v"),
    )
    top = (
        restored.alias("r")
        .join(
            v.alias("v"),
            (F.col("r.run") == F.col("v.run"))
            & (F.col("r.node") == F.col("v.node"))
            & (F.col("v.v_life") < F.col("r.life")),
        )
        .groupBy("r.run", "r.node", "r.seq", "r.epoch", "r.voted_for")
        .agg(F.max("v.v").alias("top"))
    )
    first_vote = voted.select(
        "run", "node", F.col("seq").alias("top_seq"), F.col("voted_for").alias("top_for")
    )
    forgot = (
        top.withColumn("top_seq", F.col("top.seq"))
        .join(first_vote, ["run", "node", "top_seq"])
        .select(
            "run",
            "node",
            F.col("top.epoch").alias("epoch"),
            "top_seq",
            F.col("seq").alias("r_seq"),
            F.when(F.col("epoch") < F.col("top.epoch"), F.lit("epoch-forgotten"))
            .when(
                (F.col("epoch") == F.col("top.epoch"))
                & ~F.col("voted_for").eqNullSafe(F.col("top_for")),
                F.lit("vote-forgotten"),
            )
            .alias("kind"),
        )
        .where(F.col("kind").isNotNull())
    )
    doubles = (
        voted.groupBy("run", "node", "epoch")
        .agg(
            F.min("voted_for").alias("lo"),
            F.max("voted_for").alias("hi"),
            F.max("seq").alias("last"),
        )
        .where(F.col("lo") != F.col("hi"))
        .select(
            "run",
            "node",
            "epoch",
            F.lit(None).cast("bigint").alias("top_seq"),
            F.col("last").alias("r_seq"),
            F.lit("double-vote").alias("kind"),
        )
    )
    found = forgot.unionByName(doubles)
    kinds = {r["kind"]: r["count"] for r in found.groupBy("kind").count().collect()}
    total = sum(kinds.values())
    rows = (
        found.orderBy("run", "node", "epoch", "r_seq").limit(MAX_ANOMALIES).collect()
        if total
        else []
    )
    anomalies: list[Anomaly] = []
    if rows:
        wanted = {(r["run"], r["node"]) for r in rows}
        lines: dict[tuple[str, int], list[dict[str, Any]]] = {k: [] for k in wanted}
        keys = cast.sparkSession.createDataFrame(sorted(wanted), "run string, node bigint")
        for row in cast.join(F.broadcast(keys), ["run", "node"]).collect():
            d = row.asDict()
            lines[(d["run"], d["node"])].append(d)
        for r in rows:
            node_lines = {d["seq"]: d for d in lines[(r["run"], r["node"])]}
            if r["kind"] == "double-vote":
                firsts: dict[int, dict[str, Any]] = {}
                for d in sorted(node_lines.values(), key=lambda d: d["seq"]):
                    if d["event"] in _VOTES and d["epoch"] == r["epoch"]:
                        firsts.setdefault(d["voted_for"], d)
                witness = tuple(sorted(firsts.values(), key=lambda d: d["seq"]))
                message = vote_message("double-vote", r["node"], witness[0], None)
            else:
                vote, line = node_lines[r["top_seq"]], node_lines[r["r_seq"]]
                witness = (vote, line)
                message = vote_message(r["kind"], r["node"], vote, line)
            anomalies.append(
                Anomaly(
                    VOTE_DURABILITY,
                    r["kind"],
                    message,
                    run=r["run"],
                    node=r["node"],
                    witness=witness,
                )
            )
    counts = (
        cast.groupBy()
        .agg(
            F.sum(F.col("event").isin(list(_VOTES)).cast("long")).alias("votes"),
            F.sum(F.col("event").isin(list(_RESTORES)).cast("long")).alias("restores"),
        )
        .collect()[0]
    )
    detail = {
        "applicable": True,
        "kinds": kinds,
        "votes": int(counts["votes"] or 0),
        "restores": int(counts["restores"] or 0),
    }
    return result_of(VOTE_DURABILITY, anomalies, count=total, detail=detail)
