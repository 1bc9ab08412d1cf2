"""Host ownership in the drop-in ([shared_host_manager] host_ownership, design §5.6).

Schedulers deciding at the same moment on the same view would all put the same
best host first and race for it in placement; with ownership each puts first the
best host it owns among the live schedulers (rendezvous hashing, the same answer
everywhere without talking), looking at most 2 x peers hosts deep.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from protocol.messages import ANNOUNCED_ACCEPTED, ANNOUNCED_ALLOCATIONS  # noqa: E402
from shared_host_manager.decision.subset import PeerOwnership  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.core import vector  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

PEERS = ("s1", "s2", "s3")


def _docs(n: int = 24) -> dict:
    nodes = [fx.compute_node(i, free_ram_mb=8192 + 997 * i) for i in range(n)]
    return {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                     cell_uuid=fx.CELL1) for cn in nodes}


def _order(manager: shm.SharedHostManager, n: int) -> tuple[list[str], set[int]]:
    spec = fx.request_spec(instance_uuid=fx.uuid_for("own", n))
    rows = manager.get_host_states_by_uuids(None, None, spec)
    weighed = manager.get_weighed_hosts(manager.get_filtered_hosts(rows, spec, 0), spec)
    return [vector.node_uuid(w.obj) for w in weighed], set(rows.touched)


@pytest.fixture
def schedulers():
    fx.setup_nova()
    docs = _docs()
    out = {}
    for name in PEERS:
        cache = fx.cache_from_documents(docs, name=name)
        cache.peers = PEERS
        out[name] = (cache, shm.SharedHostManager(cache, register_claims=False,
                                                  default_cell_uuid=fx.CELL1, host_ownership=True))
    return out


def test_racing_schedulers_put_different_hosts_first(schedulers):
    nova_order, _ = _order(shm.SharedHostManager(schedulers["s1"][0], register_claims=False,
                                                 default_cell_uuid=fx.CELL1), 0)
    firsts = {}
    for name, (_, manager) in schedulers.items():
        order, touched = _order(manager, 1)
        assert not touched  # ownership reads the rows, it builds no HostState
        assert PeerOwnership(name, list(PEERS)).owns(order[0])
        assert order[0] in nova_order[:2 * len(PEERS)]  # among the best 2 x peers
        # behind it, nova's order unchanged
        assert order[1:] == [u for u in nova_order if u != order[0]]
        firsts[name] = order[0]
    assert len(set(firsts.values())) == len(PEERS)  # no two schedulers race for one host
    assert all(m.counters["owned_choices"] == 1 for _, m in schedulers.values())


def test_alone_or_switched_off_it_is_novas_order(schedulers):
    cache, manager = schedulers["s1"]
    nova_order, _ = _order(shm.SharedHostManager(cache, register_claims=False,
                                                 default_cell_uuid=fx.CELL1), 2)
    cache.peers = ("s1",)  # the only live scheduler
    assert _order(manager, 3)[0] == nova_order
    cache.peers = PEERS
    manager.host_ownership = False
    assert _order(manager, 4)[0] == nova_order


def test_a_peer_leaving_hands_its_hosts_over(schedulers):
    cache, manager = schedulers["s1"]
    cache.peers = ("s1", "s2")  # s3 left: its hosts go to s1 or s2
    order, _ = _order(manager, 5)
    assert PeerOwnership("s1", ["s1", "s2"]).owns(order[0])


def test_a_claim_placement_accepted_is_deducted_by_the_peers(schedulers):
    """[cache] announce_claims in the drop-in (design §5.2): the claim nova's manager made is
    handed to the cache's announcer, and a peer that ingests it counts the host that much
    fuller (and with one more build in flight) until the host lists the instance."""
    from protocol.codec import Encoder

    (cache1, m1), (cache2, m2) = schedulers["s1"], schedulers["s2"]
    m1.register_claims = True
    encoder = Encoder()
    cache1.claim_announcer = lambda claim: cache2.ingest_peer_claim(
        encoder.encode(dataclasses.replace(claim, request={})))
    spec = fx.request_spec(instance_uuid=fx.uuid_for("peer", 1), memory_mb=4096)
    rows = m1.get_host_states_by_uuids(None, None, spec)
    target = rows.shells[0]
    before = {h.uuid: (h.free_ram_mb, h.num_io_ops)
              for h in m2.get_host_states_by_uuids(None, [vector.node_uuid(target)], spec)}
    target.consume_from_request(spec)
    assert m1.counters["claims_announced"] == 1
    (after,) = m2.get_host_states_by_uuids(None, [target.uuid], spec)
    ram, io_ops = before[target.uuid]
    assert (after.free_ram_mb, after.num_io_ops) == (ram - 4096, io_ops + 1)
    # the peer's own claims are not touched by it: nothing to cancel or resolve there
    assert cache2.receiver.pending_claims() == 0
    # without an announcer (no peers, or announce_claims off) nothing is sent
    cache1.claim_announcer = None
    spec2 = fx.request_spec(instance_uuid=fx.uuid_for("peer", 2))
    m1.get_host_states_by_uuids(None, None, spec2).shells[1].consume_from_request(spec2)
    assert m1.counters["claims_announced"] == 1


def test_the_host_about_to_be_claimed_is_announced_before_placement_answers(schedulers):
    """With nova's host_subset_size = 1, the best weighed host is the one nova's manager
    claims first: announced (an intent) by the drop-in's step after the sort, it is held once
    by a peer, also when the claim recorded after placement accepted follows with the same id."""
    from protocol.codec import Encoder

    (cache1, m1), (cache2, m2) = schedulers["s1"], schedulers["s2"]
    m1.register_claims = True
    sent = []
    encoder = Encoder()

    def announce(claim):
        sent.append(claim)
        cache2.ingest_peer_claim(encoder.encode(dataclasses.replace(claim, request={})))

    cache1.claim_announcer = announce
    spec = fx.request_spec(instance_uuid=fx.uuid_for("intent", 1), memory_mb=2048)
    free = {h.uuid: h.free_ram_mb for h in m2.get_host_states_by_uuids(None, None, spec)}
    rows = m1.get_host_states_by_uuids(None, None, spec)
    weighed = m1.get_weighed_hosts(m1.get_filtered_hosts(rows, spec, 0), spec)
    first = weighed[0].obj
    assert sent == []  # weighing tells nobody
    assert m1.announce_intent(first, spec)
    assert [(c.source, c.claim_id) for c in sent] == [(vector.node_uuid(first), spec.instance_uuid)]
    (seen,) = m2.get_host_states_by_uuids(None, [vector.node_uuid(first)], spec)
    assert seen.free_ram_mb == free[seen.uuid] - 2048
    first.consume_from_request(spec)  # placement accepted: the pending claim, announced again
    assert len(sent) == 2
    (seen,) = m2.get_host_states_by_uuids(None, [first.uuid], spec)
    assert seen.free_ram_mb == free[seen.uuid] - 2048  # held once


def test_weighing_alone_announces_nothing(schedulers):
    """get_weighed_hosts is a query (issue 35): no intent is sent and no peer deducts anything,
    whichever host ownership puts first."""
    (cache1, m1), (_, m2) = schedulers["s1"], schedulers["s2"]
    sent = []
    cache1.claim_announcer = sent.append
    spec = fx.request_spec(instance_uuid=fx.uuid_for("query", 1), memory_mb=2048)
    free = {h.uuid: h.free_ram_mb for h in m2.get_host_states_by_uuids(None, None, spec)}
    for _ in range(2):
        rows = m1.get_host_states_by_uuids(None, None, spec)
        assert m1.get_weighed_hosts(m1.get_filtered_hosts(rows, spec, 0), spec)
    assert sent == [] and m1.counters["intents_announced"] == 0
    assert m1.counters["owned_choices"] == 2  # it did order
    assert {h.uuid: h.free_ram_mb for h in m2.get_host_states_by_uuids(None, None, spec)} == free


def test_select_destinations_announces_each_host_nova_claims_first(nova_conf):
    """A multi-create with alternates through nova's select_destinations and the drop-in's
    manager: each instance's host is announced after nova's sort and before its claim in
    placement, then its accepted claim, both with the allocation request nova claims; the
    alternates' re-sort announces nothing (its instance is claimed already: an intent would
    hold the first alternate at every peer for peer_claim_ttl, for nothing)."""
    from nova import context as nova_context
    from nova import objects

    from shared_host_manager.nova import report_client as rc

    docs = _docs(8)
    cache = fx.cache_from_documents(docs, name="s1")
    placement = fx.FakePlacement(list(docs))
    sent = []
    carried = []
    cache.claim_announcer = lambda c: (
        sent.append((c.source, c.claim_id, [u for u, _ in placement.claims])),
        carried.append((c.request.get(ANNOUNCED_ALLOCATIONS), c.request.get(ANNOUNCED_ACCEPTED))))
    uuids = [fx.uuid_for("step", 1), fx.uuid_for("step", 2)]
    group = objects.InstanceGroup(policy="anti-affinity", policies=["anti-affinity"], rules={},
                                  members=list(uuids), hosts=[])
    spec = fx.request_spec(instance_uuid=uuids[0], group=group, num_instances=2)
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement):
            # the step nova-scheduler-shared runs (SharedSchedulerManager), with nova's
            # placement client: FakePlacement through patched_scheduler
            mgr = rc.AnnouncingSchedulerManager()
            mgr.host_manager.register_claims = True
            selections = mgr.select_destinations(
                nova_context.get_admin_context(), spec_obj=spec, instance_uuids=uuids,
                return_objects=True, return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    first, second = (alts[0].compute_node_uuid for alts in selections)
    alternate = selections[1][1].compute_node_uuid
    assert len({first, second, alternate}) == 3
    assert sent == [(first, uuids[0], []), (first, uuids[0], uuids[:1]),
                    (second, uuids[1], uuids[:1]), (second, uuids[1], uuids)]
    # both carry the allocation request nova claims, for the peers' placement views (design
    # §11); the second says placement accepted it
    flavor = {"VCPU": spec.vcpus, "MEMORY_MB": spec.memory_mb,
              "DISK_GB": spec.root_gb + spec.ephemeral_gb}
    assert carried == [({first: flavor}, None), ({first: flavor}, True),
                       ({second: flavor}, None), ({second: flavor}, True)]
    assert mgr.host_manager.counters["intents_announced"] == 2
    # nova's own manager over the drop-in weighs without announcing: only accepted claims
    del sent[:]
    placement.claims.clear()
    spec2 = fx.request_spec(instance_uuid=fx.uuid_for("step", 3))
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement):
            from nova.scheduler import manager as nova_manager

            plain = nova_manager.SchedulerManager()
            plain.host_manager.register_claims = True
            (alts,) = plain.select_destinations(
                nova_context.get_admin_context(), spec_obj=spec2,
                instance_uuids=[spec2.instance_uuid], return_objects=True,
                return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    assert sent == [(alts[0].compute_node_uuid, spec2.instance_uuid, [spec2.instance_uuid])]


def test_every_drop_in_manager_runs_the_step():
    """nova-scheduler-shared and the functional fixture build SharedSchedulerManager (through
    nova's SERVICE_MANAGERS), the simulator its own manager: all run the one step."""
    from oslo_utils import importutils

    from shared_host_manager.nova import report_client as rc
    from shared_host_manager.nova.testing import simulation

    assert issubclass(importutils.import_class(rc.MANAGER_PATH), rc.AnnouncingSchedulerManager)
    assert issubclass(simulation._scheduler_manager_class(), rc.AnnouncingSchedulerManager)


def test_the_intent_names_the_host_nova_picked_among_equally_weighed_ones(nova_conf):
    """nova's shuffle_best_same_weighed_hosts picks at random among the best hosts of equal
    weight, after weighing: the intent names the host nova then claims, not the first one
    weighing returned."""
    from nova import context as nova_context

    from shared_host_manager.nova import report_client as rc

    nova_conf.set(**{"filter_scheduler.shuffle_best_same_weighed_hosts": True})
    # every weigher's input alike (compute_node varies disk by i % 50 and i % 3, metrics by i % 7)
    nodes = [fx.compute_node(1050 * k, free_ram_mb=8192) for k in range(6)]
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                     cell_uuid=fx.CELL1) for cn in nodes}
    cache = fx.cache_from_documents(docs, name="s1")
    placement = fx.FakePlacement(list(docs))
    sent = []
    cache.claim_announcer = sent.append
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement):
            mgr = rc.AnnouncingSchedulerManager()
            mgr.host_manager.register_claims = False  # every request sees the same tie
            chosen = []
            for k in range(8):
                spec = fx.request_spec(instance_uuid=fx.uuid_for("tie", k))
                (alts,) = mgr.select_destinations(
                    nova_context.get_admin_context(), spec_obj=spec,
                    instance_uuids=[spec.instance_uuid], return_objects=True,
                    return_alternates=False)
                chosen.append(alts[0].compute_node_uuid)
    finally:
        shm.set_cache_provider(None)
    assert [c.source for c in sent] == chosen
    assert len(set(chosen)) > 1  # nova's pick did vary
