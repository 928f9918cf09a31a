"""kq: a KRaft-style (Kafka Raft) metadata quorum service.

This package is the ``kq`` command line: :mod:`kq.cli` dispatches to the
commands in :mod:`kq.commands`, thin adapters over the libraries below them
(``docs/architecture.md``).
"""

__version__ = "0.1.0"
