"""Client workloads of the chaos harness: each drives a data model's
operations against a cluster's client addresses and records them as a
history (``docs/history-format.md``)."""
