"""NUMA and PCI held between requests by this scheduler's pending claims (design §5.5).

nova's consumption pins CPUs, takes NUMA memory and PCI devices on the chosen
host's per-request view; until the compute reports the instance, the next
requests must see that too, or consecutive pinned-CPU requests pick the same
host and the second is refused by the compute.  The pending claim carries what
nova's arithmetic took and is retired exactly like its vCPU/RAM/disk: no longer
subtracted once the host's document lists the instance, or when cancelled.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova.scheduler.filters import numa_topology_filter, pci_passthrough_filter  # noqa: E402
from nova_world import build_world, with_candidates  # noqa: E402

from protocol.messages import Snapshot  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova


def _state(world, manager, host):
    return next(h for h in with_candidates(world.our_states(manager)) if h.host == host)


@pytest.fixture
def world():
    fx.setup_nova()
    return build_world()


def test_pinned_cpus_are_held_until_the_compute_reports_the_instance(world):
    manager = world.manager(register_claims=True)
    numa_filter = numa_topology_filter.NUMATopologyFilter()
    uuids = [fx.uuid_for("pin", i) for i in range(3)]
    for uuid in uuids[:2]:  # each takes the four dedicated CPUs of one cell of host0
        spec = fx.request_spec(instance_uuid=uuid, vcpus=4, numa=fx.dedicated_cpus(4))
        hs = _state(world, manager, "host0")
        assert numa_filter.host_passes(hs, spec)
        hs.consume_from_request(spec)
    held = _state(world, manager, "host0")
    assert [c.pinned_cpus for c in held.numa_topology.cells] == [{4, 5, 6, 7}, {12, 13, 14, 15}]
    assert [c.memory_usage for c in held.numa_topology.cells] == [2048, 2048]
    third = fx.request_spec(instance_uuid=uuids[2], vcpus=4, numa=fx.dedicated_cpus(4))
    assert not numa_filter.host_passes(held, third)  # no host-side refusal needed
    # only the views changed: the cache still holds the document as the compute reported it
    cn = next(n for n in world.nodes if n.host == "host0")
    assert world.cache.receiver.sources[cn.uuid].doc["numa"] == world.hook.document(cn.uuid)["numa"]

    # the compute reports the first instance (its CPUs pinned in its document): that claim
    # stops being subtracted, the second still is, and nothing is counted twice
    reported = fx.numa_topology(pinned={4, 5, 6, 7})
    cn.numa_topology = reported._to_json()
    doc = ndoc.document_from_compute_node(cn, service=fx.service_dict("host0"))
    doc["instances"] = {uuids[0]: {}}
    cache = world.cache
    with cache.lock:
        view = cache.receiver.sources[cn.uuid]
        cache.receiver.receive(Snapshot(cn.uuid, view.epoch, view.seq + 1, doc), cache.clock())
    again = _state(world, manager, "host0")
    assert [c.pinned_cpus for c in again.numa_topology.cells] == [{4, 5, 6, 7}, {12, 13, 14, 15}]
    # (the reported document says cell 0 uses no memory: only the pending claim's cell does)
    assert [c.memory_usage for c in again.numa_topology.cells] == [0, 2048]
    assert not numa_filter.host_passes(again, third)
    # the second build is given up: its CPUs come back at once
    assert manager.cancel_claims([uuids[1]]) == 1
    freed = _state(world, manager, "host0")
    assert [c.pinned_cpus for c in freed.numa_topology.cells] == [{4, 5, 6, 7}, set()]
    assert numa_filter.host_passes(freed, third)


def test_pci_devices_are_held_and_given_back(world):
    manager = world.manager(register_claims=True)
    pci_filter = pci_passthrough_filter.PciPassthroughFilter()
    uuids = [fx.uuid_for("pci", i) for i in range(5)]
    for i, uuid in enumerate(uuids[:4]):  # host5 has four devices
        spec = fx.request_spec(instance_uuid=uuid, pci=fx.pci_request())
        hs = _state(world, manager, "host5")
        assert hs.pci_stats.pools[0]["count"] == 4 - i
        assert pci_filter.host_passes(hs, spec)
        hs.consume_from_request(spec)
    full = _state(world, manager, "host5")
    assert full.pci_stats.pools[0]["count"] == 0
    assert not pci_filter.host_passes(full, fx.request_spec(instance_uuid=uuids[4], pci=fx.pci_request()))
    assert manager.cancel_claims(uuids[:2]) == 2
    assert _state(world, manager, "host5").pci_stats.pools[0]["count"] == 2


def test_the_vector_core_weighs_held_pci_devices_as_novas_weigher(world):
    """PCIWeigher prefers hosts with fewer free devices: the devices a pending claim holds
    count as taken in the vector core's column as in the full HostState."""
    manager = world.manager(register_claims=True)
    for i in range(4):  # every device of host5 held by a pending claim
        spec = fx.request_spec(instance_uuid=fx.uuid_for("pci-w", i), pci=fx.pci_request())
        _state(world, manager, "host5").consume_from_request(spec)
    decided = {}
    for vector_on in (True, False):
        manager.vector_decisions = vector_on
        spec = fx.request_spec(instance_uuid=fx.uuid_for("pci-w", 9))
        # straight from the rows, as nova's manager calls it: no shell touched, so the
        # vector core weighs every host from its columns
        hosts = manager.get_host_states_by_uuids(None, [cn.uuid for cn in world.nodes], spec)
        passed = manager.get_filtered_hosts(hosts, spec, 0)
        decided[vector_on] = [(w.obj.host, w.weight) for w in manager.get_weighed_hosts(passed, spec)]
    assert manager.counters["vector_weighed"] == 1  # once by the vector core, once by nova's handler
    assert "host5" in dict(decided[False])
    assert decided[True] == decided[False]
