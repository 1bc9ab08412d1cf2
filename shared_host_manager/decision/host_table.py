"""The hosts of one decision as the vector forms of nova's filters and weighers read them.

Role
----
nova's filters and weighers run as *vector forms* (shared_host_manager/nova/core/vector.py,
design §5.6): one numpy operation over every host of a request instead of a
method call per host.  They read their hosts through :class:`HostTable` only,
so any holder of host documents can feed them:

* the drop-in's per-request rows (``nova.vector.HostRows``), built under the
  cache lock for each ``select_destinations``;
* the engine's incremental index (:class:`~shared_host_manager.decision.index.HostIndex`),
  which keeps the same numbers between decisions (design §10, item 13).

Both derive their numbers with :func:`document_numbers` and :func:`add_pending`
here, so a host's column values do not depend on which holder it came from.
The numbers are those nova's ``HostState`` holds for the document's compute
node (``HostState.update`` from the ComputeNode that
``nova.document.compute_node_from_document`` rebuilds): the differential tests
in tests/nova/test_nova_vector.py hold them to nova's own arithmetic.

Life cycle: a table is valid for one decision.  Row numbers index its columns;
``row`` arguments are those numbers, and a request's candidate rows are an
array of them (a holder may have rows that hold no host; they are never asked).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.hostdoc import free_disk_gb, free_ram_mb

_T = TypeVar("_T")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: nova HostState's numbers the vector forms read, in a table's column order; ``pci_free``
#: is the free devices of every PCI pool, ``down`` is 1.0 when the service is disabled or
#: forced down (ComputeFilter's flag)
COLUMNS = ("free_ram_mb", "free_disk_mb", "disk_mb_used", "vcpus_used", "num_instances",
           "num_io_ops", "vcpus_total", "cpu_allocation_ratio", "failed_builds",
           "hypervisor_version", "pci_free", "down")
COLUMN = {name: i for i, name in enumerate(COLUMNS)}

def allocation_ratio(compute: Mapping[str, Any], key: str) -> float:
    """An allocation ratio as the host state holds it: the reported one if positive, else 1.0."""
    value: Any = compute.get(key)
    return float(value) if type(value) in (int, float) and value > 0 else 1.0


def service_down(service: Mapping[str, Any]) -> bool:
    """ComputeFilter's service flag: disabled or forced down."""
    return bool(service.get("disabled", False)) or bool(service.get("forced_down", False))


def document_numbers(compute: Mapping[str, Any], service: Mapping[str, Any],
                     pci: Mapping[str, Any] | None) -> tuple[float, ...]:
    """The :data:`COLUMNS` of a host document's namespaces, before any pending claim.

    As nova's ``HostState._update_from_compute_node``: free disk is the smaller
    of total - reserved - used and ``disk_available_least``; the used amounts
    include what the compute reserved (the document keeps it apart, see
    nova/core/document.py).
    """
    free_gb = free_disk_gb(compute)
    least = compute.get("disk_available_least")
    if type(least) is int:
        free_gb = min(least, free_gb)
    pools = pci.values() if pci else ()
    return (free_ram_mb(compute), free_gb * 1024,
            (compute.get("disk_gb_used", 0) + compute.get("reserved_disk_gb", 0)) * 1024,
            compute.get("vcpus_used", 0) + compute.get("reserved_vcpus", 0),
            compute.get("num_instances", 0), compute.get("num_io_ops", 0),
            compute.get("vcpus", 0), allocation_ratio(compute, "cpu_allocation_ratio"),
            compute.get("failed_builds", 0), compute.get("hypervisor_version") or 0,
            sum(p.get("count", 0) for p in pools if type(p) is dict) or 0,
            1.0 if service_down(service) else 0.0)


def pending_changes(resources: Mapping[str, int], claims: int, instances: int
                    ) -> tuple[tuple[str, int], ...]:
    """(number, change) of pending claims, as nova's consume_from_request counts a selected
    instance: their resources as used, each claim an I/O op, each claimed instance an
    instance (design §5.2).  Applied to a row of numbers (:func:`add_pending`) and to a
    host object's attributes alike."""
    if not claims:
        return ()
    disk = resources.get("disk_gb", 0) * 1024
    return (("free_ram_mb", -resources.get("memory_mb", 0)), ("free_disk_mb", -disk),
            ("disk_mb_used", disk), ("vcpus_used", resources.get("vcpus", 0)),
            ("num_instances", instances), ("num_io_ops", claims))


def add_pending(numbers: FloatArray, resources: Mapping[str, int], claims: int,
                instances: int) -> None:
    """Count pending claims into one row of numbers, in place (:func:`pending_changes`)."""
    for name, change in pending_changes(resources, claims, instances):
        numbers[COLUMN[name]] += change


def pending_numbers(numbers: Sequence[float], resources: Mapping[str, int], claims: int,
                    instances: int) -> list[float]:
    """:func:`add_pending` on a row of numbers not in an array yet (a new list)."""
    out = list(numbers)
    for name, change in pending_changes(resources, claims, instances):
        out[COLUMN[name]] += change
    return out


class HostTable(Protocol):
    """What the vector forms read of a decision's hosts (see the module docstring)."""

    @property
    def touched(self) -> Collection[int]:
        """Rows whose host object nova's manager has used (its numbers may differ from the
        columns now): the forms leave these to nova's classes, one by one."""
        ...

    #: whether :meth:`group_answers` keeps answers (else it is not worth making a key)
    keeps_group_answers: bool

    def col(self, name: str) -> FloatArray:
        """One of :data:`COLUMNS` for every row, net of pending claims."""
        ...

    def group_ids(self) -> IntArray:
        """Per row, a small number for its aggregates: rows with equal numbers have equal
        aggregate metadata (nova's per-aggregate answers are asked once per number);
        :meth:`group_rep` gives one row of each."""
        ...

    def group_rep(self) -> Sequence[int]:
        """One row of each aggregate group, by group number; -1 for a number no row has."""
        ...

    def group_answers(self, key: Hashable, answer: Callable[[Sequence[Any]], Any]
                      ) -> FloatArray | None:
        """Per aggregate group number, ``answer(the group's aggregates)``, kept across
        decisions under ``key`` (which names everything ``answer`` reads besides the
        aggregates); None where the holder keeps no answers (then the caller asks per group
        of its rows)."""
        ...

    def derived(self, key: Hashable, derive: Callable[[], _T]) -> _T:
        """What a form derives from the request alone (from nothing set per instance):
        ``derive()``, kept for the requests alike where the holder knows them; ``key``
        names the form and whatever else ``derive`` reads (an option's value, say)."""
        ...

    def aggregates(self, row: int) -> Sequence[Any]:
        """The row's aggregates, as nova's filters read them (``uuid``, ``metadata``)."""
        ...

    def name(self, row: int) -> str:
        """The row's host name."""
        ...

    def nodename(self, row: int) -> str:
        """The row's node name."""
        ...

    def cell_uuid(self, row: int) -> str | None:
        ...

    def instances_of(self, row: int) -> Collection[str]:
        """The instance uuids on the row's host, pending ones included."""
        ...

    def rows_with_instances(self, uuids: Collection[str], among: IntArray) -> Collection[int]:
        """The rows holding any of ``uuids`` (as :meth:`instances_of` has them); at least
        those of ``among``, the rows the caller asks about."""
        ...

    def heard_within(self, rows: IntArray, seconds: float) -> BoolArray:
        """Per row of ``rows``: was it heard from within ``seconds`` of the decision's time,
        as nova's database servicegroup driver decides (``abs(now - last_seen_up) <=
        seconds``, ``last_seen_up`` the wall-clock time of the host's last message)."""
        ...

    def values(self, name: str, fn: Callable[[Any], Any]) -> Sequence[Any]:
        """``fn(template)`` of every row, memoised per template under ``name``: a template is
        the row's document version read back into nova's attributes (``attrs``), for what
        only a new version changes (capabilities, NUMA and metrics names)."""
        ...

    def value_ids(self, name: str, fn: Callable[[Any], Any]) -> IntArray:
        """Per row a small number naming :meth:`values`' value (equal values, equal numbers):
        what the rows are grouped by, so that nova's code runs once per group."""
        ...

    def value_count(self, name: str) -> int:
        """How many hosts' values :meth:`value_ids` of ``name`` has numbered: with as many
        :meth:`value_answers`, every host's value has its answer."""
        ...

    def value_answers(self, name: str, key: Hashable) -> dict[int, Any] | None:
        """nova's answers per :meth:`value_ids` number of ``name``, kept across decisions
        under ``key`` (which names everything the answer reads besides the value); the
        caller fills it in.  None where the holder keeps no answers."""
        ...

    def per_request_attribute(self, name: str) -> bool:
        """Whether nova's host object computes ``name`` per request rather than holding it
        from the document (then an extra spec naming it is checked per host)."""
        ...

    def host(self, row: int) -> Any:
        """The row's host object, for a filter or weigher that runs per host."""
        ...

    def row_of(self, host: Any) -> int:
        """The row of a host object :meth:`host` returned."""
        ...


__all__ = ["COLUMN", "COLUMNS", "HostTable", "add_pending", "allocation_ratio",
           "document_numbers", "pending_changes", "service_down"]
