"""SharedHostState: one host for one request, as nova's HostState, built from a template.

A :class:`SharedHostState` takes a :class:`~.template._Template`'s attributes by
reference and adds what belongs to the request alone: ``limits`` and
``allocation_candidates`` (written by nova's manager and filters), ``instances``
(copied on first access), ``updated``; and the pending claims the document does not
include yet subtracted, their NUMA and PCI usage taken on copies of the host's NUMA
topology and PCI stats.  nova's ``consume_from_request`` runs on the view only.

The drop-in's host manager (:mod:`shared_host_manager.nova.host_manager`) hands these
to nova's SchedulerManager, one per host per request; the engine's index
(:mod:`.index_table`) builds one where a nova class without a vector form reads a
host.  The manager a view reports consumption to is passed in (``None`` where nobody
records).  The contract: docs/design.md §5.5, §5.6.
"""

from __future__ import annotations

import copy
import datetime
import logging
from typing import Any

from nova import objects
from nova.scheduler import host_manager as nova_host_manager

from shared_host_manager.decision.host_table import pending_changes
from shared_host_manager.nova.core import vector
from shared_host_manager.nova.core.template import _Template, pending_effect

LOG = logging.getLogger(__name__)

_UTC = datetime.UTC


def _numa_pci_usage(numa_before: Any, numa_after: Any, pci_before: dict[str, int] | None,
                    pci_after: Any) -> dict[str, Any]:
    """What one consumption took from the host's NUMA cells and PCI pools (JSON-like).

    Taken as the difference of nova's own before and after, so that the next
    requests can be shown the same change again (:func:`_apply_numa_pci`) without
    knowing the request: cpu and memory usage, pinned CPUs and used pages per cell,
    devices per pool.
    """
    usage: dict[str, Any] = {}
    if numa_before is not None and numa_after is not None and numa_after is not numa_before:
        before = {c.id: c for c in numa_before.cells}
        cells = {}
        for cell in numa_after.cells:
            old = before.get(cell.id)
            if old is None:
                continue
            pages = {str(p.size_kb): p.used - q.used
                     for p, q in zip(cell.mempages or (), old.mempages or (), strict=False)
                     if p.size_kb == q.size_kb and p.used != q.used}
            entry = {"cpu_usage": cell.cpu_usage - old.cpu_usage,
                     "memory_usage": cell.memory_usage - old.memory_usage,
                     "pinned_cpus": sorted(cell.pinned_cpus - old.pinned_cpus), "pages": pages}
            if entry["cpu_usage"] or entry["memory_usage"] or entry["pinned_cpus"] or pages:
                cells[str(cell.id)] = entry
        if cells:
            usage["numa"] = cells
    if pci_before is not None and pci_after is not None:
        counts = vector.pool_counts(pci_after)
        pools = {key: n - counts.get(key, 0) for key, n in pci_before.items()}
        pools = {k: n for k, n in pools.items() if n}
        if pools:
            usage["pci"] = pools
    return usage


def _apply_numa_pci(numa: Any, pci: Any, usages: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The host's NUMA topology and PCI stats with the pending usages taken (copies; the
    template's objects are shared and never written)."""
    cloned = any("numa" in u for u in usages) and numa is not None
    if cloned:
        numa = numa.obj_clone()
        cells = {str(c.id): c for c in numa.cells}
        for usage in usages:
            for cell_id, entry in usage.get("numa", {}).items():
                cell = cells.get(cell_id)
                if cell is None:
                    continue
                cell.cpu_usage += entry["cpu_usage"]
                cell.memory_usage += entry["memory_usage"]
                cell.pinned_cpus = cell.pinned_cpus | set(entry["pinned_cpus"])
                for page in cell.mempages or ():
                    page.used += entry["pages"].get(str(page.size_kb), 0)
    take_pci = any("pci" in u for u in usages)
    if pci is not None and (take_pci or cloned):
        own = copy.copy(pci)
        own.numa_topology = numa  # the PCI NUMA-affinity checks read the cells just changed
        if take_pci:
            own.pools = copy.deepcopy(pci.pools)
            for usage in usages:
                for key, n in usage.get("pci", {}).items():
                    for pool in own.pools:  # the same key in two pools: take from the first first
                        if n <= 0:
                            break
                        if vector.pool_key(pool) == key:
                            took = min(n, pool["count"])
                            pool["count"] -= took
                            n -= took
        pci = own
    return numa, pci


class SharedHostState(nova_host_manager.HostState):
    """A nova HostState for one host and one request (see the module docstring).

    Built by :meth:`~shared_host_manager.nova.host_manager.SharedHostManager.get_host_states_by_uuids`
    and by :func:`.index_table.host_state`; nova's
    ``HostState.__init__`` is not run (the template supplies every attribute it
    sets).  Reads like nova's HostState; writes stay in this object.
    """

    # nova's NUMATopology and PciDeviceStats (None when the host has none), untyped there;
    # the template supplies them, consume_from_request replaces them with its copies
    numa_topology: Any
    pci_stats: Any

    @classmethod
    def _make(cls, tpl: _Template, view: Any, manager: Any,
              wall_offset: float, api_service: dict[str, Any] | None = None,
              hints: dict[str, Any] | None = None) -> SharedHostState:
        self = cls.__new__(cls)
        d = self.__dict__
        d.update(tpl.attrs)
        d["limits"] = {}
        d["allocation_candidates"] = []
        d["aggregates"] = list(tpl.aggregates)
        d["_tpl"] = tpl
        d["_instances"] = None
        d["_extra_instances"] = ()
        d["_hidden_instances"] = ()
        d["_manager"] = manager
        d["_claim_id"] = None
        service = dict(tpl.service)
        if api_service is not None:
            # the API side owns service state: its newest word wins over the compute's copy
            for key in ("disabled", "forced_down"):
                service[key] = bool(api_service.get(key, False))
            service["disabled_reason"] = api_service.get("disabled_reason")
        if hints:
            # nova's instance info fanout, newer than the document until it lists the change
            listed = tpl.doc_instances
            d["_extra_instances"] = tuple(u for u, added in hints.items() if added and u not in listed)
            d["_hidden_instances"] = tuple(u for u, added in hints.items() if not added and u in listed)
        service["last_seen_up"] = datetime.datetime.fromtimestamp(wall_offset + view.last_heard, _UTC)
        service["updated_at"] = service["last_seen_up"]
        svc = nova_host_manager.ReadOnlyDict.__new__(nova_host_manager.ReadOnlyDict)
        svc.data = service
        d["service"] = svc
        if view.pending:
            resources, claims, insts, usages = pending_effect(view, tpl.doc_instances)
            if usages:
                # pinned CPUs, NUMA memory and PCI devices held by our pending claims (design §5.5)
                d["numa_topology"], d["pci_stats"] = _apply_numa_pci(
                    d.get("numa_topology"), d.get("pci_stats"), usages)
            if claims:
                for name, change in pending_changes(resources, claims, len(insts)):
                    d[name] += change
                d["_extra_instances"] = tuple(insts) + d["_extra_instances"]
        return self

    # ``instances``: copied on first access (the manager adds stubs to the selected
    # host's dict), so requests that never look at instances copy nothing.
    @property
    def instances(self) -> dict[str, Any]:
        d = self.__dict__
        insts = d["_instances"]
        if insts is None:
            insts = dict(d["_tpl"].instances)
            for uuid in d["_hidden_instances"]:
                insts.pop(uuid, None)
            for uuid in d["_extra_instances"]:
                if uuid not in insts:
                    insts[uuid] = objects.Instance(uuid=uuid)
            d["_instances"] = insts
        return insts

    @instances.setter
    def instances(self, value: dict[str, Any]) -> None:
        self.__dict__["_instances"] = value

    @property
    def updated(self) -> datetime.datetime | None:
        return self.__dict__["_updated"]

    @updated.setter
    def updated(self, value: datetime.datetime | None) -> None:
        self.__dict__["_updated"] = value

    def update(self, compute=None, service=None, aggregates=None, inst_dict=None):
        raise TypeError("a SharedHostState is fed by the host-state stream, not by update()")

    def consume_from_request(self, spec_obj: Any) -> None:
        """nova's consumption, applied to this request's view only.

        As nova's ``set_update_time_on_success``: a failure is logged and
        swallowed (the compute's claim decides), success sets ``updated``.
        Then the claim is recorded in the cache's pending ledger.  The NUMA
        topology and the PCI pools, which nova's consumption changes in place,
        are copied from the shared template first.
        """
        self._manager._steps.consumed(self, spec_obj)
        numa_before = self.numa_topology
        pci_before = vector.pool_counts(self.pci_stats.pools) if self.pci_stats is not None else None
        try:
            if self.numa_topology is not None and spec_obj.numa_topology:
                # numa_usage_from_instance_numa updates the host's mempages in place,
                # and the template shares them
                self.numa_topology = self.numa_topology.obj_clone()
            pci_requests = spec_obj.pci_requests
            if pci_requests and pci_requests.requests and self.pci_stats:
                # apply_requests mutates the pools, which the template shares
                shared = self.pci_stats
                own = copy.copy(shared)
                own.pools = copy.deepcopy(shared.pools)
                self.pci_stats = own
            self._locked_consume_from_request(spec_obj)
        except Exception as e:
            LOG.warning("Selected host: %(host)s failed to consume from instance. Error: %(error)s",
                        {"host": self.host, "error": e})
            return None
        self._updated = datetime.datetime.now(_UTC)
        usage = _numa_pci_usage(numa_before, self.numa_topology, pci_before,
                                self.pci_stats.pools if self.pci_stats is not None else None)
        self._manager._consumed(self, spec_obj, usage)
        return None


__all__ = ["SharedHostState"]
