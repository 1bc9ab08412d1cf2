"""The memory side alone: the provider state's life cycle, the query's reasons, limit and randomize.

placement itself is compared in test_differential.py; here are the parts it
does not reach: generations, deletions and slot reuse, growth past the
initial capacity, the covered-set reasons of the state, every reason of the
parser, the random source, and nova's ResourceRequest as its report client
turns it into a querystring.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from shared_host_manager.placement import (
    REASONS,
    PlacementConfig,
    ProviderState,
    Unanswered,
    answer,
    parse_querystring,
)
from shared_host_manager.placement.query import query_of_resource_request
from shared_host_manager.placement.state import Provider, ratios

AGG = "aaaaaaaa-0000-4000-8000-000000000001"


def uuid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def prov(i: int, gen: int = 1, vcpu: int = 8, used: int = 0, **kw: Any) -> dict[str, Any]:
    return {"uuid": uuid(i), "name": f"cn{i}", "generation": gen,
            "inventories": {"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": 4096}},
            "usages": {"VCPU": used}, **kw}


def uuids(body: Any) -> list[str]:
    assert not isinstance(body, Unanswered), body
    return [next(iter(a["allocations"])) for a in body["allocation_requests"]]


def test_newest_generation_wins_and_delete_frees_the_slot() -> None:
    s = ProviderState()
    assert s.apply(prov(1, gen=3, used=8))
    assert uuids(answer(s, "resources=VCPU:1")) == []
    # an older or equal generation is a late copy: ignored
    assert not s.apply(prov(1, gen=2, used=0))
    assert not s.apply(prov(1, gen=3, used=0))
    assert uuids(answer(s, "resources=VCPU:1")) == []
    assert s.apply(prov(1, gen=4, used=7))
    body = answer(s, "resources=VCPU:1")
    assert uuids(body) == [uuid(1)]
    assert not isinstance(body, Unanswered)
    assert body["provider_summaries"][uuid(1)]["resources"]["VCPU"] == {"capacity": 8, "used": 7}
    slot = s.slot_of(uuid(1))
    assert s.delete(uuid(1)) and not s.delete(uuid(1))
    assert uuid(1) not in s and len(s) == 0
    assert uuids(answer(s, "resources=VCPU:1")) == []
    s.apply(prov(2))
    assert s.slot_of(uuid(2)) == slot


def test_growth_past_capacity_keeps_every_column() -> None:
    s = ProviderState(capacity=4)
    for i in range(1, 151):
        s.apply(prov(i, used=i % 9, traits=["CUSTOM_ODD"] if i % 2 else [],
                     aggregates=[AGG] if i % 3 == 0 else []))
    assert s.capacity >= 150
    got = set(uuids(answer(s, f"resources=VCPU:1&required=CUSTOM_ODD&member_of={AGG}")))
    assert got == {uuid(i) for i in range(1, 151) if i % 2 and i % 3 == 0 and i % 9 < 8}
    again = ProviderState.from_dict(s.to_dict())
    assert answer(again, "resources=VCPU:2") == answer(s, "resources=VCPU:2")


def child(i: int, parent: int, root: int | None = None, gen: int = 1, **inventories: int
          ) -> dict[str, Any]:
    return {"uuid": uuid(i), "name": f"dev{i}", "generation": gen, "parent_provider_uuid": uuid(parent),
            "root_provider_uuid": uuid(root or parent),
            "inventories": {rc: {"total": n} for rc, n in inventories.items()}, "usages": {}}


def test_tree_members_are_summarised_with_their_root() -> None:
    s = ProviderState(capacity=2)
    s.apply(prov(1))
    s.apply(prov(2))
    s.apply(child(3, 1, VGPU=4))
    s.apply({**child(4, 3, root=1), "traits": ["CUSTOM_DEEP"]})  # a grandchild, no inventory
    body = answer(s, "resources=VCPU:1")
    assert not isinstance(body, Unanswered)
    assert uuids(body) == [uuid(1), uuid(2)]
    assert sorted(body["provider_summaries"]) == [uuid(i) for i in (1, 2, 3, 4)]
    assert body["provider_summaries"][uuid(3)] == {
        "resources": {"VGPU": {"capacity": 4, "used": 0}}, "traits": [],
        "parent_provider_uuid": uuid(1), "root_provider_uuid": uuid(1)}
    assert body["provider_summaries"][uuid(4)]["resources"] == {}
    # in_tree names any member of the tree; a limit keeps the summaries of the kept
    # candidates' trees only
    body = answer(s, f"resources=VCPU:1&in_tree={uuid(4)}")
    assert not isinstance(body, Unanswered) and sorted(body["provider_summaries"]) == [
        uuid(i) for i in (1, 3, 4)]
    body = answer(s, "resources=VCPU:1&limit=1")
    assert not isinstance(body, Unanswered) and sorted(body["provider_summaries"]) == [
        uuid(i) for i in (1, 3, 4)]
    # a class a member holds: one allocation request per product of the tree's providers
    body = answer(s, "resources=VCPU:1,VGPU:1")
    assert not isinstance(body, Unanswered)
    assert body["allocation_requests"] == [{
        "allocations": {uuid(1): {"resources": {"VCPU": 1}}, uuid(3): {"resources": {"VGPU": 1}}},
        "mappings": {"": [uuid(1), uuid(3)]}}]
    assert sorted(body["provider_summaries"]) == [uuid(i) for i in (1, 3, 4)]
    assert uuids(answer(s, "resources=VCPU:1,VGPU:1&required=CUSTOM_DEEP")) == []
    s.delete(uuid(4))
    s.apply(child(3, 1, gen=2, VGPU=4, VCPU=2))
    body = answer(s, "resources=VCPU:1&in_tree=" + uuid(1))
    assert not isinstance(body, Unanswered)
    assert [sorted(a["allocations"]) for a in body["allocation_requests"]] == [[uuid(1)], [uuid(3)]]
    body = answer(s, "resources=VCPU:1,VGPU:1&in_tree=" + uuid(1))
    assert not isinstance(body, Unanswered)
    assert [a["allocations"] for a in body["allocation_requests"]] == [
        {uuid(1): {"resources": {"VCPU": 1}}, uuid(3): {"resources": {"VGPU": 1}}},
        {uuid(3): {"resources": {"VCPU": 1, "VGPU": 1}}}]
    # a member held before its root, and a root deleted under its members
    s.delete(uuid(1))
    assert uuids(answer(s, "resources=VGPU:1")) == []
    s.apply(prov(1, gen=2))
    assert uuids(answer(s, "resources=VGPU:1")) == [uuid(3)]
    s.delete(uuid(3))
    assert not s.has_trees and uuids(answer(s, "resources=VCPU:1")) == [uuid(1), uuid(2)]
    assert sorted(answer(s, "resources=VCPU:1")["provider_summaries"]) == [uuid(1), uuid(2)]  # type: ignore[index]


def test_sharing_provider_lends_to_the_trees_of_its_aggregates() -> None:
    s = ProviderState()
    for i in (1, 2):
        s.apply({**prov(i), "aggregates": [AGG]})
    s.apply(prov(3))
    s.apply({"uuid": uuid(9), "name": "nfs", "generation": 1, "inventories": {"DISK_GB": {"total": 100}},
             "traits": ["MISC_SHARES_VIA_AGGREGATE"], "aggregates": [AGG]})
    assert s.sharing_holds("DISK_GB") and not s.sharing_holds("VCPU")
    body = answer(s, "resources=VCPU:1,DISK_GB:10")
    assert not isinstance(body, Unanswered)
    assert sorted(sorted(a["allocations"]) for a in body["allocation_requests"]) == [
        [uuid(1), uuid(9)], [uuid(2), uuid(9)]]
    assert sorted(body["provider_summaries"]) == [uuid(1), uuid(2), uuid(9)]
    # lent to three trees (its own among them), the same request once
    body = answer(s, "resources=DISK_GB:10")
    assert not isinstance(body, Unanswered)
    assert [a["allocations"] for a in body["allocation_requests"]] == [
        {uuid(9): {"resources": {"DISK_GB": 10}}}]
    assert sorted(body["provider_summaries"]) == [uuid(9)]
    # a suffixed group's sharing provider serves the trees it lends to
    body = answer(s, "resources=VCPU:1&resources1=DISK_GB:10&group_policy=none")
    assert not isinstance(body, Unanswered)
    assert sorted(a["mappings"]["1"] == [uuid(9)] for a in body["allocation_requests"]) == [True, True]
    # ... but an unsuffixed candidate several trees borrow is merged by placement under one of
    # them only (its sets decide which)
    r = answer(s, "resources=DISK_GB:10&resources1=VCPU:1&group_policy=none")
    assert isinstance(r, Unanswered) and r.reason == "sharing_provider"
    # in_tree keeps a request in its tree: nothing is borrowed
    assert uuids(answer(s, "resources=VCPU:1,DISK_GB:10&in_tree=" + uuid(1))) == []
    # a sharing provider in a tree: placement may fail (500), so nothing is answered
    s.apply({"uuid": uuid(10), "name": "nfs2", "generation": 1, "parent_provider_uuid": uuid(3),
             "root_provider_uuid": uuid(3), "inventories": {"DISK_GB": {"total": 100}},
             "traits": ["MISC_SHARES_VIA_AGGREGATE"], "aggregates": [AGG]})
    r = answer(s, "resources=VCPU:1")
    assert isinstance(r, Unanswered) and r.reason == "sharing_provider"
    s.delete(uuid(10))
    assert uuids(answer(s, "resources=VCPU:1")) == [uuid(1), uuid(2), uuid(3)]


def test_state_outside_the_covered_set() -> None:
    s = ProviderState()
    s.apply(prov(1))
    s.apply(prov(3))
    s.apply(prov(4, aggregates=[AGG.upper()]))
    r = answer(s, "resources=VCPU:1")
    assert isinstance(r, Unanswered) and r.reason == "noncanonical_uuid"
    s.delete(uuid(4))
    assert uuids(answer(s, "resources=VCPU:1")) == [uuid(1), uuid(3)]


@pytest.mark.parametrize("qs,mv,reason", [
    ("resources=VCPU:1", "1.35", "microversion"),
    ("resources=VCPU:1", "latest", "microversion"),
    ("resources=VCPU:1&colour=blue", "1.36", "unknown_parameter"),
    # suffixed groups: placement's 400s (a resourceless group outside same_subtree, no
    # group_policy with two of them)
    ("resources=VCPU:1&required_NET=CUSTOM_X", "1.36", "invalid_request"),
    ("resources1=VCPU:1&resources2=VCPU:1", "1.36", "invalid_request"),
    ("resources1=VCPU:1&required1=CUSTOM_X,!CUSTOM_X", "1.36", "invalid_request"),
    ("required=CUSTOM_X&resources1=VCPU:1", "1.36", "invalid_request"),
    ("resources=VCPU:1&resources1=VCPU:1", "1.36", "repeated_class"),
    ("resources=VCPU:1&resources1=VGPU:1&resources2=VCPU:1&group_policy=isolate", "1.36", "repeated_class"),
    ("resources=VCPU:1&same_subtree=_A,_B", "1.36", "invalid_request"),
    ("resources=VCPU:1&resources_A=VGPU:1&same_subtree=_A,", "1.36", "invalid_request"),
    ("resources_A=VGPU:1&required_B=CUSTOM_X&same_subtree=_A", "1.36", "invalid_request"),
    ("required_B=CUSTOM_X&same_subtree=_B", "1.36", "invalid_request"),
    ("resources=VCPU:1&limit=2&limit=3", "1.36", "duplicate_parameter"),
    ("resources=VCPU:1&root_required=CUSTOM_A&root_required=CUSTOM_B", "1.36", "duplicate_parameter"),
    ("required=CUSTOM_A", "1.36", "invalid_request"),
    ("resources=", "1.36", "invalid_request"),
    ("resources=VCPU", "1.36", "invalid_request"),
    ("resources=VCPU:0", "1.36", "invalid_request"),
    ("resources=VCPU:x", "1.36", "invalid_request"),
    ("resources=VCPU:1&limit=0", "1.36", "invalid_request"),
    ("resources=VCPU:1&group_policy=all", "1.36", "invalid_request"),
    ("resources=VCPU:1&required=in:CUSTOM_A,CUSTOM_B", "1.38", "invalid_request"),
    ("resources=VCPU:1&required=in:CUSTOM_A,!CUSTOM_B", "1.39", "invalid_request"),
    ("resources=VCPU:1&required=CUSTOM_A,,CUSTOM_B", "1.36", "invalid_request"),
    ("resources=VCPU:1&required=CUSTOM_A,!CUSTOM_A", "1.36", "invalid_request"),
    ("resources=VCPU:1&root_required=CUSTOM_A,!CUSTOM_A", "1.36", "invalid_request"),
    ("resources=VCPU:1&root_required=in:CUSTOM_A", "1.39", "invalid_request"),
    (f"resources=VCPU:1&member_of={AGG},{AGG}", "1.36", "invalid_request"),
    ("resources=VCPU:1&member_of=in:nope", "1.36", "invalid_request"),
    (f"resources=VCPU:1&member_of={AGG.upper()}", "1.36", "noncanonical_uuid"),
    (f"resources=VCPU:1&in_tree={AGG.replace('-', '')}", "1.36", "noncanonical_uuid"),
    ("resources=VCPU:1&in_tree=nope", "1.36", "invalid_request"),
])
def test_parser_reasons(qs: str, mv: str, reason: str) -> None:
    assert reason in REASONS
    got = parse_querystring(qs, mv)
    assert isinstance(got, Unanswered) and got.reason == reason, got


def test_parser_reads_as_placement_does() -> None:
    q = parse_querystring("resources=VCPU:1,VCPU:2&resources=MEMORY_MB:5,DISK_GB:1"
                          "&required=!!CUSTOM_A,CUSTOM_B&required=CUSTOM_C"
                          f"&member_of=in:{AGG}&member_of=!{uuid(9)}&in_tree=%20{uuid(3)}%20", "1.36")
    assert not isinstance(q, Unanswered)
    # the last resources wins; before 1.39 only the last required counts; in_tree is stripped
    assert q.main.resources == (("MEMORY_MB", 5), ("DISK_GB", 1))
    assert q.main.required == (frozenset({"CUSTOM_C"}),) and q.main.forbidden == frozenset()
    assert q.main.member_of == (frozenset({AGG}),) and q.main.forbidden_aggregates == {uuid(9)}
    assert q.main.in_tree == uuid(3)
    q = parse_querystring("resources=VCPU:1&required=!!CUSTOM_A,CUSTOM_B"
                          "&required=in:CUSTOM_C,CUSTOM_D", "placement 1.39")
    assert not isinstance(q, Unanswered)
    assert q.main.required == (frozenset({"CUSTOM_B"}), frozenset({"CUSTOM_C", "CUSTOM_D"}))
    assert q.main.forbidden == {"CUSTOM_A"}


def test_unknown_names() -> None:
    s = ProviderState(traits=["CUSTOM_DEFINED"], resource_classes=["VCPU", "MEMORY_MB", "CUSTOM_RC"])
    s.apply(prov(1, traits=["CUSTOM_ON_A_PROVIDER"]))
    assert uuids(answer(s, "resources=VCPU:1&required=!CUSTOM_DEFINED,CUSTOM_ON_A_PROVIDER")) == [uuid(1)]
    assert uuids(answer(s, "resources=CUSTOM_RC:1")) == []
    for qs, reason in (("resources=DISK_GB:1", "unknown_resource_class"),
                       ("resources=VCPU:1&required=CUSTOM_NOPE", "unknown_trait"),
                       ("resources=VCPU:1&root_required=!CUSTOM_NOPE", "unknown_trait")):
        r = answer(s, qs)
        assert isinstance(r, Unanswered) and r.reason == reason
    # without the lists: standard names are known, custom ones only on a provider
    s = ProviderState()
    s.apply(prov(1))
    assert uuids(answer(s, "resources=DISK_GB:1&required=HW_CPU_X86_AVX2")) == []
    r = answer(s, "resources=VCPU:1&required=CUSTOM_DEFINED")
    assert isinstance(r, Unanswered) and r.reason == "unknown_trait"


def test_limit_and_randomize() -> None:
    s = ProviderState()
    for i in range(1, 11):
        s.apply(prov(i))
    everyone = uuids(answer(s, "resources=VCPU:1"))
    assert everyone == [uuid(i) for i in range(1, 11)]
    assert uuids(answer(s, "resources=VCPU:1&limit=3")) == everyone[:3]
    shuffled = PlacementConfig(randomize_allocation_candidates=True)
    a = uuids(answer(s, "resources=VCPU:1&limit=3", config=shuffled, rng=random.Random(1)))
    b = uuids(answer(s, "resources=VCPU:1&limit=3", config=shuffled, rng=random.Random(1)))
    assert a == b and len(set(a)) == 3 and set(a) <= set(everyone)
    body = answer(s, "resources=VCPU:1&limit=3", config=shuffled, rng=random.Random(1))
    assert not isinstance(body, Unanswered) and sorted(body["provider_summaries"]) == sorted(a)
    c = uuids(answer(s, "resources=VCPU:1&limit=30", config=shuffled, rng=random.Random(2)))
    assert sorted(c) == everyone and c != everyone
    capped = PlacementConfig(max_allocation_candidates=4)
    assert uuids(answer(s, "resources=VCPU:1&limit=30", config=capped)) == everyone[:4]
    with pytest.raises(ValueError):
        answer(s, "resources=VCPU:1", config=shuffled)


def test_single_precision_ratios() -> None:
    # MariaDB's FLOAT column: SQL computes with the 32-bit float, Python reads six digits back
    assert ratios(0.7, "single") == (0.699999988079071, 0.7)
    assert ratios(0.7, "double") == (0.7, 0.7)
    s = ProviderState(allocation_ratio_storage="single")
    s.apply({"uuid": uuid(1), "generation": 1, "inventories": {"VCPU": {
        "total": 10, "allocation_ratio": 0.7}}})
    body = answer(s, "resources=VCPU:1")
    assert not isinstance(body, Unanswered)
    assert body["provider_summaries"][uuid(1)]["resources"]["VCPU"]["capacity"] == 7
    # 7 fits int(10 * 0.7) but not 10 * 0.699999988
    assert uuids(answer(s, "resources=VCPU:7")) == []


def test_over_capacity_is_usage_beyond_what_placements_claim_allows() -> None:
    # placement's claim: used + amount <= (total - reserved) * ratio, the ratio read back
    p = Provider.from_dict({**prov(1), "inventories": {
        "VCPU": {"total": 10, "reserved": 2, "allocation_ratio": 1.5},
        "MEMORY_MB": {"total": 10, "allocation_ratio": 0.7}},
        "usages": {"VCPU": 12, "MEMORY_MB": 7}})
    assert p.over_capacity("double") == {}
    assert p.over_capacity("single") == {}  # 7 <= 10 * 0.7 as placement reads 0.7 back
    more = Provider.from_dict({**p.to_dict(), "usages": {"VCPU": 13, "MEMORY_MB": 8, "DISK_GB": 5}})
    assert more.over_capacity() == {"VCPU": (13, 12.0), "MEMORY_MB": (8, 7.0)}


@pytest.mark.nova
def test_nova_resource_request() -> None:
    pytest.importorskip("nova")
    from shared_host_manager.nova.core.nova_setup import setup_nova_objects

    setup_nova_objects()
    from nova import objects
    from nova.scheduler import utils

    flavor = objects.Flavor(vcpus=2, memory_mb=1024, root_gb=10, ephemeral_gb=0, swap=0,
                            extra_specs={"trait:HW_CPU_X86_AVX2": "required",
                                         "trait:CUSTOM_SLOW": "forbidden"})
    spec = objects.RequestSpec(requested_resources=[], flavor=flavor, is_bfv=False,
                               image=objects.ImageMeta.from_dict({"properties": {}}))
    # nova's compute_status_filter prefilter
    spec.root_forbidden.add("COMPUTE_STATUS_DISABLED")
    q = query_of_resource_request(utils.ResourceRequest.from_request_spec(spec))
    assert not isinstance(q, Unanswered)
    assert dict(q.main.resources) == {"DISK_GB": 10, "MEMORY_MB": 1024, "VCPU": 2}
    assert q.main.required == (frozenset({"HW_CPU_X86_AVX2"}),) and q.main.forbidden == {"CUSTOM_SLOW"}
    assert q.root_forbidden == {"COMPUTE_STATUS_DISABLED"} and q.limit == 1000
    assert q.microversion == (1, 36)
