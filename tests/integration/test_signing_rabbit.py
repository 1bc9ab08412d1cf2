"""No unsigned path (design §7.4), over RabbitMQ: with signing on, what a forger or a replayer
sends is rejected and counted, and nothing they send changes a view.

* a forged source id (a compute node signing with its own key a message naming another host);
* a forged batch origin (the address resync requests go to, covered by the items' signatures);
* a replayed old message: an old data item on the stream, an old claim on the control plane;
* a claim result for another scheduler's claim, cast to this one.

Every rejection shows in the figures a metrics endpoint exports (``SchedulerService.figures()``,
``ReporterService.figures()``).
"""

from __future__ import annotations

import uuid

import msgpack
import pytest
from oslo_config import cfg
from svc_harness import make_reporter, make_scheduler, wait_for

from protocol.codec import Decoder, Encoder
from protocol.document import SET
from protocol.messages import Batch, Claim, ClaimResult, Delta, Snapshot
from protocol.signing import Keyring
from transport import no_eventlet  # noqa: F401  (before oslo_messaging)
from transport.kombu_stream import KombuStreamDataPlane, StreamSettings
from transport.oslo_rpc import OsloRpcControlPlane
from transport.rpcapi import ReporterAPI, SchedulerAPI

pytestmark = pytest.mark.rabbit

MASTER = b"signing integration master secret"


@pytest.fixture
def signed_cloud(rabbit_url, oslo_rabbit_url, stream_name, delete_broker_queues):
    conf = cfg.ConfigOpts()
    conf([])
    data = KombuStreamDataPlane(StreamSettings(url=rabbit_url, name=stream_name))
    control = OsloRpcControlPlane(conf, oslo_rabbit_url)
    suffix = uuid.uuid4().hex[:8]
    topics = (f"shm-sig-reporter-{suffix}", f"shm-sig-scheduler-{suffix}")
    keyring = Keyring(master=MASTER)
    reporter = make_reporter(data, control, "r", hosts=2, seed=3, topics=topics, change_interval=0,
                             encoder=Encoder(keyring), decoder=Decoder(keyring))
    scheds = [make_scheduler(data, control, name, topics=topics, encoder=Encoder(keyring),
                             decoder=Decoder(keyring)) for name in ("s0", "s1")]
    for s in scheds:
        s.start()
    reporter.start()
    try:
        for s in scheds:
            wait_for(lambda s=s: sum(v.doc is not None for v in s.receiver.sources.values()) == 2,
                     30, f"{s.name} holds both sources")
        yield data, control, topics, reporter, scheds
    finally:
        reporter.stop()
        for s in scheds:
            s.stop()
        control.close()
        data.close()
        delete_broker_queues(list(topics) + [f"{t}.{n}" for t in topics for n in ("r", "s0", "s1")])


def _views(sched):
    with sched.cache.lock:
        return {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}


def test_forged_source_and_forged_origin_are_rejected_and_counted(signed_cloud):
    data, _, _, _, (s0, _) = signed_cloud
    victim, other = sorted(s0.receiver.sources)
    before = _views(s0)
    pub = data.stream_publisher()
    # the compute node `other` holds only its own derived key and speaks for `victim`
    own = Keyring({other: Keyring(master=MASTER).key_for(other)})
    forged = Encoder(own)._wrap(Delta(other, 1, 1, [[SET, "compute", "vcpus", 1]]))
    inner = {**msgpack.unpackb(forged["p"]), "s": victim}
    pub.publish(msgpack.packb({"v": 1, "t": "batch",
                               "m": [{**forged, "p": msgpack.packb(inner)}]}))
    # a genuine, signed batch whose origin is rewritten in transit
    view = s0.receiver.sources[victim]
    genuine = Encoder(Keyring(master=MASTER)).encode(
        Batch([Snapshot(victim, view.epoch, view.seq, dict(view.doc or {}))], "r"))
    outer = msgpack.unpackb(genuine)
    pub.publish(msgpack.packb({**outer, "o": "attacker"}))
    pub.close()
    wait_for(lambda: s0.figures()["invalid"].get("signature", 0) >= 2, 30, "both rejected")
    assert s0.figures()["invalid"]["signature"] == 2
    assert _views(s0) == before
    assert s0.cache.origins[victim] == "r"


@pytest.mark.slow
def test_replayed_old_messages_are_rejected_and_counted(signed_cloud):
    data, control, topics, reporter, (s0, _) = signed_cloud
    source = sorted(s0.receiver.sources)[0]
    old = s0.receiver.sources[source]
    old_snapshot = Snapshot(source, old.epoch, old.seq, dict(old.doc or {}))
    # the source moves on; a replayer then re-publishes the old, validly signed item
    reporter.manager.change(source, [[SET, "stats", "replay", 1]], reporter.clock())
    reporter.wake()
    wait_for(lambda: s0.receiver.sources[source].version > old_snapshot_version(old_snapshot), 30,
             "s0 sees the new version")
    before, dups = _views(s0), s0.figures()["receiver"]["duplicates"]
    pub = data.stream_publisher()
    pub.publish(Encoder(Keyring(master=MASTER)).encode(Batch([old_snapshot], "r")))
    pub.close()
    wait_for(lambda: s0.figures()["receiver"]["duplicates"] > dups, 30, "the replay counted")
    assert _views(s0) == before
    # an old claim cast again: answered from the arbiter's memory, applied once
    with s0.cache.lock:
        view = s0.receiver.sources[source]
        claim = Claim(f"s0:{uuid.uuid4().hex}", "s0", source, view.epoch, view.seq, {"vcpus": 1},
                      uuid.uuid4().hex)
        s0.receiver.add_claim(claim, s0.clock())
    assert s0.send_claim(claim)
    wait_for(lambda: reporter.figures()["machines"].get("claims_accepted", 0) >= 1, 30, "accepted")
    used = reporter.manager.machines[source].document["compute"]["vcpus_used"]
    client = control.control_client()
    try:
        ReporterAPI(client, Encoder(Keyring(master=MASTER)), topics[0]).claim("r", claim)
        wait_for(lambda: reporter.figures()["machines"].get("claims_duplicate", 0) >= 1, 30,
                 "the replayed claim counted")
    finally:
        client.close()
    assert reporter.manager.machines[source].document["compute"]["vcpus_used"] == used


def old_snapshot_version(snap: Snapshot) -> tuple[int, int]:
    return snap.epoch, snap.seq


@pytest.mark.slow
def test_a_claim_result_for_another_schedulers_claim_is_rejected_and_counted(signed_cloud):
    _, control, topics, _, (s0, s1) = signed_cloud
    source = sorted(s1.receiver.sources)[0]
    with s1.cache.lock:
        view = s1.receiver.sources[source]
        claim = Claim(f"s1:{uuid.uuid4().hex}", "s1", source, view.epoch, view.seq, {"vcpus": 1},
                      uuid.uuid4().hex)
        s1.receiver.add_claim(claim, s1.clock())
    before = _views(s0)
    # validly signed by the source, but an answer to s1's claim, cast to s0
    result = ClaimResult(claim.claim_id, "s1", source, False, view.epoch, view.seq, "no",
                         [Snapshot(source, view.epoch, view.seq, {"compute": {"vcpus": 0}})])
    client = control.control_client()
    try:
        SchedulerAPI(client, Encoder(Keyring(master=MASTER)), topics[1]).send("s0", result)
        wait_for(lambda: s0.figures()["receiver"]["claim_results_foreign"] == 1, 30, "counted")
    finally:
        client.close()
    assert _views(s0) == before
    with s1.cache.lock:
        assert claim.claim_id in s1.receiver.sources[source].pending
