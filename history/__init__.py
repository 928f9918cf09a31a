"""The history format: the contract between the chaos harness, the
simulators and the verifiers (``docs/history-format.md``).

- :mod:`history.ops`: one operation (:class:`~history.ops.Op`), the recorder
  that numbers and times them, and the well-formedness rules (pure);
- :mod:`history.queue`: the ``queue`` model's values (Jepsen's Kafka
  workload: send, poll, assign, crash) and their shape checks (pure);
- :mod:`history.files`: histories as JSON Lines files, written as a run goes;
- :mod:`history.exports`, :mod:`history.export_files`: what each node exports
  after a run (its committed log and its role changes) and their files;
- :mod:`history.runs`: run folders (config, history, summary, node exports)
  and their checks.

A bottom layer: it imports nothing else of kq.  The simulator
(:mod:`quorum.sim`) and the chaos harness (:mod:`chaos`) write it;
``spark_verify`` reads the same files without importing it.
"""
