"""Server-group policy arbitrated by the source (protocol/groups.py; design §5.3).

Racing schedulers each send a member of one group to the same host without
knowing of the other's; only the host sees both claims, and it must keep the
policy as it keeps the resources.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.document import apply_ops, copy_document
from protocol.errors import FieldError
from protocol.groups import AFFINITY, ANTI_AFFINITY, GROUP_KEY, ClaimGroup, group_conflict
from protocol.messages import Claim, ClaimResult, Delta, Snapshot
from protocol.source import SourceMachine

SRC = "compute-1"
EPOCH = 3
DOC = {"compute": {"vcpus": 64, "vcpus_used": 0, "memory_mb": 65536, "memory_mb_used": 0,
                   "num_instances": 0},
       "instances": {"old-1": {}, "old-2": {"claim": "x", "resources": {}, GROUP_KEY: "g-other"}}}


def machine() -> SourceMachine:
    m = SourceMachine(SRC, EPOCH, copy_document(DOC))
    m.poll(0.0)
    return m


def claim(m: SourceMachine, claim_id: str, instance: str, group: ClaimGroup | None,
          scheduler: str = "sched-a") -> Claim:
    return Claim(claim_id, scheduler, SRC, EPOCH, m.seq, {"vcpus": 1}, instance, {}, group)


def result(sends: list) -> ClaimResult:
    [res] = [s.message for s in sends if type(s.message) is ClaimResult]
    return res


def test_anti_affinity_counts_listed_members_and_members_recorded_by_the_arbiter() -> None:
    group = ClaimGroup("g", ANTI_AFFINITY, 1, ("old-1",))
    assert "anti-affinity" in (group_conflict(DOC["instances"], group, "new") or "")
    # a member the scheduler did not list counts when the arbiter recorded its group
    unlisted = ClaimGroup("g-other", ANTI_AFFINITY, 1, ())
    assert group_conflict(DOC["instances"], unlisted, "new") is not None
    # the instance itself (a move) does not count; a looser rule admits one more
    assert group_conflict(DOC["instances"], group, "old-1") is None
    assert group_conflict(DOC["instances"], ClaimGroup("g", ANTI_AFFINITY, 2, ("old-1",)), "new") is None
    assert group_conflict(DOC["instances"], None, "new") is None


def test_affinity_needs_a_located_member_here_unless_none_was_located() -> None:
    assert group_conflict(DOC["instances"], ClaimGroup("g", AFFINITY, 1, ()), "new") is None
    assert group_conflict(DOC["instances"], ClaimGroup("g", AFFINITY, 1, ("old-1",)), "new") is None
    elsewhere = ClaimGroup("g", AFFINITY, 1, ("on-another-host",))
    assert "other hosts" in (group_conflict(DOC["instances"], elsewhere, "new") or "")
    # an instance the arbiter recorded with the group anchors it here as well
    assert group_conflict(DOC["instances"], ClaimGroup("g-other", AFFINITY, 1, ("far",)), "new") is None


def test_racing_schedulers_cannot_put_two_anti_affinity_members_on_one_host() -> None:
    m = machine()
    # both decided on the same version, neither knowing the other's new member
    a = claim(m, "a:1", "member-a", ClaimGroup("g", ANTI_AFFINITY, 1, ()), "sched-a")
    b = claim(m, "b:1", "member-b", ClaimGroup("g", ANTI_AFFINITY, 1, ()), "sched-b")
    first = result(m.handle_claim(a, 1.0))
    assert first.accepted
    assert m.document["instances"]["member-a"][GROUP_KEY] == "g"
    second = m.handle_claim(b, 1.0)
    res = result(second)
    assert not res.accepted and "anti-affinity" in res.reason
    # the correction shows the member the second scheduler missed
    held = copy_document(DOC)
    for item in res.correction:
        assert type(item) is Delta
        apply_ops(held, item.ops)
    assert "member-a" in held["instances"]
    assert "member-b" not in m.document["instances"]


def test_claim_group_crosses_the_wire_and_bad_groups_are_refused() -> None:
    group = ClaimGroup("g-1", ANTI_AFFINITY, 2, ("m-1", "m-2"))
    msg = Claim("c", "sched", SRC, EPOCH, 0, {"vcpus": 1}, "i", {}, group)
    assert codec.decode(codec.encode(msg)) == msg
    bare = Claim("c", "sched", SRC, EPOCH, 0, {"vcpus": 1}, "i")
    assert codec.decode(codec.encode(bare)).group is None
    for bad in (ClaimGroup("", ANTI_AFFINITY), ClaimGroup("g", ANTI_AFFINITY, 0),
                ClaimGroup("g", ANTI_AFFINITY, 1, ("",))):
        with pytest.raises(FieldError):
            codec.decode(codec.encode(Claim("c", "sched", SRC, EPOCH, 0, {"vcpus": 1}, "i", {}, bad)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.integers(0, 2),
                          st.sampled_from([ANTI_AFFINITY, AFFINITY]), st.booleans()),
                min_size=1, max_size=12),
       st.integers(1, 3))
def test_any_interleaving_of_racing_claims_keeps_the_policy_on_the_host(
        claims: list[tuple[str, int, str, bool]], limit: int) -> None:
    """Schedulers claim members of groups on one host, each having seen a random part of
    the others' members (possibly stale): the host never breaks a group's policy."""
    m = machine()
    placed: dict[str, list[str]] = {}
    for n, (scheduler, gi, policy, saw_others) in enumerate(claims):
        uuid = f"{policy}-{gi}"
        members = tuple(placed.get(uuid, [])) if saw_others else ()
        if policy == AFFINITY:
            members = ()  # affinity: a host cannot see the other hosts; only the listed ones
        instance = f"inst-{n}"
        res = result(m.handle_claim(
            claim(m, f"{scheduler}:{n}", instance, ClaimGroup(uuid, policy, limit, members), scheduler),
            float(n)))
        if res.accepted:
            placed.setdefault(uuid, []).append(instance)
    instances = m.document["instances"]
    for uuid, members in placed.items():
        if uuid.startswith(ANTI_AFFINITY):
            assert len([i for i in members if i in instances]) <= limit
    # what the arbiter recorded is what a receiver sees: a snapshot carries the group tags
    snap = m.snapshot()
    assert type(snap) is Snapshot
    for uuid, members in placed.items():
        assert all(snap.doc["instances"][i][GROUP_KEY] == uuid for i in members)
