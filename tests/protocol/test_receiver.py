"""Unit tests of the receiver-side rules (protocol/receiver.py module docstring)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.document import SET, digest
from protocol.errors import LocalProtocolError
from protocol.messages import (
    NO_EPOCH,
    Batch,
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    ResyncAnswer,
    ResyncRequest,
    Send,
    Snapshot,
)
from protocol.receiver import Outcome, ReceiverMachine, Status
from protocol.source_state import SourceState

A = "compute-a"
B = "compute-b"
E = 100
DOC = {"compute": {"vcpus": 8, "vcpus_used": 0, "memory_mb": 4096}, "metrics": {"n": 0}}


def rx(**kw: Any) -> ReceiverMachine:
    kw.setdefault("reorder_window", 4)
    kw.setdefault("reorder_timeout", 0.2)
    kw.setdefault("resync_timeout", 1.0)
    kw.setdefault("resync_backoff_max", 8.0)
    kw.setdefault("down_interval", 30.0)
    kw.setdefault("claim_deadline", 30.0)
    return ReceiverMachine("sched-1", **kw)


def snap(seq: int = 0, epoch: int = E, source: str = A, claims: list[str] | None = None, n: int | None = None
         ) -> Snapshot:
    doc = {"compute": dict(DOC["compute"]), "metrics": {"n": seq if n is None else n}}
    return Snapshot(source, epoch, seq, doc, claims or [])


def delta(seq: int, epoch: int = E, source: str = A, claims: list[str] | None = None) -> Delta:
    """The delta that makes metrics.n == seq (so the held document shows what was applied)."""
    return Delta(source, epoch, seq, [[SET, "metrics", "n", seq]], claims or [])


def held(r: ReceiverMachine, source: str = A) -> tuple[int, int, int | None]:
    view = r.view(source)
    assert view is not None and view.doc is not None
    return view.epoch, view.seq, view.doc["metrics"]["n"]


def requests(sends: list[Send]) -> list[ResyncRequest]:
    assert all(type(s.message) is ResyncRequest and s.to == s.message.source for s in sends), sends
    return [s.message for s in sends]


def established(**kw: Any) -> ReceiverMachine:
    r = rx(**kw)
    assert r.receive(snap(0), 0.0) == []
    r.tick(0.0)
    return r


# --------------------------------------------------------------------------
# establishing a source


def test_unknown_source_is_established_only_by_a_snapshot() -> None:
    r = rx()
    [req] = requests(r.receive(delta(3), 0.0))
    assert req == ResyncRequest(A, "sched-1", NO_EPOCH, 0, True)
    view = r.view(A)
    assert view.status is Status.SYNCING and view.doc is None
    assert requests(r.receive(Heartbeat(A, E, 3, bytes(16)), 0.1)) == []  # rate-limited
    assert r.receive(snap(3), 0.2) == []
    assert view.status is Status.ACTIVE
    assert held(r) == (E, 3, 3)
    assert A in r.drain_changed()


def test_add_source_hint_asks_for_a_snapshot() -> None:
    r = rx()
    [req] = requests(r.add_source_hint(B, 0.0))
    assert (req.epoch, req.seq, req.full) == (NO_EPOCH, 0, True)
    assert r.view(B).status is Status.SYNCING
    r.receive(snap(0, source=B), 0.1)
    assert r.add_source_hint(B, 0.2) == []


def test_a_batch_may_carry_items_of_many_sources() -> None:
    r = rx()
    r.receive(Batch([snap(0), snap(5, source=B), delta(1), delta(6, source=B)]), 0.0)
    assert held(r, A) == (E, 1, 1)
    assert held(r, B) == (E, 6, 6)


def test_receiver_refuses_control_messages_it_does_not_handle() -> None:
    with pytest.raises(LocalProtocolError):
        rx().receive(ResyncRequest(A, "x", E, 0), 0.0)


# --------------------------------------------------------------------------
# deltas: in order, duplicates, gaps


def test_next_delta_applies_and_older_ones_are_duplicates() -> None:
    r = established()
    r.receive(delta(1), 0.1)
    r.receive(delta(2), 0.2)
    assert held(r) == (E, 2, 2)
    r.receive(delta(2), 0.3)
    r.receive(delta(1), 0.3)
    assert held(r) == (E, 2, 2)
    assert r.stats["applied"] == 2 and r.stats["duplicates"] == 2


def test_gap_waits_in_the_reorder_buffer_and_closes() -> None:
    r = established()
    assert r.receive(delta(3), 0.1) == []
    assert r.receive(delta(2), 0.1) == []
    assert r.receive(delta(3), 0.1) == []  # the same buffered delta twice
    assert held(r) == (E, 0, 0)  # never out of order
    assert r.stats["gaps"] == 1 and r.stats["buffered"] == 2 and r.stats["duplicates"] == 1
    r.receive(delta(1), 0.15)
    assert held(r) == (E, 3, 3)
    assert r.view(A).buffer == {}
    assert r.tick(1.0) == []  # nothing left to chase


def test_gap_that_does_not_close_asks_for_a_resync_from_the_held_version() -> None:
    r = established()
    r.receive(delta(1), 0.0)
    r.receive(delta(3), 1.0)
    assert r.tick(1.19) == []
    [req] = requests(r.tick(1.21))
    assert req == ResyncRequest(A, "sched-1", E, 1, False)
    assert r.stats["resyncs_requested"] == 1
    # the answer fills the gap; the buffered delta is used, not dropped
    r.receive(ResyncAnswer(A, "sched-1", [delta(2)]), 1.3)
    assert held(r) == (E, 3, 3)
    assert r.tick(5.0) == []


def test_buffer_overflow_resyncs_at_once() -> None:
    r = established(reorder_window=2)
    r.receive(delta(3), 0.0)
    r.receive(delta(4), 0.0)
    [req] = requests(r.receive(delta(5), 0.0))
    assert (req.epoch, req.seq, req.full) == (E, 0, False)
    assert r.stats["buffer_overflows"] == 1
    assert r.view(A).buffer == {}
    r.receive(ResyncAnswer(A, "sched-1", [delta(i) for i in range(1, 6)]), 0.1)
    assert held(r) == (E, 5, 5)


def test_answer_with_a_snapshot_keeps_newer_buffered_deltas() -> None:
    r = established()
    r.receive(delta(5), 0.0)
    r.receive(delta(2), 0.0)
    r.receive(ResyncAnswer(A, "sched-1", [snap(4)]), 0.1)
    assert held(r) == (E, 5, 5)  # 2 was stale and dropped, 5 applied after the snapshot
    assert r.view(A).buffer == {}


# --------------------------------------------------------------------------
# heartbeats


def test_heartbeat_of_the_held_version_and_digest_is_quiet() -> None:
    r = established()
    assert r.receive(Heartbeat(A, E, 0, digest(snap(0).doc)), 1.0) == []
    assert r.stats["divergences"] == 0


def test_heartbeat_ahead_asks_for_a_resync() -> None:
    r = established()
    [req] = requests(r.receive(Heartbeat(A, E, 4, bytes(16)), 1.0))
    assert (req.epoch, req.seq, req.full) == (E, 0, False)
    assert r.stats["heartbeat_resyncs"] == 1
    assert requests(r.receive(Heartbeat(A, E, 4, bytes(16)), 1.1)) == []  # still waiting
    assert r.stats["heartbeat_resyncs"] == 1


def test_old_heartbeat_is_ignored() -> None:
    r = established()
    r.receive(delta(1), 0.0)
    assert r.receive(Heartbeat(A, E, 0, bytes(16)), 1.0) == []
    assert r.receive(Heartbeat(A, E - 1, 9, bytes(16)), 1.0) == []
    assert r.stats["stale"] == 1


def test_digest_mismatch_is_a_divergence_repaired_by_a_full_resync() -> None:
    r = established()
    r.receive(delta(1), 0.0)
    [req] = requests(r.receive(Heartbeat(A, E, 1, b"\x01" * 16), 1.0))
    assert (req.epoch, req.seq, req.full) == (E, 1, True)
    assert r.stats["divergences"] == 1
    assert r.view(A).want_full
    # a snapshot of the *same* version replaces the diverged document
    r.receive(ResyncAnswer(A, "sched-1", [snap(1, n=42)]), 1.1)
    assert held(r) == (E, 1, 42)
    assert not r.view(A).want_full
    assert r.tick(10.0) == []


def test_full_resync_is_retried_until_a_snapshot_comes() -> None:
    r = established()
    r.receive(Heartbeat(A, E, 0, b"\x01" * 16), 1.0)
    assert r.receive(ResyncAnswer(A, "sched-1", []), 1.1) == []
    [req] = requests(r.tick(1.2))  # an empty answer does not repair a divergence
    assert req.full


# --------------------------------------------------------------------------
# epochs


def test_newer_epoch_needs_a_snapshot_and_retires_pending_claims() -> None:
    r = established()
    r.add_claim(Claim("c1", "sched-1", A, E, 0, {"vcpus": 2}), 0.0)
    [req] = requests(r.receive(delta(1, epoch=E + 1), 0.1))
    assert (req.epoch, req.seq, req.full) == (E, 0, False)
    assert held(r) == (E, 0, 0)  # a new epoch is never established by a delta
    requests(r.receive(Heartbeat(A, E + 1, 1, bytes(16)), 0.2))
    r.add_claim(Claim("c2", "sched-1", A, E, 0, {"vcpus": 1}), 0.25)
    # the new epoch's document still carries c1 (applied before the restart), not c2
    r.receive(snap(1, epoch=E + 1, claims=["c1"]), 0.3)
    assert held(r) == (E + 1, 1, 1)
    assert sorted(r.drain_outcomes()) == [("c1", A, Outcome.INCLUDED),
                                          ("c2", A, Outcome.EPOCH_CHANGED)]
    assert r.view(A).pending_usage == {}
    assert r.stats["epochs_changed"] == 1 and r.stats["claims_epoch_retired"] == 1


def test_new_epoch_discards_deltas_buffered_from_the_old_one() -> None:
    r = established()
    r.receive(delta(3), 0.0)  # buffered behind a gap, epoch E
    r.receive(snap(2, epoch=E + 1), 0.1)
    assert held(r) == (E + 1, 2, 2)  # the old epoch's seq 3 is not the new epoch's seq 3
    assert r.view(A).buffer == {}
    r.receive(delta(3, epoch=E + 1), 0.2)
    assert held(r) == (E + 1, 3, 3)


def test_older_epoch_never_replaces_a_newer_one() -> None:
    r = rx()
    r.receive(snap(3, epoch=E + 1), 0.0)
    assert r.receive(snap(9, epoch=E), 0.1) == []
    assert r.receive(delta(4, epoch=E), 0.1) == []
    assert r.receive(ResyncAnswer(A, "sched-1", [snap(10, epoch=E)]), 0.2) == []
    assert held(r) == (E + 1, 3, 3)
    assert r.stats["stale"] == 3


def test_older_snapshot_of_the_same_epoch_is_a_duplicate() -> None:
    r = established()
    r.receive(delta(1), 0.0)
    r.receive(snap(0), 0.1)
    r.receive(snap(1, n=77), 0.1)  # same version, no divergence known: keep what we hold
    assert held(r) == (E, 1, 1)
    assert r.stats["duplicates"] == 2


# --------------------------------------------------------------------------
# liveness


def test_source_goes_down_after_the_down_interval_and_comes_back() -> None:
    r = established(down_interval=4.0)
    r.tick(3.9)
    assert r.view(A).status is Status.ACTIVE
    r.drain_changed()
    r.tick(5.0)
    view = r.view(A)
    assert view.status is Status.DOWN
    assert view.doc is not None  # not forgotten
    assert r.stats["went_down"] == 1 and A in r.drain_changed()
    r.receive(Heartbeat(A, E, 0, digest(snap(0).doc)), 6.0)
    assert view.status is Status.ACTIVE
    assert r.stats["came_up"] == 1


def test_a_goodbye_takes_the_source_down_at_once_until_its_next_epoch() -> None:
    """Defect 2 of issue 13: a source that stops cleanly leaves the eligible set with its last
    delta, not down_interval later; heartbeats do not bring it back, its next epoch does."""
    r = established(down_interval=30.0)
    r.drain_changed()
    r.receive(Delta(A, E, 1, [[SET, "service", "stopped", True]]), 1.0)
    view = r.view(A)
    assert view.status is Status.DOWN and view.seq == 1
    assert r.stats["goodbyes"] == 1 and A in r.drain_changed()
    r.receive(Heartbeat(A, E, 1, digest(view.doc)), 2.0)  # a late heartbeat of the same version
    assert view.status is Status.DOWN
    r.receive(snap(0, epoch=E + 1), 3.0)  # the source starts again: a new epoch, no goodbye
    assert view.status is Status.ACTIVE and r.stats["came_up"] == 1


def test_any_message_is_proof_of_life() -> None:
    r = established(down_interval=4.0)
    r.receive(delta(1), 3.0)
    r.receive(ClaimResult("x", "sched-1", A, False, E, 1), 6.0)
    r.tick(9.0)
    assert r.view(A).status is Status.ACTIVE
    r.tick(11.0)
    assert r.view(A).status is Status.DOWN


# --------------------------------------------------------------------------
# resync backoff


def test_unanswered_resync_is_retried_with_exponential_backoff() -> None:
    r = rx(resync_timeout=1.0, resync_backoff_max=4.0)
    sent = [0.0] if r.add_source_hint(A, 0.0) else []
    t = 0.0
    while t < 20.0:
        t = round(t + 0.1, 6)
        if r.tick(t):
            sent.append(t)
    assert sent == [0.0, 1.0, 3.0, 7.0, 11.0, 15.0, 19.0]  # waits 1, 2, 4, then capped at 4
    assert r.stats["resyncs_requested"] == len(sent)


def test_an_answer_resets_the_backoff() -> None:
    r = rx(resync_timeout=1.0)
    r.add_source_hint(A, 0.0)
    r.tick(1.0)
    r.tick(3.0)
    assert r.view(A).resync_attempts == 3
    r.receive(ResyncAnswer(A, "sched-1", [snap(0)]), 3.5)
    assert r.view(A).resync_attempts == 0 and r.view(A).resync_sent_at is None
    [req] = requests(r.receive(Heartbeat(A, E, 2, bytes(16)), 3.6))  # a new need asks at once
    assert req.seq == 0


def test_next_deadline_is_never_in_the_past_after_tick() -> None:
    """Regression: after a timed-out gap sent its resync, next_deadline() kept returning
    gap_since + reorder_timeout (already past), so an edge sleeping until it would spin."""
    r = established(resync_timeout=2.0, down_interval=30.0)
    r.receive(delta(2), 0.1)
    assert r.next_deadline() == pytest.approx(0.3)
    requests(r.tick(0.31))
    now, sent = 0.31, []
    while now < 7.0:
        deadline = r.next_deadline()
        assert deadline > now, f"next_deadline() {deadline} is already past at {now}"
        now = deadline
        if r.tick(now):
            sent.append(round(now, 6))
    assert sent == [2.31, 6.31]  # retries after 2 s, then 4 s; no wake-up was wasted on them


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["delta", "snap", "hb", "answer", "claim", "tick"]),
                          st.integers(0, 6), st.integers(0, 2), st.sampled_from([0.0, 0.05, 0.3, 1.5, 4.0])),
                max_size=40))
def test_tick_leaves_nothing_due(steps: list[tuple[str, int, int, float]]) -> None:
    """After tick(now), nothing is due before next_deadline() (> now): an edge may sleep."""
    r = rx(resync_timeout=0.5, resync_backoff_max=3.0, down_interval=5.0, claim_deadline=2.0)
    now = 0.0
    for i, (kind, seq, epoch, dt) in enumerate(steps):
        now = round(now + dt, 6)
        if kind == "delta" and seq:
            r.receive(delta(seq, epoch=E + epoch), now)
        elif kind == "snap":
            r.receive(snap(seq, epoch=E + epoch), now)
        elif kind == "hb":
            r.receive(Heartbeat(A, E + epoch, seq, bytes(16)), now)
        elif kind == "answer":
            r.receive(ResyncAnswer(A, "sched-1", [snap(seq, epoch=E + epoch)]), now)
        elif kind == "claim" and r.view(A) is not None and r.view(A).doc is not None:
            r.add_claim(Claim(f"c{i}", "sched-1", A, r.view(A).epoch, r.view(A).seq, {"vcpus": 1}), now)
        r.tick(now)
        deadline = r.next_deadline()
        assert deadline > now, (deadline, now)
        assert r.tick(now) == []
        if now < deadline - 1e-6 < now + 100:  # nothing happens before the deadline either
            before = dict(r.stats)
            assert r.tick(deadline - 1e-6) == []
            assert r.stats == before


# --------------------------------------------------------------------------
# the pending-claim ledger


def _claim(claim_id: str, r: ReceiverMachine, **resources: int) -> Claim:
    view = r.view(A)
    return Claim(claim_id, "sched-1", A, view.epoch, view.seq, resources or {"vcpus": 1}, f"i-{claim_id}")


def test_add_claim_needs_a_held_view_and_a_new_id() -> None:
    r = rx()
    with pytest.raises(LocalProtocolError):
        r.add_claim(Claim("c1", "sched-1", A, E, 0, {"vcpus": 1}), 0.0)
    r.receive(snap(0), 0.0)
    r.add_claim(_claim("c1", r), 0.0)
    with pytest.raises(LocalProtocolError):
        r.add_claim(_claim("c1", r), 0.0)


def test_pending_usage_is_the_sum_of_pending_claims() -> None:
    r = established()
    r.add_claim(_claim("c1", r, vcpus=2, memory_mb=512), 0.0)
    r.add_claim(_claim("c2", r, vcpus=1), 0.0)
    assert r.view(A).pending_usage == {"vcpus": 3, "memory_mb": 512}
    assert r.pending_claims() == 2
    r.receive(delta(1, claims=["c1"]), 0.1)
    assert r.view(A).pending_usage == {"vcpus": 1}
    assert r.drain_outcomes() == [("c1", A, Outcome.INCLUDED)]


def test_acceptance_is_informational_and_inclusion_retires() -> None:
    r = established()
    r.add_claim(_claim("c1", r), 0.0)
    r.receive(ClaimResult("c1", "sched-1", A, True, E, 1), 0.1)
    r.receive(ClaimResult("c1", "sched-1", A, True, E, 1), 0.1)  # a duplicate answer
    assert r.drain_outcomes() == [("c1", A, Outcome.ACCEPTED)]
    assert r.view(A).pending_usage == {"vcpus": 1}  # still pending until the delta
    r.receive(delta(1, claims=["c1"]), 0.2)
    assert r.drain_outcomes() == [("c1", A, Outcome.INCLUDED)]
    r.receive(ClaimResult("c1", "sched-1", A, True, E, 1), 0.3)  # acceptance after inclusion
    assert r.drain_outcomes() == [] and r.stats["claim_results_late"] == 0


def test_inclusion_by_a_snapshot_retires_the_claim() -> None:
    r = established()
    r.add_claim(_claim("c1", r), 0.0)
    r.add_claim(_claim("c2", r), 0.0)
    r.receive(ResyncAnswer(A, "sched-1", [snap(5, claims=["c1", "other"])]), 0.1)
    assert r.drain_outcomes() == [("c1", A, Outcome.INCLUDED)]
    assert list(r.view(A).pending) == ["c2"]


def test_buffered_delta_listing_a_claim_retires_it_when_applied() -> None:
    r = established()
    r.add_claim(_claim("c1", r), 0.0)
    r.receive(delta(2, claims=["c1"]), 0.1)
    assert r.drain_outcomes() == []  # not applied yet: still pending
    r.receive(delta(1), 0.1)
    assert r.drain_outcomes() == [("c1", A, Outcome.INCLUDED)]


def test_rejection_applies_the_correction_then_retires() -> None:
    r = established()
    r.add_claim(_claim("c1", r, vcpus=4), 0.0)
    correction = [delta(1), delta(2)]
    r.receive(ClaimResult("c1", "sched-1", A, False, E, 2, "insufficient vcpus", correction), 0.1)
    assert held(r) == (E, 2, 2)
    assert r.drain_outcomes() == [("c1", A, Outcome.REJECTED)]
    assert r.view(A).pending_usage == {}
    r.receive(ClaimResult("c1", "sched-1", A, False, E, 2, "insufficient vcpus"), 0.2)
    assert r.stats["claim_results_late"] == 1
    assert r.drain_outcomes() == []


def test_claim_result_of_an_unknown_source_is_ignored() -> None:
    r = rx()
    assert r.receive(ClaimResult("c1", "sched-1", B, False, E, 0, "", [snap(0, source=B)]), 0.0) == []
    assert r.view(B) is None


def test_claim_deadline_expiry_is_counted() -> None:
    r = established(claim_deadline=5.0)
    r.add_claim(_claim("c1", r, vcpus=2), 1.0)
    r.tick(5.9)
    assert r.drain_outcomes() == []
    assert r.next_deadline() <= 6.0
    r.tick(6.0)
    assert r.drain_outcomes() == [("c1", A, Outcome.EXPIRED)]
    assert r.stats["claims_expired"] == 1
    assert r.view(A).pending_usage == {} and r.pending_claims() == 0
    r.receive(delta(1, claims=["c1"]), 6.1)  # the inclusion arrives late: nothing twice
    assert r.drain_outcomes() == []


def test_a_cancelled_claim_stops_being_deducted_once() -> None:
    r = established(claim_deadline=5.0)
    r.add_claim(_claim("c1", r, vcpus=2), 1.0)
    r.add_claim(_claim("c2", r, vcpus=3), 1.0)
    assert r.view(A).pending_usage == {"vcpus": 5}
    r.drain_changed()
    assert r.cancel_claim(A, "c1") is True
    assert r.view(A).pending_usage == {"vcpus": 3}
    assert r.drain_outcomes() == [("c1", A, Outcome.CANCELLED)]
    assert r.drain_changed() == {A}  # indexes must recompute the host's free resources
    assert r.stats["claims_cancelled"] == 1
    assert r.cancel_claim(A, "c1") is False  # not pending any more: nothing twice
    assert r.cancel_claim(B, "c2") is False  # no such claim on that source
    assert r.cancel_claim(A, "nope") is False
    r.tick(6.0)  # c1's deadline passes: already retired, only c2 expires
    assert r.drain_outcomes() == [("c2", A, Outcome.EXPIRED)]
    r.receive(delta(1, claims=["c1"]), 6.1)  # the arbiter accepted it anyway: the delta says so
    assert r.drain_outcomes() == [] and r.view(A).pending_usage == {}


def test_a_cancelled_claim_id_can_be_claimed_again() -> None:
    r = established(claim_deadline=5.0)
    r.add_claim(_claim("c1", r, vcpus=2), 1.0)
    assert r.cancel_claim(A, "c1")
    r.add_claim(_claim("c1", r, vcpus=4), 2.0)  # a retry of the same build (nova: same instance)
    r.tick(6.5)  # the first attempt's deadline (6.0) must not expire the second (7.0)
    assert r.view(A).pending_usage == {"vcpus": 4}
    r.tick(7.0)
    assert r.view(A).pending_usage == {}


def test_each_claim_resolves_once_whatever_arrives() -> None:
    r = established(claim_deadline=1.0)
    r.add_claim(_claim("c1", r), 0.0)
    r.receive(delta(1, claims=["c1"]), 0.1)
    r.receive(ClaimResult("c1", "sched-1", A, False, E, 1, "?"), 0.2)
    r.receive(snap(3, epoch=E + 1, claims=["c1"]), 0.3)
    r.tick(5.0)
    assert [o for _, _, o in r.drain_outcomes()] == [Outcome.INCLUDED]


def test_forget_expires_pending_claims() -> None:
    r = established()
    r.add_claim(_claim("c1", r), 0.0)
    r.forget(A)
    assert r.view(A) is None
    assert r.drain_outcomes() == [("c1", A, Outcome.EXPIRED)]
    r.tick(100.0)  # the claim's deadline finds nothing
    assert r.drain_outcomes() == []
    r.forget(A)  # twice is harmless


def test_restore_keeps_what_a_view_held_before_heard_since():
    """A saved view restored over one already held: what the receiver heard itself is newer
    than the save, so the view keeps its own last_heard."""
    r = ReceiverMachine("s", down_interval=30.0)
    r.receive(Snapshot("h1", 1, 5, {"compute": {"vcpus": 4}}), 100.0)
    r.restore(Snapshot("h1", 1, 4, {"compute": {"vcpus": 4}}), 101.0, last_heard=0.0)
    view = r.sources["h1"]
    assert view.version == (1, 5) and view.last_heard == 100.0
    assert view.state is SourceState.ACTIVE


def test_a_message_heard_long_ago_does_not_bring_a_source_up():
    """``heard``: a message of a restart's backlog, sent down_interval ago or more, is no
    proof of life now: a new view is DOWN at once, a DOWN one stays so (also when the
    message ends a goodbye), a later one brings it up; ``heard`` never counts past now."""
    r = ReceiverMachine("s", down_interval=30.0)
    doc = {"compute": {"vcpus": 4}}
    r.receive(Batch([Snapshot("h1", 1, 1, doc), Heartbeat("h2", 1, 0, b"")]), 100.0, heard=60.0)
    assert r.sources["h1"].state is SourceState.DOWN and r.sources["h1"].last_heard == 60.0
    assert r.sources["h2"].state is SourceState.DOWN
    assert r.stats["went_down"] == 2
    r.receive(Snapshot("h1", 1, 2, doc), 100.0, heard=65.0)
    assert r.sources["h1"].state is SourceState.DOWN and r.sources["h1"].version == (1, 2)
    r.receive(Snapshot("h3", 1, 1, {**doc, "service": {"stopped": True}}), 100.0, heard=50.0)
    r.receive(Snapshot("h3", 2, 1, doc), 100.0, heard=65.0)  # its next epoch, long ago
    assert r.sources["h3"].state is SourceState.DOWN and r.sources["h3"].last_heard == 65.0
    r.receive(Snapshot("h1", 1, 3, doc), 100.0, heard=75.0)
    assert r.sources["h1"].state is SourceState.ACTIVE and r.sources["h1"].last_heard == 75.0
    r.receive(Snapshot("h1", 1, 4, doc), 100.0, heard=70.0)  # never back in time
    assert r.sources["h1"].last_heard == 75.0
    r.receive(Snapshot("h1", 1, 5, doc), 100.0, heard=250.0)
    assert r.sources["h1"].last_heard == 100.0


def test_restore_of_a_goodbye_stays_down_without_counting_a_silence():
    r = ReceiverMachine("s", down_interval=30.0)
    goodbye = {"compute": {"vcpus": 4}, "service": {"stopped": True}}
    r.restore(Snapshot("h1", 1, 5, goodbye), 100.0, last_heard=0.0)
    assert r.sources["h1"].state is SourceState.DOWN
    assert r.stats["went_down"] == 0
