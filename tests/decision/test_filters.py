"""Every built-in filter: nova 34 semantics per host, and the vector form agrees on the index."""

from __future__ import annotations

import pytest

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.filters.aggregate_instance_extra_specs import (
    AggregateInstanceExtraSpecsFilter,
)
from shared_host_manager.decision.filters.aggregate_multitenancy_isolation import (
    AggregateMultiTenancyIsolation,
)
from shared_host_manager.decision.filters.availability_zone_filter import AvailabilityZoneFilter
from shared_host_manager.decision.filters.compute_filter import ComputeFilter
from shared_host_manager.decision.filters.different_host_filter import DifferentHostFilter
from shared_host_manager.decision.filters.extra_specs_ops import match
from shared_host_manager.decision.filters.image_props_filter import ImagePropertiesFilter
from shared_host_manager.decision.filters.io_ops_filter import IoOpsFilter
from shared_host_manager.decision.filters.num_instances_filter import NumInstancesFilter
from shared_host_manager.decision.filters.resource_fit_filter import ResourceFitFilter
from shared_host_manager.decision.filters.same_host_filter import SameHostFilter
from shared_host_manager.decision.filters.server_group_affinity_filter import ServerGroupAffinityFilter
from shared_host_manager.decision.filters.server_group_anti_affinity_filter import (
    ServerGroupAntiAffinityFilter,
)
from shared_host_manager.decision.filters.volume_locality_filter import VolumeLocalityFilter
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from simulator.synthetic_hosts import host_doc

INST = {"claim": "c", "resources": {"vcpus": 1}}


def agg(name, **metadata):
    return {name: {"name": name, "metadata": metadata}}


# -- ComputeFilter -------------------------------------------------------------------------

def test_compute_filter(harness):
    docs = {
        "up": host_doc("up"),
        "disabled": host_doc("disabled", disabled=True),
        "forced": host_doc("forced", forced_down=True),
        "silent": host_doc("silent"),
    }
    assert harness.run(ComputeFilter(), docs, RequestSpec(), down=("silent",)) == {"up"}


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


# -- AggregateInstanceExtraSpecsFilter -----------------------------------------------------

@pytest.mark.parametrize("extra_specs, passes", [
    ({}, {"ssd", "fast", "plain"}),
    ({"ssd": "true"}, {"ssd"}),
    ({"aggregate_instance_extra_specs:ssd": "true"}, {"ssd"}),
    ({"trust:trusted_host": "true"}, {"ssd", "fast", "plain"}),  # other scopes are ignored
    ({"cpu_mhz": ">= 3000"}, {"fast"}),
    ({"cpu_mhz": "= 2000"}, {"fast", "ssd"}),  # '=' is numeric >=
    ({"ssd": "<or> false <or> true"}, {"ssd"}),
    ({"ssd": "false"}, set()),
    ({"tier": "gold"}, {"fast"}),  # comma-separated aggregate values: any may match
])
def test_aggregate_instance_extra_specs(harness, extra_specs, passes):
    docs = {"ssd": host_doc("ssd", aggregates=agg("s", ssd="true", cpu_mhz="2000")),
            "fast": host_doc("fast", aggregates=agg("f", cpu_mhz="3500", tier="silver, gold")),
            "plain": host_doc("plain")}
    spec = RequestSpec(flavor=Flavor(extra_specs=extra_specs))
    assert harness.run(AggregateInstanceExtraSpecsFilter(), docs, spec) == passes


def test_extra_specs_ops():
    assert match("1", "1") and not match("1", "2")
    assert match("4096", ">= 1024") and not match("512", ">= 1024")
    assert match("abc", "s== abc") and match("b", "s< c")
    assert match("sse4, avx", "<in> avx") and match("sse4 avx", "<all-in> sse4 avx")
    assert match("b", "<or> a <or> b") and not match("c", "<or> a <or> b")
    assert not match("x", ">= notanumber")  # nova would raise; we fail the match
    assert not match(None, "<in> a")


# -- AggregateMultiTenancyIsolation --------------------------------------------------------

def test_multitenancy_isolation(harness):
    docs = {"p1": host_doc("p1", aggregates=agg("a", filter_tenant_id="proj1")),
            "p12": host_doc("p12", aggregates=agg("b", filter_tenant_id="proj1,proj2")),
            "p3": host_doc("p3", aggregates=agg("c", filter_tenant_id2="proj3")),
            "open": host_doc("open", aggregates=agg("d", ssd="true")),
            "none": host_doc("none")}
    flt = AggregateMultiTenancyIsolation()
    assert harness.run(flt, docs, RequestSpec(project_id="proj1")) == {"p1", "p12", "open", "none"}
    assert harness.run(flt, docs, RequestSpec(project_id="proj2")) == {"p12", "open", "none"}
    assert harness.run(flt, docs, RequestSpec(project_id="proj3")) == {"p3", "open", "none"}


# -- ImagePropertiesFilter -----------------------------------------------------------------

def _img_docs():
    return {
        "kvm6": host_doc("kvm6", supported_instances=[["x86_64", "kvm", "hvm"]],
                         hypervisor_version=6000000),
        "qemu62": host_doc("qemu62", supported_instances=[["x86_64", "qemu", "hvm"],
                                                          ["i686", "qemu", "hvm"]],
                           hypervisor_version=6002000),
        "arm": host_doc("arm", supported_instances=[["aarch64", "qemu", "hvm"]]),
        "none": host_doc("none", supported_instances=[]),
    }


@pytest.mark.parametrize("props, passes", [
    ({}, {"kvm6", "qemu62", "arm", "none"}),
    ({"hw_architecture": "x86_64", "img_hv_type": "kvm", "hw_vm_mode": "hvm"}, {"kvm6"}),
    ({"hw_architecture": "x86_64"}, {"kvm6", "qemu62"}),
    ({"hw_architecture": "amd64"}, {"kvm6", "qemu62"}),  # canonicalised
    ({"hw_architecture": "i386"}, {"qemu62"}),  # i386 -> i686
    ({"hw_vm_mode": "hv"}, {"kvm6", "qemu62", "arm"}),  # hv -> hvm
    ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.0,<6.2"}, {"kvm6"}),
    ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.2"}, {"qemu62"}),
    ({"hw_architecture": "armv7l"}, set()),
])
def test_image_properties_filter(harness, props, passes):
    spec = RequestSpec(image_properties=props)
    assert harness.run(ImagePropertiesFilter(), _img_docs(), spec) == passes


def test_image_properties_default_architecture(harness):
    flt = ImagePropertiesFilter(SchedulerConfig(image_properties_default_architecture="aarch64"))
    assert harness.run(flt, _img_docs(), RequestSpec()) == {"arm"}


# -- server groups --------------------------------------------------------------------------

def _group_docs():
    return {"h1": host_doc("h1", instances={"m1": INST}),
            "h2": host_doc("h2", instances={"m2": INST, "m3": INST}),
            "h3": host_doc("h3", instances={"other": INST})}


def test_affinity_hosts_derived_from_members(harness):
    flt = ServerGroupAffinityFilter()
    group = InstanceGroup("affinity", members=["m1"])
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h1"}
    # a new group (no member placed yet): every host
    group = InstanceGroup("affinity", members=["fresh"])
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h1", "h2", "h3"}
    # explicit group.hosts as nova's conductor fills them, plus derived ones
    group = InstanceGroup("affinity", members=["m1"], hosts=["h3"])
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h1", "h3"}
    # a pending claim of ours counts as the member being there
    group = InstanceGroup("affinity", members=["m9"])
    got = harness.run(flt, _group_docs(), RequestSpec(instance_group=group),
                      pending=(("h3", {"vcpus": 1}, "m9"),))
    assert got == {"h3"}
    # the anti-affinity policy is not this filter's business
    group = InstanceGroup("anti-affinity", members=["m1"])
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h1", "h2", "h3"}


def test_anti_affinity(harness):
    flt = ServerGroupAntiAffinityFilter()
    group = InstanceGroup("anti-affinity", members=["m1", "m2", "m3"])
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h3"}
    group = InstanceGroup("anti-affinity", members=["m1", "m2", "m3"],
                          rules={"max_server_per_host": 2})
    assert harness.run(flt, _group_docs(), RequestSpec(instance_group=group)) == {"h1", "h3"}
    # a move: the host already holding the instance being placed passes
    group = InstanceGroup("anti-affinity", members=["m1", "m2", "m3"])
    spec = RequestSpec(instance_group=group, instance_uuids=["m2"])
    assert harness.run(flt, _group_docs(), spec, uuids=("m2",)) == {"h2", "h3"}
    # our pending claim of a member counts
    got = harness.run(flt, _group_docs(), RequestSpec(instance_group=InstanceGroup(
        "anti-affinity", members=["m9"])), pending=(("h3", {"vcpus": 1}, "m9"),))
    assert got == {"h1", "h2"}


# -- same / different host -----------------------------------------------------------------

def test_same_and_different_host(harness):
    docs = _group_docs()
    same = RequestSpec(scheduler_hints={"same_host": ["m1", "m3"]})
    assert harness.run(SameHostFilter(), docs, same) == {"h1", "h2"}
    one = RequestSpec(scheduler_hints={"same_host": ["m2"]})  # one-element list -> a str
    assert harness.run(SameHostFilter(), docs, one) == {"h2"}
    diff = RequestSpec(scheduler_hints={"different_host": ["m1", "m3"]})
    assert harness.run(DifferentHostFilter(), docs, diff) == {"h3"}
    nohint = RequestSpec()
    assert harness.run(SameHostFilter(), docs, nohint) == set(docs)
    assert harness.run(DifferentHostFilter(), docs, nohint) == set(docs)
    unknown = RequestSpec(scheduler_hints={"same_host": ["nowhere"]})
    assert harness.run(SameHostFilter(), docs, unknown) == set()


# -- NumInstances / IoOps --------------------------------------------------------------------

def test_num_instances_filter_default_and_pending(harness):
    docs = {"full": host_doc("full", num_instances=50), "almost": host_doc("almost", num_instances=49),
            "empty": host_doc("empty", num_instances=0)}
    flt = NumInstancesFilter()
    assert flt.config.max_instances_per_host == 50
    assert harness.run(flt, docs, RequestSpec()) == {"almost", "empty"}
    got = harness.run(flt, docs, RequestSpec(), pending=(("almost", {"vcpus": 1}, "x"),))
    assert got == {"empty"}
    assert harness.run(NumInstancesFilter(SchedulerConfig(max_instances_per_host=1)), docs,
                       RequestSpec()) == {"empty"}


def test_io_ops_filter_default_and_pending(harness):
    docs = {"busy": host_doc("busy", num_io_ops=8), "seven": host_doc("seven", num_io_ops=7),
            "idle": host_doc("idle", num_io_ops=0)}
    flt = IoOpsFilter()
    assert flt.config.max_io_ops_per_host == 8
    assert harness.run(flt, docs, RequestSpec()) == {"seven", "idle"}
    got = harness.run(flt, docs, RequestSpec(), pending=(("seven", {"vcpus": 1}, ""),))
    assert got == {"idle"}


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
