"""kq's Python clients over gRPC (docs/clients.md): the producer, the
consumer and the admin clients that talk to brokers' ``BrokerService``.

Each is a thin asyncio driver over the pure core of ``broker/client/``
(Kafka's client decisions without I/O): it keeps the cluster's metadata
(``metadata_cache``), moves the core's requests over gRPC (mutual TLS when
credentials are given) and hands every answer back to the core. ``sync``
wraps them for callers without an event loop (the commands).
"""

from broker.client.transactions import ConsumerGroupMetadata
from broker.grpc_client.admin import Admin, OffsetSpec, PartitionOffset
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.errors import (
    BrokerClientError,
    DeliveryFailedError,
    InvalidProducerEpochError,
    NoBrokerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
    TransactionStateError,
    UnknownTopicError,
)
from broker.grpc_client.metadata_cache import MetadataCache, PartitionInfo
from broker.grpc_client.producer import Producer, RecordMetadata
from broker.grpc_client.txn_admin import (
    AbortSpec,
    HangingTransaction,
    OpenTransactionNotFoundError,
    ProducerState,
    TransactionAdmin,
    TransactionDescription,
    TransactionListing,
    TransactionNotFoundError,
)

__all__ = [
    "AbortSpec",
    "Admin",
    "BrokerClientError",
    "Consumer",
    "ConsumerGroupMetadata",
    "DeliveryFailedError",
    "HangingTransaction",
    "InvalidProducerEpochError",
    "MetadataCache",
    "NoBrokerError",
    "OffsetSpec",
    "OpenTransactionNotFoundError",
    "PartitionInfo",
    "PartitionOffset",
    "Producer",
    "ProducerFencedError",
    "ProducerState",
    "RecordMetadata",
    "TransactionAbortableError",
    "TransactionAdmin",
    "TransactionDescription",
    "TransactionFatalError",
    "TransactionListing",
    "TransactionNotFoundError",
    "TransactionStateError",
    "UnknownTopicError",
]
