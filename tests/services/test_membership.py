"""Scheduler membership from the stream (shared_host_manager/membership.py; design §2).

Each scheduler publishes its own entry as a source on the stream; every one
learns its live peers from them, without configuration, and shares the hosts
out among them.  A scheduler that stops hands its share over at once; one
that goes silent is dropped 1.5 of its intervals after it was last heard.
"""

from __future__ import annotations

import uuid

import pytest
from svc_harness import make_reporter, start_peers, wait_for

from protocol.codec import decode, encode
from protocol.hostdoc import SCHEDULER, is_host
from protocol.receiver import ReceiverMachine
from shared_host_manager.decision.request import Flavor, RequestSpec
from shared_host_manager.decision.subset import PeerOwnership
from shared_host_manager.membership import (
    LIVENESS,
    MembershipPublisher,
    live_peers,
    source_id,
)
from transport.inprocess import InProcessBus


@pytest.fixture
def bus():
    b = InProcessBus(threaded=True)
    yield b
    b.close()


def _feed(receiver: ReceiverMachine, pub: MembershipPublisher, now: float, *, leave: bool = False,
          load: dict | None = None) -> None:
    snap = pub.leave(now, load) if leave else pub.publish(now, load)
    receiver.receive(decode(encode(snap)), now)  # as it crosses the stream


def test_peers_come_from_their_entries_and_leave_or_fall_silent():
    receiver = ReceiverMachine("s0", down_interval=30.0)
    pubs = {n: MembershipPublisher(n, 100 + i, 1000.0 + i, interval=1.0)
            for i, n in enumerate(("s0", "s1", "s2"))}
    for pub in pubs.values():
        _feed(receiver, pub, 0.0, load={"pending_claims": 0})
    assert live_peers(receiver, 0.1) == ["s0", "s1", "s2"]
    view = receiver.sources[source_id("s1")]
    assert not is_host(view.doc) and view.doc[SCHEDULER]["started_at"] == 1001.0
    # every publication is a new version and a whole snapshot: one lost costs nothing
    _feed(receiver, pubs["s0"], 0.9)
    pubs["s1"].publish(0.9)  # lost on the way
    _feed(receiver, pubs["s1"], 1.25)
    assert receiver.sources[source_id("s1")].seq == pubs["s1"].machine.seq
    # s2 stops: gone at once
    _feed(receiver, pubs["s2"], 1.3, leave=True)
    assert live_peers(receiver, 1.3) == ["s0", "s1"]
    # s1 falls silent: gone once LIVENESS of its intervals passed since it was last heard
    _feed(receiver, pubs["s0"], 2.0)
    assert live_peers(receiver, 1.25 + LIVENESS * 1.0) == ["s0", "s1"]
    assert live_peers(receiver, 1.25 + LIVENESS * 1.0 + 0.01) == ["s0"]
    # and comes back with its next publication
    _feed(receiver, pubs["s1"], 3.0)
    assert live_peers(receiver, 3.0) == ["s0", "s1"]
    with pytest.raises(ValueError):
        MembershipPublisher("x", 1, 0.0, interval=0)


def test_schedulers_find_each_other_share_hosts_and_take_over_a_leavers_share(bus):
    reporter = make_reporter(bus, bus, "r", hosts=12, seed=5, change_interval=0)
    managers = start_peers(bus, bus, reporter, 3)
    try:
        wait_for(lambda: all(len([s for s in m.versions() if not s.startswith("scheduler/")]) == 12
                             for m in managers), what="hosts")
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=128, root_gb=1),
                           instance_uuids=[uuid.uuid4().hex])
        result = managers[0].select_destinations(spec)
        [source] = result.placed.values()
        # the decision used the peers read from the stream: it claimed a host s0 owns
        assert managers[0].engine.peer_coordination.ownership is not None
        assert managers[0].engine.peer_coordination.ownership.peers == ["s0", "s1", "s2"]
        assert PeerOwnership("s0", ["s1", "s2"]).owns(source)
        # s2 stops: the other two drop it within one interval and share its hosts out
        managers[2].stop()
        wait_for(lambda: all(m.service.peers == ("s0", "s1") for m in managers[:2]), timeout=0.2 * 5,
                 what="s2's share to be handed over")
        managers[1].select_destinations(RequestSpec(
            flavor=Flavor(vcpus=1, memory_mb=128, root_gb=1), instance_uuids=[uuid.uuid4().hex]))
        assert managers[1].engine.peer_coordination.ownership is not None
        assert managers[1].engine.peer_coordination.ownership.peers == ["s0", "s1"]
        assert managers[0].service.figures()["peers"] == ["s0", "s1"]
    finally:
        for m in managers[:2]:
            m.stop()
        reporter.stop()
