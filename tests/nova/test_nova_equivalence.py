"""nova's own filters and weighers, unchanged, decide the same on our views as on nova's HostStates.

Both sides are built from the same ComputeNodes: nova's HostState through
``update(compute, service, aggregates, instances)``, ours through the compute
hook's documents, the cache and SharedHostManager.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import objects  # noqa: E402
from nova.scheduler import filters as nova_filters  # noqa: E402
from nova.scheduler import weights as nova_weights  # noqa: E402
from nova.scheduler.filters import (  # noqa: E402
    affinity_filter,
    aggregate_instance_extra_specs,
    compute_capabilities_filter,
    compute_filter,
    image_props_filter,
    io_ops_filter,
    num_instances_filter,
    numa_topology_filter,
    pci_passthrough_filter,
)
from nova_world import MEMBER, build_world, with_candidates  # noqa: E402

from shared_host_manager.nova.core.document import canonical_primitive  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

FILTERS = {
    "ComputeFilter": compute_filter.ComputeFilter,
    "ComputeCapabilitiesFilter": compute_capabilities_filter.ComputeCapabilitiesFilter,
    "ImagePropertiesFilter": image_props_filter.ImagePropertiesFilter,
    "ServerGroupAffinityFilter": affinity_filter.ServerGroupAffinityFilter,
    "ServerGroupAntiAffinityFilter": affinity_filter.ServerGroupAntiAffinityFilter,
    "AggregateInstanceExtraSpecsFilter": aggregate_instance_extra_specs.AggregateInstanceExtraSpecsFilter,
    "NUMATopologyFilter": numa_topology_filter.NUMATopologyFilter,
    "PciPassthroughFilter": pci_passthrough_filter.PciPassthroughFilter,
    "IoOpsFilter": io_ops_filter.IoOpsFilter,
    "NumInstancesFilter": num_instances_filter.NumInstancesFilter,
}


def _group(policy, members=(), hosts=()):
    return objects.InstanceGroup(policy=policy, policies=[policy], rules={}, members=list(members),
                                 hosts=list(hosts))


SPECS = {
    "plain": {},
    "aggregate": {"extra_specs": {"aggregate_instance_extra_specs:ssd": "true"}},
    "capabilities": {"extra_specs": {"capabilities:cpu_info:arch": "x86_64",
                                     "capabilities:hypervisor_version": ">= 7000000",
                                     "num_vm_active": ">= 2"}},
    "image": {"image_props": {"hw_architecture": "x86_64", "img_hv_type": "qemu",
                              "img_hv_requested_version": ">= 7.0"}},
    "anti_affinity": {"group": lambda: _group("anti-affinity", members=[MEMBER])},
    "affinity": {"group": lambda: _group("affinity", members=[MEMBER], hosts=["host9"])},
    "numa_dedicated": {"numa": fx.dedicated_cpus},
    "pci": {"pci": fx.pci_request},
    "numa_and_pci": {"numa": fx.dedicated_cpus, "pci": fx.pci_request},
}


def _plain(limits):
    """Limits as comparable data (NUMATopologyLimits has no __eq__)."""
    return {k: canonical_primitive(v.obj_to_primitive()) if hasattr(v, "obj_to_primitive") else v
            for k, v in limits.items()}


def _numa(topology):
    """A NUMATopology with its lazy defaults filled (our templates fill them up front)."""
    if topology is None:
        return None
    topology = topology.obj_clone()
    for cell in topology.cells:
        for page in cell.mempages:
            page.obj_set_defaults()
    return topology


def _same(attr, a, b):
    return _numa(a) == _numa(b) if attr == "numa_topology" else a == b


def _spec(name):
    kw = {k: (v() if callable(v) else v) for k, v in SPECS[name].items()}
    return fx.request_spec(instance_uuid=fx.uuid_for("req", 1), **kw)


@pytest.fixture(scope="module")
def world():
    fx.setup_nova()
    return build_world()


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_every_filter_passes_the_same_hosts(world, nova_conf, spec_name):
    nova_conf.set(**{"filter_scheduler.max_io_ops_per_host": 8,
                     "filter_scheduler.max_instances_per_host": 50})
    handler = nova_filters.HostFilterHandler()
    for name, cls in FILTERS.items():
        spec_nova, spec_ours = _spec(spec_name), _spec(spec_name)
        theirs = handler.get_filtered_objects([cls()], with_candidates(world.nova_states()), spec_nova, 0)
        ours = handler.get_filtered_objects([cls()], with_candidates(world.our_states()), spec_ours, 0)
        assert sorted(h.host for h in ours) == sorted(h.host for h in theirs), (spec_name, name)
        # what the filters wrote (NUMA limits, pruned candidates) is the same too
        by_host = {h.host: h for h in theirs}
        for h in ours:
            assert _plain(h.limits) == _plain(by_host[h.host].limits), (spec_name, name, h.host)
            assert h.allocation_candidates == by_host[h.host].allocation_candidates


def test_the_world_exercises_every_filter(world, nova_conf):
    """Guard against a vacuous comparison: each filter rejects someone somewhere."""
    nova_conf.set(**{"filter_scheduler.max_io_ops_per_host": 8,
                     "filter_scheduler.max_instances_per_host": 50})
    handler = nova_filters.HostFilterHandler()
    expected_rejects = {
        ("plain", "ComputeFilter"): {"host1", "host2"},
        ("plain", "IoOpsFilter"): {"host3"},
        ("plain", "NumInstancesFilter"): {"host4"},
        ("aggregate", "AggregateInstanceExtraSpecsFilter"): None,
        ("capabilities", "ComputeCapabilitiesFilter"): {"host7", "host9"},
        ("image", "ImagePropertiesFilter"): {"host7"},
        ("anti_affinity", "ServerGroupAntiAffinityFilter"): {"host9"},
        ("affinity", "ServerGroupAffinityFilter"): None,
        ("numa_dedicated", "NUMATopologyFilter"): {"host6"},
        ("pci", "PciPassthroughFilter"): None,
    }
    everyone = {cn.host for cn in world.nodes}
    for (spec_name, name), rejected in expected_rejects.items():
        passed = {h.host for h in handler.get_filtered_objects(
            [FILTERS[name]()], with_candidates(world.our_states()), _spec(spec_name), 0)}
        if rejected is None:  # a filter that keeps only a few
            assert passed and passed != everyone, (spec_name, name, passed)
        else:
            assert everyone - passed == rejected, (spec_name, name, passed)


def test_all_weighers_give_the_same_weights(world, nova_conf):
    nova_conf.set(**{"filter_scheduler.num_instances_weight_multiplier": 1.0,
                     "filter_scheduler.soft_affinity_weight_multiplier": 2.0,
                     "filter_scheduler.soft_anti_affinity_weight_multiplier": 3.0,
                     "filter_scheduler.hypervisor_version_weight_multiplier": 1.0,
                     "metrics.weight_setting": ["cpu.frequency=1.0"]})
    weighers = [cls() for cls in nova_weights.all_weighers()]
    assert len(weighers) == 13
    handler = nova_weights.HostWeightHandler()
    for group in (None, _group("soft-affinity", members=[MEMBER]),
                  _group("soft-anti-affinity", members=[MEMBER])):
        spec = fx.request_spec(instance_uuid=fx.uuid_for("req", 2), group=group)
        for weigher in weighers:
            theirs = handler.get_weighed_objects([weigher], world.nova_states(), spec)
            ours = handler.get_weighed_objects([weigher], world.our_states(), spec)
            assert {w.obj.host: w.weight for w in ours} == {w.obj.host: w.weight for w in theirs}, \
                type(weigher).__name__
        theirs = handler.get_weighed_objects(weighers, world.nova_states(), spec)
        ours = handler.get_weighed_objects(weighers, world.our_states(), spec)
        assert [(w.obj.host, w.weight) for w in ours] == [(w.obj.host, w.weight) for w in theirs]


@pytest.mark.parametrize("spec_name,host", [("numa_dedicated", "host0"), ("pci", "host5")])
def test_consume_from_request_matches_nova_on_the_view_only(world, nova_conf, spec_name, host):
    spec_n, spec_o = _spec(spec_name), _spec(spec_name)
    theirs = next(h for h in with_candidates(world.nova_states()) if h.host == host)
    manager = world.manager()
    ours = next(h for h in with_candidates(world.our_states(manager)) if h.host == host)
    for hs, spec in ((theirs, spec_n), (ours, spec_o)):
        assert numa_topology_filter.NUMATopologyFilter().host_passes(hs, spec)
        assert pci_passthrough_filter.PciPassthroughFilter().host_passes(hs, spec)
        hs.consume_from_request(spec)
    for attr in ("free_ram_mb", "free_disk_mb", "vcpus_used", "num_instances", "num_io_ops",
                 "numa_topology"):
        assert _same(attr, getattr(ours, attr), getattr(theirs, attr)), attr
    assert ours.pci_stats.pools == theirs.pci_stats.pools
    if spec_name == "pci":
        assert ours.pci_stats.pools[0]["count"] == 3
    else:
        assert spec_o.numa_topology.cells[0].cpu_pinning == spec_n.numa_topology.cells[0].cpu_pinning
        assert ours.numa_topology.cells[0].pinned_cpus == {4, 5}
    assert ours.updated is not None
    # the next request sees the host as the compute reported it: nothing leaked into the cache
    again = next(h for h in world.our_states(manager) if h.host == host)
    fresh = next(h for h in world.nova_states() if h.host == host)
    for attr in ("free_ram_mb", "vcpus_used", "num_instances", "num_io_ops", "numa_topology"):
        assert _same(attr, getattr(again, attr), getattr(fresh, attr)), attr
    assert again.pci_stats.pools == fresh.pci_stats.pools
    assert again.limits == {} and again.allocation_candidates == []


def test_cpu_info_is_a_dict_so_maxphysaddr_images_work(world):
    """nova hands ImagePropertiesFilter the ComputeNode's cpu_info *string*; with an image asking
    for hw_maxphysaddr_bits it raises AttributeError (nova 34 bug).  Our views carry the decoded
    dict, which both ImagePropertiesFilter and ComputeCapabilitiesFilter accept."""
    spec = fx.request_spec(image_props={"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 40,
                                        "hw_maxphysaddr_mode": "emulate"})
    theirs = world.nova_states()[0]
    with pytest.raises(AttributeError):
        image_props_filter.ImagePropertiesFilter().host_passes(theirs, spec)
    ours = world.our_states()[0]
    assert isinstance(ours.cpu_info, dict)
    assert image_props_filter.ImagePropertiesFilter().host_passes(ours, spec)
