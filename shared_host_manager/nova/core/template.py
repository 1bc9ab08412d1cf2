"""A compute node's document as nova's objects: one template per source and version.

:func:`build_template` rebuilds, from a host document (:mod:`.document`), the nova
objects a scheduler's HostState holds -- NUMATopology, PciDeviceStats,
MonitorMetricList, Instance stubs, the numbers -- and the attribute dict of a
HostState, once per source and document version.  A template is never mutated once
built; objects of namespaces a delta did not touch are carried over from the previous
version (NUMA cells one by one), so a counter change costs ~30 us per host instead of
~1 ms.  :func:`pending_effect` says what the pending claims a document does not include
yet take from it.

The drop-in's host manager (:mod:`shared_host_manager.nova.host_manager`) builds its
per-request HostStates from these templates; the engine's index
(:mod:`.index_table`) keeps them per row.  The contract: docs/design.md §5.5, §5.8.
"""

from __future__ import annotations

from typing import Any

import netaddr
from nova import objects
from nova.pci import stats as pci_stats

from protocol import hostdoc
from shared_host_manager.decision.host_table import allocation_ratio, document_numbers
from shared_host_manager.nova.core.document import (
    metrics_from_namespace,
    parse_time,
    pci_pools_from_namespace,
)

_EMPTY: dict[str, Any] = {}

#: where a pending claim keeps the NUMA and PCI consumption nova's arithmetic made
USAGE_KEY = "numa_pci_usage"


class _Template:
    """The nova objects of one source at one document version (immutable once built)."""

    __slots__ = ("version", "numbers", "attrs", "instances", "host", "cell_uuid", "service",
                 "agg_gen", "aggregates", "doc_instances", "parts", "vec")

    def __init__(self, version: tuple[int, int], numbers: tuple[float, ...], attrs: dict[str, Any],
                 instances: dict[str, Any], service: dict[str, Any],
                 doc_instances: Any) -> None:
        self.version = version
        #: the vector forms' numbers (decision/host_table.py), before pending claims
        self.numbers = numbers
        self.attrs = attrs
        self.instances = instances
        self.host = attrs["host"]
        self.cell_uuid = attrs["cell_uuid"]
        self.service = service
        self.doc_instances = doc_instances
        self.agg_gen = -1
        self.aggregates: list[Any] = []
        #: what the nova objects were built from, to reuse them across versions (see _parts)
        self.parts: dict[str, Any] = {}
        #: what the vector core derived from this version (group keys, weights), see vector.py
        self.vec: dict[str, Any] = {}


def _ip(value: Any) -> Any:
    """nova keeps host_ip as a netaddr.IPAddress (SimpleCIDRAffinityFilter accepts either)."""
    if type(value) is not str:
        return None
    try:
        return netaddr.IPAddress(value)
    except (netaddr.AddrFormatError, ValueError):
        return value


def _items(ns: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((ns or _EMPTY).items()))


def _unchanged(old: tuple[tuple[str, Any], ...] | None, new: tuple[tuple[str, Any], ...]) -> bool:
    """Same keys and the *same value objects*: document values are replaced, never mutated,
    when they change, so identity means "unchanged" (the old tuple keeps them alive)."""
    return old is not None and len(old) == len(new) and all(
        a[0] == b[0] and a[1] is b[1] for a, b in zip(old, new, strict=True))


def _parts(doc: Any, previous: _Template | None) -> dict[str, Any]:
    """The NUMA, PCI and metrics objects of ``doc``, reusing the previous version's when their
    namespace did not change (most deltas change counters only: rebuilding a NUMA topology
    costs about 1 ms per host).  NUMA cells are reused one by one."""
    old = previous.parts if previous is not None else _EMPTY
    parts: dict[str, Any] = {}
    numa_items = _items(doc.get(hostdoc.NUMA))
    if _unchanged(old.get("numa_items"), numa_items):
        numa = old["numa"]
    else:
        old_cells = old.get("cells") or _EMPTY
        cells = {}
        for key, value in numa_items:
            hit = old_cells.get(key)
            if hit is not None and hit[0] is value:
                cells[key] = hit
            elif type(value) is dict:
                cell = objects.NUMACell.obj_from_primitive(value)
                for page in cell.mempages:
                    # set the lazily defaulted fields now: NUMATopologyFilter would otherwise set
                    # them on this shared object from concurrent requests (same values, but a write)
                    page.obj_set_defaults()
                cells[key] = (value, cell)
        parts["cells"] = cells
        numa = objects.NUMATopology(cells=sorted((c for _, c in cells.values()), key=lambda c: c.id)) \
            if cells else None
    parts["numa_items"] = numa_items
    parts.setdefault("cells", old.get("cells"))
    parts["numa"] = numa
    pci_items = _items(doc.get(hostdoc.PCI))
    if numa is old.get("numa") and _unchanged(old.get("pci_items"), pci_items):
        parts["pci_stats"] = old["pci_stats"]
    else:
        pools = pci_pools_from_namespace(doc.get(hostdoc.PCI))
        parts["pci_stats"] = pci_stats.PciDeviceStats(numa, stats=pools)
    parts["pci_items"] = pci_items
    metrics_items = _items(doc.get(hostdoc.METRICS))
    if _unchanged(old.get("metrics_items"), metrics_items):
        parts["metrics"] = old["metrics"]
    else:
        parts["metrics"] = metrics_from_namespace(doc.get(hostdoc.METRICS))
    parts["metrics_items"] = metrics_items
    return parts


def build_template(source: str, view: Any, default_cell: str | None,
                   previous: _Template | None) -> _Template | None:
    doc = view.doc
    c = doc.get(hostdoc.COMPUTE)
    if not c:
        return None  # not a compute node (an aggregate catalogue, a volume backend...)
    host = c.get("host") or source
    node = c.get("nodename") or host
    parts = _parts(doc, previous)
    numa = parts["numa"]
    s = doc.get(hostdoc.SERVICE) or _EMPTY
    # one derivation of the numbers for both the vector forms and nova's per-host classes
    numbers = document_numbers(c, s, doc.get(hostdoc.PCI))
    (free_ram, free_disk, disk_used, vcpus_used, num_instances, num_io_ops, vcpus_total,
     cpu_ratio, failed_builds) = numbers[:9]
    supported = c.get("supported_instances")
    attrs = {
        "host": host,
        "nodename": node,
        "uuid": source,
        "cell_uuid": c.get("cell_uuid") or default_cell,
        "_lock_name": f"{host}-{node}",
        "total_usable_ram_mb": c.get("memory_mb", 0),
        "total_usable_disk_gb": c.get("disk_gb", 0),
        "disk_mb_used": disk_used,
        "free_ram_mb": free_ram,
        "free_disk_mb": free_disk,
        "vcpus_total": vcpus_total,
        "vcpus_used": vcpus_used,
        "numa_topology": numa,
        "pci_stats": parts["pci_stats"],
        "num_instances": num_instances,
        "num_io_ops": num_io_ops,
        "failed_builds": failed_builds,
        "host_ip": _ip(c.get("host_ip")),
        "hypervisor_type": c.get("hypervisor_type"),
        "hypervisor_version": c.get("hypervisor_version"),
        "hypervisor_hostname": node,
        "cpu_info": c.get("cpu_info"),
        "supported_instances": [list(s) for s in supported] if type(supported) is list else [],
        "stats": dict(doc.get(hostdoc.STATS) or _EMPTY),
        "metrics": parts["metrics"],
        "cpu_allocation_ratio": cpu_ratio,
        "ram_allocation_ratio": allocation_ratio(c, "ram_allocation_ratio"),
        "disk_allocation_ratio": allocation_ratio(c, "disk_allocation_ratio"),
        "_updated": parse_time(c.get("updated_at")),
    }
    # Instance stubs (nova's scheduler keeps stubs too: filters read the keys only);
    # reuse the previous version's objects for instances that are still there.
    doc_instances = doc.get(hostdoc.INSTANCES) or _EMPTY
    old = previous.instances if previous is not None else _EMPTY
    instances = {u: old.get(u) or objects.Instance(uuid=u) for u in doc_instances}
    service = {
        "host": host, "binary": "nova-compute", "topic": "compute",
        "disabled": bool(s.get("disabled", False)),
        "disabled_reason": s.get("disabled_reason"),
        "forced_down": bool(s.get("forced_down", False)),
        "version": s.get("version"),
    }
    tpl = _Template(view.version, numbers, attrs, instances, service, doc_instances)
    tpl.parts = parts
    return tpl


def pending_effect(view: Any, doc_instances: Any
                    ) -> tuple[dict[str, int], int, list[str], list[dict[str, Any]]]:
    """(resources, claims, instance uuids, NUMA/PCI usages) of the pending claims the
    document does not include yet."""
    resources: dict[str, int] = {}
    claims = 0
    insts: list[str] = []
    usages: list[dict[str, Any]] = []
    for pending in view.pending.values():
        claim = pending.claim
        if claim.instance and claim.instance in doc_instances:
            continue  # the compute already reports it: its usage is in the document
        claims += 1
        if claim.instance:
            insts.append(claim.instance)
        for resource, amount in claim.resources.items():
            resources[resource] = resources.get(resource, 0) + amount
        usage = claim.request.get(USAGE_KEY)
        if usage:
            usages.append(usage)
    return resources, claims, insts, usages


__all__ = ["USAGE_KEY", "build_template", "pending_effect"]
