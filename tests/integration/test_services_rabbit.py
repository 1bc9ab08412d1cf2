"""Reporters and schedulers as real services over RabbitMQ: a kombu stream and oslo.messaging RPC.

Each test gets its own stream and topics and removes them.  Broker faults are
injected with ``rabbitmqctl close_all_connections``, which leaves the broker
itself running.
"""

from __future__ import annotations

import threading
import time
import uuid

import msgpack
import pytest
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from protocol.codec import Decoder, Encoder
from protocol.document import SET
from protocol.messages import Batch, Claim, Delta
from protocol.receiver import Outcome
from protocol.signing import Keyring
from transport import no_eventlet  # noqa: F401  (before oslo_messaging)
from transport.rpcapi import peer_topic

pytestmark = pytest.mark.rabbit


def _start(*services):
    for s in services:
        s.start()


def _stop(*services):
    for s in services:
        s.stop()


def _claim(sched, source, resources):
    with sched.cache.lock:
        view = sched.receiver.sources[source]
        claim = Claim(uuid.uuid4().hex, sched.name, source, view.epoch, view.seq, resources,
                      uuid.uuid4().hex)
        sched.receiver.add_claim(claim, sched.clock())
    assert sched.send_claim(claim)
    return claim


@pytest.mark.slow
def test_reporters_and_two_schedulers_converge_then_claim(planes):
    data, control, topics = planes
    reporters = [make_reporter(data, control, f"r{i}", hosts=20, seed=i, topics=topics)
                 for i in range(3)]
    schedulers = [make_scheduler(data, control, f"s{i}", topics=topics) for i in range(2)]
    _start(*schedulers, *reporters)
    try:
        wait_for(lambda: all(len(s.receiver.sources) == 60 for s in schedulers), 30, "sources")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, schedulers), 30, "convergence")
        s0, s1 = schedulers
        source = sorted(s0.receiver.sources)[0]
        ok = _claim(s0, source, {"vcpus": 2, "memory_mb": 1024})
        wait_for(lambda: not s0.receiver.sources[source].pending, 20, "claim retired")
        assert (ok.claim_id, source, Outcome.INCLUDED) in s0.receiver.drain_outcomes()
        # The other scheduler learns of it from the same delta: claims are not broadcast.
        wait_for(lambda: ok.instance in (s1.receiver.sources[source].doc.get("instances") or {}),
                 20, "second scheduler sees the claim")
        too_big = _claim(s1, source, {"memory_mb": 10**9})
        wait_for(lambda: not s1.receiver.sources[source].pending, 20, "rejection")
        assert (too_big.claim_id, source, Outcome.REJECTED) in s1.receiver.drain_outcomes()
        wait_for(lambda: converged(reporters, schedulers), 20, "convergence after claims")
    finally:
        _stop(*reporters, *schedulers)


def test_late_scheduler_and_restarted_scheduler_catch_up_from_the_stream(planes, tmp_path):
    data, control, topics = planes
    reporter = make_reporter(data, control, "r", hosts=40, seed=4, topics=topics)
    early = make_scheduler(data, control, "early", topics=topics, state_dir=str(tmp_path))
    _start(early, reporter)
    try:
        wait_for(lambda: len(early.receiver.sources) == 40, 30, "sources")
        early.stop()
        published = reporter.stats["published"]
        wait_for(lambda: reporter.stats["published"] > published + 10, 30, "changes while down")
        late = make_scheduler(data, control, "late", topics=topics)
        restarted = make_scheduler(data, control, "early", topics=topics, state_dir=str(tmp_path))
        _start(late, restarted)
        try:
            assert restarted.resumed_from is not None
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [late, restarted]), 30, "catch-up")
            # Both caught up from the stream alone: no source had to resync.
            assert late.receiver.stats["resyncs_requested"] == 0
            assert restarted.receiver.stats["resyncs_requested"] == 0
            # The restarted one resumed after its offset instead of re-reading everything.
            assert restarted.cache.messages < late.cache.messages
        finally:
            _stop(late, restarted)
    finally:
        reporter.stop()


def test_reporter_restart_new_epoch_is_established(planes, tmp_path):
    data, control, topics = planes
    reporter = make_reporter(data, control, "r", hosts=5, seed=9, topics=topics,
                             state_dir=str(tmp_path))
    sched = make_scheduler(data, control, "s", topics=topics)
    _start(sched, reporter)
    try:
        wait_for(lambda: len(sched.receiver.sources) == 5, 30, "sources")
        source = sorted(sched.receiver.sources)[0]
        before = sched.receiver.sources[source].epoch
        reporter.stop()
        reporter = make_reporter(data, control, "r", hosts=5, seed=9, topics=topics,
                                 state_dir=str(tmp_path))
        reporter.start()
        quiesce([reporter])
        wait_for(lambda: converged([reporter], [sched]), 30, "re-established")
        assert sched.receiver.sources[source].epoch > before
    finally:
        _stop(reporter, sched)


@pytest.mark.slow
def test_connections_cut_mid_run_everything_reconverges(planes, rabbitmqctl):
    data, control, topics = planes
    reporter = make_reporter(data, control, "r", hosts=30, seed=2, topics=topics,
                             change_interval=0.3)
    schedulers = [make_scheduler(data, control, f"s{i}", topics=topics, claim_deadline=60.0)
                  for i in range(2)]
    _start(*schedulers, reporter)
    claims: list[tuple[object, Claim]] = []
    stop = threading.Event()
    try:
        wait_for(lambda: all(len(s.receiver.sources) == 30 for s in schedulers), 30, "sources")
        sources = sorted(schedulers[0].receiver.sources)

        def claimer() -> None:
            i = 0
            while not stop.is_set():
                sched = schedulers[i % 2]
                source = sources[i % len(sources)]
                try:
                    claims.append((sched, _claim(sched, source, {"vcpus": 1, "memory_mb": 256})))
                except Exception:  # a cast during the cut may fail; the claim then expires
                    pass
                i += 1
                time.sleep(0.02)

        worker = threading.Thread(target=claimer, daemon=True)
        worker.start()
        for _ in range(2):
            time.sleep(1.0)
            rabbitmqctl("close_all_connections", "test")
        time.sleep(1.0)
        stop.set()
        worker.join(10)
        quiesce([reporter])
        # Every claim resolves exactly once and nothing stays pending.
        wait_for(lambda: all(s.receiver.pending_claims() == 0 for s in schedulers), 90,
                 "claims resolved")
        wait_for(lambda: converged([reporter], schedulers), 60, "reconvergence")
        assert all(s.running for s in schedulers)
        outcomes: dict[str, list[Outcome]] = {}
        for s in schedulers:
            for claim_id, _, outcome in s.receiver.drain_outcomes():
                if outcome is not Outcome.ACCEPTED:
                    outcomes.setdefault(claim_id, []).append(outcome)
        assert len(claims) > 20
        for _, claim in claims:
            assert len(outcomes.get(claim.claim_id, [])) == 1, claim.claim_id
        # No claim applied twice: each host's usage is exactly the instances it holds
        # (the simulated tracker deletes some), and every instance it holds came from
        # a claim its scheduler saw included.
        with reporter.manager._lock:
            for source, machine in reporter.manager.machines.items():
                instances = machine.document.get("instances", {})
                assert machine.document["compute"]["vcpus_used"] == len(instances)
                included = {c.instance for _, c in claims if c.source == source
                            and outcomes[c.claim_id] == [Outcome.INCLUDED]}
                assert set(instances) <= included
    finally:
        stop.set()
        _stop(reporter, *schedulers)


def test_bad_input_on_the_real_bus_is_dropped_and_counted(planes, rabbit_url, stream_name):
    data, control, topics = planes
    master = b"m" * 32
    keyring = Keyring(master=master)
    reporter = make_reporter(data, control, "r", hosts=3, seed=1, topics=topics,
                             change_interval=0, encoder=Encoder(keyring), decoder=Decoder(keyring))
    sched = make_scheduler(data, control, "s", topics=topics, encoder=Encoder(keyring),
                           decoder=Decoder(keyring))
    _start(sched, reporter)
    try:
        wait_for(lambda: len(sched.receiver.sources) == 3, 30, "sources")
        victim = sorted(sched.receiver.sources)[0]
        before = {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}
        pub = data.stream_publisher()
        pub.publish(b"\xc1 not msgpack")
        pub.publish(msgpack.packb({"v": 99, "t": "batch", "m": []}))
        # A compute node holding only its own derived key tries to speak for another host.
        intruder = Keyring({"intruder": keyring.key_for("intruder")})
        forged = Encoder(intruder)._wrap(Delta("intruder", 1, 1, [[SET, "compute", "vcpus", 1]]))
        forged_bytes = msgpack.packb({"v": 1, "t": "batch", "m": [
            {**forged, "p": msgpack.packb({**msgpack.unpackb(forged["p"]), "s": victim})}]})
        pub.publish(forged_bytes)
        pub.publish(Encoder().encode(Batch([Delta(victim, 1, 5, [])])))  # unsigned
        pub.close()
        wait_for(lambda: sum(sched.cache.invalid.values()) >= 4, 30, "invalid counted")
        assert sched.cache.invalid["undecodable"] == 1
        assert sched.cache.invalid["version"] == 1
        assert sched.cache.invalid["signature"] == 2
        after = {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}
        assert before == after
        assert sched.running
    finally:
        _stop(reporter, sched)


@pytest.mark.slow
def test_schedulers_announce_their_claims_to_their_live_peers(planes, delete_broker_queues):
    """[cache] announce_claims over oslo.messaging (design §5.2): a peer deducts an accepted
    claim until its delta lists it, a rejected one until the host's rejection, forwarded by
    the claimer, arrives (long before peer_claim_ttl here); a peer that has left only misses
    the casts."""
    data, control, topics = planes
    reporter = make_reporter(data, control, "r0", hosts=5, seed=1, topics=topics)
    s0, s1 = (make_scheduler(data, control, f"s{i}", topics=topics, membership_interval=0.5,
                             peer_claim_ttl=60.0) for i in range(2))
    _start(s0, s1, reporter)
    try:
        wait_for(lambda: all(s.peers == ("s0", "s1") for s in (s0, s1)), 30, "membership")
        # both: the claim below is s0's, on a host s1 holds (on a busy machine either may lag)
        wait_for(lambda: all(len([v for v in s.receiver.sources.values() if v.doc is not None])
                             >= 7 for s in (s0, s1)), 30, "sources")
        quiesce([reporter])
        source = sorted(s for s in s0.receiver.sources if not s.startswith("scheduler/"))[0]
        ok = _claim(s0, source, {"vcpus": 1, "memory_mb": 512})
        # held until its delta lists it, or already included when the cast arrived
        wait_for(lambda: s1.receiver.stats["peer_claims"] + s1.receiver.stats["peer_claims_ignored"]
                 >= 1, 20, "the announcement")
        wait_for(lambda: ok.instance in (s1.receiver.sources[source].doc.get("instances") or {}),
                 20, "the including delta")
        with s1.cache.lock:
            assert not s1.receiver.sources[source].peer
            assert not s1.receiver.sources[source].peer_usage
        too_big = _claim(s0, source, {"memory_mb": 10**9})
        wait_for(lambda: (too_big.claim_id, source, Outcome.REJECTED) in s0.receiver.drain_outcomes()
                 or not s0.receiver.sources[source].pending, 20, "rejection")
        wait_for(lambda: s1.receiver.stats["peer_claims_rejected"] == 1, 20, "the rejection")
        assert s1.cache.control_received["peer_claim"] == 2
        assert s1.cache.control_received["peer_rejection"] == 1
        assert s1.receiver.stats["peer_claims_expired"] == 0
        assert not s1.cache.invalid
        assert s0.figures()["claims_announced"] == 2
        # with one peer, each is cast to it alone: no echo comes back to the sender
        assert s0.cache.control_received["peer_echo"] == 0
        with s1.cache.lock:
            assert not s1.receiver.sources[source].peer
        # a peer gone: the casts go nowhere, the claim itself is arbitrated as ever
        s1.stop()
        third = _claim(s0, source, {"vcpus": 1, "memory_mb": 512})
        wait_for(lambda: third.instance in (s0.receiver.sources[source].doc.get("instances") or {}),
                 20, "a claim with the peer gone")
    finally:
        _stop(reporter, s0, s1)
        peers = peer_topic(topics[1])
        delete_broker_queues([peers, f"{peers}.s0", f"{peers}.s1"])


@pytest.mark.slow
def test_a_scarce_request_goes_to_the_coordinator_on_the_peer_topic(planes, delete_broker_queues):
    """[filter_scheduler] scarce_coordinator over RabbitMQ (design §5.4): s1 hands a request
    only one host fits to s0 (first by name) as a scarce_request cast on the peer topic
    (control plane 1.4); s0 decides and claims it, and its scarce_answer, signed like every
    cast between schedulers, places it for s1."""
    from shared_host_manager.decision.manager import SchedulerManager
    from shared_host_manager.decision.request import Flavor, RequestSpec

    data, control, topics = planes
    ring = Keyring(master=b"scarce test secret")
    reporter = make_reporter(data, control, "r0", hosts=5, seed=1, topics=topics,
                             change_interval=0, encoder=Encoder(ring), decoder=Decoder(ring))
    managers = [SchedulerManager(make_scheduler(
        data, control, f"s{i}", topics=topics, membership_interval=0.5, encoder=Encoder(ring),
        decoder=Decoder(ring)), request_timeout=20.0) for i in range(2)]
    s0, s1 = managers
    _start(*managers, reporter)
    try:
        wait_for(lambda: all(m.service.peers == ("s0", "s1") for m in managers), 30, "membership")
        wait_for(lambda: all(len([s for s in m.versions() if not s.startswith("scheduler/")]) == 5
                             for m in managers), 30, "sources")
        # one host keeps 6 GB free, the others 1 GB: a 4 GB server fits that one only
        for i, source in enumerate(reporter.tracker.hosts()):
            memory = reporter.tracker.document(source)["compute"]["memory_mb"]
            reporter.manager.change(source, [[SET, "compute", "memory_mb_used",
                                              memory - (6144 if i == 0 else 1024)]],
                                    time.monotonic())
        reporter.wake()
        wait_for(lambda: converged([reporter], [m.service for m in managers]), 30, "the views")
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=4096, root_gb=1),
                           instance_uuids=[uuid.uuid4().hex])
        result = s1.select_destinations(spec)
        assert result.decided_by == "s0" and not result.timed_out
        assert result.placed == {spec.instance_uuids[0]: reporter.tracker.hosts()[0]}
        assert s0.scarce_stats["decided_for_peers"] == 1 and s1.scarce_stats["answered"] == 1
        assert s0.service.cache.control_received["scarce_request"] == 1
        assert not s0.service.cache.invalid and not s1.service.cache.invalid
    finally:
        _stop(reporter, *managers)
        peers = peer_topic(topics[1])
        delete_broker_queues([peers, f"{peers}.s0", f"{peers}.s1"])
