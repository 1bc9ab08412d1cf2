"""Catching up with the stream before a decision that needs it, through real services
(design §5.4).

A host freed just before a decision publishes its delta at the end of its reporter's
coalescing window; a scheduler that answered at once would refuse a request the cloud had
room for.  With ``[filter_scheduler] no_valid_host_catch_up`` it waits that long, puts its
own membership entry on the stream, reads it back and decides again.  An affinity request
listing members the view does not hold reads its entry back before deciding at all.
"""

from __future__ import annotations

import time
import uuid

import pytest
from svc_harness import converged, make_reporter, make_scheduler, start_peers, wait_for

from protocol.document import SET
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.manager import SchedulerManager
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from transport.inprocess import InProcessBus

#: the reporter publishes a change this long after it is made (its coalescing window)
WINDOW = 1.0


def _full_cloud(bus, catch_up: float, membership: bool = True):
    reporter = make_reporter(bus, bus, "r", hosts=4, seed=3, change_interval=0,
                             coalesce_window=WINDOW)
    config = SchedulerConfig(no_valid_host_catch_up=catch_up)
    if membership:
        [manager] = start_peers(bus, bus, reporter, 1, config=config, request_timeout=5.0)
    else:
        manager = SchedulerManager(make_scheduler(bus, bus, "s0"), config=config,
                                   request_timeout=5.0)
        manager.start()
        reporter.start()
    now = time.monotonic()
    for source in reporter.tracker.hosts():  # no host has 4 GB free
        memory = reporter.tracker.document(source)["compute"]["memory_mb"]
        reporter.manager.change(source, [[SET, "compute", "memory_mb_used", memory - 512]], now)
    reporter.wake()
    wait_for(lambda: converged([reporter], [manager.service]), what="the views")
    return reporter, manager


def _free_one_host(reporter) -> str:
    """Free 6 GB on one host now: its delta reaches the stream WINDOW seconds later."""
    source = reporter.tracker.hosts()[0]
    memory = reporter.tracker.document(source)["compute"]["memory_mb"]
    reporter.manager.change(source, [[SET, "compute", "memory_mb_used", memory - 6144]],
                            time.monotonic())
    reporter.wake()
    return source


def _big() -> RequestSpec:
    return RequestSpec(flavor=Flavor(vcpus=1, memory_mb=4096, root_gb=1),
                       instance_uuids=[uuid.uuid4().hex])


@pytest.mark.parametrize("catch_up", [0.0, pytest.param(WINDOW + 1.0, marks=pytest.mark.slow)])
def test_a_host_freed_just_before_the_decision_counts_once_caught_up(catch_up):
    bus = InProcessBus(threaded=True)
    reporter, manager = _full_cloud(bus, catch_up)
    try:
        assert manager.select_destinations(_big()).failed  # full: NoValidHost either way
        source = _free_one_host(reporter)
        started = time.monotonic()
        result = manager.select_destinations(_big())
        if catch_up:
            # it let the freed host's delta arrive, read its own entry back, decided again
            assert list(result.placed.values()) == [source] and not result.failed
            assert time.monotonic() - started >= catch_up
            assert (manager.catch_ups, manager.caught_up_decided) == (2, 1)
        else:
            # answered at once on a view the delta had not reached
            assert result.failed and not result.placed and manager.catch_ups == 0
    finally:
        manager.stop()
        reporter.stop()
        bus.close()


def test_without_a_membership_entry_no_valid_host_is_answered_at_once():
    bus = InProcessBus(threaded=True)
    reporter, manager = _full_cloud(bus, WINDOW + 1.0, membership=False)
    try:
        _free_one_host(reporter)
        started = time.monotonic()
        assert manager.select_destinations(_big()).failed
        assert time.monotonic() - started < WINDOW and manager.catch_ups == 0
    finally:
        manager.stop()
        reporter.stop()
        bus.close()


def test_catch_up_returns_once_its_own_entry_is_back_on_the_view():
    bus = InProcessBus(threaded=True)
    reporter = make_reporter(bus, bus, "r", hosts=2, seed=1, change_interval=0)
    [manager] = start_peers(bus, bus, reporter, 1)
    service = manager.service
    try:
        assert service.catch_up(0.01)
        with service.cache.lock:
            held = service.receiver.sources["scheduler/s0"].version
        assert held == (service.membership.machine.epoch, service.membership.machine.seq)
        assert service.catch_up()  # no settling: only what is on the stream already
    finally:
        manager.stop()
        reporter.stop()
        bus.close()
    assert not service.catch_up(0.01)  # stopped


def test_an_affinity_request_whose_members_no_view_holds_catches_up_first():
    bus = InProcessBus(threaded=True)
    reporter = make_reporter(bus, bus, "r", hosts=4, seed=2, change_interval=0)
    [manager] = start_peers(bus, bus, reporter, 1, request_timeout=5.0)
    try:
        wait_for(lambda: converged([reporter], [manager.service]), what="the views")
        group = InstanceGroup("affinity", members=[uuid.uuid4().hex], uuid=uuid.uuid4().hex)
        first = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=64, root_gb=1),
                            instance_uuids=[uuid.uuid4().hex], instance_group=group)
        # its member is nowhere (deleted, or a delta on its way): read back, then decide
        result = manager.select_destinations(first)
        assert result.placed and manager.affinity_catch_ups == 1
        # a member the view holds needs nothing more; nor does a group without members
        [instance] = result.placed
        second = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=64, root_gb=1),
                             instance_uuids=[uuid.uuid4().hex], instance_group=InstanceGroup(
                                 "affinity", members=[instance], uuid=group.uuid))
        assert manager.select_destinations(second).placed == {
            second.instance_uuids[0]: result.placed[instance]}
        alone = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=64, root_gb=1),
                            instance_uuids=[uuid.uuid4().hex],
                            instance_group=InstanceGroup("affinity", uuid=uuid.uuid4().hex))
        assert manager.select_destinations(alone).placed
        assert manager.affinity_catch_ups == 1
    finally:
        manager.stop()
        reporter.stop()
        bus.close()
