"""ACL bindings (Kafka's AclControlManager, KIP-801): CreateAcls and
DeleteAcls decide the records, DescribeAcls reads the image.  Pure:
decisions only."""

from __future__ import annotations

from collections.abc import Sequence

from metadata.acls import AclBindingFilter, InvalidAclError, StandardAcl
from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.image import MetadataImage
from metadata.records import AccessControlEntryRecord, Record, RemoveAccessControlEntryRecord
from metadata.requests import (
    MAX_RECORDS_PER_ATOMIC_OP,
    ControllerResult,
    ItemResult,
    new_topic_id,
)

__all__ = ["AclControl", "describe_acls"]


def describe_acls(image: MetadataImage, f: AclBindingFilter) -> list[tuple[str, StandardAcl]]:
    """The bindings ``f`` matches, by id."""
    return [(acl_id, acl) for acl_id, acl in image.acls.sorted_items() if f.matches(acl)]


class AclControl:
    """Decides on :class:`ControlState`'s image; changes nothing."""

    def __init__(self, state: ControlState) -> None:
        self.state = state

    def _fresh_id(self, taken: set[str]) -> str:
        # An ACL's id is a random Uuid, as a topic's (Kafka's
        # AclControlManager.newAclId); never one in use.
        while True:
            acl_id = new_topic_id(self.state.rng)
            if acl_id not in taken and acl_id not in self.state.image.acls.by_id:
                taken.add(acl_id)
                return acl_id

    def create_acls(self, acls: Sequence[StandardAcl]) -> ControllerResult[list[ItemResult]]:
        """One result per binding.  A binding that exists already (or twice
        in the request) is not written again and counts as created, as in
        Kafka; a binding that is not valid is refused, naming the fault."""
        if len(acls) > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"{len(acls)} ACLs in one request; at most {MAX_RECORDS_PER_ATOMIC_OP}",
            )
        existing = set(self.state.image.acls.by_id.values())
        taken: set[str] = set()
        records: list[Record] = []
        results: list[ItemResult] = []
        for acl in acls:
            try:
                acl.check()
            except InvalidAclError as exc:
                results.append(ItemResult(str(acl), Errors.INVALID_REQUEST, str(exc)))
                continue
            if acl not in existing:
                existing.add(acl)
                records.append(AccessControlEntryRecord.of(self._fresh_id(taken), acl))
            results.append(ItemResult(str(acl)))
        return ControllerResult(records, results)

    def delete_acls(
        self, filters: Sequence[AclBindingFilter]
    ) -> ControllerResult[list[list[tuple[str, StandardAcl]] | ApiError]]:
        """Per filter, the bindings it deleted; a binding matched by several
        filters is deleted once, under the first (Kafka's
        AclControlManager.deleteAcls)."""
        deleted: set[str] = set()
        records: list[Record] = []
        results: list[list[tuple[str, StandardAcl]] | ApiError] = []
        for f in filters:
            try:
                f.check()
            except InvalidAclError as exc:
                results.append(ApiError(Errors.INVALID_REQUEST, str(exc)))
                continue
            matched = [
                (acl_id, acl)
                for acl_id, acl in describe_acls(self.state.image, f)
                if acl_id not in deleted
            ]
            for acl_id, _ in matched:
                deleted.add(acl_id)
                records.append(RemoveAccessControlEntryRecord(acl_id))
            results.append(matched)
        if len(records) > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"the filters match {len(records)} ACLs; at most {MAX_RECORDS_PER_ATOMIC_OP} "
                "are deleted in one request: narrow them",
            )
        return ControllerResult(records, results)
