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


def test_a_peers_claim_counts_from_its_intent_until_the_feed_can_hold_it() -> None:
    """The peers' claims (design §11): what a peer is about to claim in placement is deducted
    from the moment its intent arrives, not a feed poll after placement's answer; through
    generations other claims make; until, once its acceptance came, a newer generation (the
    feed's copy can hold it from there). Announced again, it is held once."""
    clock = Clock()
    view = PlacementView(clock=clock, peer_claim_ttl=1.0)
    view.apply_providers({uuid(1): prov(1, gen=1), uuid(2): prov(2, gen=1)}, clock.now)
    view.note_peer_claim("a", {uuid(1): {"VCPU": 6}})
    assert uuids(view.answer(Q, MV)) == [uuid(2)]
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 6}
    assert view.status()["peer_claims_held"] == 1
    # the same generation read again (an allocation deleted meanwhile) keeps it
    view.apply_providers({uuid(1): prov(1, gen=1, name="cn1'")}, clock.now)
    # another claim moved the generation while placement has not answered this one: kept
    view.apply_providers({uuid(1): prov(1, gen=2, used=1)}, clock.now)
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 7}
    # placement accepted it: the next generation can hold it, and does
    view.note_peer_claim("a", {uuid(1): {"VCPU": 6}}, accepted=True)
    view.apply_providers({uuid(1): prov(1, gen=2, used=1, name="cn1''")}, clock.now)
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 7}
    view.apply_providers({uuid(1): prov(1, gen=3, used=7)}, clock.now)
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 7}
    assert (view.counters["peer_claims_accepted"], view.counters["peer_claims_included"]) == (1, 1)
    # announced again after that: not held twice
    view.note_peer_claim("a", {uuid(1): {"VCPU": 6}}, accepted=True)
    held = view.provider(uuid(1))
    assert held is not None and held["usages"] == {"VCPU": 7}
    assert view.counters["peer_claims_again"] == 1
    # an acceptance that came first (no intent: nova's next host) is held the same way
    view.note_peer_claim("n", {uuid(2): {"VCPU": 5}}, accepted=True)
    assert uuids(view.answer(Q, MV)) == []
    view.apply_providers({uuid(2): prov(2, gen=2, used=5)}, clock.now)
    held = view.provider(uuid(2))
    assert held is not None and held["usages"] == {"VCPU": 5}
    assert view.status()["peer_claims_held"] == 0


def test_a_peers_claim_moves_with_its_acceptance_and_goes_at_its_rejection_or_deadline() -> None:
    """Placement refused the intended host and accepted nova's next: the claim moves there.
    The host's rejection drops a claim at once; placement's refusal leaves no trace the feed
    could show, so a claim never accepted goes at peer_claim_ttl after its last announcement.
    The peers' claims add up with this scheduler's own."""
    clock = Clock()
    view = PlacementView(clock=clock, peer_claim_ttl=1.0)
    view.apply_providers({uuid(i): prov(i) for i in (1, 2, 3)}, clock.now)
    view.note_peer_claim("m", {uuid(1): {"VCPU": 6}})
    view.note_peer_claim("m", {uuid(2): {"VCPU": 6}}, accepted=True)
    assert uuids(view.answer(Q, MV)) == [uuid(1), uuid(3)]
    assert view.counters["peer_claims_moved"] == 1
    view.note_peer_claim("b", {uuid(3): {"VCPU": 3}})
    view.note_claim({uuid(3): {"VCPU": 2}})
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    view.drop_peer_claim("b")
    assert uuids(view.answer(Q, MV)) == [uuid(1), uuid(3)]
    assert view.counters["peer_claims_rejected"] == 1
    clock.now += 0.5
    view.note_peer_claim("c", {uuid(1): {"VCPU": 6}})
    clock.now += 0.6  # "m" announced 1.1 s ago, its generation never came: gone
    view.heard(clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(2), uuid(3)]
    clock.now += 0.39
    assert uuids(view.answer(Q, MV)) == [uuid(2), uuid(3)]
    clock.now += 0.02
    assert uuids(view.answer(Q, MV)) == [uuid(1), uuid(2), uuid(3)]
    assert view.counters["peer_claims_expired"] == 2
    assert view.status()["peer_claims_held"] == 0
    # a provider the view does not hold, an allocation of another shape: counted, ignored
    view.note_peer_claim("d", {uuid(9): {"VCPU": 1}})
    view.note_peer_claim("e", {uuid(2): {"VCPU": -1}})
    view.note_peer_claim("f", {uuid(2): ["VCPU"]})  # type: ignore[dict-item]
    assert (view.counters["peer_claims_unknown"], view.counters["peer_claims_malformed"]) == (1, 2)
    # a provider deleted takes its claims with it
    view.note_peer_claim("g", {uuid(2): {"VCPU": 1}})
    view.apply_providers({uuid(2): None}, clock.now)
    assert view.status()["peer_claims_held"] == 0


def test_the_tap_hands_a_peers_announced_allocations_and_rejections_to_the_view() -> None:
    """What reaches the view from the cache's message stream: a peer's claim that carries its
    placement allocations (the nova drop-in's intent or acceptance), and a host's rejection of
    one; a claim without allocations (the engine's) touches nothing."""
    from protocol.messages import ANNOUNCED_ACCEPTED, ANNOUNCED_ALLOCATIONS, Claim, ClaimResult
    from protocol.receiver import ReceiverMachine
    from shared_host_manager.placement.tap import PlacementTap

    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1)}, clock.now)
    tap = PlacementTap(view, ReceiverMachine("s1"))

    def claim(claim_id: str, request: dict[str, Any]) -> Claim:
        return Claim(claim_id=claim_id, scheduler="s2", source=uuid(1), epoch=1, seq=1,
                     resources={"vcpus": 6}, request=request)

    tap.message_taken(claim("plain", {}))
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    allocations = {ANNOUNCED_ALLOCATIONS: {uuid(1): {"VCPU": 6}}}
    tap.message_taken(claim("i1", allocations))
    assert uuids(view.answer(Q, MV)) == []
    tap.message_taken(ClaimResult("i1", "s2", uuid(1), True, 1, 2))
    assert uuids(view.answer(Q, MV)) == []
    tap.message_taken(ClaimResult("i1", "s2", uuid(1), False, 1, 2, "full"))
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    assert view.counters["peer_claims"] == 1 and view.counters["peer_claims_rejected"] == 1
    tap.message_taken(claim("i2", {**allocations, ANNOUNCED_ACCEPTED: True}))
    assert view.counters["peer_claims_accepted"] == 1


def test_a_peers_intent_is_held_at_most_max_staleness() -> None:
    """A deployment raises peer_claim_ttl to cover a build's start (the host states need it);
    placement's answer is in the feed within max_staleness, or the view is stale anyway."""
    clock = Clock()
    view = PlacementView(clock=clock, max_staleness=2.0, peer_claim_ttl=30.0)
    view.apply_providers({uuid(1): prov(1)}, clock.now)
    view.note_peer_claim("a", {uuid(1): {"VCPU": 6}})
    clock.now += 1.9
    view.heard(clock.now)
    assert uuids(view.answer(Q, MV)) == []
    clock.now += 0.2
    view.heard(clock.now)
    assert uuids(view.answer(Q, MV)) == [uuid(1)]
    assert view.counters["peer_claims_expired"] == 1


def test_a_request_is_answered_once_a_poll_begun_after_it_arrived_is_held() -> None:
    """Read-your-writes: the feed's poll marker at or after the request's arrival answers it;
    one from before it waits (here: not at all, or until a marker another thread applies) and
    is left to placement (``behind``) when none comes in time.  A view that never held a
    marker (a feed without them) sets no bar."""
    import threading

    clock = Clock()
    view = PlacementView(clock=clock)
    view.apply_providers({uuid(1): prov(1)}, clock.now)
    assert uuids(view.answer(Q, MV, asked_at=1e12, wait=0.0)) == [uuid(1)]  # no marker yet
    assert view.counters["waits"] == 0
    view.polled(1000.0)
    assert view.status()["poll_marker"] == 1000.0
    assert uuids(view.answer(Q, MV, asked_at=999.5)) == [uuid(1)]
    assert uuids(view.answer(Q, MV, asked_at=1000.0)) == [uuid(1)]
    assert uuids(view.answer(Q, MV)) == [uuid(1)]  # no arrival time: no bar
    assert view.counters["waits"] == 0
    got = view.answer(Q, MV, asked_at=1000.5, wait=0.0)
    assert isinstance(got, Unanswered) and got.reason == "behind" and "behind" in REASONS
    assert "0.500 s" in got.detail
    view.polled(900.0)  # an older marker (a feed restarted on a clock behind) never goes back
    assert view.status()["poll_marker"] == 1000.0

    # a poll begun after the request lands while it waits: its changes first, then its marker
    def poll_lands() -> None:
        view.apply_providers({uuid(1): prov(1, gen=2, used=8), uuid(2): prov(2)}, clock.now)
        view.polled(1001.0)

    timer = threading.Timer(0.05, poll_lands)
    timer.start()
    try:
        assert uuids(view.answer(Q, MV, asked_at=1000.5, wait=30.0)) == [uuid(2)]
    finally:
        timer.cancel()
    assert view.counters["waits"] == 2
    assert 0.0 < view.status()["waited_seconds"] < 30.0
    # no newer marker for max_staleness while the feed heartbeats (its polls fail): no wait
    clock.now += view.max_staleness + 0.5
    view.heard(clock.now)
    got = view.answer(Q, MV, asked_at=1002.0, wait=30.0)
    assert isinstance(got, Unanswered) and got.reason == "behind"
    assert got.detail.startswith("no poll of the placement feed completed for 5.5 s")
    assert view.counters["waits"] == 2


def test_the_tap_hands_the_feeds_poll_marker_after_its_changes() -> None:
    """The feed's ``placement_poll`` namespace reaches the view as its poll marker, in the
    delta with the poll's changes (applied first) or alone; a marker-only delta reads no
    provider."""
    from protocol.document import SET
    from protocol.hostdoc import PLACEMENT, PLACEMENT_META, PLACEMENT_POLL, POLL_STARTED
    from protocol.messages import Delta, Snapshot
    from protocol.receiver import ReceiverMachine
    from shared_host_manager.placement.tap import PlacementTap

    clock = Clock()
    view = PlacementView(clock=clock)
    receiver = ReceiverMachine("s1")
    tap = PlacementTap(view, receiver)
    doc = {PLACEMENT_META: {"traits": [], "resource_classes": []},
           PLACEMENT: {uuid(1): prov(1)}, PLACEMENT_POLL: {POLL_STARTED: 500.0}}
    for msg in (Snapshot("feed", 1, 1, doc),
                Delta("feed", 1, 2, [[SET, PLACEMENT, uuid(1), prov(1, gen=2, used=8)],
                                     [SET, PLACEMENT_POLL, POLL_STARTED, 501.0]]),
                Delta("feed", 1, 3, [[SET, PLACEMENT_POLL, POLL_STARTED, 502.0]])):
        receiver.receive(msg, clock.now)
        tap.note(msg)
        tap.sync()
        if msg.seq == 1:
            assert view.status()["poll_marker"] == 500.0
            assert uuids(view.answer(Q, MV, asked_at=500.0)) == [uuid(1)]
        if msg.seq == 2:
            assert view.status()["poll_marker"] == 501.0
            assert uuids(view.answer(Q, MV, asked_at=501.0)) == []
    assert view.status()["poll_marker"] == 502.0
    assert tap.full_syncs == 1 and tap.incremental_syncs == 2
