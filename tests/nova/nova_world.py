"""One set of compute nodes, seen two ways: nova's own HostStates and our per-request views.

nova side: ``HostState(host, node, cell).update(compute, service, aggregates,
instances)``, exactly as nova's HostManager._get_host_states does.
Our side: the same ComputeNodes go through the compute hook (documents),
into a cache, and out of SharedHostManager.get_host_states_by_uuids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nova import context as nova_context
from nova import objects
from nova.scheduler import host_manager as nova_hm

from shared_host_manager.nova import host_manager as shm
from shared_host_manager.nova.compute_hook import ComputeHook
from shared_host_manager.nova.testing import fixtures as fx

fx.setup_nova()  # registers nova's objects before the module-level ones below

MEMBER = fx.uuid_for("member", 1)
AGG_SSD = objects.Aggregate(id=1, uuid=fx.uuid_for("agg", 1), name="ssd", metadata={"ssd": "true"},
                            hosts=["host8", "host9"])
AGG_WEIGHT = objects.Aggregate(id=2, uuid=fx.uuid_for("agg", 2), name="heavy",
                               metadata={"ram_weight_multiplier": "2.0",
                                         "availability_zone": "az1"},
                               hosts=["host0"])


@dataclass
class World:
    nodes: list[Any]
    services: dict[str, dict[str, Any]]
    aggregates: dict[str, list[Any]]
    instances: dict[str, list[str]]
    cache: Any = None
    hook: ComputeHook = field(default_factory=ComputeHook)

    def nova_states(self) -> list[Any]:
        out = []
        for cn in self.nodes:
            hs = nova_hm.HostState(cn.host, cn.hypervisor_hostname, fx.CELL1)
            hs.update(cn, dict(self.services[cn.host]), list(self.aggregates.get(cn.host, [])),
                      {u: objects.Instance(uuid=u) for u in self.instances.get(cn.host, [])})
            out.append(hs)
        return out

    def manager(self, **kw: Any) -> shm.SharedHostManager:
        kw.setdefault("register_claims", False)
        return shm.SharedHostManager(self.cache, default_cell_uuid=fx.CELL1, **kw)

    def our_states(self, manager: shm.SharedHostManager | None = None) -> list[Any]:
        manager = manager or self.manager()
        return list(manager.get_host_states_by_uuids(
            nova_context.get_admin_context(), [cn.uuid for cn in self.nodes], None))


def with_candidates(states: list[Any]) -> list[Any]:
    for hs in states:
        hs.allocation_candidates = [{"allocations": {hs.uuid: {}}, "mappings": {"": [hs.uuid]}}]
    return states


def build_world() -> World:
    """Ten hosts, each with something a filter or weigher looks at."""
    pinned_all = set(range(4, 8)) | set(range(12, 16))
    nodes = [
        fx.compute_node(0, free_ram_mb=50000),
        fx.compute_node(1),                                         # service disabled
        fx.compute_node(2),                                         # forced down
        fx.compute_node(3, io_workload=20),                         # busy: IoOpsFilter
        fx.compute_node(4, num_instances=60),                       # full: NumInstancesFilter
        fx.compute_node(5, pci=4, free_ram_mb=20000),               # the PCI host
        fx.compute_node(6, numa=fx.numa_topology(pinned=pinned_all)),  # no free pCPU
        fx.compute_node(7, hypervisor_version=6000000, failed_builds=3),
        fx.compute_node(8, free_ram_mb=60000, vcpus_used=10),
        fx.compute_node(9, extra_stats={"num_vm_active": "1"}),
    ]
    services = {cn.host: fx.service_dict(cn.host) for cn in nodes}
    services["host1"] = fx.service_dict("host1", disabled=True)
    services["host2"] = fx.service_dict("host2", forced_down=True)
    aggregates = {"host0": [AGG_WEIGHT], "host8": [AGG_SSD], "host9": [AGG_SSD]}
    instances = {"host9": [MEMBER, fx.uuid_for("other", 9)], "host3": [fx.uuid_for("other", 3)]}
    world = World(nodes, services, aggregates, instances)
    for cn in nodes:
        world.hook.report(cn, instances=instances.get(cn.host, []), service=services[cn.host],
                          aggregates=aggregates.get(cn.host, []))
    world.cache = fx.cache_from_documents({cn.uuid: world.hook.document(cn.uuid) for cn in nodes})
    return world
