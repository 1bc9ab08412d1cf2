"""Host documents as the decision path reads them: HostView and the numbers it shares.

Role
----
The document schema and its accessors are :mod:`protocol.hostdoc`; this module adds what a *decision* sees on
top of a document: this scheduler's pending claims and the request's own
scratch.  Filters, weighers and the columnar index read hosts only through
it, so the fast and the slow path cannot read a document differently.

Life cycle of a :class:`HostView`
---------------------------------
A HostView is the per-request, read-only, HostState-like face of one
:class:`~protocol.receiver.SourceView`.  It is created when a request needs a
host in Python (the slow path for every host; the fast path only for hosts this
request already touched, or for plugins without a vector form) and dropped with
the request.  It copies nothing: it reads the receiver's document and pending
ledger live, and adds the request's own scratch (:class:`Consumption`, what
earlier instances of the same multi-instance request took from this host).
It never writes to the document, the receiver, or the index.

The numbers a filter or weigher sees are computed by the module-level helpers
(:func:`fit_inputs`, :func:`weigher_inputs`, :func:`pending_counts`) which the
columnar index calls too, so the fast and the slow path see bit-identical
floats and therefore decide identically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.groups import GROUP_KEY
from protocol.hostdoc import (
    Aggregate,
    aggregates_of,
    compute_of,
    host_name,
    instances_of,
    is_host,
    namespace,
    node_name,
    service_of,
    supported_instances_of,
)
from protocol.receiver import SourceView, Status
from protocol.resources import capacity, check_fit

_EMPTY: Mapping[str, Any] = {}

# -- numbers shared by the index and HostView -------------------------------------

def pending_counts(view: SourceView) -> tuple[int, int, tuple[str, ...]]:
    """(claims, claims that create an instance, their instance uuids) pending in ``view``.

    A pending claim is a build this scheduler sent, or one a live peer announced
    (docs/design.md §5.2), that the host has not yet reported: it counts as an io
    op and, if it names an instance, as an instance on the host, exactly as nova's
    consume_from_request counts them.
    """
    pending, peer = view.pending, view.peer
    if not pending and not peer:
        return 0, 0, ()
    insts = tuple(p.claim.instance for p in pending.values() if p.claim.instance)
    if peer:
        insts += tuple(p.claim.instance for p in peer.values() if p.claim.instance)
    return len(pending) + len(peer), len(insts), insts


def groups_of(view: SourceView, uuids: Iterable[str] | None = None) -> dict[str, str]:
    """instance -> server group, for the instances on ``view``'s host (those of ``uuids``;
    default all) that belong to one: recorded with it by the arbiter
    (``instances[uuid]["group"]``), or pending with a claim carrying it, ours or a live
    peer's.  A request of a group finds the group's members by these even before it lists
    them (design §5.4)."""
    instances = instances_of(view.doc)
    wanted = instances.keys() if uuids is None else uuids
    out: dict[str, str] = {}
    unrecorded = []
    for uuid in wanted:
        record = instances.get(uuid)
        if record is None:
            unrecorded.append(uuid)
        elif type(record) is dict and GROUP_KEY in record:
            out[uuid] = record[GROUP_KEY]
    if uuids is None or unrecorded:
        for ledger in (view.pending, view.peer):
            for p in ledger.values():
                claim = p.claim
                if claim.group is not None and claim.instance and claim.instance not in out \
                        and (uuids is None or claim.instance in unrecorded):
                    out[claim.instance] = claim.group.uuid
    return out


def held_usage(view: SourceView) -> Mapping[str, int]:
    """What the view's pending claims hold, ours and the live peers' announced ones, per
    resource class: the usable view is the document minus this."""
    peer = view.peer_usage
    if not peer:
        return view.pending_usage
    merged = dict(view.pending_usage)
    for resource, amount in peer.items():
        merged[resource] = merged.get(resource, 0) + amount
    return merged


def fit_inputs(compute: Mapping[str, Any], resource: str, pending: int) -> tuple[float, int]:
    """(usable capacity or -inf, used + pending) for :func:`protocol.resources.check_fit`'s rule.

    A request of ``amount`` fits iff ``used_plus_pending + amount <= capacity``;
    -inf capacity (no inventory) makes any positive amount fail, as check_fit does.
    """
    cap = capacity(compute, resource)
    return (float("-inf") if cap is None else cap), compute.get(f"{resource}_used", 0) + pending


def weigher_inputs(
    compute: Mapping[str, Any], pending: Mapping[str, int], n_claims: int, n_instances: int,
) -> tuple[float, float, float, int, int]:
    """nova's weigher inputs: (free_ram_mb, vcpus free, free_disk_mb, num_instances, num_io_ops).

    As in nova's HostState: RAM and disk weigh the free amount without the
    allocation ratio (``total - reserved - used``), CPU weighs
    ``vcpus_total * cpu_allocation_ratio - vcpus_used``.  Our own pending claims
    count as used, as nova's consume_from_request counts a selected instance.
    """
    mem = (compute.get("memory_mb", 0) - compute.get("reserved_memory_mb", 0)
           - compute.get("memory_mb_used", 0) - pending.get("memory_mb", 0))
    cpu = (compute.get("vcpus", 0) * compute.get("cpu_allocation_ratio", 1.0)
           - (compute.get("vcpus_used", 0) + pending.get("vcpus", 0)))
    disk = (compute.get("disk_gb", 0) - compute.get("reserved_disk_gb", 0)
            - compute.get("disk_gb_used", 0) - pending.get("disk_gb", 0)) * 1024
    return (mem, cpu, disk, compute.get("num_instances", 0) + n_instances,
            compute.get("num_io_ops", 0) + n_claims)


# -- per-request scratch -----------------------------------------------------------

@dataclass(slots=True)
class Consumption:
    """What earlier instances of *this* request took from one host (nova's consume_from_request).

    Lives in the per-request view only; it is dropped when the request's claims
    are registered with the receiver (from then on the pending ledger carries
    the same consumption, so nothing is subtracted twice).
    """

    resources: dict[str, int] = field(default_factory=dict)
    instances: list[str] = field(default_factory=list)
    claims: int = 0

    def add(self, resources: Mapping[str, int], instance_uuid: str | None) -> None:
        for resource, amount in resources.items():
            self.resources[resource] = self.resources.get(resource, 0) + amount
        self.claims += 1
        if instance_uuid:
            self.instances.append(instance_uuid)


# -- what group-level filters and weight multipliers read ---------------------------

class HasAggregates(Protocol):
    """A host as an aggregate-only filter or a weight multiplier reads it.

    A :class:`HostView`, or the columnar index's per-group representative
    (:class:`~shared_host_manager.decision.index.AggregateStub`), on which such a
    filter runs once per distinct aggregate set.
    """

    @property
    def aggregates(self) -> tuple[Aggregate, ...]: ...


class HasCapabilities(Protocol):
    """A host as an ImagePropertiesFilter-like filter reads it: a :class:`HostView`, or
    :class:`~shared_host_manager.decision.index.CapabilityStub`."""

    @property
    def supported_instances(self) -> tuple[tuple[Any, ...], ...]: ...

    @property
    def hypervisor_version(self) -> int | None: ...


# -- the HostState-like read object ------------------------------------------------

class HostView:
    """Read-only HostState-like view of one source for one request (see module docstring).

    Attribute names follow nova's HostState where nova has one, so filters
    read like nova's.  ``uuid`` is the source id (nova: the compute node uuid).
    """

    __slots__ = ("uuid", "view", "doc", "compute", "overlay", "_pending", "_counts", "_aggs",
                 "_instances", "_numbers")

    def __init__(self, view: SourceView, overlay: Consumption | None = None) -> None:
        self.uuid = view.source
        self.view = view
        self.doc: Mapping[str, Any] = view.doc or _EMPTY
        self.compute = compute_of(self.doc)
        self.overlay = overlay
        self._pending: Mapping[str, int] | None = None
        self._counts: tuple[int, int, tuple[str, ...]] | None = None
        self._aggs: tuple[Aggregate, ...] | None = None
        self._instances: frozenset[str] | None = None
        self._numbers: tuple[float, float, float, int, int] | None = None

    def __repr__(self) -> str:
        return f"HostView({self.host!r}, {self.nodename!r}, {self.uuid!r})"

    # identity ----------------------------------------------------------------
    @property
    def source(self) -> str:
        return self.uuid

    @property
    def host(self) -> str:
        return host_name(self.compute, self.uuid)

    @property
    def nodename(self) -> str:
        return node_name(self.compute, self.uuid)

    @property
    def cell_uuid(self) -> str | None:
        return self.compute.get("cell_uuid")

    @property
    def host_ip(self) -> str | None:
        return self.compute.get("host_ip")

    @property
    def version(self) -> tuple[int, int]:
        return self.view.version

    # liveness ------------------------------------------------------------------
    @property
    def service(self) -> Mapping[str, Any]:
        return service_of(self.doc)

    @property
    def is_up(self) -> bool:
        """The receiver hears from the source (ACTIVE) and it is not forced down."""
        return self.view.status is Status.ACTIVE and not self.service.get("forced_down")

    # capabilities ------------------------------------------------------------------
    @property
    def hypervisor_type(self) -> str | None:
        return self.compute.get("hypervisor_type")

    @property
    def hypervisor_version(self) -> int | None:
        return self.compute.get("hypervisor_version")

    @property
    def cpu_info(self) -> Any:
        return self.compute.get("cpu_info")

    @property
    def supported_instances(self) -> tuple[tuple[Any, ...], ...]:
        return supported_instances_of(self.compute)

    @property
    def aggregates(self) -> tuple[Aggregate, ...]:
        if self._aggs is None:
            self._aggs = aggregates_of(self.doc)
        return self._aggs

    # consumption ---------------------------------------------------------------------
    def _pending_counts(self) -> tuple[int, int, tuple[str, ...]]:
        if self._counts is None:
            claims, n_inst, insts = pending_counts(self.view)
            over = self.overlay
            if over is not None:
                claims += over.claims
                n_inst += len(over.instances)
                insts = insts + tuple(over.instances)
            self._counts = (claims, n_inst, insts)
        return self._counts

    @property
    def pending_usage(self) -> Mapping[str, int]:
        """The pending claims (ours, and the peers' announced ones) plus this request's
        scratch, per resource class."""
        if self._pending is None:
            over = self.overlay
            held = held_usage(self.view)
            if over is None or not over.resources:
                self._pending = held
            else:
                merged = dict(held)
                for resource, amount in over.resources.items():
                    merged[resource] = merged.get(resource, 0) + amount
                self._pending = merged
        return self._pending

    @property
    def instances(self) -> frozenset[str]:
        """Instance uuids on the host: reported, pending with our claims, placed by this request."""
        if self._instances is None:
            self._instances = frozenset(instances_of(self.doc)).union(self._pending_counts()[2])
        return self._instances

    def _weigher_numbers(self) -> tuple[float, float, float, int, int]:
        if self._numbers is None:
            claims, n_inst, _ = self._pending_counts()
            self._numbers = weigher_inputs(self.compute, self.pending_usage, claims, n_inst)
        return self._numbers

    @property
    def free_ram_mb(self) -> float:
        return self._weigher_numbers()[0]

    @property
    def vcpus_free(self) -> float:
        """nova CPUWeigher's input: vcpus_total * cpu_allocation_ratio - vcpus_used."""
        return self._weigher_numbers()[1]

    @property
    def free_disk_mb(self) -> float:
        return self._weigher_numbers()[2]

    @property
    def num_instances(self) -> int:
        return self._weigher_numbers()[3]

    @property
    def num_io_ops(self) -> int:
        return self._weigher_numbers()[4]

    @property
    def vcpus_total(self) -> int:
        return self.compute.get("vcpus", 0)

    @property
    def vcpus_used(self) -> int:
        return self.compute.get("vcpus_used", 0) + self.pending_usage.get("vcpus", 0)

    @property
    def cpu_allocation_ratio(self) -> float:
        return self.compute.get("cpu_allocation_ratio", 1.0)

    @property
    def ram_allocation_ratio(self) -> float:
        return self.compute.get("ram_allocation_ratio", 1.0)

    @property
    def disk_allocation_ratio(self) -> float:
        return self.compute.get("disk_allocation_ratio", 1.0)

    def fits(self, resources: Mapping[str, int]) -> str | None:
        """None if ``resources`` fit (the arbiter's rule, minus what we hold pending), else why."""
        return check_fit(self.compute, resources, self.pending_usage)

    def namespace(self, name: str) -> Mapping[str, Any]:
        """Any namespace of the host's document (for plugins reading foreign namespaces)."""
        return namespace(self.doc, name)


def host_views(
    views: Iterable[SourceView], overlays: Mapping[str, Consumption] | None = None,
) -> list[HostView]:
    """HostViews of every schedulable source in ``views`` (the slow path's host list)."""
    overlays = overlays or {}
    return [HostView(v, overlays.get(v.source)) for v in views if is_host(v.doc)]


__all__ = ["Consumption", "HasAggregates", "HasCapabilities", "HostView", "fit_inputs", "groups_of",
           "host_views", "held_usage", "pending_counts", "weigher_inputs"]
