"""The engine's host index as the vector core's host table: nova's classes over the index.

Role
----
The vector forms of nova's filters and weighers (:mod:`.vector`) read a decision's
hosts through :class:`~shared_host_manager.decision.host_table.HostTable`.  The
drop-in feeds them its per-request rows; :class:`IndexTable` feeds them the
engine's incremental :class:`~shared_host_manager.decision.index.HostIndex`
instead, so nova's own classes can decide over the index without a host object
per host per request (design §10, item 13).

* Columns, names, instances and aggregate groups are the index's, kept between
  decisions; the numbers are derived as the drop-in derives them
  (``decision/host_table.py``), net of pending claims.
* What only a new document version changes and nova's classes read from a host
  object (capabilities, NUMA topology, metrics) comes from a *template*: the
  document read back into nova's attributes by the same
  :func:`~.template.build_template` as the drop-in's, kept per source and version in
  :class:`Templates` and built only when a form or a per-host class asks.
* A host object (:meth:`IndexTable.host`) is one of the drop-in's
  ``SharedHostState``\\ s, built on first use in a decision: for a filter or
  weigher without a vector form, or a group's representative.

Life cycle: one :class:`Templates` per index (it outlives decisions); one
:class:`IndexTable` per decision, made after ``index.sync()`` under the lock the
index's caller holds, and dropped with the decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from protocol.receiver import SourceView, Status
from shared_host_manager.decision.host_table import COLUMN, pending_changes
from shared_host_manager.decision.hostview import Consumption
from shared_host_manager.decision.index import AGGREGATE_GROUPS, AggregateStub, HostIndex
from shared_host_manager.nova.core import template, vector
from shared_host_manager.nova.core.host_state import SharedHostState

BoolArray = vector.BoolArray
FloatArray = vector.FloatArray
IntArray = vector.IntArray
_T = TypeVar("_T")


class Templates:
    """Per source, the template of its latest document version seen (built on demand); and,
    once :meth:`bind`-ed to an index, per-row values derived from the templates, kept
    between decisions and derived again only for the rows whose source changed."""

    def __init__(self, default_cell: str | None = None) -> None:
        self.default_cell = default_cell
        self._by_source: dict[str, Any] = {}
        self._index: HostIndex | None = None
        self._feed: Any = None
        #: name -> (value per row, the template it came from per row, rows to look at again)
        self._columns: dict[str, tuple[list[Any], list[Any], set[int]]] = {}
        #: name -> (value number per row, value -> number, rows to number again)
        self._ids: dict[str, tuple[IntArray, dict[Any, int], set[int]]] = {}
        #: (name, key) -> nova's answer per value number (dropped with the numbering)
        self._answers: dict[tuple[str, Hashable], dict[int, Any]] = {}
        self._held = self._pci_held  # one bound method: the index keeps it (hold_numbers)
        #: (index layout, aggregate group number per row, one row per group): group_ids
        self._groups: tuple[int, IntArray, list[int]] | None = None

    def of(self, source: str, view: Any) -> Any:
        tpl = self._by_source.get(source)
        if tpl is None or tpl.version != view.version:
            tpl = template.build_template(source, view, self.default_cell, tpl)
            self._by_source[source] = tpl
        return tpl

    def bind(self, index: HostIndex) -> None:
        """Serve the decisions over ``index`` (one index per Templates): take in what changed
        since the last decision, and forget the templates of sources long gone."""
        if self._index is None:
            self._index, self._feed = index, index.receiver.change_feed()
            index.hold_numbers(self._held)
        elif self._index is not index:
            raise ValueError("a Templates serves the decisions over one index")
        changed = self._feed.drain()
        if changed and (self._columns or self._ids):
            rows = {r for r in map(index.row_of.get, changed) if r is not None}
            for *_, dirty in (*self._columns.values(), *self._ids.values()):
                dirty |= rows
        if len(self._by_source) > 2 * len(index) + 64:
            for source in [s for s in self._by_source if s not in index.row_of]:
                del self._by_source[source]

    def aggregate_groups(self) -> tuple[IntArray, list[int]]:
        """The bound index's aggregate group number per row, and one live row per group
        number (-1: none), kept while the index's layout stays (HostIndex.layout)."""
        index = self._index
        assert index is not None, "Templates.bind(index) first"
        kept = self._groups
        if kept is None or kept[0] != index.layout or len(kept[1]) != index.size:
            gids = index.gid[AGGREGATE_GROUPS][: index.size].astype(np.int64)
            live = np.flatnonzero(index.live[: index.size])
            first = np.full(len(index.tables[AGGREGATE_GROUPS].stubs), -1, dtype=np.int64)
            first[gids[live[::-1]]] = live[::-1]
            kept = self._groups = (index.layout, gids, first.tolist())
        return kept[1], kept[2]

    def _pci_held(self, source: str, view: SourceView, numbers: FloatArray) -> None:
        """Take the PCI devices the host's pending claims hold off its numbers, as the
        drop-in's host objects take them (their NUMA/PCI usage, template.pending_effect;
        vector.pci_taken)."""
        ledger = {**view.pending, **view.peer} if view.peer else view.pending
        if not any(template.USAGE_KEY in p.claim.request for p in ledger.values()):
            return  # the engine's own claims hold no devices: no template needed
        tpl = self.of(source, view)
        usages = template.pending_effect(vector.Snap(view.last_heard, ledger),
                                         tpl.doc_instances)[3]
        numbers[COLUMN["pci_free"]] -= vector.pci_taken(tpl, usages)

    def column(self, name: str, fn: Callable[[Any], Any]) -> list[Any]:
        """``fn(template)`` per row of the bound index (None for rows holding no host)."""
        index = self._index
        assert index is not None, "Templates.bind(index) first"
        entry = self._columns.get(name)
        if entry is None:
            entry = self._columns[name] = ([None] * index.size, [None] * index.size,
                                           set(range(index.size)))
        values, made_from, dirty = entry
        if len(values) < index.size:
            dirty.update(range(len(values), index.size))
            values.extend([None] * (index.size - len(values)))
            made_from.extend([None] * (index.size - len(made_from)))
        if dirty:
            live, sources = index.live, index.sources
            for row in dirty:
                source = sources[row] if row < index.size else None
                if source is None or not live[row]:
                    values[row] = made_from[row] = None
                    continue
                tpl = self.of(source, index.view(row))
                if tpl is not made_from[row]:  # a claim changes no template: most rows stay
                    values[row], made_from[row] = fn(tpl), tpl
            dirty.clear()
        return values

    def column_ids(self, name: str, fn: Callable[[Any], Any]) -> IntArray:
        """Per row of the bound index a number naming ``fn(template)``; numbered again only
        for the rows whose source changed (the numbering restarts when it outgrows the
        index, so a number stays small)."""
        index = self._index
        assert index is not None, "Templates.bind(index) first"
        entry = self._ids.get(name)
        if entry is None or len(entry[1]) > 2 * index.size + 64:
            entry = self._ids[name] = (np.zeros(index.size, dtype=np.int64), {},
                                       set(range(index.size)))
            for kept in [k for k in self._answers if k[0] == name]:
                del self._answers[kept]  # the numbers they were kept by mean nothing now
        ids, numbers, dirty = entry
        if len(ids) < index.size:
            grown = np.zeros(max(index.size, 2 * len(ids)), dtype=np.int64)
            grown[: len(ids)] = ids
            dirty.update(range(len(ids), index.size))
            entry = self._ids[name] = (grown, numbers, dirty)
            ids = grown
        if dirty:
            values = self.column(name, fn)
            for row in dirty:
                if row < index.size:
                    ids[row] = numbers.setdefault(values[row], len(numbers))
            dirty.clear()
        return ids

    def value_count(self, name: str) -> int:
        """How many hosts' values :meth:`column_ids` of ``name`` has numbered (the rows
        holding no host share one more number, their None's)."""
        numbers = self._ids[name][1]
        return len(numbers) - (None in numbers)

    def value_answers(self, name: str, key: Hashable) -> dict[int, Any]:
        """Answers by :meth:`column_ids` number of ``name`` under ``key``, kept while that
        numbering lasts (the caller fills them in)."""
        kept = self._answers.get((name, key))
        if kept is None:
            if len(self._answers) > 4096:
                self._answers.clear()
            kept = self._answers[(name, key)] = {}
        return kept


def host_state(tpl: Any, view: SourceView, heard: float, aggregates: Sequence[Any],
               consumed: Consumption | None = None) -> Any:
    """A SharedHostState of ``view``'s host for one decision: the template's attributes, net
    of the pending claims (ours and the live peers'), then of ``consumed`` (what earlier
    instances of the request took, as nova's consume_from_request counts it); ``heard``
    is the wall-clock time nova's servicegroup sees as its last report."""
    pending = {**view.pending, **view.peer} if view.peer else view.pending
    hs = SharedHostState._make(tpl, vector.Snap(heard, pending), None, 0.0)
    d = hs.__dict__
    d["aggregates"] = list(aggregates)
    if consumed is not None and consumed.claims:
        for name, change in pending_changes(consumed.resources, consumed.claims,
                                            len(consumed.instances)):
            d[name] += change
        d["_extra_instances"] = tuple(consumed.instances) + d["_extra_instances"]
    return hs


def heard_by_status(view: SourceView, wall_now: float) -> float:
    """When nova's servicegroup sees the host's last report if the receiver decides liveness:
    now while the receiver holds it ACTIVE, else never (the epoch)."""
    return wall_now if view.status is Status.ACTIVE else 0.0


class IndexTable:
    """One decision's HostTable over a HostIndex (see the module docstring).

    Liveness (ComputeFilter's "is the service up"): with ``now`` (the decision's time on the
    receiver's clock), a host is up when it was heard from within nova's
    ``service_down_time``, as nova's database servicegroup driver decides; without, the
    receiver's own status decides (ACTIVE is up: the engine's servicegroup is the
    receiver, design §4.2).  ``wall_clock`` gives the wall clock nova's checks compare with.
    """

    def __init__(self, index: HostIndex, templates: Templates, now: float | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 alike: dict[Hashable, Any] | None = None) -> None:
        self.index = index
        self.templates = templates
        #: what is kept for the requests alike this decision's request is one of (derived)
        self._alike = alike
        templates.bind(index)
        self._wall_now = wall_clock()
        self._by_status = now is None
        self._wall_offset = self._wall_now - (now or 0.0)
        self.touched: set[int] = set()
        self._hosts: dict[int, Any] = {}
        self._numbers: FloatArray | None = None

    def rows(self) -> IntArray:
        """The rows that hold a host, in source order (the engine's order of equal weights)."""
        index = self.index
        live = np.flatnonzero(index.live[: index.size])
        return live[np.argsort(index.rank[live], kind="stable")]

    # -- HostTable -----------------------------------------------------------------------

    def col(self, name: str) -> FloatArray:
        numbers = self._numbers
        if numbers is None:
            numbers = self._numbers = self.index.nova_numbers()
        return numbers[: self.index.size, COLUMN[name]]

    def group_ids(self) -> IntArray:
        """The index's own aggregate group numbers (kept between decisions, see HostIndex)."""
        return self.templates.aggregate_groups()[0]

    def group_rep(self) -> list[int]:
        return self.templates.aggregate_groups()[1]

    keeps_group_answers = True

    def group_answers(self, key: Hashable, answer: Callable[[Sequence[Any]], Any]
                      ) -> FloatArray:
        """Kept by the index per group table version (HostIndex.group_values)."""
        values, _ = self.index.group_values(AGGREGATE_GROUPS, ("nova", key),
                                            lambda stub: answer(stub.aggregates))
        return values

    def derived(self, key: Hashable, derive: Callable[[], _T]) -> _T:
        alike = self._alike
        if alike is None:
            return derive()
        kept = alike.get(("derived", key), alike)
        if kept is alike:
            kept = alike[("derived", key)] = derive()
        return kept

    def aggregates(self, row: int) -> tuple[Any, ...]:
        index = self.index
        stub = index.tables[AGGREGATE_GROUPS].stubs[int(index.gid[AGGREGATE_GROUPS][row])]
        assert isinstance(stub, AggregateStub)
        return stub.aggregates

    def name(self, row: int) -> str:
        return self.index.hosts[row]

    def nodename(self, row: int) -> str:
        return self.index.nodenames[row]

    def cell_uuid(self, row: int) -> str | None:
        return self.index.cells[row] or self.templates.default_cell

    def instances_of(self, row: int) -> frozenset[str]:
        return self.index.instances(row)

    def rows_with_instances(self, uuids: Collection[str], among: IntArray) -> set[int]:
        rows_of = self.index.rows_of_instance  # an inverted map: no row is scanned
        return {row for uuid in uuids for row in rows_of(uuid)}

    def heard_within(self, rows: IntArray, seconds: float) -> BoolArray:
        now = self._wall_now
        if self._by_status:
            if 0.0 <= seconds < now:  # heard now (ACTIVE), or at the epoch
                return self.index.up[rows]
            seen_up = np.where(self.index.up[rows], now, 0.0)
        else:
            view = self.index.view
            seen_up = self._wall_offset + np.fromiter(
                (view(r).last_heard for r in rows.tolist()), dtype=np.float64, count=len(rows))
        return np.abs(now - seen_up) <= seconds

    def _heard(self, view: SourceView) -> float:
        """The wall-clock time of the host's last report, as nova's servicegroup sees it."""
        if self._by_status:
            return heard_by_status(view, self._wall_now)
        return self._wall_offset + view.last_heard

    def values(self, name: str, fn: Callable[[Any], Any]) -> list[Any]:
        return self.templates.column(name, fn)

    def value_ids(self, name: str, fn: Callable[[Any], Any]) -> IntArray:
        return self.templates.column_ids(name, fn)

    def value_answers(self, name: str, key: Hashable) -> dict[int, Any]:
        return self.templates.value_answers(name, key)

    def value_count(self, name: str) -> int:
        return self.templates.value_count(name)

    def per_request_attribute(self, name: str) -> bool:
        live = np.flatnonzero(self.index.live[: self.index.size])
        if not len(live):
            return False
        return name not in self._template(int(live[0])).attrs \
            and hasattr(SharedHostState, name)

    def host(self, row: int) -> Any:
        """The row's SharedHostState for this decision (built on first use)."""
        hs = self._hosts.get(row)
        if hs is None:
            hs = self._hosts[row] = self.consumed_host(row, None)
        return hs

    def consumed_host(self, row: int, consumed: Consumption | None) -> Any:
        """A new SharedHostState of the row, net of ``consumed`` too (see :func:`host_state`)."""
        view = self.index.view(row)
        hs = host_state(self._template(row), view, self._heard(view), self.aggregates(row),
                        consumed)
        hs.__dict__["_index_row"] = row
        return hs

    def row_of(self, host: Any) -> int:
        return host.__dict__["_index_row"]

    def _template(self, row: int) -> Any:
        source = self.index.sources[row]
        assert source is not None
        return self.templates.of(source, self.index.view(row))


__all__ = ["IndexTable", "Templates", "heard_by_status", "host_state"]
