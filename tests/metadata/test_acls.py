"""ACL bindings in the metadata log and the authorizer that reads them
(metadata/acls.py, metadata/authorizer.py, metadata/acl_control.py): replay,
snapshots, Kafka StandardAuthorizer's rules with known answers, and
properties over any set of bindings."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.acl_control import describe_acls
from metadata.acls import (
    CLUSTER_NAME,
    AclBindingFilter,
    AclOperation,
    AclPermission,
    AclResourceType,
    InvalidAclError,
    PatternType,
    StandardAcl,
)
from metadata.authorizer import Action, AuthorizerSettings, Decision, authorize, cluster
from metadata.controller import Controller, ControllerOptions
from metadata.delta import MetadataDelta, ReplayError
from metadata.errors import ApiError, Errors
from metadata.image import MetadataImage
from metadata.records import (
    AccessControlEntryRecord,
    Record,
    RemoveAccessControlEntryRecord,
)

TOPIC = AclResourceType.TOPIC
GROUP = AclResourceType.GROUP
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
ALLOW = AclPermission.ALLOW
DENY = AclPermission.DENY
Op = AclOperation


def acl(
    principal: str = "User:alice",
    op: AclOperation = Op.READ,
    permission: AclPermission = ALLOW,
    name: str = "orders",
    pattern: PatternType = LITERAL,
    rtype: AclResourceType = TOPIC,
    host: str = "*",
) -> StandardAcl:
    return StandardAcl(rtype, name, pattern, principal, host, op, permission)


def image_of(*acls: StandardAcl) -> MetadataImage:
    delta = MetadataDelta(MetadataImage())
    for i, a in enumerate(acls):
        delta.replay(AccessControlEntryRecord.of(f"id-{i}", a), i, 1)
    return delta.apply()


NO_SETTINGS = AuthorizerSettings()


def decide(
    image: MetadataImage,
    principal: str = "User:alice",
    op: AclOperation = Op.READ,
    name: str = "orders",
    rtype: AclResourceType = TOPIC,
    host: str = "10.0.0.1",
    settings: AuthorizerSettings = NO_SETTINGS,
) -> Decision:
    return authorize(image.acls, settings, principal, host, Action(op, rtype, name)).decision


A, D = Decision.ALLOWED, Decision.DENIED


# -- records, replay, snapshots ------------------------------------------------------


def test_replay_adds_and_removes_bindings_and_snapshots_carry_them() -> None:
    image = image_of(acl(), acl(name="pay-", pattern=PREFIXED, op=Op.WRITE))
    assert len(image.acls) == 2
    assert {a.resource_name for a in image.acls.on_resource(TOPIC, "pay-eu")} == {"pay-"}
    # A snapshot is to_records(); replaying it gives the same ACLs.
    again = MetadataDelta(MetadataImage())
    for i, r in enumerate(image.to_records()):
        again.replay(r, i, 1)
    assert again.apply().acls.by_id == image.acls.by_id
    delta = MetadataDelta(image)
    delta.replay(RemoveAccessControlEntryRecord("id-0"), 10, 1)
    after = delta.apply()
    assert set(after.acls.by_id) == {"id-1"}
    assert list(after.acls.on_resource(TOPIC, "orders")) == []
    # The old image is untouched.
    assert len(list(image.acls.on_resource(TOPIC, "orders"))) == 1


@pytest.mark.parametrize(
    ("records", "fragment"),
    [
        (
            [AccessControlEntryRecord.of("x", acl()), AccessControlEntryRecord.of("x", acl())],
            "ACL x already exists",
        ),
        ([RemoveAccessControlEntryRecord("nope")], "removing ACL nope, which does not exist"),
        ([AccessControlEntryRecord.of("x", acl(principal="alice"))], "ACL x is not valid"),
        ([AccessControlEntryRecord.of("x", acl(pattern=PatternType.MATCH))], "is a filter"),
    ],
)
def test_replay_refuses_what_the_controller_never_writes(
    records: list[Record], fragment: str
) -> None:
    delta = MetadataDelta(MetadataImage())
    with pytest.raises(ReplayError, match=fragment):
        for i, r in enumerate(records):
            delta.replay(r, i, 1)


def test_an_id_removed_and_added_again_in_one_delta_is_indexed_once() -> None:
    image = image_of(acl())
    delta = MetadataDelta(image)
    delta.replay(RemoveAccessControlEntryRecord("id-0"), 5, 1)
    delta.replay(AccessControlEntryRecord.of("id-0", acl(name="other")), 6, 1)
    after = delta.apply()
    assert list(after.acls.on_resource(TOPIC, "orders")) == []
    assert [a.resource_name for a in after.acls.on_resource(TOPIC, "other")] == ["other"]


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (acl(rtype=AclResourceType.ANY), "not a resource"),
        (acl(pattern=PatternType.ANY), "is a filter"),
        (acl(name=""), "must not be empty"),
        (acl(rtype=AclResourceType.CLUSTER, name="other"), "cluster resource is the literal"),
        (acl(name="*", pattern=PREFIXED), "prefixed pattern of '*'"),
        (acl(principal="Nobody:x"), "not Type:name"),
        (acl(host=""), "host must not be empty"),
        (acl(op=Op.ANY), "not an operation"),
        (acl(permission=AclPermission.ANY), "not ALLOW or DENY"),
    ],
)
def test_invalid_bindings_are_named(bad: StandardAcl, fragment: str) -> None:
    with pytest.raises(InvalidAclError, match=fragment):
        bad.check()


# -- the authorizer's rules, known answers ---------------------------------------------


def test_no_acl_is_deny_unless_allow_everyone() -> None:
    empty = image_of()
    assert decide(empty) is D
    everyone = AuthorizerSettings(allow_everyone_if_no_acl_found=True)
    assert decide(empty, settings=everyone) is A
    # Once the resource has any binding (for someone else), the default is gone.
    bob = image_of(acl(principal="User:bob"))
    assert decide(bob, settings=everyone) is D
    # ... but only on that resource.
    assert decide(bob, name="other", settings=everyone) is A


def test_super_users_are_always_allowed() -> None:
    image = image_of(acl(principal="User:admin", permission=DENY, op=Op.ALL))
    su = AuthorizerSettings(super_users=frozenset({"User:admin"}))
    assert decide(image, "User:admin", Op.DELETE, settings=su) is A
    assert decide(image, "User:admin", Op.DELETE) is D
    with pytest.raises(ValueError, match="everyone do anything"):
        AuthorizerSettings(super_users=frozenset({"User:*"}))


def test_literal_wildcard_and_prefixed_patterns() -> None:
    image = image_of(
        acl(name="orders"),
        acl(name="*", op=Op.WRITE),
        acl(name="pay", pattern=PREFIXED, op=Op.DELETE),
    )
    assert decide(image, op=Op.READ) is A
    assert decide(image, op=Op.READ, name="orders2") is D
    assert decide(image, op=Op.WRITE, name="anything") is A
    assert decide(image, op=Op.DELETE, name="payments") is A
    assert decide(image, op=Op.DELETE, name="pay") is A
    assert decide(image, op=Op.DELETE, name="pa") is D
    # Another resource type is another namespace.
    assert decide(image, op=Op.READ, rtype=GROUP) is D


def test_deny_wins_over_allow() -> None:
    image = image_of(acl(op=Op.ALL), acl(op=Op.WRITE, permission=DENY))
    assert decide(image, op=Op.READ) is A
    assert decide(image, op=Op.WRITE) is D
    # A prefixed DENY beats a literal ALLOW.
    image = image_of(acl(), acl(name="ord", pattern=PREFIXED, permission=DENY))
    assert decide(image) is D
    # DENY ALL denies everything.
    assert decide(image_of(acl(op=Op.ALL), acl(op=Op.ALL, permission=DENY)), op=Op.CREATE) is D


def test_implied_operations() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert decide(image_of(acl(op=op)), op=Op.DESCRIBE) is A, op
    assert decide(image_of(acl(op=Op.CREATE)), op=Op.DESCRIBE) is D
    assert decide(image_of(acl(op=Op.ALTER_CONFIGS)), op=Op.DESCRIBE_CONFIGS) is A
    assert decide(image_of(acl(op=Op.DESCRIBE_CONFIGS)), op=Op.ALTER_CONFIGS) is D
    assert decide(image_of(acl(op=Op.ALTER)), op=Op.ALTER_CONFIGS) is D
    # Implication widens allows, never denies: DENY READ leaves DESCRIBE.
    image = image_of(acl(op=Op.ALL), acl(op=Op.READ, permission=DENY))
    assert decide(image, op=Op.DESCRIBE) is A
    assert decide(image, op=Op.READ) is D


def test_principals_and_hosts() -> None:
    image = image_of(acl(principal="User:*"), acl(op=Op.WRITE, host="10.0.0.9"))
    assert decide(image, "User:carol") is A
    assert decide(image, "Broker:3") is A  # User:* matches any principal, as in Kafka
    assert decide(image, op=Op.WRITE, host="10.0.0.9") is A
    assert decide(image, op=Op.WRITE, host="10.0.0.1") is D
    assert decide(image_of(acl(principal="User:bob")), "User:alice") is D


def test_the_cluster_resource() -> None:
    image = image_of(acl(rtype=AclResourceType.CLUSTER, name=CLUSTER_NAME, op=Op.ALTER))
    verdict = authorize(image.acls, AuthorizerSettings(), "User:alice", "h", cluster(Op.ALTER))
    assert verdict.allowed and "allowed by ACL" in verdict.reason
    verdict = authorize(image.acls, AuthorizerSettings(), "User:bob", "h", cluster(Op.ALTER))
    assert not verdict.allowed and verdict.reason == "no ACL allows it"


# -- properties ----------------------------------------------------------------------

PRINCIPALS = ["User:alice", "User:bob", "User:*"]
NAMES = ["orders", "ord", "o", "*", "pay"]
OPS = [o for o in AclOperation if o not in (Op.UNKNOWN, Op.ANY)]

acls_ = st.builds(
    StandardAcl,
    st.sampled_from([TOPIC, GROUP]),
    st.sampled_from(NAMES),
    st.sampled_from([LITERAL, PREFIXED]),
    st.sampled_from(PRINCIPALS),
    st.sampled_from(["*", "10.0.0.1", "10.0.0.2"]),
    st.sampled_from(OPS),
    st.sampled_from([ALLOW, DENY]),
).filter(lambda a: not (a.pattern_type is PREFIXED and a.resource_name == "*"))
actions = st.builds(
    Action, st.sampled_from(OPS), st.sampled_from([TOPIC, GROUP]), st.sampled_from(NAMES[:3])
)
who = st.sampled_from(["User:alice", "User:bob"])
hosts = st.sampled_from(["10.0.0.1", "10.0.0.2"])
everyone = st.booleans().map(lambda b: AuthorizerSettings(allow_everyone_if_no_acl_found=b))


@settings(max_examples=300, deadline=None)
@given(st.lists(acls_, max_size=8), acls_, actions, who, hosts, everyone)
def test_adding_a_deny_never_grants(
    base: list[StandardAcl],
    extra: StandardAcl,
    action: Action,
    principal: str,
    host: str,
    s: AuthorizerSettings,
) -> None:
    deny = dataclasses.replace(extra, permission=DENY)
    before = authorize(image_of(*base).acls, s, principal, host, action)
    after = authorize(image_of(*base, deny).acls, s, principal, host, action)
    assert before.allowed or not after.allowed


@settings(max_examples=300, deadline=None)
@given(st.lists(acls_, max_size=8), acls_, actions, who, hosts)
def test_adding_an_allow_never_denies(
    base: list[StandardAcl], extra: StandardAcl, action: Action, principal: str, host: str
) -> None:
    # Without allow_everyone_if_no_acl_found (with it, any first binding on
    # a resource ends everyone's default access: Kafka's rule, tested above).
    allow = dataclasses.replace(extra, permission=ALLOW)
    s = AuthorizerSettings()
    before = authorize(image_of(*base).acls, s, principal, host, action)
    after = authorize(image_of(*base, allow).acls, s, principal, host, action)
    assert after.allowed or not before.allowed


@settings(max_examples=300, deadline=None)
@given(st.lists(acls_, max_size=8), actions, hosts)
def test_bindings_of_other_principals_do_not_matter(
    base: list[StandardAcl], action: Action, host: str
) -> None:
    # alice's answer is the same whatever bob's own bindings say, as long
    # as the resource has some binding either way.
    mine = [a for a in base if a.principal != "User:bob"]
    s = AuthorizerSettings()
    full = authorize(image_of(*base).acls, s, "User:alice", host, action)
    alone = authorize(image_of(*mine).acls, s, "User:alice", host, action)
    assert full.allowed == alone.allowed


@settings(max_examples=200, deadline=None)
@given(st.lists(acls_, max_size=8), actions, who, hosts)
def test_the_index_finds_what_a_full_scan_finds(
    base: list[StandardAcl], action: Action, principal: str, host: str
) -> None:
    image = image_of(*base)
    indexed = sorted(map(str, image.acls.on_resource(action.resource_type, action.resource_name)))
    match = AclBindingFilter(action.resource_type, action.resource_name, PatternType.MATCH)
    scanned = sorted(str(a) for _, a in describe_acls(image, match))
    assert indexed == scanned


# -- the controller's decisions -------------------------------------------------------


def controller_with(*acls: StandardAcl) -> Controller:
    c = Controller(ControllerOptions("c"), random.Random(7))
    c.reset(image_of(*acls))
    c.next_offset = 100
    return c


def test_create_acls_writes_new_bindings_once_and_refuses_bad_ones() -> None:
    c = controller_with(acl())
    made = c.create_acls([acl(), acl(op=Op.WRITE), acl(op=Op.WRITE), acl(principal="bob")])
    assert [r.error for r in made.response] == [
        Errors.NONE,
        Errors.NONE,
        Errors.NONE,
        Errors.INVALID_REQUEST,
    ]
    assert "not Type:name" in made.response[3].message
    assert len(made.records) == 1
    record = made.records[0]
    assert isinstance(record, AccessControlEntryRecord) and record.acl == acl(op=Op.WRITE)
    assert record.id not in c.image.acls.by_id
    c.replay(made.records, 100, 1)
    assert len(c.image.acls) == 2


def test_delete_acls_by_filters() -> None:
    c = controller_with(
        acl(),
        acl(op=Op.WRITE),
        acl(name="pay", pattern=PREFIXED),
        acl(principal="User:bob", name="*"),
    )
    made = c.delete_acls(
        [
            AclBindingFilter(TOPIC, "orders", PatternType.LITERAL, principal="User:alice"),
            # MATCH finds the literal name, '*' and the prefixes: bob's '*'
            # (alice's were taken by the first filter: deleted once).
            AclBindingFilter(TOPIC, "orders", PatternType.MATCH),
            AclBindingFilter(permission=AclPermission.UNKNOWN),
        ]
    )
    first, second, bad = made.response
    assert isinstance(first, list) and {a.operation for _, a in first} == {Op.READ, Op.WRITE}
    assert isinstance(second, list) and [a.principal for _, a in second] == ["User:bob"]
    assert isinstance(bad, ApiError) and "UNKNOWN" in bad.message
    assert len(made.records) == 3
    c.replay(made.records, 100, 1)
    assert [a.resource_name for a in c.image.acls.by_id.values()] == ["pay"]
    # ANY with a name is that exact name, any pattern type.
    exact = describe_acls(c.image, AclBindingFilter(resource_name="pay"))
    assert len(exact) == 1
    assert describe_acls(c.image, AclBindingFilter(resource_name="payments")) == []
