"""How a nova ComputeNode travels as a host document, and how nova's objects come back.

One document per compute node; the source id is ``ComputeNode.uuid``, which
is also the placement resource provider uuid the scheduler's allocation
candidates are keyed by.  The compute hook writes it
(:mod:`shared_host_manager.nova.compute_hook`), the scheduler side reads it back
(:mod:`.template`); both use only this module for the mapping, so the two sides
cannot drift apart.

Namespaces
----------
The namespaces and their keys are the host document of :mod:`protocol.hostdoc`;
this table says where each comes from in nova.

``compute``

              ========================  =========================================
              key                       nova source
              ========================  =========================================
              host, nodename, host_ip   host, hypervisor_hostname, str(host_ip)
              cell_uuid                 the compute's configured cell (nova-compute
                                        does not know it; ``[shared_host_manager]
                                        cell_uuid``)
              vcpus, memory_mb,         vcpus, memory_mb, local_gb
              disk_gb
              reserved_vcpus, ...       the reserved amount nova folded into
              reserved_memory_mb,       ``*_used`` (``reserved_host_cpus``,
              reserved_disk_gb          ``reserved_host_memory_mb``,
                                        ``reserved_host_disk_mb // 1024``), capped
                                        at nova's used amount
              vcpus_used,               nova's used amount minus the reserved one:
              memory_mb_used,           what instances consume, as the arbiter and
              disk_gb_used              placement count it
              disk_available_least      disk_available_least (omitted if None)
              cpu/ram/disk_             the same
              allocation_ratio
              num_instances,            int(stats['num_instances'|'io_workload'|
              num_io_ops, failed_builds 'failed_builds'])
              hypervisor_type/_version  the same
              cpu_info                  the JSON **decoded** (a dict); a value
                                        that is not a JSON object stays a string
              supported_instances       [[arch, hv_type, vm_mode], ...]
              updated_at                ISO 8601 (omitted if unknown)
              ========================  =========================================

              Reversible: nova's ``free_ram_mb = memory_mb - reserved_memory_mb -
              memory_mb_used``, ``free_disk_gb`` likewise, ``vcpus_used (nova) =
              vcpus_used + reserved_vcpus``, exactly, for any configuration.
``stats``     ``ComputeNode.stats`` verbatim ({str: str}); ComputeCapabilitiesFilter
              and JsonFilter read arbitrary keys of it.  Its own namespace so that
              one changed counter is a one-key delta.
``numa``      ``{"cell<id>": NUMACell primitive}``: one key per host NUMA cell, so a
              pinning on cell 1 resends cell 1 only.
``pci``       ``{"pool<index>": {product_id, vendor_id, numa_node, tags, count}}``
              in ``PciDeviceStats`` pool order.
``metrics``   ``{name: {name, value, timestamp, source[, numa_membw_values]}}``:
              the entries of ``ComputeNode.metrics`` (a JSON list) by name.
``service``   disabled, disabled_reason, forced_down, version (nova-compute's
              service version, which lets the scheduler compute the minimum
              compute version without a DB read).
``instances`` ``{instance_uuid: {}}``: the instances nova's ResourceTracker
              tracks on the host (``tracked_instances``): exactly those whose
              usage is in ``*_used``.  Host-wide, as nova's HostState.instances.
``aggregates`` ``{aggregate_uuid: {"id": int, "name": str, "metadata": {str: str}}}``.

Primitives
----------
NUMA cells travel as ``obj_to_primitive()`` output made canonical: the
``nova_object.changes`` lists (whose order follows set iteration of strings,
i.e. hash randomisation) are dropped, and the tuples oslo.versionedobjects
makes of set fields become sorted lists.  So equal objects give equal bytes
in every process, and an unchanged cell never shows up in a delta.  They are
rebuilt with ``obj_from_primitive``; the host manager caches the rebuilt
objects per source version (see there), never per request.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nova import objects
from oslo_serialization import jsonutils

from protocol.hostdoc import (
    AGGREGATES,
    COMPUTE,
    INSTANCES,
    METRICS,
    NUMA,
    PCI,
    SERVICE,
    STATS,
    free_disk_gb,
)

_CHANGES = "nova_object.changes"


# -- canonical primitives ---------------------------------------------------------

def canonical_primitive(value: Any) -> Any:
    """JSON-like, order-stable form of an ``obj_to_primitive()`` result."""
    t = type(value)
    if t is dict:
        return {k: canonical_primitive(v) for k, v in value.items() if k != _CHANGES}
    if t is list:
        return [canonical_primitive(v) for v in value]
    if t in (tuple, set, frozenset):  # a set field: order is meaningless, sort it
        items = [canonical_primitive(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    return value


def object_primitive(obj: Any) -> dict[str, Any]:
    return canonical_primitive(obj.obj_to_primitive())


# -- NUMA ----------------------------------------------------------------------------

def numa_namespace(numa: Any) -> dict[str, Any]:
    """``numa`` namespace of a ComputeNode.numa_topology (JSON string) or NUMATopology."""
    if not numa:
        return {}
    if isinstance(numa, str):
        numa = objects.NUMATopology.obj_from_db_obj(numa)
    return {f"cell{cell.id}": object_primitive(cell) for cell in numa.cells}


def numa_from_namespace(ns: Mapping[str, Any] | None) -> Any:
    """The NUMATopology of a ``numa`` namespace (None when the host reports none)."""
    if not ns:
        return None
    cells = [objects.NUMACell.obj_from_primitive(p) for p in ns.values() if type(p) is dict]
    if not cells:
        return None
    cells.sort(key=lambda c: c.id)
    return objects.NUMATopology(cells=cells)


# -- PCI -----------------------------------------------------------------------------

_POOL_FIELDS = ("product_id", "vendor_id", "numa_node", "tags", "count")


def pci_namespace(pools: Any) -> dict[str, Any]:
    """``pci`` namespace of a PciDevicePoolList (or None)."""
    if not pools:
        return {}
    out = {}
    for i, pool in enumerate(pools):
        entry = {f: getattr(pool, f) for f in _POOL_FIELDS if pool.obj_attr_is_set(f)}
        entry["tags"] = dict(entry.get("tags") or {})
        out[f"pool{i:04d}"] = entry
    return out


def pci_pools_from_namespace(ns: Mapping[str, Any] | None) -> Any:
    """The PciDevicePoolList of a ``pci`` namespace, in the order the compute reported."""
    pools = []
    ns = ns or {}
    for key in sorted(ns):
        entry = ns[key]
        if type(entry) is dict:
            pools.append(objects.PciDevicePool(**{f: entry[f] for f in _POOL_FIELDS if f in entry}))
    return objects.PciDevicePoolList(objects=pools)


# -- metrics ---------------------------------------------------------------------------

def metrics_namespace(metrics_json: str | None) -> dict[str, Any]:
    """``metrics`` namespace of ComputeNode.metrics (the JSON list nova stores)."""
    if not metrics_json:
        return {}
    out = {}
    for metric in jsonutils.loads(metrics_json):
        if type(metric) is dict and type(metric.get("name")) is str:
            out[metric["name"]] = metric
    return out


def metrics_json_from_namespace(ns: Mapping[str, Any] | None) -> str:
    """ComputeNode.metrics again (sorted by name); entries that are not maps are skipped."""
    entries = []
    ns = ns or {}
    for name in sorted(ns):
        value = ns[name]
        if type(value) is not dict:  # a non-nova source publishing bare numbers
            continue
        entries.append(value)
    return jsonutils.dumps(entries)


def metrics_from_namespace(ns: Mapping[str, Any] | None) -> Any:
    return objects.MonitorMetricList.from_json(metrics_json_from_namespace(ns))


# -- the compute namespace ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reserved:
    """What nova-compute's ResourceTracker folds into ``*_used`` before any instance."""

    vcpus: int = 0
    memory_mb: int = 0
    disk_gb: int = 0

    @classmethod
    def from_conf(cls, conf: Any) -> Reserved:
        return cls(int(conf.reserved_host_cpus), int(conf.reserved_host_memory_mb),
                   int(conf.reserved_host_disk_mb / 1024))


NO_RESERVED = Reserved()


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.isoformat()


def parse_time(value: Any) -> datetime.datetime | None:
    """An ``updated_at`` of the document as the tz-aware datetime nova's objects carry."""
    if type(value) is not str:
        return None
    try:
        dt = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=datetime.UTC)


def decode_cpu_info(cpu_info: Any) -> Any:
    """The JSON object nova keeps as a string, decoded; anything else unchanged."""
    if isinstance(cpu_info, str):
        try:
            decoded = jsonutils.loads(cpu_info)
        except ValueError:
            return cpu_info
        if type(decoded) is dict:
            return decoded
    return cpu_info


def _get(cn: Any, field: str, default: Any = None) -> Any:
    return getattr(cn, field) if cn.obj_attr_is_set(field) else default


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def compute_namespace(cn: Any, *, cell_uuid: str | None = None,
                      reserved: Reserved = NO_RESERVED) -> dict[str, Any]:
    """The ``compute`` namespace of one ComputeNode (see the module docstring)."""
    stats = _get(cn, "stats") or {}
    vcpus_used = _int(_get(cn, "vcpus_used"))
    memory_used = _int(_get(cn, "memory_mb_used"))
    disk_used = _int(_get(cn, "local_gb_used"))
    # Cap the reserved amounts at nova's used ones, so used - reserved >= 0 and the
    # free amounts nova derives come back exactly (free = total - reserved - used).
    r_cpu = max(0, min(reserved.vcpus, vcpus_used))
    r_mem = max(0, min(reserved.memory_mb, memory_used))
    r_disk = max(0, min(reserved.disk_gb, disk_used))
    ns: dict[str, Any] = {
        "host": _get(cn, "host"),
        "nodename": _get(cn, "hypervisor_hostname"),
        "vcpus": _int(_get(cn, "vcpus")),
        "vcpus_used": vcpus_used - r_cpu,
        "reserved_vcpus": r_cpu,
        "memory_mb": _int(_get(cn, "memory_mb")),
        "memory_mb_used": memory_used - r_mem,
        "reserved_memory_mb": r_mem,
        "disk_gb": _int(_get(cn, "local_gb")),
        "disk_gb_used": disk_used - r_disk,
        "reserved_disk_gb": r_disk,
        "num_instances": _int(stats.get("num_instances")),
        "num_io_ops": _int(stats.get("io_workload")),
        "failed_builds": _int(stats.get("failed_builds")),
        "hypervisor_type": _get(cn, "hypervisor_type"),
        "hypervisor_version": _get(cn, "hypervisor_version"),
        "cpu_info": decode_cpu_info(_get(cn, "cpu_info")),
        "supported_instances": [list(spec.to_list()) for spec in (_get(cn, "supported_hv_specs") or [])],
    }
    host_ip = _get(cn, "host_ip")
    if host_ip is not None:
        ns["host_ip"] = str(host_ip)
    if cell_uuid:
        ns["cell_uuid"] = cell_uuid
    least = _get(cn, "disk_available_least")
    if least is not None:
        ns["disk_available_least"] = int(least)
    for ratio in ("cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio"):
        value = _get(cn, ratio)
        if value:
            ns[ratio] = float(value)
    updated = _iso(_get(cn, "updated_at"))
    if updated:
        ns["updated_at"] = updated
    return {k: v for k, v in ns.items() if v is not None}


def service_namespace(service: Any) -> dict[str, Any]:
    """``service`` namespace of a nova Service object or service dict."""
    if service is None:
        return {"disabled": False, "forced_down": False}
    get = service.get if isinstance(service, Mapping) else (
        lambda k, d=None: getattr(service, k) if service.obj_attr_is_set(k) else d)
    ns: dict[str, Any] = {
        "disabled": bool(get("disabled", False)),
        "forced_down": bool(get("forced_down", False)),
    }
    reason = get("disabled_reason")
    if reason:
        ns["disabled_reason"] = str(reason)
    version = get("version")
    if version is not None:
        ns["version"] = int(version)
    return ns


def aggregate_entry(agg: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": agg.name or "", "metadata": dict(agg.metadata or {})}
    if agg.obj_attr_is_set("id"):
        entry["id"] = agg.id
    return entry


def document_from_compute_node(
    cn: Any,
    *,
    service: Any = None,
    instances: Iterable[str] = (),
    aggregates: Iterable[Any] = (),
    cell_uuid: str | None = None,
    reserved: Reserved = NO_RESERVED,
) -> dict[str, dict[str, Any]]:
    """The whole document of one compute node (empty namespaces are left out)."""
    doc = {
        COMPUTE: compute_namespace(cn, cell_uuid=cell_uuid, reserved=reserved),
        STATS: {str(k): v for k, v in (_get(cn, "stats") or {}).items()},
        NUMA: numa_namespace(_get(cn, "numa_topology")),
        PCI: pci_namespace(_get(cn, "pci_device_pools")),
        METRICS: metrics_namespace(_get(cn, "metrics")),
        SERVICE: service_namespace(service),
        INSTANCES: {uuid: {} for uuid in instances},
        AGGREGATES: {agg.uuid: aggregate_entry(agg) for agg in aggregates},
    }
    return {ns: entries for ns, entries in doc.items() if entries}


# -- back to nova -------------------------------------------------------------------------

def compute_node_from_document(source: str, doc: Mapping[str, Mapping[str, Any]]) -> Any:
    """A ComputeNode equal (in every field the scheduler reads) to the one the document came from.

    Used for ``get_compute_nodes_by_host_or_node`` and by the tests' round trip.
    """
    c = doc.get(COMPUTE) or {}
    numa = numa_from_namespace(doc.get(NUMA))
    cpu_info = c.get("cpu_info")
    cn = objects.ComputeNode(
        uuid=source,
        host=c.get("host"),
        hypervisor_hostname=c.get("nodename"),
        vcpus=c.get("vcpus", 0),
        vcpus_used=c.get("vcpus_used", 0) + c.get("reserved_vcpus", 0),
        memory_mb=c.get("memory_mb", 0),
        memory_mb_used=c.get("memory_mb_used", 0) + c.get("reserved_memory_mb", 0),
        local_gb=c.get("disk_gb", 0),
        local_gb_used=c.get("disk_gb_used", 0) + c.get("reserved_disk_gb", 0),
        free_ram_mb=(c.get("memory_mb", 0) - c.get("reserved_memory_mb", 0)
                     - c.get("memory_mb_used", 0)),
        free_disk_gb=free_disk_gb(c),
        disk_available_least=c.get("disk_available_least"),
        hypervisor_type=c.get("hypervisor_type", ""),
        hypervisor_version=c.get("hypervisor_version", 0),
        cpu_info=jsonutils.dumps(cpu_info) if type(cpu_info) is dict else cpu_info,
        host_ip=c.get("host_ip"),
        supported_hv_specs=[objects.HVSpec.from_list(list(s)) for s in c.get("supported_instances", [])],
        numa_topology=numa._to_json() if numa is not None else None,
        pci_device_pools=pci_pools_from_namespace(doc.get(PCI)),
        stats=dict(doc.get(STATS) or {}),
        metrics=metrics_json_from_namespace(doc.get(METRICS)),
        updated_at=parse_time(c.get("updated_at")),
    )
    for ratio in ("cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio"):
        if ratio in c:
            setattr(cn, ratio, c[ratio])
    cn.obj_reset_changes()
    return cn


__all__ = [
    "AGGREGATES", "COMPUTE", "INSTANCES", "METRICS", "NUMA", "PCI", "SERVICE", "STATS",
    "NO_RESERVED", "Reserved", "aggregate_entry", "canonical_primitive", "compute_namespace",
    "compute_node_from_document", "decode_cpu_info", "document_from_compute_node",
    "free_disk_gb", "metrics_from_namespace", "metrics_json_from_namespace", "metrics_namespace",
    "numa_from_namespace", "numa_namespace", "object_primitive", "parse_time",
    "pci_namespace", "pci_pools_from_namespace", "service_namespace",
]
