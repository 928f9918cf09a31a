"""Pairing each invoke with its completion, in Spark, and the nemesis's fault intervals.

A history is a sequence of events per process: each process is single
threaded (Jepsen's model, ``docs/history-format.md``), so its invoke is
answered by the next event of the same process.  The pairing of the
reference checker (``history.ops.check_well_formed``) is a state machine per
process whose state after an event depends on that event alone: after an
invoke the process has that op in flight, after a completion it has
nothing.  So the state *before* an event is given by the previous event of
its process, and one ``lag`` over a window partitioned by (run, process) and
ordered by ``index`` pairs the whole history with one shuffle, no matter its
size, without collecting rows to the driver:

- a completion whose previous event is an invoke completes it (with the
  same ``f`` and ``key``, or ``completion-mismatch``); otherwise it is an
  ``unmatched-completion``;
- an invoke whose previous event is an invoke is a ``concurrent-invoke``
  (the earlier one is then never completed, and the reference, which
  replaces it, does not report it again);
- an invoke that is its process's last event is an ``open-invoke``;
- a client invoke after a (matched) ``info`` of its process is
  ``invoke-after-info``: Jepsen retires a process whose op is indeterminate,
  because that op may still take effect at any later time (Knossos models
  it as running forever).

``ops`` holds each client invoke completed by the next event of its process
with the same ``f`` and ``key``: the operations a linearizability checker
(Wing & Gong; Knossos, Porcupine) takes, each with its interval
``[call, ret]`` (``ret`` NULL for ``info``: it may take effect any time
after its call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_verify.load import HISTORY_COLUMNS, op_line
from spark_verify.ops import PAIRED_COLUMNS

__all__ = [
    "NEMESIS_COLUMNS",
    "NEMESIS_ENDS",
    "Paired",
    "pair_ops",
]

NEMESIS_COLUMNS: Final = ("run", "f", "kind", "nodes", "start", "end", "value", "index", "type")
"""The NEMESIS schema, then ``index`` (the fault's invoke) and ``type`` (its
completion's: ``ok``, or ``info`` when it may have happened)."""

NEMESIS_ENDS: Final = {"kill": "start", "pause": "resume", "partition": "heal", "packet": "heal"}
"""A fault that lasts and the op that ends it (as ``history.ops.NEMESIS_ENDS``)."""

_PER_NODE: Final = ("kill", "pause")
_OP_TYPES: Final = ("invoke", "ok", "fail", "info")
_NEMESIS: Final = "nemesis"


@dataclass(frozen=True, slots=True)
class Paired:
    """What :func:`pair_ops` finds: ``ops`` (PAIRED: client ops only),
    ``problems`` (``run, index, kind, message, line``) and ``nemesis``
    (NEMESIS: one row per fault that started, ``ok`` or ``info``)."""

    ops: DataFrame
    problems: DataFrame
    nemesis: DataFrame


def _problem(kind: str, when: Column, message: Column, line: Column) -> Column:
    return F.when(
        when, F.struct(F.lit(kind).alias("kind"), message.alias("message"), line.alias("line"))
    )


def _text(c: Column) -> Column:
    return c.cast("string")


def pair_ops(history: DataFrame) -> Paired:
    """Pair the invokes and completions of a :func:`spark_verify.load.load_history`
    frame (every run at once).

    Rows that cannot take part (no ``index``, ``process`` or ``f``, or a
    ``type`` that is not one of invoke/ok/fail/info) are left out: they
    are ``history_problems``'s.  Nothing runs until an action on a result.
    """
    c = F.col
    events = history.where(
        c("index").isNotNull()
        & c("process").isNotNull()
        & c("f").isNotNull()
        & c("type").isin(*_OP_TYPES)
    ).select(
        "run",
        *(name for name, _ in HISTORY_COLUMNS),
        op_line(history).alias("text"),
    )
    w = Window.partitionBy("run", "process").orderBy("index")
    prev_fields = ("index", "time", "type", "f", "key", "value", "text")
    step = events.select(
        "*",
        F.lag(F.struct(*[c(n) for n in prev_fields])).over(w).alias("prev"),
        F.lead("index").over(w).alias("next_index"),
    )
    in_flight = c("prev.type") == "invoke"
    completion = c("type") != "invoke"
    matched = completion & in_flight
    same = (c("prev.f") == c("f")) & c("prev.key").eqNullSafe(c("key"))
    client = c("process") != _NEMESIS
    # The first matched info of a client process retires it (Jepsen).
    retiring = F.when(matched & (c("type") == "info") & client, F.struct(c("index"), c("text")))
    earlier = w.rowsBetween(Window.unboundedPreceding, -1)
    steps = step.withColumn("retired", F.first(retiring, ignorenulls=True).over(earlier))

    both = F.concat_ws("\n", c("prev.text"), c("text"))
    proc = F.concat(F.lit("process "), c("process"))
    found = F.array_compact(
        F.array(
            _problem(
                "unmatched-completion",
                completion & ~F.coalesce(in_flight, F.lit(False)),
                F.concat(c("type"), F.lit(" by "), proc, F.lit(" with no invoke in flight")),
                c("text"),
            ),
            _problem(
                "completion-mismatch",
                matched & ~same,
                F.concat(
                    c("type"),
                    F.lit(" of f="),
                    c("f"),
                    F.lit(" key="),
                    F.coalesce(c("key"), F.lit("null")),
                    F.lit(" completes op "),
                    _text(c("prev.index")),
                    F.lit(", an invoke of f="),
                    c("prev.f"),
                    F.lit(" key="),
                    F.coalesce(c("prev.key"), F.lit("null")),
                ),
                both,
            ),
            _problem(
                "concurrent-invoke",
                ~completion & F.coalesce(in_flight, F.lit(False)),
                F.concat(
                    proc,
                    F.lit(" invokes "),
                    c("f"),
                    F.lit(" while op "),
                    _text(c("prev.index")),
                    F.lit(" ("),
                    c("prev.f"),
                    F.lit(") is in flight"),
                ),
                both,
            ),
            _problem(
                "open-invoke",
                ~completion & c("next_index").isNull(),
                F.concat(
                    proc,
                    F.lit("'s "),
                    c("f"),
                    F.lit(
                        " was never completed (a run ends by completing each op in flight as info)"
                    ),
                ),
                c("text"),
            ),
            _problem(
                "invoke-after-info",
                ~completion & client & c("retired").isNotNull(),
                F.concat(
                    proc,
                    F.lit(" invokes after its info at op "),
                    _text(c("retired.index")),
                    F.lit(" (a process retired by info never invokes again)"),
                ),
                F.concat_ws("\n", c("retired.text"), c("text")),
            ),
        )
    )
    pairing_problems = steps.select("run", "index", F.explode(found).alias("p")).select(
        "run", "index", "p.kind", "p.message", "p.line"
    )

    pairs = steps.where(matched & same).select(
        "run",
        "key",
        "process",
        "f",
        "type",
        c("prev.index").alias("index"),
        c("index").alias("complete_index"),
        c("prev.time").alias("call"),
        F.when(c("type") != "info", c("time")).alias("ret"),
        c("prev.value").alias("value"),
        c("value").alias("result"),
        "error",
        "node",
        "offset",
        "epoch",
        c("text"),
    )
    ops = pairs.where(client).select(*PAIRED_COLUMNS)
    nemesis, unended = _nemesis(pairs.where(~client))
    return Paired(ops, pairing_problems.unionByName(unended), nemesis)


def _nemesis(pairs: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Fault intervals and ``nemesis-unended`` problems from the paired
    nemesis ops.

    A fault that may have started (completion ``ok`` or ``info``: Jepsen's
    indeterminate nemesis op) lasts from its invoke until the ``ok``
    completion of the first later op that ends it: per node for ``kill``
    (``start``) and ``pause`` (``resume``), so a fault of several nodes ends
    when the last of them is ended; one ``heal`` ends every ``partition`` and
    ``packet`` in force.  A ``kill`` or ``pause`` without a list of node ids
    (an ``invalid-op``) has nothing to end and is left out, as the reference
    checker leaves it.

    One pass: each fault and each ending op becomes one row per target (a
    node, or -1 for the network), and a window per (run, family, target)
    ordered by completion finds the first ending op after each fault.
    """
    c = F.col
    value = F.try_parse_json(c("result"))
    node_ids = F.try_variant_get(value, "$.nodes", "array<bigint>")
    family = (
        F.when(c("f").isin("kill", "start"), F.lit("kill"))
        .when(c("f").isin("pause", "resume"), F.lit("pause"))
        .otherwise(F.lit("net"))
    )
    is_fault = c("f").isin(*NEMESIS_ENDS) & c("type").isin("ok", "info")
    is_end = c("f").isin(*set(NEMESIS_ENDS.values())) & (c("type") == "ok")
    rows = pairs.where(is_fault | is_end).select(
        "run",
        "f",
        "type",
        "index",
        "complete_index",
        "text",
        c("call").alias("start"),
        c("result").alias("value"),
        is_fault.alias("is_fault"),
        F.when(is_end, c("ret")).alias("end_time"),
        family.alias("family"),
        F.try_variant_get(value, "$.kind", "string").alias("kind"),
        F.coalesce(
            F.to_json(F.try_variant_get(value, "$.nodes", "variant")),
            F.to_json(F.try_variant_get(value, "$.groups", "variant")),
        ).alias("nodes"),
        F.explode(
            F.when(family == "net", F.array(F.lit(-1).cast("bigint"))).otherwise(node_ids)
        ).alias("target"),
    )
    later = (
        Window.partitionBy("run", "family", "target")
        .orderBy("complete_index")
        .rowsBetween(1, Window.unboundedFollowing)
    )
    per_target = rows.withColumn("end", F.first("end_time", ignorenulls=True).over(later)).where(
        "is_fault"
    )
    per_fault = per_target.groupBy(
        "run", "f", "kind", "nodes", "start", "value", "index", "type", "complete_index", "text"
    ).agg(
        F.max("end").alias("last_end"),
        F.count(F.lit(1)).alias("n"),
        F.count("end").alias("n_ended"),
        F.sort_array(F.collect_list(F.when(c("end").isNull(), c("target")))).alias("open"),
    )
    nemesis = per_fault.select(
        "run",
        "f",
        "kind",
        "nodes",
        "start",
        F.when(c("n") == c("n_ended"), c("last_end")).alias("end"),
        "value",
        "index",
        "type",
    )
    open_nodes = F.array_join(F.transform("open", lambda n: n.cast("string")), ", ")
    unended = per_fault.where(c("n") != c("n_ended")).select(
        "run",
        c("complete_index").alias("index"),
        F.lit("nemesis-unended").alias("kind"),
        F.concat(
            c("f"),
            F.when(c("f").isin(*_PER_NODE), F.concat(F.lit(" of node(s) "), open_nodes)).otherwise(
                F.lit("")
            ),
            F.lit(" is never ended by a "),
            F.when(c("f") == "kill", F.lit("start"))
            .when(c("f") == "pause", F.lit("resume"))
            .otherwise(F.lit("heal")),
            F.lit(" (every fault that started must be ended before the history ends)"),
        ).alias("message"),
        c("text").alias("line"),
    )
    return nemesis, unended
