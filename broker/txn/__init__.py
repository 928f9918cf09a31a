"""The transaction coordinator (KIP-98, with KIP-890's server-side
defence): its pure core.

A transactional id lives in one partition of the compacted transaction
log (``__transaction_state``); the partition's leader is the id's
coordinator.  The core decides on a transaction's state and returns
records and an answer; only replaying records changes state
(:mod:`broker.txn.records` are the records, :mod:`broker.txn.codec` their
bytes, :mod:`broker.txn.coordinator` the decisions).
"""
