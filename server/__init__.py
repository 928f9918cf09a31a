"""Process assembly: what turns the libraries below into running processes.

- :mod:`server.config`: a controller's settings from a TOML file, ``KQ_*``
  variables and overrides, validated (no flag parsing: that is the
  commands');
- :mod:`server.controller`: a controller process: the quorum node, its
  plug-ins (the key-value store, the metadata controller), its gRPC server
  and metrics, run until a signal;
- :mod:`server.local_cluster`: the local cluster of ``kq cluster``, used by
  the chaos harness and the benchmarks too.

Above the quorum node and metadata (and, later, the brokers); below the
commands (:mod:`kq.commands`) and the tools (chaos, bench).
"""
