"""Scarce requests handed to the coordinating scheduler, through real services (design §5.4).

Three SchedulerManagers on the in-process bus find each other through the stream
(membership); the first by name coordinates.  A scarce request decided by another is cast
to it as a ScarceRequest, decided and claimed there, and answered with a ScarceAnswer, both
on the peer topic (control plane 1.4).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest
from svc_harness import (
    SCHEDULER_TOPIC,
    converged,
    make_reporter,
    make_scheduler,
    start_peers,
    wait_for,
)

from protocol.codec import Encoder
from protocol.document import SET
from protocol.messages import ScarceRequest
from shared_host_manager.decision.manager import SchedulerManager
from shared_host_manager.decision.request import Flavor, RequestSpec, spec_to_wire
from transport.inprocess import InProcessBus

BIG = 2


@pytest.fixture
def bus():
    bus = InProcessBus(threaded=True)
    yield bus
    bus.close()


@pytest.fixture
def cloud(bus):
    reporter = _reporter(bus)
    with _cloud(reporter, start_peers(bus, bus, reporter, 3, request_timeout=5.0)) as managers:
        yield managers


def _reporter(bus):
    return make_reporter(bus, bus, "r", hosts=12, seed=7, change_interval=0)


@contextlib.contextmanager
def _cloud(reporter, managers):
    """The managers, once their views hold the BIG hosts and the others; stopped after."""
    try:
        # BIG hosts keep 6 GB of memory free, the others 1 GB: a 4 GB server is scarce (it
        # fits at most 2 hosts per live scheduler), and fits once on each BIG host
        for i, source in enumerate(reporter.tracker.hosts()):
            memory = reporter.tracker.document(source)["compute"]["memory_mb"]
            free = 6144 if i < BIG else 1024
            reporter.manager.change(source, [[SET, "compute", "memory_mb_used", memory - free]],
                                    time.monotonic())
        reporter.wake()
        wait_for(lambda: converged([reporter], [m.service for m in managers]), what="the views")
        yield managers
    finally:
        for m in managers:
            m.stop()
        reporter.stop()


def _scarce() -> RequestSpec:
    """A one-server request only the BIG hosts fit (at most 2 per live scheduler: scarce)."""
    return RequestSpec(flavor=Flavor(vcpus=1, memory_mb=4096, root_gb=1),
                       instance_uuids=[uuid.uuid4().hex])


def test_a_scarce_request_is_decided_and_claimed_by_the_coordinator(cloud):
    s0, s1, _ = cloud
    spec = _scarce()
    result = s1.select_destinations(spec)
    assert result.decided_by == "s0" and not result.timed_out
    assert list(result.placed) == list(spec.instance_uuids) and result.claims == 1
    assert s1.scarce_stats["handed_over"] == 1 and s1.scarce_stats["answered"] == 1
    assert s0.scarce_stats["decided_for_peers"] == 1 and s1.engine.stats["delegated"] == 1
    # the coordinator's own scarce request, and anyone's request many hosts fit, stay home
    assert s0.select_destinations(_scarce()).decided_by == ""
    small = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=64, root_gb=1),
                        instance_uuids=[uuid.uuid4().hex])
    assert s1.select_destinations(small).decided_by == ""
    assert s1.scarce_stats["handed_over"] == 1


def test_racing_scarce_requests_meet_at_the_coordinator_not_at_the_host(cloud):
    # BIG + 1 schedulers ask for a scarce server at the same moment and BIG hosts fit one
    # each: the coordinator decides them one after another (its own under the same lock),
    # places BIG and answers NoValidHost to the last at once; no claim is rejected
    results = {}
    go = threading.Barrier(len(cloud))

    def ask(manager: SchedulerManager) -> None:
        spec = _scarce()
        go.wait()
        results[manager.name] = manager.select_destinations(spec)

    threads = [threading.Thread(target=ask, args=(m,)) for m in cloud]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results["s0"].decided_by == ""
    for name in ("s1", "s2"):
        # handed to the coordinator, unless the coordinator's claims on both hosts had
        # already reached this scheduler (a loaded machine): then it refuses by itself
        r = results[name]
        assert r.decided_by == "s0" or (r.decided_by == "" and not r.placed), (name, r)
    assert sorted(len(r.placed) for r in results.values()) == [0, 1, 1]
    assert len({s for r in results.values() for s in r.placed.values()}) == BIG
    assert sum(r.rejected for r in results.values()) == 0
    failed = next(r for r in results.values() if not r.placed)
    assert "not enough hosts" in next(iter(failed.failed.values()))


def test_a_coordinator_that_does_not_answer_leaves_the_request_timed_out(cloud):
    s0, s1, _ = cloud
    s0.service.set_peer_handler(None)  # it drops what it is handed (as one predating 1.2 would)
    s1.request_timeout = 0.5
    result = s1.select_destinations(_scarce())
    assert result.timed_out and not result.placed and result.decided_by == "s0"
    assert s1.scarce_stats["timed_out"] == 1


def test_a_handed_request_and_its_answer_travel_on_the_peer_topic_alone(bus, cloud):
    # control plane 1.4: one route per kind.  A scarce request cast on the scheduler topic
    # (its route before 1.4) is dropped as on the wrong plane and decided by nobody; handed
    # over on the peer topic, it is decided and answered there
    s0, s1, _ = cloud
    spec = _scarce()
    stray = ScarceRequest(f"s1:{uuid.uuid4()}", "s1", "s0", spec_to_wire(spec))
    bus.control_client().cast(SCHEDULER_TOPIC, "s0", Encoder().encode(stray))
    wait_for(lambda: s0.service.cache.invalid["wrong_plane"] == 1, what="the stray request")
    assert s0.scarce_stats["decided_for_peers"] == 0
    result = s1.select_destinations(spec)
    assert result.decided_by == "s0" and list(result.placed) == list(spec.instance_uuids)
    assert s0.service.cache.control_received["scarce_request"] == 1
    assert s1.service.cache.control_received["scarce_answer"] == 1
    assert [m.service.cache.invalid["wrong_plane"] for m in cloud] == [1, 0, 0]


def test_requests_are_handed_over_without_announcing_claims(bus):
    # every scheduler listens on the peer topic: one that does not announce its claims
    # still hands requests over and decides those handed to it
    reporter = _reporter(bus)
    managers = [SchedulerManager(make_scheduler(bus, bus, f"s{i}", membership_interval=0.2,
                                                announce_claims=False), request_timeout=5.0)
                for i in range(2)]
    for m in managers:
        m.start()
    reporter.start()
    wait_for(lambda: all(m.service.peers == ("s0", "s1") for m in managers), what="the peers")
    with _cloud(reporter, managers) as (s0, s1):
        result = s1.select_destinations(_scarce())
        assert result.decided_by == "s0" and len(result.placed) == 1 and not result.timed_out
        assert s0.service.claims_announced == 0 and s1.service.claims_announced == 0
