"""The engine's own filters (what nova has no class for): semantics per host, and the vector
form agrees on the index.  The filters nova has are nova's classes; tests/decision/
test_differential.py and tests/nova/test_nova_vector.py hold them to nova's handlers."""

from __future__ import annotations

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.filters.availability_zone_filter import AvailabilityZoneFilter
from shared_host_manager.decision.filters.resource_fit_filter import ResourceFitFilter
from shared_host_manager.decision.filters.volume_locality_filter import VolumeLocalityFilter
from shared_host_manager.decision.request import Flavor, RequestSpec
from simulator.synthetic_hosts import host_doc


def agg(name, **metadata):
    return {name: {"name": name, "metadata": metadata}}


# -- ResourceFitFilter -----------------------------------------------------------------------

def test_resource_fit_uses_allocation_ratios_reserved_and_pending(harness):
    docs = {
        # vcpus: (4 - 0) * 2.0 = 8 capacity, 6 used: 2 left
        "a": host_doc("a", vcpus=4, vcpus_used=6, cpu_ratio=2.0),
        # memory: (4096 - 1024 reserved) * 1.5 = 4608, used 2560: 2048 left
        "b": host_doc("b", memory_mb=4096, memory_mb_used=2560, ram_ratio=1.5,
                      reserved={"memory_mb": 1024}),
        # would fit, but our own pending claim takes the room
        "c": host_doc("c", vcpus=4, vcpus_used=0, cpu_ratio=1.0),
    }
    flt = ResourceFitFilter()
    two = RequestSpec(flavor=Flavor(vcpus=2, memory_mb=2048))
    three = RequestSpec(flavor=Flavor(vcpus=3, memory_mb=512))
    pending = (("c", {"vcpus": 3}, "x"),)
    assert harness.run(flt, docs, two, pending=pending) == {"a", "b"}
    assert harness.run(flt, docs, three, pending=pending) == {"b"}
    mem = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=2049))
    assert "b" not in harness.run(flt, docs, mem)


def test_resource_fit_disk_and_missing_inventory(harness):
    docs = {"full": host_doc("full", disk_gb=100, disk_gb_used=90),
            "ok": host_doc("ok", disk_gb=100, disk_gb_used=0)}
    no_disk = host_doc("nodisk")
    del no_disk["compute"]["disk_gb"]
    docs["nodisk"] = no_disk
    flt = ResourceFitFilter()
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512, root_gb=10, ephemeral_gb=1))
    assert harness.run(flt, docs, spec) == {"ok"}
    # boot from volume: no root disk; ephemeral still counts, and a zero request needs no inventory
    assert harness.run(flt, docs, RequestSpec(flavor=Flavor(root_gb=10), is_bfv=True)) == set(docs)


def test_resource_fit_extra_class_runs_per_host(harness):
    docs = {"gpu": host_doc("gpu"), "plain": host_doc("plain")}
    docs["gpu"]["compute"].update({"vgpu": 2, "vgpu_used": 1})
    spec = RequestSpec(flavor=Flavor(vcpus=1), extra_resources={"vgpu": 1})
    assert harness.run(ResourceFitFilter(), docs, spec) == {"gpu"}


# -- AvailabilityZoneFilter ------------------------------------------------------------------

def test_availability_zone_filter(harness):
    docs = {"z1": host_doc("z1", aggregates=agg("a1", availability_zone="az1")),
            "z2": host_doc("z2", aggregates=agg("a2", availability_zone="az2")),
            "none": host_doc("none")}
    flt = AvailabilityZoneFilter(SchedulerConfig(default_availability_zone="nova"))
    assert harness.run(flt, docs, RequestSpec(availability_zone="az1")) == {"z1"}
    assert harness.run(flt, docs, RequestSpec(availability_zone="nova")) == {"none"}
    assert harness.run(flt, docs, RequestSpec()) == set(docs)


# -- VolumeLocalityFilter (a foreign namespace) ------------------------------------------------

def test_volume_locality_filter(harness):
    docs = {"h1": host_doc("h1"), "h2": host_doc("h2"), "h3": host_doc("h3"),
            "volume-backend:ceph-a": {"locality": {"hosts": ["h1", "h2"]},
                                      "volumes": {"vol-1": {"size_gb": 10}}},
            "volume-backend:lvm-b": {"locality": {"hosts": ["h3"]},
                                     "volumes": {"vol-2": {"size_gb": 5}}}}
    flt = VolumeLocalityFilter()
    assert harness.run(flt, docs, RequestSpec(scheduler_hints={"near_volume": ["vol-1"]})) == {"h1", "h2"}
    assert harness.run(flt, docs, RequestSpec(scheduler_hints={"near_volume": "vol-2"})) == {"h3"}
    assert harness.run(flt, docs, RequestSpec(scheduler_hints={"near_volume": "vol-x"})) == set()
    both = RequestSpec(scheduler_hints={"near_volume": ["vol-1", "vol-2"]})
    assert harness.run(flt, docs, both) == set()
    assert harness.run(flt, docs, RequestSpec()) == {"h1", "h2", "h3"}
