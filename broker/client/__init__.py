"""The pure core of kq's producer and consumer clients (docs/clients.md).

Kafka's Java client decisions without I/O, so that the gRPC client is a thin
driver over them: the partitioners (``partitioner``), the record
accumulator with batching, readiness, draining and delivery timeouts
(``accumulator``), the idempotent producer's sequences and its reading of
every answer (``sequencing``), and the consumer's positions and fetches
(``consumer``). No asyncio, grpc, socket, time, os, threading or global
randomness: time enters as ``now_ms``, randomness as a ``random.Random``.
"""
