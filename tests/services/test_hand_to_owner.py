"""A request whose best hosts are all a peer's is decided by that peer, through real services
(design §5.4, ``[filter_scheduler] hand_to_owner``).

Three SchedulerManagers on the in-process bus; every host s1 owns is full, so s1 owns none of
the hosts a request fits: it hands the request to the owner of the best one, which claims one
of its own hosts with its own requests, and answers.
"""

from __future__ import annotations

import time
import uuid

from svc_harness import converged, make_reporter, start_peers, wait_for

from protocol.document import SET
from shared_host_manager.decision.request import Flavor, RequestSpec
from shared_host_manager.decision.subset import PeerOwnership
from transport.inprocess import InProcessBus


def test_a_request_owning_none_of_its_hosts_is_decided_by_their_owner():
    bus = InProcessBus(threaded=True)
    reporter = make_reporter(bus, bus, "r", hosts=30, seed=5, change_interval=0)
    managers = start_peers(bus, bus, reporter, 3, request_timeout=5.0)
    s0, s1, s2 = managers
    try:
        ownership = PeerOwnership("s1", ["s0", "s1", "s2"])
        now = time.monotonic()
        fitting = []
        for i, source in enumerate(reporter.tracker.hosts()):
            memory = reporter.tracker.document(source)["compute"]["memory_mb"]
            # s1's hosts are full; the others keep 4 GB and more free, each a little more
            free = 256 if ownership.owns(source) else 4096 + 64 * i
            if not ownership.owns(source):
                fitting.append((free, source))
            reporter.manager.change(source, [[SET, "compute", "memory_mb_used", memory - free]],
                                    now)
        reporter.wake()
        wait_for(lambda: converged([reporter], [m.service for m in managers]), what="the views")
        assert len(fitting) > 2 * 3  # not a scarce request: the coordinator is not involved
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=2048, root_gb=1),
                           instance_uuids=[uuid.uuid4().hex])
        result = s1.select_destinations(spec)
        owner = result.decided_by  # the owner of the best host by s1's weighers
        assert owner in ("s0", "s2") and not result.timed_out and result.rejected == 0
        [host] = result.placed.values()
        assert ownership.owner(host) == owner
        by_name = {m.name: m for m in managers}
        assert s1.scarce_stats["handed_to_owner"] == 1 and s1.scarce_stats["handed_over"] == 0
        assert by_name[owner].scarce_stats["decided_for_peers"] == 1
        # the owner's own request for the same stays with it
        assert by_name[owner].select_destinations(RequestSpec(
            flavor=Flavor(vcpus=1, memory_mb=2048, root_gb=1),
            instance_uuids=[uuid.uuid4().hex])).decided_by == ""
    finally:
        for m in managers:
            m.stop()
        reporter.stop()
        bus.close()
