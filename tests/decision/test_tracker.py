"""The request tracker: rejections and expiries move to alternates; acceptances complete."""

from __future__ import annotations

import random

import pytest

from protocol.document import SET
from protocol.messages import ClaimResult, Delta
from protocol.receiver import Outcome
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, RequestSpec
from shared_host_manager.decision.request_tracker import (
    InstanceFailed,
    InstanceRescheduled,
    InstanceScheduled,
    InstanceState,
    RequestFinished,
    RequestTracker,
    claims_of,
)
from simulator.synthetic_hosts import host_doc, load_receiver


def _setup(n=3, **cfg):
    docs = {f"cn{i}": host_doc(f"h{i}", vcpus=4, cpu_ratio=1.0, memory_mb=8192 + 1024 * i)
            for i in range(n)}
    rec = load_receiver(docs, down_interval=1e9, claim_deadline=5.0)
    engine = DecisionEngine(rec, config=SchedulerConfig(**cfg), rng=random.Random(0))
    return RequestTracker(engine), rec, []


def _submit(tracker, sent, spec, now):
    """Submit as the manager does: the claims the tracker returns are cast (kept in ``sent``)."""
    request, claims = tracker.submit(spec, now)
    sent.extend(claims)
    return request


def _process(tracker, sent, outcomes, now):
    """Process as the manager does: the alternates' claims in the events are cast (``sent``)."""
    events = tracker.process(outcomes, now)
    sent.extend(claims_of(events))
    return events


def _reject(rec, claim, now=1.0):
    rec.receive(ClaimResult(claim.claim_id, rec.name, claim.source, False, claim.epoch, claim.seq,
                            "no room"), now)


def _accept(rec, claim, now=1.0):
    rec.receive(ClaimResult(claim.claim_id, rec.name, claim.source, True, claim.epoch,
                            claim.seq + 1), now)


def test_rejection_claims_the_next_alternate_then_acceptance_completes():
    tracker, rec, sent = _setup()
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=2), instance_uuids=["vm"]), 0.0)
    assert [s.source for s in req.selections[0]] == ["cn2", "cn1", "cn0"]
    _reject(rec, sent[0])
    [event] = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert isinstance(event, InstanceRescheduled) and event.outcome is Outcome.REJECTED
    assert event.selection.source == "cn1" and sent[-1].source == "cn1"
    assert event.claim is sent[-1]  # the alternate's claim leaves in the event, nowhere else
    assert sent[-1].claim_id in rec.sources["cn1"].pending
    assert tracker.engine.subset.observed == 1 and tracker.engine.subset.rate > 0
    _accept(rec, sent[-1])
    events = _process(tracker, sent, rec.drain_outcomes(), 2.0)
    assert isinstance(events[0], InstanceScheduled) and events[0].selection.source == "cn1"
    assert isinstance(events[1], RequestFinished) and set(events[1].placed) == {"vm"}
    # the INCLUDED that follows (delta listing the claim) changes nothing
    rec.receive(Delta("cn1", 1, 1, [[SET, "compute", "vcpus_used", 2]], [sent[-1].claim_id]), 3.0)
    assert _process(tracker, sent, rec.drain_outcomes(), 3.0) == []
    assert tracker.request(req.request_id).instances["vm"].state is InstanceState.DONE


def test_exhausted_alternates_fail_with_no_valid_host():
    tracker, rec, sent = _setup(max_attempts=2)
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=2), instance_uuids=["vm"]), 0.0)
    assert len(req.selections[0]) == 2
    _reject(rec, sent[0])
    _process(tracker, sent, rec.drain_outcomes(), 1.0)
    _reject(rec, sent[1])
    events = _process(tracker, sent, rec.drain_outcomes(), 2.0)
    assert isinstance(events[0], InstanceFailed)
    assert isinstance(events[0].error, NoValidHost)
    assert "Exceeded max scheduling attempts 2" in str(events[0].error)
    assert isinstance(events[1], RequestFinished) and set(events[1].failed) == {"vm"}
    assert tracker.in_flight() == 0


def test_expired_claim_moves_on_and_an_alternate_that_no_longer_fits_is_skipped():
    tracker, rec, sent = _setup()
    _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=3), instance_uuids=["vm"]), 0.0)
    # cn1 (the first alternate) filled up meanwhile
    rec.receive(Delta("cn1", 1, 1, [[SET, "compute", "vcpus_used", 4]]), 1.0)
    rec.tick(10.0)  # the claim on cn2 expires without an answer
    [event] = _process(tracker, sent, rec.drain_outcomes(), 10.0)
    assert isinstance(event, InstanceRescheduled) and event.outcome is Outcome.EXPIRED
    assert event.selection.source == "cn0"
    inst = next(iter(tracker.requests.values())).instances["vm"]
    assert inst.history == ["h2: claim expired", "h1: insufficient vcpus: requested 3, used 4, "
                            "capacity 4"]


def test_accepted_claim_is_never_retried_even_if_it_later_expires():
    tracker, rec, sent = _setup()
    _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["vm"]), 0.0)
    _accept(rec, sent[0])
    assert isinstance(_process(tracker, sent, rec.drain_outcomes(), 1.0)[0], InstanceScheduled)
    rec.tick(100.0)  # the including delta never came: the receiver expires the pending claim
    assert [o for _, _, o in rec.drain_outcomes()] == [Outcome.EXPIRED]
    assert len(sent) == 1


def test_multi_instance_request_finishes_when_every_instance_is_resolved():
    tracker, rec, sent = _setup(n=4)
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), num_instances=2), 0.0)
    assert len(sent) == 2
    _accept(rec, sent[0])
    events = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert [type(e) for e in events] == [InstanceScheduled]
    _accept(rec, sent[1])
    events = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert [type(e) for e in events] == [InstanceScheduled, RequestFinished]
    assert tracker.request(req.request_id).finished


def test_no_valid_host_at_submit_propagates():
    tracker, rec, sent = _setup()
    with pytest.raises(NoValidHost):
        _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=100)), 0.0)
    assert tracker.stats["no_valid_host_at_once"] == 1 and not tracker.requests


def test_outcomes_of_unknown_claims_are_ignored():
    tracker, rec, sent = _setup()
    assert _process(tracker, sent, [("nope", "cn1", Outcome.REJECTED)], 0.0) == []


def test_alternate_failing_a_filter_now_is_skipped():
    # anti-affinity: after the decision, a member of the group shows up on the first alternate
    tracker, rec, sent = _setup()
    from shared_host_manager.decision.request import InstanceGroup

    group = InstanceGroup("anti-affinity", members=["m1"])
    _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["vm"],
                               instance_group=group), 0.0)
    rec.receive(Delta("cn1", 1, 1, [[SET, "instances", "m1", {"claim": "x"}]]), 1.0)
    _reject(rec, sent[0])
    [event] = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert isinstance(event, InstanceRescheduled) and event.selection.source == "cn0"
    inst = next(iter(tracker.requests.values())).instances["vm"]
    assert inst.history[-1] == "h1: ServerGroupAntiAffinityFilter no longer passes"


def test_rejected_siblings_do_not_meet_on_a_shared_alternate():
    from shared_host_manager.decision.request import InstanceGroup

    tracker, rec, sent = _setup(n=3)
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["a", "b"],
                                     instance_group=InstanceGroup("anti-affinity")), 0.0)
    assert [s.source for s in req.selections[0][1:]] == ["cn0"] == [
        s.source for s in req.selections[1][1:]]
    _reject(rec, sent[0])
    _reject(rec, sent[1])
    events = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert isinstance(events[0], InstanceRescheduled) and events[0].selection.source == "cn0"
    # b may not join a on cn0; with attempts left it takes the one host it has not tried,
    # where no member of the group is now (a's claim there was rejected)
    assert isinstance(events[1], InstanceRescheduled) and events[1].selection.source == "cn2"
    assert req.instances["b"].history[-1] == "h0: ServerGroupAntiAffinityFilter no longer passes"
    assert {c.source for c in sent[2:]} == {"cn0", "cn2"}


def test_alternates_run_out_before_max_attempts_then_the_view_now_gives_fresh_ones():
    # a scarce request: only cn2 fits at decision time, so the decision has no alternate
    tracker, rec, sent = _setup(max_attempts=3)
    for s in ("cn0", "cn1"):
        rec.receive(Delta(s, 1, 1, [[SET, "compute", "vcpus_used", 3]]), 0.0)
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=2), instance_uuids=["vm"]), 0.0)
    assert [s.source for s in req.selections[0]] == ["cn2"]
    # meanwhile a deletion freed cn0; cn2 rejects the claim
    rec.receive(Delta("cn0", 1, 2, [[SET, "compute", "vcpus_used", 0]]), 1.0)
    _reject(rec, sent[0])
    [event] = _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert isinstance(event, InstanceRescheduled) and event.selection.source == "cn0"
    assert sent[-1].source == "cn0" and tracker.stats["fresh_alternates"] == 1
    inst = req.instances["vm"]
    assert inst.claims == 2 and [h.source for h in inst.hosts] == ["cn2", "cn0"]
    # cn0 rejects too: the only untried host (cn1) still does not fit, so it fails,
    # saying it had attempts left
    _reject(rec, sent[-1])
    events = _process(tracker, sent, rec.drain_outcomes(), 2.0)
    assert isinstance(events[0], InstanceFailed)
    assert "No valid host left for instance vm after 2 of 3 attempts" in str(events[0].error)
    assert len(sent) == 2


def test_fresh_alternates_never_exceed_max_attempts_claims():
    tracker, rec, sent = _setup(n=6, max_attempts=3)
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["vm"]), 0.0)
    # two alternates were chosen; one host fills up meanwhile, so its alternate is skipped
    rec.receive(Delta(req.selections[0][1].source, 1, 1, [[SET, "compute", "vcpus_used", 4]]), 0.5)
    for step in range(1, 10):
        _reject(rec, sent[-1], now=float(step))
        events = _process(tracker, sent, rec.drain_outcomes(), float(step))
        if isinstance(events[0], InstanceFailed):
            break
    assert len(sent) == 3 and len({c.source for c in sent}) == 3
    assert "Exceeded max scheduling attempts 3" in str(events[0].error)


def test_rejected_claims_are_counted_by_how_their_host_was_chosen():
    # more hosts fit than make a request scarce; a peer's host is taken here, not handed over
    tracker, rec, sent = _setup(n=12, hand_to_owner=False)
    tracker.engine.set_peers(["s0", rec.name])  # a peer: hosts are owned, choices labelled
    req = _submit(tracker, sent, RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["vm"]), 0.0)
    first = sent[0]
    stats = tracker.engine.stats
    assert stats["scarce_choices"] == 0 and stats["owned_choices"] + stats["peer_choices"] == 1
    chosen = "owned" if stats["owned_choices"] else "peer"
    [claimed, *alternates] = req.selections[0]
    assert claimed.claim_id == first.claim_id and claimed.choice == chosen
    assert alternates and all(a.choice == "alternate" for a in alternates)
    _reject(rec, first)
    _process(tracker, sent, rec.drain_outcomes(), 1.0)
    _reject(rec, sent[-1])  # the alternate claimed after the rejection
    _process(tracker, sent, rec.drain_outcomes(), 1.0)
    _accept(rec, sent[-1])
    _process(tracker, sent, rec.drain_outcomes(), 1.0)
    assert tracker.rejected_by_choice == {chosen: 1, "alternate": 1}
