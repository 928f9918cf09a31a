"""The group coordinator of consumer groups (KIP-848): its pure core.

A group lives in one partition of the compacted offsets topic
(``__consumer_offsets``); the partition's leader is the group's
coordinator.  The core decides on a group's state and returns records and
an answer; only replaying records changes state (:mod:`broker.group.records`
are the records, :mod:`broker.group.codec` their bytes,
:mod:`broker.group.assignors` the server-side assignors).
"""
