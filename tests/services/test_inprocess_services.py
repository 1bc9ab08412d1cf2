"""Reporters and schedulers as real services (threads) on the in-process bus."""

from __future__ import annotations

import uuid

import pytest
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from protocol.messages import Claim
from protocol.receiver import Outcome
from transport.inprocess import InProcessBus


@pytest.fixture
def bus():
    b = InProcessBus(threaded=True)
    yield b
    b.close()


def _claim(sched, source, resources, instance=None):
    with sched.cache.lock:
        view = sched.receiver.sources[source]
        claim = Claim(uuid.uuid4().hex, sched.name, source, view.epoch, view.seq, resources,
                      instance or uuid.uuid4().hex)
        sched.receiver.add_claim(claim, sched.clock())
    assert sched.send_claim(claim)
    return claim


def test_reporters_and_schedulers_converge(bus):
    reporters = [make_reporter(bus, bus, f"r{i}", hosts=20, seed=i) for i in range(3)]
    schedulers = [make_scheduler(bus, bus, f"s{i}") for i in range(2)]
    for s in schedulers:
        s.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: all(len(s.receiver.sources) == 60 for s in schedulers), what="all sources")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, schedulers), what="convergence")
    finally:
        for r in reporters:
            r.stop()
        for s in schedulers:
            s.stop()


def test_claim_accepted_then_rejected_with_correction(bus):
    reporter = make_reporter(bus, bus, "r", hosts=2, seed=7, change_interval=0)
    sched = make_scheduler(bus, bus, "s")
    sched.start()
    reporter.start()
    try:
        wait_for(lambda: len(sched.receiver.sources) == 2, what="sources")
        source = sorted(sched.receiver.sources)[0]
        ok = _claim(sched, source, {"vcpus": 1, "memory_mb": 512})
        wait_for(lambda: not sched.receiver.sources[source].pending, what="claim retired")
        outcomes = sched.receiver.drain_outcomes()
        assert (ok.claim_id, source, Outcome.INCLUDED) in outcomes
        assert sched.receiver.sources[source].doc["instances"][ok.instance]["claim"] == ok.claim_id
        too_big = _claim(sched, source, {"vcpus": 10_000})
        wait_for(lambda: not sched.receiver.sources[source].pending, what="rejection")
        assert (too_big.claim_id, source, Outcome.REJECTED) in sched.receiver.drain_outcomes()
        assert sched.receiver.stats["claims_rejected"] == 1
    finally:
        reporter.stop()
        sched.stop()


def test_late_scheduler_catches_up_from_stream(bus):
    reporter = make_reporter(bus, bus, "r", hosts=30, seed=3)
    reporter.start()
    early = make_scheduler(bus, bus, "early")
    early.start()
    try:
        wait_for(lambda: len(early.receiver.sources) == 30, what="early sources")
        late = make_scheduler(bus, bus, "late")
        late.start()
        try:
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [early, late]), what="late convergence")
            # It learnt everything from the stream: the announcement snapshots are retained.
            assert late.receiver.stats["resyncs_requested"] == 0
        finally:
            late.stop()
    finally:
        reporter.stop()
        early.stop()


def test_scheduler_restart_resumes_from_offset(bus, tmp_path):
    reporter = make_reporter(bus, bus, "r", hosts=30, seed=5)
    reporter.start()
    sched = make_scheduler(bus, bus, "s", state_dir=str(tmp_path))
    sched.start()
    try:
        wait_for(lambda: len(sched.receiver.sources) == 30, what="sources")
        sched.stop()
        # Changes keep flowing while the scheduler is down.
        wait_for(lambda: reporter.stats["published"] > 5, what="publishing")
        again = make_scheduler(bus, bus, "s", state_dir=str(tmp_path))
        again.start()
        try:
            assert again.resumed_from is not None
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [again]), what="convergence after restart")
            assert again.receiver.stats["resyncs_requested"] == 0
        finally:
            again.stop()
    finally:
        reporter.stop()


def test_reporter_restart_new_epoch_is_established(bus, tmp_path):
    reporter = make_reporter(bus, bus, "r", hosts=5, seed=9, state_dir=str(tmp_path))
    sched = make_scheduler(bus, bus, "s")
    sched.start()
    reporter.start()
    try:
        wait_for(lambda: len(sched.receiver.sources) == 5, what="sources")
        source = sorted(sched.receiver.sources)[0]
        first_epoch = sched.receiver.sources[source].epoch
        reporter.stop()
        reporter = make_reporter(bus, bus, "r", hosts=5, seed=9, state_dir=str(tmp_path))
        reporter.start()
        quiesce([reporter])
        wait_for(lambda: converged([reporter], [sched]), what="re-established")
        assert sched.receiver.sources[source].epoch > first_epoch
    finally:
        reporter.stop()
        sched.stop()


def test_garbage_on_stream_is_dropped_and_counted(bus):
    reporter = make_reporter(bus, bus, "r", hosts=3, seed=1, change_interval=0)
    sched = make_scheduler(bus, bus, "s")
    sched.start()
    reporter.start()
    try:
        wait_for(lambda: len(sched.receiver.sources) == 3, what="sources")
        before = {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}
        pub = bus.stream_publisher()
        pub.publish(b"\xc1garbage")
        pub.publish(b"\x82\xa1v\x63\xa1t\xa5delta")  # protocol version 99
        wait_for(lambda: sum(sched.cache.invalid.values()) == 2, what="invalid counted")
        assert sched.cache.invalid["undecodable"] == 1
        assert sched.cache.invalid["version"] == 1
        after = {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}
        assert before == after
    finally:
        reporter.stop()
        sched.stop()


def test_cold_start_by_asking_every_known_source(bus):
    reporter = make_reporter(bus, bus, "r", hosts=10, seed=11)
    reporter.start()
    try:
        wait_for(lambda: reporter.stats["published"] > 0, what="publishing")
        hosts = reporter.tracker.hosts()
        sched = make_scheduler(bus, bus, "s", known_sources=dict.fromkeys(hosts, "r"))
        sched.start()
        try:
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [sched]), what="convergence by resync")
            # It skipped the stream's history and asked each source once.
            assert sched.receiver.stats["resyncs_requested"] == len(hosts)
        finally:
            sched.stop()
    finally:
        reporter.stop()


def test_scheduler_manager_places_retries_and_refuses(bus):
    from shared_host_manager.decision.manager import SchedulerManager
    from shared_host_manager.decision.request import Flavor, RequestSpec

    reporter = make_reporter(bus, bus, "r", hosts=3, seed=21, change_interval=0)
    managers = [SchedulerManager(make_scheduler(bus, bus, f"s{i}"), peers=["s0", "s1"])
                for i in range(2)]
    for m in managers:
        m.start()
    reporter.start()
    try:
        wait_for(lambda: all(len(m.versions()) == 3 for m in managers), what="sources")
        small = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=1024, root_gb=10),
                            instance_uuids=[uuid.uuid4().hex for _ in range(2)])
        result = managers[0].select_destinations(small)
        assert set(result.placed) == set(small.instance_uuids) and not result.failed
        for instance, source in result.placed.items():
            with reporter.manager._lock:
                assert instance in reporter.manager.machines[source].document["instances"]
        huge = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=10**7), instance_uuids=["x"])
        refused = managers[1].select_destinations(huge)
        assert "x" in refused.failed and not refused.placed and refused.claims == 0
        # fill the cloud from both managers at once: never overcommitted, all resolved
        import threading

        from protocol.resources import overcommitted

        results = []

        def fill(m):
            for _ in range(30):
                spec = RequestSpec(flavor=Flavor(vcpus=8, memory_mb=16384, root_gb=100),
                                   instance_uuids=[uuid.uuid4().hex])
                results.append(m.select_destinations(spec))

        threads = [threading.Thread(target=fill, args=(m,)) for m in managers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 60 and not any(r.timed_out for r in results)
        assert any(r.failed for r in results), "the cloud should have filled up"
        with reporter.manager._lock:
            for machine in reporter.manager.machines.values():
                assert not overcommitted(machine.document["compute"])
    finally:
        reporter.stop()
        for m in managers:
            m.stop()


def test_a_decisions_claims_leave_from_the_callers_thread_after_the_lock(bus):
    # The first claim of a decision is cast by the thread that decided, once it released
    # the cache lock (not queued behind the sender thread); alternates claimed on ingest
    # go through the sender thread.  Both through the one ClaimSender.
    import threading

    from shared_host_manager.decision.manager import SchedulerManager
    from shared_host_manager.decision.request import Flavor, RequestSpec

    reporter = make_reporter(bus, bus, "r", hosts=3, seed=22, change_interval=0)
    service = make_scheduler(bus, bus, "s0")
    manager = SchedulerManager(service)
    sent = []
    send = service.send_claim

    def spy(claim):
        sent.append((claim.claim_id, threading.current_thread().name,
                     manager.lock._is_owned()))
        return send(claim)

    manager._sender._send = spy
    manager.start()
    reporter.start()
    try:
        wait_for(lambda: len(manager.versions()) == 3, what="sources")
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512),
                           instance_uuids=[uuid.uuid4().hex for _ in range(2)])
        result = manager.select_destinations(spec)
        assert set(result.placed) == set(spec.instance_uuids)
        assert len(sent) == 2
        assert all(name == threading.current_thread().name and not locked
                   for _, name, locked in sent)
    finally:
        reporter.stop()
        manager.stop()


def test_a_reporter_says_goodbye_before_its_control_server_stops(bus):
    """Stopping an oslo.messaging server takes seconds, and a process on its way out (nova's
    graceful shutdown) may not wait: the goodbye must be on the stream by then."""
    stopped_at: list[int] = []

    class SlowToStop:
        """The bus's control plane, noting how much was published when its server stopped."""

        def control_client(self):
            return bus.control_client()

        def control_server(self, topic, server, handler):
            inner = bus.control_server(topic, server, handler)

            class Server:
                def start(self) -> None:
                    inner.start()

                def stop(self) -> None:
                    stopped_at.append(reporter.stats["published"])
                    inner.stop()

            return Server()

    reporter = make_reporter(bus, SlowToStop(), "r0", 3, seed=1)
    sched = make_scheduler(bus, bus, "s0")
    sched.start()
    reporter.start()
    try:
        wait_for(lambda: converged([reporter], [sched]), what="converged")
        reporter.stop()
        assert stopped_at == [reporter.stats["published"]]  # nothing published after it
        wait_for(lambda: all(v.status.value == "down" for v in sched.receiver.sources.values()),
                 5, "every host down at once, by its goodbye")
    finally:
        sched.stop()
