"""Unit tests of the source-side rules (protocol/source.py module docstring)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.document import DEL, DROP, SET, apply_ops, copy_document, digest
from protocol.errors import LocalProtocolError
from protocol.messages import (
    NO_EPOCH,
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    ResyncAnswer,
    ResyncRequest,
    Send,
    Snapshot,
)
from protocol.source import SourceMachine, next_epoch

SRC = "compute-1"
EPOCH = 7
DOC = {
    "compute": {"vcpus": 4, "vcpus_used": 0, "memory_mb": 2048, "memory_mb_used": 0,
                "cpu_allocation_ratio": 2.0, "num_instances": 0},
    "service": {"disabled": False},
    "metrics": {"load": 0.5},
}


def machine(**kw: Any) -> SourceMachine:
    kw.setdefault("coalesce_window", 0.05)
    kw.setdefault("heartbeat_interval", 10.0)
    m = SourceMachine(SRC, EPOCH, copy_document(DOC), **kw)
    sends = m.poll(0.0)
    assert [type(s.message) for s in sends] == [Snapshot]
    return m


def only(sends: list[Send], typ: type) -> list[Any]:
    return [s.message for s in sends if type(s.message) is typ]


def claim(claim_id: str = "c1", seq: int | None = None, m: SourceMachine | None = None, *,
          epoch: int = EPOCH, instance: str | None = None, **resources: int) -> Claim:
    return Claim(claim_id, "sched-1", SRC, epoch, seq if seq is not None else (m.seq if m else 0),
                 resources or {"vcpus": 1}, instance if instance is not None else f"inst-{claim_id}")


# --------------------------------------------------------------------------
# announcement, coalescing, heartbeat


def test_first_poll_announces_a_snapshot_of_the_epoch() -> None:
    m = SourceMachine(SRC, EPOCH, copy_document(DOC), heartbeat_interval=10.0)
    assert m.next_deadline() == float("-inf")
    sends = m.poll(5.0)
    assert len(sends) == 1 and sends[0].to is None
    snap = sends[0].message
    assert snap == Snapshot(SRC, EPOCH, 0, DOC, [])
    assert m.version == (EPOCH, 0)
    assert m.next_deadline() == 15.0
    assert m.poll(5.0) == []


def test_changes_before_the_announcement_ride_in_the_first_snapshot() -> None:
    m = SourceMachine(SRC, EPOCH, copy_document(DOC))
    m.change([[SET, "metrics", "load", 0.9]], 0.0)
    sends = m.poll(0.0)
    assert [type(s.message) for s in sends] == [Snapshot]  # no delta nobody could place
    snap = sends[0].message
    assert snap.doc["metrics"]["load"] == 0.9
    assert snap.seq == 1  # a version of its own: (EPOCH, 0) stays the document as built
    assert m.published_digest() == digest(snap.doc)


def test_negative_epoch_is_refused() -> None:
    with pytest.raises(LocalProtocolError):
        SourceMachine(SRC, -1)


def test_empty_namespaces_are_dropped_at_construction() -> None:
    m = SourceMachine(SRC, EPOCH, {"pci": {}, "metrics": {"a": 1}})
    assert m.document == {"metrics": {"a": 1}}


def test_coalescing_window_merges_changes_into_one_delta() -> None:
    m = machine()
    m.change([[SET, "metrics", "load", 0.6], [SET, "metrics", "x", 1]], 1.00)
    m.change([[SET, "metrics", "load", 0.7], [DEL, "metrics", "x"]], 1.02)
    assert m.has_pending
    assert m.next_deadline() == pytest.approx(1.05)
    assert m.poll(1.04) == []  # window not elapsed (it started with the first change)
    [delta] = only(m.poll(1.05), Delta)
    assert delta.seq == 1 and delta.epoch == EPOCH
    # last write per key wins; the set-then-delete of x collapses to one DEL
    assert delta.ops == [[SET, "metrics", "load", 0.7], [DEL, "metrics", "x"]]
    assert not m.has_pending
    assert m.poll(1.2) == []
    assert m.next_deadline() == 10.0


def test_coalesced_delta_reproduces_the_document() -> None:
    m = machine()
    before = copy_document(m.document)
    m.change([[DROP, "metrics"], [SET, "metrics", "a", [1, {"b": None}]], [SET, "pci", "dev0", "x"]], 0.0)
    m.change([[DEL, "pci", "dev0"], [SET, "service", "disabled", True]], 0.01)
    [delta] = only(m.flush(), Delta)
    apply_ops(before, delta.ops)
    assert digest(before) == m.published_digest()


def test_changes_that_change_nothing_are_skipped() -> None:
    m = machine()
    m.change([[SET, "metrics", "load", 0.5], [DEL, "metrics", "nope"], [DROP, "numa"]], 0.0)
    assert not m.has_pending
    assert m.flush() == []
    assert m.seq == 0


@pytest.mark.parametrize(("old", "new"), [(0, False), (1, True), (1, 1.0), ([0], [False]),
                                          ({"a": 1}, {"a": 1.0}), ([[1]], [[True]])], ids=repr)
def test_a_change_of_type_is_a_change(old: Any, new: Any) -> None:
    """0 == False in Python but not on the wire (the digest tells them apart)."""
    m = machine()
    m.change([[SET, "metrics", "v", old]], 0.0)
    m.flush()
    m.change([[SET, "metrics", "v", new]], 0.1)
    [delta] = only(m.flush(), Delta)
    assert delta.ops == [[SET, "metrics", "v", new]]
    assert type(m.document["metrics"]["v"]) is type(new)


def test_update_namespace_and_replace_document() -> None:
    m = machine()
    m.update_namespace("metrics", {"load": 0.5, "iops": 3}, 0.0)
    [delta] = only(m.flush(), Delta)
    assert delta.ops == [[SET, "metrics", "iops", 3]]
    m.update_namespace("metrics", {}, 0.1)
    [delta] = only(m.flush(), Delta)
    assert sorted(map(tuple, delta.ops)) == [(DEL, "metrics", "iops"), (DEL, "metrics", "load")]
    assert "metrics" not in m.document  # an empty namespace does not exist
    m.replace_document({"service": {"disabled": True}}, 0.2)
    [delta] = only(m.flush(), Delta)
    assert m.document == {"service": {"disabled": True}}
    assert [DROP, "compute"] in delta.ops


def test_unknown_op_code_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        machine().change([[9, "metrics", "x"]], 0.0)


def test_heartbeat_carries_version_and_digest_and_flushes_first() -> None:
    m = machine(heartbeat_interval=1.0)
    assert only(m.poll(0.99), Heartbeat) == []
    m.change([[SET, "metrics", "load", 0.8]], 0.995)
    sends = m.poll(1.0)  # heartbeat due: the pending change is published first
    assert [type(s.message) for s in sends] == [Delta, Heartbeat]
    hb = sends[1].message
    assert (hb.epoch, hb.seq) == (EPOCH, 1) == m.version
    assert hb.digest == digest(m.document) == m.published_digest()
    assert m.poll(1.5) == []
    assert [type(s.message) for s in m.poll(2.0)] == [Heartbeat]
    assert m.stats["heartbeats"] == 2


def test_published_digest_and_snapshot_refuse_unpublished_changes() -> None:
    m = machine()
    m.change([[SET, "metrics", "load", 0.1]], 0.0)
    with pytest.raises(LocalProtocolError):
        m.published_digest()
    with pytest.raises(LocalProtocolError):
        m.snapshot()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["change", "claim", "poll", "resync", "hb"]),
                          st.integers(0, 5)), max_size=30))
def test_versions_are_consecutive(steps: list[tuple[str, int]]) -> None:
    """The machine never emits seq N+1 before seq N, whatever calls it."""
    m = machine(heartbeat_interval=1.0)
    now, last = 0.0, 0
    for kind, n in steps:
        now += 0.03
        if kind == "change":
            m.change([[SET, "metrics", f"k{n}", n]], now)
            sends = []
        elif kind == "claim":
            sends = m.handle_claim(claim(f"c{n}", m=m), now)
        elif kind == "poll":
            sends = m.poll(now)
        elif kind == "resync":
            sends = m.handle_resync(ResyncRequest(SRC, "s", EPOCH, max(0, m.seq - n)), now)
        else:
            now += 1.0
            sends = m.poll(now)
        for s in sends:
            if type(s.message) is Delta:
                assert s.message.seq == last + 1
                last = s.message.seq
    assert last <= m.seq


# --------------------------------------------------------------------------
# resync: ring buffer vs snapshot


def _deltas(m: SourceMachine, n: int, start: float = 1.0) -> list[Delta]:
    out = []
    for i in range(n):
        m.change([[SET, "metrics", "load", i + start]], 0.0)
        out.extend(only(m.flush(), Delta))
    return out


def test_catch_up_from_the_ring_buffer() -> None:
    m = machine(ring_size=4, max_resync_deltas=3)
    deltas = _deltas(m, 4)
    assert m.catch_up(EPOCH, 4) == []
    assert m.catch_up(EPOCH, 3) == deltas[3:]
    assert m.catch_up(EPOCH, 1) == deltas[1:]  # exactly the missing ones, in order


def test_catch_up_falls_back_to_a_snapshot() -> None:
    m = machine(ring_size=4, max_resync_deltas=3)
    deltas = _deltas(m, 6)  # seqs 3..6 in the ring
    snap = Snapshot(SRC, EPOCH, 6, copy_document(m.document), [])
    assert m.catch_up(EPOCH, 1) == [snap]  # delta 2 fell off the ring
    assert m.catch_up(EPOCH, 2) == [snap]  # 4 missing > max_resync_deltas
    assert m.catch_up(EPOCH, 3) == deltas[3:]
    assert m.catch_up(EPOCH - 1, 6) == [snap]  # another epoch
    assert m.catch_up(NO_EPOCH, 0) == [snap]
    assert m.catch_up(EPOCH, 9) == [snap]  # ahead of us: cannot be ours
    fresh = machine()
    assert fresh.catch_up(EPOCH, 0) == []
    assert fresh.catch_up(EPOCH - 1, 0) == [fresh.snapshot()]


def test_handle_resync_answers_the_requester() -> None:
    m = machine()
    deltas = _deltas(m, 2)
    m.change([[SET, "metrics", "load", 9]], 0.0)  # pending: published before answering
    sends = m.handle_resync(ResyncRequest(SRC, "sched-9", EPOCH, 0), 0.0)
    assert [s.to for s in sends] == [None, "sched-9"]
    flushed, answer = sends[0].message, sends[1].message
    assert type(flushed) is Delta and flushed.seq == 3
    assert answer == ResyncAnswer(SRC, "sched-9", deltas + [flushed])
    assert m.stats["resyncs_answered"] == 1


def test_full_resync_gets_a_snapshot_even_if_deltas_would_do() -> None:
    m = machine()
    _deltas(m, 1)
    [send] = m.handle_resync(ResyncRequest(SRC, "s", EPOCH, 0, full=True), 0.0)
    assert send.message.items == [m.snapshot()]


def test_resync_for_another_source_is_ignored() -> None:
    assert machine().handle_resync(ResyncRequest("other", "s", EPOCH, 0), 0.0) == []


def test_handle_dispatch() -> None:
    m = machine()
    assert only(m.handle(claim(m=m), 0.0), ClaimResult)[0].accepted
    assert only(m.handle(ResyncRequest(SRC, "s", EPOCH, 0), 0.0), ResyncAnswer)
    with pytest.raises(LocalProtocolError):
        m.handle(Heartbeat(SRC, 1, 1, bytes(16)), 0.0)


# --------------------------------------------------------------------------
# the arbiter


def test_accepted_claim_is_applied_and_published_at_once() -> None:
    m = machine()
    sends = m.handle_claim(claim("c1", m=m, vcpus=3, memory_mb=1024), 0.0)
    assert [s.to for s in sends] == [None, "sched-1"]
    delta, result = sends[0].message, sends[1].message
    assert result == ClaimResult("c1", "sched-1", SRC, True, EPOCH, 1)
    assert delta.seq == 1 and delta.claims == ["c1"]
    compute = m.document["compute"]
    assert (compute["vcpus_used"], compute["memory_mb_used"], compute["num_instances"]) == (3, 1024, 1)
    assert m.document["instances"]["inst-c1"] == {"claim": "c1", "resources": {"vcpus": 3, "memory_mb": 1024}}
    assert m.snapshot().claims == ["c1"]  # a snapshot lists what it includes
    assert m.stats["claims_accepted"] == 1


def test_duplicate_claim_is_answered_the_same_and_applied_once() -> None:
    m = machine()
    first = only(m.handle_claim(claim("c1", m=m, vcpus=2), 0.0), ClaimResult)[0]
    _deltas(m, 2)
    again = m.handle_claim(claim("c1", seq=0, vcpus=2), 1.0)
    assert [type(s.message) for s in again] == [ClaimResult]  # no new delta
    assert again[0].message == first
    assert m.document["compute"]["vcpus_used"] == 2
    assert m.stats["claims_duplicate"] == 1 and m.stats["claims_accepted"] == 1


def test_rejection_carries_reason_and_the_missed_deltas() -> None:
    m = machine()
    missed = only(m.handle_claim(claim("c1", m=m, vcpus=7), 0.0), Delta)  # 7 of 8
    stale = claim("c2", seq=0, vcpus=2)  # decided on version 0, when 8 were free
    [send] = m.handle_claim(stale, 0.1)
    result = send.message
    assert send.to == "sched-1"
    assert not result.accepted
    assert result.reason == "insufficient vcpus: requested 2, used 7, capacity 8"
    assert (result.epoch, result.seq) == (EPOCH, 1)
    assert result.correction == missed
    assert m.document["compute"]["vcpus_used"] == 7
    assert m.stats["claims_rejected"] == 1


def test_rejection_correction_is_a_snapshot_when_the_ring_lost_the_deltas() -> None:
    m = machine(ring_size=2)
    _deltas(m, 3)
    result = only(m.handle_claim(claim("c1", seq=0, vcpus=9), 0.0), ClaimResult)[0]
    assert result.correction == [m.snapshot()]


def test_rejection_publishes_pending_changes_before_answering() -> None:
    m = machine()
    m.change([[SET, "compute", "vcpus_used", 8]], 0.0)
    sends = m.handle_claim(claim("c1", seq=0, vcpus=1), 0.01)
    assert [type(s.message) for s in sends] == [Delta, ClaimResult]
    assert sends[1].message.correction == [sends[0].message]


def test_duplicate_of_a_rejected_claim_is_rejected_again_even_if_it_fits_now() -> None:
    m = machine()
    m.change([[SET, "compute", "vcpus_used", 8]], 0.0)
    m.flush()
    first = only(m.handle_claim(claim("c1", m=m, vcpus=1), 0.0), ClaimResult)[0]
    m.change([[SET, "compute", "vcpus_used", 0]], 0.1)
    sends = m.handle_claim(claim("c1", seq=1, vcpus=1), 0.2)
    again = only(sends, ClaimResult)[0]
    assert not again.accepted and again.reason == first.reason
    assert again.correction == only(sends, Delta)  # what it missed since seq 1, fresh
    assert m.document["compute"]["vcpus_used"] == 0


@pytest.mark.parametrize(("mutate", "make", "reason"), [
    (None, lambda m: Claim("c", "s", "compute-2", EPOCH, 0, {"vcpus": 1}), "claim for 'compute-2' sent to"),
    ([SET, "service", "disabled", True], None, "compute service is disabled"),
    ([SET, "service", "forced_down", True], None, "compute service is forced down"),
    ([SET, "instances", "inst-c", {"claim": "other"}], None, "instance inst-c is already on this host"),
    (None, lambda m: claim("c", m=m, CUSTOM_GPU=1), "host has no CUSTOM_GPU inventory"),
    (None, lambda m: claim("c", m=m, memory_mb=2049), "insufficient memory_mb"),
    (None, lambda m: claim("c", m=m, epoch=EPOCH - 1), "claim based on epoch 6, source is at epoch 7"),
    (None, lambda m: claim("c", m=m, epoch=EPOCH + 1), "claim based on epoch 8"),
], ids=["wrong-source", "disabled", "forced-down", "instance-present", "no-inventory", "no-room",
        "older-epoch", "newer-epoch"])
def test_rejection_reasons(mutate: list | None, make: Any, reason: str) -> None:
    m = machine()
    if mutate:
        m.change([mutate], 0.0)
    c = make(m) if make else claim("c", m=m)
    result = only(m.handle_claim(c, 0.0), ClaimResult)[0]
    assert not result.accepted
    assert result.reason.startswith(reason)


def test_capacity_uses_ratio_and_reserved() -> None:
    m = machine()
    m.change([[SET, "compute", "reserved_vcpus", 1]], 0.0)  # (4 - 1) * 2.0 = 6
    assert only(m.handle_claim(claim("c1", m=m, vcpus=6), 0.0), ClaimResult)[0].accepted
    assert not only(m.handle_claim(claim("c2", m=m, vcpus=1), 0.0), ClaimResult)[0].accepted


def test_zero_amounts_always_fit() -> None:
    m = machine()
    result = only(m.handle_claim(claim("c1", m=m, vcpus=0, CUSTOM_GPU=0), 0.0), ClaimResult)[0]
    assert result.accepted
    assert m.document["compute"]["vcpus_used"] == 0


def test_claim_without_instance_still_publishes_a_delta_listing_it() -> None:
    m = machine()
    c = Claim("c1", "s", SRC, EPOCH, 0, {"vcpus": 0})
    delta = only(m.handle_claim(c, 0.0), Delta)[0]
    assert delta.claims == ["c1"] and delta.ops == []


def test_claim_is_judged_on_the_document_now_not_on_its_version() -> None:
    m = machine()
    _deltas(m, 3)
    result = only(m.handle_claim(claim("c1", seq=0, vcpus=1), 0.0), ClaimResult)[0]
    assert result.accepted  # an old version is no reason to refuse
    assert result.seq == 4


def test_answer_memory_is_bounded() -> None:
    m = machine(claim_memory=2)
    for i in range(3):
        only(m.handle_claim(claim(f"c{i}", m=m, vcpus=0, instance=""), 0.0), ClaimResult)
    assert list(m._results) == ["c1", "c2"]
    assert list(m.snapshot().claims) == ["c1", "c2"]


def test_release_gives_back_what_an_instance_consumed() -> None:
    m = machine()
    m.handle_claim(claim("c1", m=m, vcpus=3, memory_mb=512), 0.0)
    assert m.release("inst-c1", 1.0)
    [delta] = only(m.flush(), Delta)
    compute = m.document["compute"]
    assert (compute["vcpus_used"], compute["memory_mb_used"], compute["num_instances"]) == (0, 0, 0)
    assert "instances" not in m.document
    assert [DEL, "instances", "inst-c1"] in delta.ops
    assert not m.release("inst-c1", 1.0)


def test_next_epoch_is_always_newer() -> None:
    assert next_epoch(None, 5) == 5
    assert next_epoch(5, 9) == 9
    assert next_epoch(9, 9) == 10
    assert next_epoch(9, 3) == 10  # the wall clock went backwards


def test_everything_a_source_emits_passes_the_codec() -> None:
    m = machine(heartbeat_interval=1.0)
    sends = m.handle_claim(claim("c1", m=m, vcpus=1), 0.0)
    sends += m.handle_claim(claim("c2", seq=0, vcpus=99), 0.0)
    m.change([[SET, "metrics", "x", [1, 2.5, None, "s", {"k": True}]]], 0.0)
    sends += m.poll(1.0)
    sends += m.handle_resync(ResyncRequest(SRC, "s", EPOCH, 0), 1.0)
    sends += m.handle_resync(ResyncRequest(SRC, "s", NO_EPOCH, 0, True), 1.0)
    assert len(sends) >= 7
    for s in sends:
        assert codec.decode(codec.encode(s.message)) == s.message
