"""The protobuf and gRPC modules generated from ``proto/kqproto/*.proto``.

Generated at install time by ``tools/gen_proto.py`` (never committed):
``quorum_pb2`` (LeaderHint, LogPosition, the quorum's admin service),
``raft_pb2`` (between quorum nodes), ``kv_pb2`` (the key-value store) and
``metadata_pb2`` (the metadata services), each with its ``*_pb2_grpc``
module and typed stubs.  Every layer may import this package; it imports
nothing of kq.
"""
