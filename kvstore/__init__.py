"""The replicated key-value store: a plug-in of a quorum node.

- :mod:`kvstore.state_machine`: its records and state machine (pure), a
  :class:`~quorum.shared_log.LogPart` of the node's log;
- :mod:`kvstore.service`: ``kq.kv.KvService`` on the node's gRPC server;
- :mod:`kvstore.client`: the client (``kq kv``, the chaos harness's
  ``--store kv``, the benchmarks).

It sees the quorum through the node's seams (``quorum.driver.raft_client``,
``quorum.driver.plugin``), as the metadata controller does.
"""
