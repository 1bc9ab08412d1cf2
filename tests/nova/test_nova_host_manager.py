"""SharedHostManager's own duties: templates per version, liveness, cells, aggregates, RPC feeds."""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import objects  # noqa: E402

from protocol.document import DEL, SET  # noqa: E402
from protocol.messages import Delta, Heartbeat  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()
OTHER_CELL = fx.uuid_for("cell", 2)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world():
    nodes = [fx.compute_node(i) for i in range(4)]
    docs = {}
    for cn in nodes:
        aggs = [objects.Aggregate(id=7, uuid=fx.uuid_for("agg", 7), name="a", metadata={"x": "1"})] \
            if cn.host in ("host0", "host1") else []
        docs[cn.uuid] = ndoc.document_from_compute_node(
            cn, service=fx.service_dict(cn.host), aggregates=aggs,
            cell_uuid=OTHER_CELL if cn.host == "host3" else None)
    clock = Clock()
    cache = fx.cache_from_documents(docs, clock=clock, down_interval=10.0)
    manager = shm.SharedHostManager(cache, default_cell_uuid=fx.CELL1)
    return nodes, docs, cache, clock, manager


def _hosts(manager, uuids=None, spec=None):
    return {h.host: h for h in manager.get_host_states_by_uuids(None, uuids, spec)}


def test_nova_objects_are_rebuilt_once_per_version(world):
    nodes, docs, cache, clock, manager = world
    first = _hosts(manager)
    assert manager.counters["templates_built"] == 4
    second = _hosts(manager)
    assert manager.counters["templates_built"] == 4
    assert second["host0"] is not first["host0"]  # a new view per request...
    assert second["host0"].numa_topology is first["host0"].numa_topology  # ...sharing the objects
    with cache.lock:  # one compute reports a change
        cache.receiver.receive(Delta(nodes[0].uuid, 1, 1, [[SET, "compute", "num_io_ops", 5]]), clock())
    third = _hosts(manager)
    assert manager.counters["templates_built"] == 5
    assert third["host0"].num_io_ops == 5 and third["host1"].num_io_ops == 1
    # a counter changed: the NUMA, PCI and metrics objects are reused, not rebuilt
    for attr in ("numa_topology", "pci_stats", "metrics"):
        assert getattr(third["host0"], attr) is getattr(first["host0"], attr), attr
    # one NUMA cell changed: only that cell is rebuilt
    cell1 = ndoc.numa_namespace(fx.numa_topology(pinned={12}))["cell1"]
    with cache.lock:
        cache.receiver.receive(Delta(nodes[0].uuid, 1, 2, [[SET, "numa", "cell1", cell1]]), clock())
    fourth = _hosts(manager)["host0"]
    assert fourth.numa_topology is not first["host0"].numa_topology
    assert fourth.numa_topology.cells[0] is first["host0"].numa_topology.cells[0]
    assert fourth.numa_topology.cells[1].pinned_cpus == {12}
    assert fourth.pci_stats.numa_topology is fourth.numa_topology


def test_silent_sources_are_not_eligible_until_they_speak(world):
    nodes, docs, cache, clock, manager = world
    clock.now += 11
    with cache.lock:
        cache.receiver.tick(clock())
    assert _hosts(manager) == {}
    with cache.lock:
        view = cache.receiver.sources[nodes[2].uuid]
        cache.receiver.receive(Heartbeat(nodes[2].uuid, 1, 0, view.digest()), clock())
    hosts = _hosts(manager)
    assert set(hosts) == {"host2"}
    # ComputeFilter's heartbeat is when the cache last heard from the source: just now
    age = datetime.datetime.now(datetime.UTC) - hosts["host2"].service["last_seen_up"]
    assert abs(age.total_seconds()) < 5


def test_cells_come_from_the_documents(world):
    nodes, docs, cache, clock, manager = world
    manager.refresh_cells_caches()
    assert sorted(manager.cells) == sorted([fx.CELL1, OTHER_CELL])
    assert all(not c.disabled for c in manager.enabled_cells)
    hosts = _hosts(manager)
    assert hosts["host3"].cell_uuid == OTHER_CELL and hosts["host0"].cell_uuid == fx.CELL1
    spec = fx.request_spec()
    spec.requested_destination = objects.Destination(
        cell=objects.CellMapping(uuid=OTHER_CELL), allow_cross_cell_move=False)
    assert set(_hosts(manager, spec=spec)) == {"host3"}


def test_aggregates_from_documents_overridden_by_the_rpc_fanout(world):
    nodes, docs, cache, clock, manager = world
    hosts = _hosts(manager)
    assert [a.metadata for a in hosts["host0"].aggregates] == [{"x": "1"}]
    assert hosts["host2"].aggregates == []
    newer = objects.Aggregate(id=7, uuid=fx.uuid_for("agg", 7), name="a", metadata={"x": "2"},
                              hosts=["host1", "host2"])
    manager.update_aggregates([newer])
    hosts = _hosts(manager)
    assert hosts["host0"].aggregates == []  # removed from the aggregate since its last report
    assert [a.metadata for a in hosts["host1"].aggregates] == [{"x": "2"}]
    assert [a.metadata for a in hosts["host2"].aggregates] == [{"x": "2"}]
    manager.delete_aggregate(newer)
    assert all(h.aggregates == [] for h in _hosts(manager).values())


def test_instance_info_fanout_is_an_overlay_until_the_document_includes_it(world):
    """Defect 1 of issue 13: nova's tracker publishes the source host of a confirmed move
    before it forgets the instance; delete_instance_info (sent by confirm_resize) must hide
    it at once, as it does for nova's own HostManager."""
    nodes, docs, cache, clock, manager = world
    moved, built = fx.uuid_for("i", 1), fx.uuid_for("i", 2)
    with cache.lock:  # host0 lists the moved instance (its tracker has not published yet)
        cache.receiver.receive(Delta(nodes[0].uuid, 1, 1, [[SET, "instances", moved, {}]]), clock())
    assert moved in _hosts(manager)["host0"].instances
    manager.delete_instance_info(None, "host0", moved)
    manager.update_instance_info(None, "host1", objects.InstanceList(objects=[objects.Instance(uuid=built)]))
    hosts = _hosts(manager)
    assert moved not in hosts["host0"].instances  # hidden although the document still lists it
    assert built in hosts["host1"].instances  # added before host1's document lists it
    with cache.lock:  # the owners' next versions include both changes: the hints retire
        cache.receiver.receive(Delta(nodes[0].uuid, 1, 2, [[DEL, "instances", moved]]), clock())
        cache.receiver.receive(Delta(nodes[1].uuid, 1, 1, [[SET, "instances", built, {}]]), clock())
    hosts = _hosts(manager)
    assert moved not in hosts["host0"].instances and built in hosts["host1"].instances
    assert "host1" not in manager._inst_hints

    # a hint never outlives instance_hint_ttl: a document that still disagrees wins after it
    manager.sync_instance_info(None, "host2", [fx.uuid_for("i", 3)])
    assert list(_hosts(manager)["host2"].instances) == [fx.uuid_for("i", 3)]
    clock.now += manager.instance_hint_ttl + 1
    with cache.lock:
        for cn in nodes:
            cache.receiver.receive(Heartbeat(cn.uuid, 1, cache.receiver.sources[cn.uuid].seq,
                                             cache.receiver.sources[cn.uuid].digest()), clock())
    assert list(_hosts(manager)["host2"].instances) == []


def test_compute_nodes_by_host_or_node(world):
    nodes, docs, cache, clock, manager = world
    assert [cn.uuid for cn in manager.get_compute_nodes_by_host_or_node(None, "host1", None)] == \
        [nodes[1].uuid]
    found = manager.get_compute_nodes_by_host_or_node(None, None, "node2")
    assert [(cn.host, cn.hypervisor_hostname) for cn in found] == [("host2", "node2")]
    assert len(manager.get_compute_nodes_by_host_or_node(None, "host1", "node2")) == 0
    assert found[0].free_ram_mb == nodes[2].free_ram_mb


def test_minimum_compute_version_from_the_stream(world):
    nodes, docs, cache, clock, manager = world
    assert manager.minimum_compute_version() == 74
    with cache.lock:
        cache.receiver.receive(Delta(nodes[1].uuid, 1, 1, [[SET, "service", "version", 70]]), clock())
    assert manager.minimum_compute_version() == 70
    assert manager.minimum_compute_version() == 70  # asked again, nothing applied: the same
    with cache.lock:  # a compute that does not say its version: nova's own query decides
        cache.receiver.receive(Delta(nodes[2].uuid, 1, 1, [[DEL, "service", "version"]]), clock())
    assert manager.minimum_compute_version() is None


def test_a_bad_document_costs_one_host_not_the_request(world):
    nodes, docs, cache, clock, manager = world
    with cache.lock:
        cache.receiver.receive(Delta(nodes[1].uuid, 1, 1, [[SET, "numa", "cell0", {"bogus": 1}]]), clock())
    assert set(_hosts(manager)) == {"host0", "host2", "host3"}
    assert manager.counters["bad_documents"] == 1


def test_without_a_cache_the_error_says_what_to_do():
    manager = shm.SharedHostManager()
    with pytest.raises(RuntimeError, match="set_cache_provider"):
        list(manager.get_host_states_by_uuids(None, None, None))


def test_the_scheduler_process_gc_threshold():
    import gc

    from shared_host_manager.gc_threshold import YOUNG_THRESHOLD, tune_gc, tuned

    before = gc.get_threshold()
    try:
        tune_gc(0)  # 0: Python's own thresholds stay
        assert gc.get_threshold() == before
        tune_gc(100000)
        assert gc.get_threshold() == (100000, before[1], before[2])
    finally:
        gc.set_threshold(*before)
    with tuned():  # a command's run, its thresholds restored after it
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
    assert gc.get_threshold() == before
