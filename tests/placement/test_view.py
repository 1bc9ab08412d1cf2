"""The scheduler's placement view alone: feed input, freshness, claims overlaid, corrections.

The feed and the cache that drive it are in test_feed.py and
test_stream.py; here the view is fed by hand with a fake clock.
"""

from __future__ import annotations

from typing import Any

from shared_host_manager.placement import REASONS, Unanswered
from shared_host_manager.placement.view import PlacementView

Q = "resources=VCPU:4"
MV = "1.36"


def uuid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def prov(i: int, gen: int = 1, vcpu: int = 8, used: int = 0, **kw: Any) -> dict[str, Any]:
    return {"uuid": uuid(i), "name": f"cn{i}", "generation": gen,
            "inventories": {"VCPU": {"total": vcpu}}, "usages": {"VCPU": used},
            "traits": [], "aggregates": [], **kw}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def uuids(body: Any) -> list[str]:
    assert not isinstance(body, Unanswered), body
    return sorted(next(iter(a["allocations"])) for a in body["allocation_requests"])


def test_no_feed_then_fresh_then_stale_then_fresh_again() -> None:
    clock = Clock()
    view = PlacementView(clock=clock, max_staleness=5.0)
    got = view.answer(Q, MV)
    assert isinstance(got, Unanswered) and got.reason == "no_feed"
    assert {"no_feed", "stale"} <= set(REASONS)
    view.apply_providers({uuid(1): prov(1)}, clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    clock.now += 5.5
    got = view.answer(Q, MV)
    assert isinstance(got, Unanswered) and got.reason == "stale"
    assert view.status()["fresh"] is False and view.status()["reason"] == "stale"
    view.heard(clock.now)  # a heartbeat
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    view.source_down()
    got = view.answer(Q, MV)
    assert isinstance(got, Unanswered) and got.reason == "stale"
    view.heard(clock.now)
    st = view.status()
    assert st["fresh"] and st["providers"] == 1 and st["last_applied"] == 5.5


def test_newest_generation_wins_deletion_and_recreation() -> None:
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1, gen=3, created_at="t0"), uuid(2): prov(2)}, clock.now)
    view.apply_providers({uuid(1): prov(1, gen=2, used=8, created_at="t0")}, clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1), uuid(2)]
    view.apply_providers({uuid(2): None}, clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    # deleted and created again under the same uuid: generation 0 of a new provider
    view.apply_providers({uuid(1): prov(1, gen=0, used=8, created_at="t1")}, clock.now)
    assert uuids(view.answer(Q, MV)) == []
    assert view.counters["recreated"] == 1
    # again within created_at's resolution (a second on MySQL): placement's row id tells it
    view.apply_providers({uuid(1): prov(1, gen=4, created_at="t1", id=1)}, clock.now)
    view.apply_providers({uuid(1): prov(1, gen=0, used=8, created_at="t1", id=2)}, clock.now)
    assert uuids(view.answer(Q, MV)) == []
    assert view.counters["recreated"] == 3


def test_own_claims_count_until_a_newer_generation_arrives() -> None:
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1, gen=1)}, clock.now)
    view.note_claim({uuid(1): {"VCPU": 4}, uuid(9): {"VCPU": 1}})
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    view.note_claim({uuid(1): {"VCPU": 2}})
    assert uuids(view.answer(Q, MV)) == []
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 6}
    assert view.counters["claims_unknown"] == 1
    # the same generation again (a duplicate publish) keeps the claims
    view.apply_providers({uuid(1): prov(1, gen=1)}, clock.now)
    assert uuids(view.answer(Q, MV)) == []
    # the feed read the provider after the claims: placement's usages include them
    view.apply_providers({uuid(1): prov(1, gen=3, used=4)}, clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1)]


def test_a_correction_applies_when_newer() -> None:
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1, gen=2)}, clock.now)
    view.correct(prov(1, gen=2, used=8))
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    view.correct(prov(1, gen=5, used=8))
    assert uuids(view.answer(Q, MV)) == []
    # the feed's copy of an older generation changes nothing
    view.apply_providers({uuid(1): prov(1, gen=4, used=0)}, clock.now)
    assert uuids(view.answer(Q, MV)) == []
    assert view.counters["older"] == 1


def test_a_correction_of_capacity_alone_gives_way_to_the_feeds_copy_of_its_generation() -> None:
    """A refused claim's correction reads inventories and usages only and keeps the rest as
    held: should a trait have changed by that generation, the feed's copy of the same
    generation (its other content) replaces the corrected provider."""
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1, gen=2)}, clock.now)
    held = view.provider(uuid(1))
    assert held is not None
    view.correct({**held, "generation": 4, "usages": {"VCPU": 8}})
    assert uuids(view.answer(Q, MV)) == []
    view.apply_providers({uuid(1): prov(1, gen=4, used=8, traits=["CUSTOM_NEW"])}, clock.now)
    got = view.provider(uuid(1))
    assert got is not None and got["traits"] == ["CUSTOM_NEW"] and got["usages"] == {"VCPU": 8}


def test_the_same_generation_read_again_after_an_allocation_deleted_applies() -> None:
    """placement does not increment the generation when an allocation is deleted: the feed
    publishes the provider again at the same generation, with the usage down."""
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1, gen=3, used=8)}, clock.now)
    assert uuids(view.answer(Q, MV)) == []
    view.apply_providers({uuid(1): prov(1, gen=3, used=0)}, clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    # the same copy again changes nothing
    view.apply_providers({uuid(1): prov(1, gen=3, used=0)}, clock.now)
    assert view.counters["same"] == 1 and view.counters["older"] == 0
    # this scheduler's claim (placement: generation 4) survives a copy of generation 3
    view.note_claim({uuid(1): {"VCPU": 8}})
    view.apply_providers({uuid(1): prov(1, gen=3, used=1)}, clock.now)
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 9}


def test_known_names_and_single_precision_storage() -> None:
    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1)}, clock.now)
    view.set_known_names(traits=["CUSTOM_A"], resource_classes=["VCPU"],
                         allocation_ratio_storage="single")
    assert view.state.allocation_ratio_storage == "single" and len(view.state) == 1
    got = view.answer("resources=VCPU:1&required=CUSTOM_B", MV)
    assert isinstance(got, Unanswered) and got.reason == "unknown_trait"
    assert uuids(view.answer("resources=VCPU:1&required=!CUSTOM_A", MV)) == [uuid(1)]
