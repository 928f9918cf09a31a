"""The state machine a controller (or broker) runs on the quorum's log.

It implements :class:`quorum.shared_log.LogPart`: committed batches are
replayed in log order into the :class:`MetadataImage`.  It owns the
metadata records (:func:`metadata.records.is_metadata_record`); records of
other state machines sharing the log (the key-value store's) are skipped.
This is the only place the committed metadata changes: decide, then replay.

Snapshots hold the image as the records that rebuild it (Kafka's snapshots
are records too), so a node restarted from a snapshot and the log after it
holds exactly the image of a node that replayed the whole log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgpack

from metadata.delta import MetadataDelta
from metadata.image import EMPTY_IMAGE, MetadataImage
from metadata.records import decode_record, encode_record, is_metadata_record
from quorum.types import Batch, BatchKind, LeaderAndEpoch, SnapshotId

__all__ = ["CommitListener", "ControllerStateMachine", "decode_snapshot", "encode_snapshot"]

# 2: the image alone; 1 (still read): also the log digest and the key-value
# rows of the store that was embedded here before it became a plug-in of its
# own (the digest is the node's shared log's now).
SNAPSHOT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Called after each batch with metadata records: (the delta, the new image).
CommitListener = Callable[[MetadataDelta, MetadataImage], None]


class ControllerStateMachine:
    """Implements :class:`quorum.shared_log.LogPart`."""

    def __init__(self) -> None:
        self.image: MetadataImage = EMPTY_IMAGE
        self.leader = LeaderAndEpoch(None, 0)
        # The epoch of the last LeaderChange batch applied: once it equals
        # the leader's own epoch, everything before the leader's epoch start
        # is applied, so an active controller may decide (Kafka fires
        # handleLeaderChange to the leader only then).
        self.last_leader_change_epoch = 0
        self._applied = 0
        self._listeners: list[CommitListener] = []
        self._batch_listeners: list[Callable[[Batch], None]] = []
        self._load_listeners: list[Callable[[MetadataImage], None]] = []

    # -- listeners ----------------------------------------------------------------

    def add_listener(self, listener: CommitListener) -> None:
        """``listener(delta, image)`` after every batch that changed metadata."""
        self._listeners.append(listener)

    def add_batch_listener(self, listener: Callable[[Batch], None]) -> None:
        """``listener(batch)`` after every applied batch."""
        self._batch_listeners.append(listener)

    def add_load_listener(self, listener: Callable[[MetadataImage], None]) -> None:
        """``listener(image)`` after a snapshot replaced the whole state."""
        self._load_listeners.append(listener)

    # -- StateMachine ---------------------------------------------------------------

    @property
    def applied_offset(self) -> int:
        return self._applied

    def owns(self, record: bytes) -> bool:
        return is_metadata_record(record)

    def handle_commit(self, batch: Batch) -> Sequence[object]:
        if batch.base_offset != self._applied:
            raise ValueError(
                f"batch at offset {batch.base_offset} applied after offset {self._applied}"
            )
        results: list[object] = []
        delta: MetadataDelta | None = None
        if batch.kind is BatchKind.LEADER_CHANGE:
            self.last_leader_change_epoch = batch.epoch
            results = [None] * len(batch.records)
        else:
            for i, record in enumerate(batch.records):
                offset = batch.base_offset + i
                if is_metadata_record(record):
                    if delta is None:
                        delta = MetadataDelta(self.image)
                    delta.replay(decode_record(record), offset, batch.epoch)
                    results.append(None)
                else:
                    results.append(None)  # another state machine's
        self._applied = batch.end_offset
        if delta is not None:
            self.image = delta.apply().with_provenance(batch.end_offset, batch.epoch)
            for listener in self._listeners:
                listener(delta, self.image)
        else:
            self.image = self.image.with_provenance(batch.end_offset, batch.epoch)
        for batch_listener in self._batch_listeners:
            batch_listener(batch)
        return results

    def handle_load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        image = decode_snapshot(snapshot_id, data)
        self.image = image
        self._applied = snapshot_id.end_offset
        for listener in self._load_listeners:
            listener(image)

    def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.leader = leader

    def snapshot(self) -> bytes:
        return self.capture_snapshot()()

    def capture_snapshot(self) -> Callable[[], bytes]:
        # The image is immutable: holding it is the capture.
        image, applied = self.image, self._applied
        return lambda: encode_snapshot(image, applied)


def encode_snapshot(image: MetadataImage, applied: int) -> bytes:
    records = [encode_record(r) for r in image.to_records()]
    return bytes(
        msgpack.packb(
            {
                "version": SNAPSHOT_VERSION,
                "end_offset": applied,
                "epoch": image.epoch,
                "metadata": records,
            }
        )
    )


def decode_snapshot(snapshot_id: SnapshotId, data: bytes) -> MetadataImage:
    """The image of a snapshot; ValueError naming what is wrong with a
    malformed one."""
    try:
        obj = msgpack.unpackb(data)
        if not isinstance(obj, dict):
            raise ValueError("not a map")
        if obj.get("version") not in READABLE_VERSIONS:
            raise ValueError(
                f"snapshot format version {obj.get('version')!r}; this build reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        if obj["end_offset"] != snapshot_id.end_offset:
            raise ValueError(f"it holds the state at offset {obj['end_offset']}")
        delta = MetadataDelta(EMPTY_IMAGE)
        for raw in obj["metadata"]:
            delta.replay(decode_record(bytes(raw)), 0, 0)
        image = delta.apply().with_provenance(snapshot_id.end_offset, snapshot_id.epoch)
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed controller snapshot {snapshot_id}: {exc}") from exc
    return image
