"""kq: a KRaft-style (Kafka Raft) metadata quorum service.

This package holds the ``kq`` command line (:mod:`kq.cli`) and the protobuf and
gRPC modules generated from ``proto/kq/*.proto`` at install time
(``kq.raft_pb2``, ``kq.raft_pb2_grpc``).
"""

__version__ = "0.1.0"
