"""The host document: the one schema every party reads and writes (docs/design.md §2).

A compute node's source publishes one document ``{namespace: {key: value}}``
(see :mod:`protocol.document` for documents in general).  This module is the
only place that names its namespaces and knows the dict paths inside them:
the arbiter (:mod:`protocol.source`), the simulated and nova trackers that
write documents, the decision core that reads them, and the nova mapping
(:mod:`shared_host_manager.nova.core.document`) all go through these names.

Namespaces
----------
``compute``     the host and its resources.  Identity: ``host``, ``nodename``,
                ``host_ip``, ``cell_uuid``.  Per resource class ``r`` (``vcpus``,
                ``memory_mb``, ``disk_gb``, or any integer class): ``r`` (total),
                ``r_used`` (what instances consume), ``reserved_r`` (kept by the
                host), and the allocation ratio (:mod:`protocol.resources`).
                Counters: ``num_instances``, ``num_io_ops``, ``failed_builds``.
                Capabilities: ``hypervisor_type``, ``hypervisor_version``,
                ``cpu_info`` (a map), ``supported_instances`` (``[[arch, hv_type,
                vm_mode], ...]``), ``disk_available_least``, ``updated_at`` (ISO 8601).
``service``     ``disabled``, ``disabled_reason``, ``forced_down``, ``version``
                (the compute service version), ``endpoint`` (the reporter that
                serves the host: where claims and resync requests go),
                ``stopped`` (true in a source's last delta: its goodbye, design §4.2).
``instances``   ``{instance_uuid: record}``: the instances whose usage ``*_used``
                includes.  An arbiter-made record is ``{"claim": id,
                "resources": {...}}``; a nova-tracked one is ``{}``.
``builds``      ``{instance_uuid: {}}``: builds the host has received and not finished,
                whose usage ``*_used`` may not include yet (nova-compute queues builds
                behind its build slots).  A scheduler's pending claim of an instance
                listed here does not expire; one whose instance leaves the list without
                being counted retires at once, "dropped" (design §5.2).
``aggregates``  ``{aggregate_uuid: {"name": str, "metadata": {str: str}, "id"?: int}}``.
``stats``       free-form ``{str: str}`` (nova's ComputeNode.stats).
``numa``        ``{"cell<id>": NUMA cell}`` (nova's NUMACell primitive).
``pci``         ``{"pool<index>": {product_id, vendor_id, numa_node, tags, count}}``.
``metrics``     ``{name: value or {name, value, timestamp, source}}``.
``locality``    (a volume backend's document) ``{"hosts": [host names]}``.
``api``         (an API-side source's document, design §2) ``role`` (``nova-api`` or
                ``nova-conductor``), ``started_at`` (wall time): present from the source's
                first message, so a scheduler knows the source for what it is before it
                has published any change.
``services``    (an API-side source) ``{host: {disabled,
                disabled_reason, forced_down, deleted, changed, stamps}}``; ``stamps``:
                per field, the wall time it was last written.
``nodes``       (an API-side source) ``{compute node uuid: {deleted, changed}}``.
``catalogue``   (an API-side source) ``{aggregate uuid: {name, metadata, hosts,
                id, deleted, changed}}``; ``changed`` is the wall time of the change.
``volumes``     (a volume backend's document) ``{volume_id: {...}}``.
``placement``   (the placement feed's document, design §11) ``{resource provider uuid:
                provider}``, a provider in the dict form of
                ``shared_host_manager.placement.state`` plus ``created_at``.
``placement_meta`` (the placement feed's document) ``traits`` and ``resource_classes``
                (every name placement defines), ``allocation_ratio_storage``
                (``double`` or ``single``).
``scheduler``   (a scheduler's own document, source ``scheduler/<name>``) ``name``,
                ``started_at``, ``state`` ("running" or "leaving"), ``interval`` (seconds
                between publications), ``published`` (a counter), ``load`` (a map):
                how schedulers know their live peers (shared_host_manager.membership).

Another project may publish a namespace of its own; readers ignore what they
do not know.  A source is a schedulable host iff its document has a non-empty
``compute`` namespace.

The accessors below never copy and never return None: an absent namespace
reads as an empty mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPUTE = "compute"
SERVICE = "service"
INSTANCES = "instances"
BUILDS = "builds"
AGGREGATES = "aggregates"
STATS = "stats"
NUMA = "numa"
PCI = "pci"
METRICS = "metrics"
#: namespaces of a volume backend source (cross-project affinity)
LOCALITY = "locality"
VOLUMES = "volumes"
#: namespaces of an API-side source (service state, deletions, aggregates; design §2)
API_SOURCE = "api"
API_SERVICES = "services"
API_NODES = "nodes"
API_CATALOGUE = "catalogue"
#: namespaces of the placement feed's source (placement's providers; design §11)
PLACEMENT = "placement"
PLACEMENT_META = "placement_meta"
#: namespace of the placement feed's poll marker: ``started``, the wall-clock time (seconds) at
#: which the feed's last complete poll began; every write placement's database committed
#: before it is in the document (design §11, read-your-writes)
PLACEMENT_POLL = "placement_poll"
POLL_STARTED = "started"
#: namespace of a scheduler's own document (membership)
SCHEDULER = "scheduler"

#: ``service.endpoint``: the control-plane name of the reporter serving the host
ENDPOINT = "endpoint"
#: ``service.stopped``: set by the last delta of a source that stops cleanly (its goodbye)
STOPPED = "stopped"

_EMPTY: Mapping[str, Any] = {}


def namespace(doc: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    """``doc[name]`` or an empty mapping; never None, never a copy."""
    if not doc:
        return _EMPTY
    return doc.get(name) or _EMPTY


def compute_of(doc: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return namespace(doc, COMPUTE)


def service_of(doc: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return namespace(doc, SERVICE)


def instances_of(doc: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return namespace(doc, INSTANCES)


def is_host(doc: Mapping[str, Any] | None) -> bool:
    """A source is a schedulable host iff its document has a compute namespace."""
    return bool(doc and doc.get(COMPUTE))


def host_name(compute: Mapping[str, Any], source: str) -> str:
    """nova's ``host`` (the compute service host); the source id if not reported."""
    name = compute.get("host")
    return name if type(name) is str and name else source


def node_name(compute: Mapping[str, Any], source: str) -> str:
    name = compute.get("nodename")
    return name if type(name) is str and name else host_name(compute, source)


def enabled(service: Mapping[str, Any]) -> bool:
    """Service enabled and not forced down (nova's disabled flag and forced_down)."""
    return not service.get("disabled") and not service.get("forced_down")


def said_goodbye(doc: Mapping[str, Any] | None) -> bool:
    """The source published its goodbye (``service.stopped``): not eligible until it is back."""
    return service_of(doc).get(STOPPED) is True


def endpoint_of(doc: Mapping[str, Any] | None) -> str | None:
    """The reporter serving this source (``service.endpoint``), if the document names one."""
    endpoint = service_of(doc).get(ENDPOINT)
    return endpoint if type(endpoint) is str else None


def volume_hosts_of(doc: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Host names a foreign (volume backend) source declares itself local to."""
    hosts = namespace(doc, LOCALITY).get("hosts")
    if type(hosts) is not list:
        return ()
    return tuple(h for h in hosts if type(h) is str)


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One aggregate the host is in, as its document lists it (nova's Aggregate, read-only)."""

    uuid: str
    name: str
    metadata: Mapping[str, str]


def aggregates_of(doc: Mapping[str, Any] | None) -> tuple[Aggregate, ...]:
    """The host's aggregates, sorted by uuid so every reader sees the same order.

    Metadata values are nova's strings; a non-string value (a reporter bug) is
    turned into its ``str`` rather than crashing a filter.
    """
    ns = namespace(doc, AGGREGATES)
    if not ns:
        return ()
    out = []
    for agg_uuid in sorted(ns):
        entry = ns[agg_uuid]
        if type(entry) is not dict:
            continue
        meta = entry.get("metadata")
        if type(meta) is not dict:
            meta = {}
        elif any(type(v) is not str for v in meta.values()):
            meta = {str(k): v if type(v) is str else str(v) for k, v in meta.items()}
        name = entry.get("name")
        out.append(Aggregate(agg_uuid, name if type(name) is str else "", meta))
    return tuple(out)


def aggregates_key(aggs: tuple[Aggregate, ...]) -> tuple[Any, ...]:
    """Hashable identity of an aggregate set (same key = same filter/weigher answers)."""
    return tuple((a.uuid, a.name, tuple(sorted(a.metadata.items()))) for a in aggs)


def supported_instances_of(compute: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
    value = compute.get("supported_instances")
    if type(value) is not list:
        return ()
    return tuple(tuple(item) for item in value if type(item) in (list, tuple))


def free_disk_gb(compute: Mapping[str, Any]) -> int:
    """nova's ``free_disk_gb``: total - reserved - used, without the allocation ratio."""
    return (compute.get("disk_gb", 0) - compute.get("reserved_disk_gb", 0)
            - compute.get("disk_gb_used", 0))


def free_ram_mb(compute: Mapping[str, Any]) -> int:
    """nova's ``free_ram_mb``: total - reserved - used, without the allocation ratio."""
    return (compute.get("memory_mb", 0) - compute.get("reserved_memory_mb", 0)
            - compute.get("memory_mb_used", 0))


__all__ = [
    "AGGREGATES", "API_CATALOGUE", "API_NODES", "API_SERVICES", "API_SOURCE", "COMPUTE", "ENDPOINT",
    "INSTANCES", "LOCALITY", "METRICS", "NUMA", "PCI", "PLACEMENT", "PLACEMENT_META", "PLACEMENT_POLL",
    "POLL_STARTED", "SCHEDULER", "SERVICE", "STATS", "STOPPED", "VOLUMES", "Aggregate", "aggregates_key",
    "aggregates_of", "compute_of", "enabled",
    "endpoint_of", "free_disk_gb", "free_ram_mb", "host_name", "instances_of", "is_host", "namespace",
    "node_name", "said_goodbye", "service_of", "supported_instances_of", "volume_hosts_of",
]
