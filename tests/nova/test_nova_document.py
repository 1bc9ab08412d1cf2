"""ComputeNode -> document -> nova objects: lossless for everything the scheduler reads."""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import objects  # noqa: E402
from nova.scheduler import host_manager as nova_hm  # noqa: E402

from protocol.codec import Decoder, Encoder  # noqa: E402
from protocol.document import check_document, digest  # noqa: E402
from protocol.messages import Snapshot  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()

FIELDS = ("host", "nodename", "uuid", "free_ram_mb", "free_disk_mb", "vcpus_total", "vcpus_used",
          "total_usable_ram_mb", "total_usable_disk_gb", "disk_mb_used", "num_io_ops", "num_instances",
          "failed_builds", "hypervisor_type", "hypervisor_version", "hypervisor_hostname",
          "supported_instances", "host_ip", "stats", "cpu_allocation_ratio", "ram_allocation_ratio",
          "disk_allocation_ratio", "numa_topology", "updated", "cpu_info")


def _nova_state(cn):
    hs = nova_hm.HostState(cn.host, cn.hypervisor_hostname, fx.CELL1)
    hs.update(cn, fx.service_dict(cn.host), [], {})
    return hs


@pytest.mark.parametrize("reserved", [ndoc.NO_RESERVED, ndoc.Reserved(2, 512, 10),
                                      ndoc.Reserved(99, 10**6, 10**4)])
def test_round_trip_gives_nova_the_same_host_state(reserved):
    cn = fx.compute_node(3, pci=4, free_ram_mb=1000, vcpus_used=6, numa=fx.numa_topology(pinned={5, 6}))
    doc = ndoc.document_from_compute_node(cn, cell_uuid=fx.CELL1, reserved=reserved)
    back = ndoc.compute_node_from_document(cn.uuid, doc)
    a, b = _nova_state(cn), _nova_state(back)
    for field in FIELDS:
        assert getattr(a, field) == getattr(b, field), field
    assert a.pci_stats.pools == b.pci_stats.pools
    # metrics come back sorted by name (filters and weighers look them up by name)
    assert {m.name: m.to_dict() for m in a.metrics} == {m.name: m.to_dict() for m in b.metrics}
    # the reserved amounts are split out of *_used and never make them negative
    c = doc["compute"]
    assert all(c[k] >= 0 for k in ("vcpus_used", "memory_mb_used", "disk_gb_used"))


def test_document_is_valid_on_the_wire_and_canonical():
    cn = fx.compute_node(7, pci=2)
    agg = objects.Aggregate(id=4, uuid=fx.uuid_for("agg", 4), name="ssd", metadata={"ssd": "true"})
    doc = ndoc.document_from_compute_node(
        cn, service=fx.service_dict(cn.host), instances=[fx.uuid_for("i", 1)], aggregates=[agg],
        cell_uuid=fx.CELL1)
    check_document(doc, "test")
    decoded = Decoder().decode(Encoder().encode(Snapshot(cn.uuid, 1, 0, doc)))
    assert digest(decoded.doc) == digest(doc)
    # rebuilding the same object twice gives the same bytes (no set order, no change lists)
    again = ndoc.document_from_compute_node(
        ndoc.compute_node_from_document(cn.uuid, doc), service=fx.service_dict(cn.host),
        instances=[fx.uuid_for("i", 1)], aggregates=[agg], cell_uuid=fx.CELL1)
    for ns in ("numa", "pci", "metrics", "stats"):
        assert digest({ns: again[ns]}) == digest({ns: doc[ns]}), ns
    assert all("nova_object.changes" not in repr(v) for v in doc["numa"].values())
    assert set(doc["numa"]) == {"cell0", "cell1"}
    assert doc["service"] == {"disabled": False, "forced_down": False, "version": 74}
    assert doc["aggregates"] == {agg.uuid: {"id": 4, "name": "ssd", "metadata": {"ssd": "true"}}}
    assert isinstance(doc["compute"]["cpu_info"], dict)


def test_numa_pinning_changes_only_that_cell():
    cn = fx.compute_node(1, numa=fx.numa_topology())
    before = ndoc.numa_namespace(cn.numa_topology)
    after = ndoc.numa_namespace(fx.numa_topology(pinned={12, 13}))
    assert before["cell0"] == after["cell0"]
    assert before["cell1"] != after["cell1"]
    rebuilt = ndoc.numa_from_namespace(after)
    assert rebuilt.cells[1].pinned_cpus == {12, 13}
    assert ndoc.numa_from_namespace({}) is None
