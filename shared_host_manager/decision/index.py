"""The columnar host index: every source's decision inputs as numpy columns, kept incrementally.

Role
----
A decision over 10 000 hosts must not loop in Python over every host.  The
index holds, per schedulable source (one *row*), exactly what the hot filters
and the standard weighers read, already net of this scheduler's pending
claims, as numpy columns; filters and weighers then run as a handful of
vector operations per request.  What varies little between hosts
(aggregate sets, hypervisor capabilities) is interned into *groups*: a
per-row group id column plus one representative per group, so a filter on
aggregates runs once per distinct aggregate set, not once per host.  Inverted
maps (instance -> row, host name -> rows, volume -> backend sources, server
group -> rows and members) answer same-host, affinity and locality questions
without a scan.

Life cycle::

    HostIndex(receiver)          rebuild(): one row per source the receiver holds
         |
    sync()  <-- by the engine, under the service's cache lock: at the start of each
         |      decision and after it registers claims (ingest does not sync: the
         |      changes of every message since the last decision are applied at once)
         |      drains receiver.drain_changed(); recomputes only those rows;
         |      appends rows for new sources, frees rows of forgotten ones
         v
    read by DecisionEngine (vector filters, weigher columns, group masks)

Rules:

* The index is the *only* consumer of ``receiver.drain_changed()`` (it is a
  destructive read); :meth:`sync` returns the drained set so the service layer
  can pass it on if anything else needs it.  Another incremental reader takes
  its own ``receiver.change_feed()``.
* It never writes to the receiver or its documents.  Its numbers come from the
  helpers in :mod:`shared_host_manager.decision.hostview`, the same ones HostView uses,
  so both paths see bit-identical floats.
* Not thread-safe: the caller serialises :meth:`sync` and decisions with ingest
  (the service layer holds its cache lock around each ingest step and around
  decisions).
* Group tables only grow between compactions; a table is compacted (group ids
  renumbered) when most of its groups are no longer used by any row.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, TypeVar, final, overload

import numpy as np
import numpy.typing as npt

from protocol.hostdoc import (
    AGGREGATES,
    PCI,
    VOLUMES,
    Aggregate,
    aggregates_key,
    aggregates_of,
    enabled,
    host_name,
    instances_of,
    is_host,
    namespace,
    node_name,
    service_of,
    supported_instances_of,
    volume_hosts_of,
)
from protocol.receiver import ReceiverMachine, SourceView, Status
from protocol.resources import STANDARD_RESOURCES
from shared_host_manager.decision.host_table import COLUMNS, document_numbers, pending_numbers
from shared_host_manager.decision.hostview import (
    fit_inputs,
    groups_of,
    held_usage,
    pending_counts,
    weigher_inputs,
)

#: per-row columns of the index
BoolArray: TypeAlias = npt.NDArray[np.bool_]
FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]
GroupIdArray: TypeAlias = npt.NDArray[np.int32]

_Scalar = TypeVar("_Scalar", bound=np.generic)

# -- what a vector filter returns -------------------------------------------------


class _PassAll(enum.Enum):
    """Singleton (an enum, so ``res is PASS_ALL`` narrows): the filter removes no host."""

    PASS_ALL = "PASS_ALL"

    def __repr__(self) -> str:
        return "PASS_ALL"

    __str__ = __repr__


PASS_ALL: Final = _PassAll.PASS_ALL
#: the type of :data:`PASS_ALL`
PassAll: TypeAlias = Literal[_PassAll.PASS_ALL]


@final
@dataclass(slots=True)
class Only:
    """Only these rows may pass (the rest are removed)."""

    rows: Iterable[int]


@final
@dataclass(slots=True)
class Exclude:
    """These rows are removed (the rest pass)."""

    rows: Iterable[int]


#: what pending claims hold beyond their resources, taken off one row of nova's numbers in
#: place: (source, its view, the row) -> None (HostIndex.hold_numbers)
HeldNumbers: TypeAlias = Callable[[str, SourceView, npt.NDArray[np.float64]], None]

#: a vector filter's answer: a bool per row (the first ``index.size`` rows), rows, or PASS_ALL
VectorResult: TypeAlias = BoolArray | Only | Exclude | _PassAll

#: weigher input columns (float64), in the order weigher_inputs returns them
WEIGHER_COLUMNS = ("free_ram_mb", "vcpus_free", "free_disk_mb", "num_instances", "num_io_ops")

AGGREGATE_GROUPS: Final = "aggregates"
CAPABILITY_GROUPS: Final = "capabilities"
GroupKind: TypeAlias = Literal["aggregates", "capabilities"]


class AggregateStub:
    """A group representative: what an aggregate-only filter may read (``aggregates``)."""

    __slots__ = ("aggregates",)

    def __init__(self, aggregates: tuple[Aggregate, ...]) -> None:
        self.aggregates = aggregates


class CapabilityStub:
    """A group representative for ImagePropertiesFilter-like filters."""

    __slots__ = ("supported_instances", "hypervisor_version")

    def __init__(self, supported_instances: tuple[tuple[Any, ...], ...],
                 hypervisor_version: int | None) -> None:
        self.supported_instances = supported_instances
        self.hypervisor_version = hypervisor_version


Stub: TypeAlias = AggregateStub | CapabilityStub


class GroupTable:
    """Interned per-row values: key -> group id, one representative (stub) per group."""

    __slots__ = ("ids", "stubs", "refs", "version")

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}
        #: AggregateStubs in the aggregates table, CapabilityStubs in the capabilities one
        self.stubs: list[Stub] = []
        self.refs: list[int] = []
        #: bumped whenever stubs change, so cached per-group answers are recomputed
        self.version = 0

    def intern(self, key: Hashable, make_stub: Callable[[], Stub]) -> int:
        gid = self.ids.get(key)
        if gid is None:
            gid = self.ids[key] = len(self.stubs)
            self.stubs.append(make_stub())
            self.refs.append(0)
            self.version += 1
        return gid


class HostIndex:
    """Columnar view of one receiver's sources; see the module docstring."""

    # the columns (allocated by _grow; rows past ``size`` are unused)
    #: the row holds a schedulable source
    live: BoolArray
    #: ComputeFilter's answer: ACTIVE and the service enabled
    compute_ok: BoolArray
    #: the receiver holds the source ACTIVE (heard from within its down interval)
    up: BoolArray
    #: per standard resource class: usable capacity (-inf: no inventory), used + pending
    cap: dict[str, FloatArray]
    used: dict[str, FloatArray]
    num_instances: IntArray
    num_io_ops: IntArray
    #: per WEIGHER_COLUMNS name: the weigher's raw input
    weigher_cols: dict[str, FloatArray]
    #: per group kind: the row's group id in that table
    gid: dict[str, GroupIdArray]
    #: the row's position in source id order (ties of equal weight)
    rank: IntArray

    def __init__(self, receiver: ReceiverMachine, *, capacity: int = 1024) -> None:
        self.receiver = receiver
        self.size = 0
        self._cap = 0
        self.sources: list[str | None] = []
        self.hosts: list[str] = []
        self.nodenames: list[str] = []
        self.cells: list[str | None] = []
        self.row_of: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._rows_by_host: dict[str, list[int]] = {}
        self._rows_by_lhost: dict[str, list[int]] = {}
        self._rows_by_lnode: dict[str, list[int]] = {}
        # instance uuid -> row (plus further rows in the rare case of duplicates)
        self._inst_row: dict[str, int] = {}
        self._inst_more: dict[str, set[int]] = {}
        self._row_insts: list[frozenset[str]] = []
        # server groups: per row, instance -> group for the instances on it that have one
        # (recorded with it by the arbiter, or pending with a claim carrying it; an
        # instance keeps its group from claim to record, so only the instances added and
        # removed are looked at), and group -> {row: members there}
        self._row_grouped: list[dict[str, str] | None] = []
        self._group_rows: dict[str, dict[int, int]] = {}
        # change detection of interned values, per row
        self._aggs_src: list[dict | None] = []
        self._caps_src: list[tuple | None] = []
        self.tables: dict[str, GroupTable] = {AGGREGATE_GROUPS: GroupTable(),
                                              CAPABILITY_GROUPS: GroupTable()}
        # per-group answers: (table version, per-group values, all groups alike)
        self._gcache: dict[Hashable, tuple[int, BoolArray, bool]] = {}
        self._vcache: dict[Hashable, tuple[int, FloatArray, bool]] = {}
        # foreign sources: volume id -> sources holding it; source -> (volumes, local hosts)
        self._volume_sources: dict[str, set[str]] = {}
        self._foreign: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
        self._rank_dirty = False
        #: counts the changes of which rows hold a host and of which group a row is in: a
        #: caller's numbering derived from ``gid`` and ``live`` holds while it is unchanged
        self.layout = 0
        # nova's numbers of every row (nova_numbers), kept once first asked for
        self._numbers: npt.NDArray[np.float64] | None = None
        self._numbers_stale: set[int] = set()
        self._numbers_held: HeldNumbers | None = None
        self.stats = {"syncs": 0, "rows_refreshed": 0, "rows_added": 0, "rows_freed": 0,
                      "compactions": 0}
        self._grow(capacity)
        self.rebuild()

    # -- storage -----------------------------------------------------------------

    def _grow(self, want: int) -> None:
        new = max(want, 2 * self._cap, 16)
        if new <= self._cap:
            return

        def grow(old: npt.NDArray[_Scalar] | None, dtype: type[_Scalar], fill: float = 0
                 ) -> npt.NDArray[_Scalar]:
            arr = np.full(new, fill, dtype=dtype)
            if old is not None:
                arr[: self._cap] = old[: self._cap]
            return arr

        first = self._cap == 0
        self.live = grow(None if first else self.live, np.bool_, False)
        self.compute_ok = grow(None if first else self.compute_ok, np.bool_, False)
        self.up = grow(None if first else self.up, np.bool_, False)
        self.cap = {r: grow(None if first else self.cap[r], np.float64, -np.inf)
                    for r in STANDARD_RESOURCES}
        self.used = {r: grow(None if first else self.used[r], np.float64) for r in STANDARD_RESOURCES}
        self.num_instances = grow(None if first else self.num_instances, np.int64)
        self.num_io_ops = grow(None if first else self.num_io_ops, np.int64)
        self.weigher_cols = {c: grow(None if first else self.weigher_cols[c], np.float64)
                             for c in WEIGHER_COLUMNS}
        if self._numbers is not None:
            numbers = np.zeros((new, len(COLUMNS)))
            numbers[: self._cap] = self._numbers[: self._cap]
            self._numbers = numbers
        self.gid = {k: grow(None if first else self.gid[k], np.int32) for k in self.tables}
        self.rank = grow(None if first else self.rank, np.int64)
        self._cap = new

    def _new_row(self, source: str) -> int:
        if self._free_rows:
            row = self._free_rows.pop()
            self.sources[row] = source
        else:
            row = self.size
            if row >= self._cap:
                self._grow(row + 1)
            self.size += 1
            self.sources.append(source)
            self.hosts.append("")
            self.nodenames.append("")
            self.cells.append(None)
            self._row_insts.append(frozenset())
            self._row_grouped.append(None)
            self._aggs_src.append(None)
            self._caps_src.append(None)
        self.row_of[source] = row
        self._rank_dirty = True
        self.stats["rows_added"] += 1
        self.layout += 1
        return row

    def _free_row(self, row: int) -> None:
        source = self.sources[row]
        if source is not None:
            self.row_of.pop(source, None)
        self.sources[row] = None
        self.live[row] = False
        self.compute_ok[row] = False
        self.up[row] = False
        self._set_host(row, "")
        self._set_node(row, "")
        self._set_instances(row, frozenset(), None)
        if self._aggs_src[row] is not None:
            self.tables[AGGREGATE_GROUPS].refs[int(self.gid[AGGREGATE_GROUPS][row])] -= 1
        if self._caps_src[row] is not None:
            self.tables[CAPABILITY_GROUPS].refs[int(self.gid[CAPABILITY_GROUPS][row])] -= 1
        self._aggs_src[row] = None
        self._caps_src[row] = None
        self._free_rows.append(row)
        self.stats["rows_freed"] += 1
        self.layout += 1

    # -- maintenance -------------------------------------------------------------------

    def rebuild(self) -> None:
        """Recompute every row from the receiver (cold start, or after a bulk load)."""
        self.receiver.drain_changed()
        for source in list(self.row_of):
            if source not in self.receiver.sources:
                self._refresh(source)
        for source in list(self.receiver.sources):
            self._refresh(source)
        self._finish()

    def sync(self) -> set[str]:
        """Apply what changed in the receiver since the last sync; returns the changed sources.

        Call under the lock that serialises ingest and decisions, before reading the
        index (the engine does at the start of each decision).  Cost is proportional to
        the number of sources changed since the last sync, not to the number of hosts.
        """
        changed = self.receiver.drain_changed()
        if changed:
            self.stats["syncs"] += 1
            for source in changed:
                self._refresh(source)
            self._finish()
        return changed

    def _finish(self) -> None:
        if self._rank_dirty:
            row_of = self.row_of  # exactly the rows holding a source
            rows = [row_of[source] for source in sorted(row_of)]
            self.rank[rows] = np.arange(len(rows), dtype=np.int64)
            self._rank_dirty = False
        for kind, table in self.tables.items():
            unused = sum(1 for c in table.refs if c <= 0)
            if len(table.refs) > 64 and unused * 2 > len(table.refs):
                self._compact(kind, table)

    def _compact(self, kind: str, table: GroupTable) -> None:
        remap = np.zeros(len(table.stubs), dtype=np.int32)
        fresh = GroupTable()
        for key, gid in table.ids.items():
            if table.refs[gid] > 0:
                new = fresh.ids[key] = len(fresh.stubs)
                fresh.stubs.append(table.stubs[gid])
                fresh.refs.append(table.refs[gid])
                remap[gid] = new
        fresh.version = table.version + 1
        col = self.gid[kind]
        col[: self.size] = remap[col[: self.size]]
        self.tables[kind] = fresh
        self.stats["compactions"] += 1
        self.layout += 1

    def _refresh(self, source: str) -> None:
        self.stats["rows_refreshed"] += 1
        view = self.receiver.sources.get(source)
        self._refresh_foreign(source, view)
        row = self.row_of.get(source)
        if view is None or not is_host(view.doc):
            if row is not None:
                self._free_row(row)
            return
        if row is None:
            row = self._new_row(source)
        self._fill(row, source, view)

    def _fill(self, row: int, source: str, view: SourceView) -> None:
        doc = view.doc
        assert doc is not None
        compute = doc["compute"]
        self.live[row] = True
        self.up[row] = view.status is Status.ACTIVE
        self.compute_ok[row] = self.up[row] and enabled(service_of(doc))
        pending = held_usage(view)
        for resource in STANDARD_RESOURCES:
            cap, used = fit_inputs(compute, resource, pending.get(resource, 0))
            self.cap[resource][row] = cap
            self.used[resource][row] = used
        claims, n_inst, pending_insts = pending_counts(view)
        numbers = weigher_inputs(compute, pending, claims, n_inst)
        cols = self.weigher_cols
        for name, value in zip(WEIGHER_COLUMNS, numbers, strict=True):
            cols[name][row] = value
        self.num_instances[row] = numbers[3]
        self.num_io_ops[row] = numbers[4]
        if self._numbers is not None:
            self._numbers_stale.add(row)
        host = host_name(compute, source)
        if host != self.hosts[row]:
            self._set_host(row, host)
        node = node_name(compute, source)
        if node != self.nodenames[row]:
            self._set_node(row, node)
        self.cells[row] = compute.get("cell_uuid")
        # interned values: recomputed only when the raw namespace changed
        # (values inside a document are replaced, never mutated, so a shallow copy
        # compared with == is a cheap and exact change test)
        prev_aggs = self._aggs_src[row]
        aggs_ns = doc.get(AGGREGATES) or {}
        if prev_aggs is None or aggs_ns != prev_aggs:
            aggs = aggregates_of(doc)
            self._regroup(AGGREGATE_GROUPS, row, prev_aggs is not None, aggregates_key(aggs),
                          lambda: AggregateStub(aggs))
            self._aggs_src[row] = dict(aggs_ns)
        prev_caps = self._caps_src[row]
        caps_raw = (compute.get("supported_instances"), compute.get("hypervisor_version"))
        if prev_caps is None or caps_raw != prev_caps:
            si = supported_instances_of(compute)
            hv = caps_raw[1]
            self._regroup(CAPABILITY_GROUPS, row, prev_caps is not None, (si, hv),
                          lambda: CapabilityStub(si, hv))
            self._caps_src[row] = caps_raw
        insts = instances_of(doc)
        if pending_insts:
            current = frozenset(insts).union(pending_insts)
        else:
            current = frozenset(insts)
        if current != self._row_insts[row]:
            self._set_instances(row, current, view)

    def _regroup(
        self, kind: str, row: int, had: bool, key: Hashable, make_stub: Callable[[], Stub],
    ) -> None:
        table = self.tables[kind]
        col = self.gid[kind]
        if had:
            table.refs[int(col[row])] -= 1
        gid = table.intern(key, make_stub)
        table.refs[gid] += 1
        if not had or col[row] != gid:
            self.layout += 1
        col[row] = gid

    def _set_host(self, row: int, host: str) -> None:
        old = self.hosts[row]
        if old:
            for mapping, key in ((self._rows_by_host, old), (self._rows_by_lhost, old.lower())):
                rows = mapping.get(key)
                if rows is not None:
                    rows.remove(row)
                    if not rows:
                        del mapping[key]
        self.hosts[row] = host
        if host:
            self._rows_by_host.setdefault(host, []).append(row)
            self._rows_by_lhost.setdefault(host.lower(), []).append(row)

    def _set_node(self, row: int, node: str) -> None:
        old = self.nodenames[row]
        if old:
            rows = self._rows_by_lnode.get(old.lower())
            if rows is not None:
                rows.remove(row)
                if not rows:
                    del self._rows_by_lnode[old.lower()]
        self.nodenames[row] = node
        if node:
            self._rows_by_lnode.setdefault(node.lower(), []).append(row)

    def _set_instances(self, row: int, current: frozenset[str], view: SourceView | None) -> None:
        old = self._row_insts[row]
        inst_row, more = self._inst_row, self._inst_more
        gone = old - current
        came = current - old
        grouped = self._row_grouped[row]
        if grouped:
            for uuid in gone:
                group = grouped.pop(uuid, None)
                if group is not None:
                    self._group_count(group, row, -1)
        if came and view is not None:
            for uuid, group in groups_of(view, came).items():
                if grouped is None:
                    grouped = self._row_grouped[row] = {}
                grouped[uuid] = group
                self._group_count(group, row, 1)
        for uuid in gone:
            if inst_row.get(uuid) == row:
                extra = more.get(uuid)
                if extra:
                    inst_row[uuid] = extra.pop()
                    if not extra:
                        del more[uuid]
                else:
                    del inst_row[uuid]
            else:
                extra = more.get(uuid)
                if extra is not None:
                    extra.discard(row)
                    if not extra:
                        del more[uuid]
        for uuid in came:
            have = inst_row.get(uuid)
            if have is None:
                inst_row[uuid] = row
            elif have != row:
                more.setdefault(uuid, set()).add(row)
        self._row_insts[row] = current

    def _group_count(self, group: str, row: int, change: int) -> None:
        rows = self._group_rows.setdefault(group, {})
        count = rows.get(row, 0) + change
        if count > 0:
            rows[row] = count
        else:
            rows.pop(row, None)
            if not rows:
                del self._group_rows[group]

    def _refresh_foreign(self, source: str, view: SourceView | None) -> None:
        doc = view.doc if view is not None else None
        volumes = frozenset(namespace(doc, VOLUMES))
        old = self._foreign.get(source)
        if not volumes:
            if old is None:
                return
            new: tuple[frozenset[str], tuple[str, ...]] | None = None
        else:
            new = (volumes, volume_hosts_of(doc))
        old_vols = old[0] if old else frozenset()
        for vol in old_vols - volumes:
            holders = self._volume_sources.get(vol)
            if holders is not None:
                holders.discard(source)
                if not holders:
                    del self._volume_sources[vol]
        for vol in volumes - old_vols:
            self._volume_sources.setdefault(vol, set()).add(source)
        if new is None:
            del self._foreign[source]
        else:
            self._foreign[source] = new

    # -- queries -------------------------------------------------------------------------

    def rows_of_hosts(self, names: Iterable[str], *, lower: bool = False) -> list[int]:
        """Rows whose host name is in ``names`` (case-insensitive with ``lower``, as force_hosts)."""
        mapping = self._rows_by_lhost if lower else self._rows_by_host
        out: list[int] = []
        for name in names:
            rows = mapping.get(name.lower() if lower else name)
            if rows:
                out.extend(rows)
        return out

    def rows_of_nodes(self, names: Iterable[str]) -> list[int]:
        """Rows whose node name is in ``names``, case-insensitive (as force_nodes)."""
        out: list[int] = []
        for name in names:
            rows = self._rows_by_lnode.get(name.lower())
            if rows:
                out.extend(rows)
        return out

    def rows_of_instance(self, uuid: str) -> Iterator[int]:
        """Rows holding ``uuid`` (reported in ``instances`` or pending with our claims)."""
        row = self._inst_row.get(uuid)
        if row is not None:
            yield row
            extra = self._inst_more.get(uuid)
            if extra:
                yield from extra

    def members_of_group(self, uuid: str) -> list[str]:
        """The instances of server group ``uuid`` on any row: recorded with the group by the
        arbiter, or pending with a claim carrying it, ours or a live peer's."""
        grouped = self._row_grouped
        return [instance for row in self._group_rows.get(uuid, ())
                for instance, group in (grouped[row] or {}).items() if group == uuid]

    def volume_hosts(self, volume_id: str) -> frozenset[str] | None:
        holders = self._volume_sources.get(volume_id)
        if not holders:
            return None
        out: set[str] = set()
        for source in holders:
            out.update(self._foreign[source][1])
        return frozenset(out)

    @overload
    def group_mask(self, kind: Literal["aggregates"], cache_key: Hashable | None,
                   passes: Callable[[AggregateStub], bool]) -> BoolArray | _PassAll: ...

    @overload
    def group_mask(self, kind: Literal["capabilities"], cache_key: Hashable | None,
                   passes: Callable[[CapabilityStub], bool]) -> BoolArray | _PassAll: ...

    def group_mask(
        self, kind: GroupKind, cache_key: Hashable | None, passes: Callable[[Any], bool],
    ) -> BoolArray | _PassAll:
        """Per-row mask of a filter that reads only a group's representative.

        ``passes`` runs once per group (not per host) on the group's stub (an
        :class:`AggregateStub` or a :class:`CapabilityStub`, by ``kind``), and its
        answers are cached per ``cache_key`` until the group table changes;
        ``cache_key`` must capture everything of the request that ``passes`` reads
        (None: no cache).
        """
        table = self.tables[kind]
        hit = self._gcache.get((kind, cache_key)) if cache_key is not None else None
        if hit is None or hit[0] != table.version:
            gpass = np.fromiter((bool(passes(stub)) for stub in table.stubs), dtype=bool,
                                count=len(table.stubs))
            hit = (table.version, gpass, bool(gpass.all()))
            if cache_key is not None:
                if len(self._gcache) > 4096:
                    self._gcache.clear()
                self._gcache[(kind, cache_key)] = hit
        if hit[2]:
            return PASS_ALL
        return hit[1][self.gid[kind][: self.size]]

    @overload
    def group_values(self, kind: Literal["aggregates"], cache_key: Hashable | None,
                     value: Callable[[AggregateStub], float]) -> tuple[FloatArray, bool]: ...

    @overload
    def group_values(self, kind: Literal["capabilities"], cache_key: Hashable | None,
                     value: Callable[[CapabilityStub], float]) -> tuple[FloatArray, bool]: ...

    def group_values(
        self, kind: GroupKind, cache_key: Hashable | None, value: Callable[[Any], float],
    ) -> tuple[FloatArray, bool]:
        """Per-group float values (e.g. weight multipliers) and whether they are all equal.

        Cached like :meth:`group_mask`.
        """
        table = self.tables[kind]
        key = ("values", kind, cache_key)
        hit = self._vcache.get(key) if cache_key is not None else None
        if hit is None or hit[0] != table.version:
            vals = np.fromiter((value(stub) for stub in table.stubs), dtype=np.float64,
                               count=len(table.stubs))
            hit = (table.version, vals, bool(len(vals) == 0 or (vals == vals[0]).all()))
            if cache_key is not None:
                if len(self._vcache) > 4096:
                    self._vcache.clear()
                self._vcache[key] = hit
        return hit[1], hit[2]

    def hold_numbers(self, held: HeldNumbers) -> None:
        """Take ``held(source, view, numbers)`` off each row's :meth:`nova_numbers` too,
        after the pending claims' resources: what pending claims hold that only the caller
        can count (the nova package: the PCI devices of nova's claims)."""
        if held is not self._numbers_held:
            self._numbers_held, self._numbers = held, None

    def nova_numbers(self) -> npt.NDArray[np.float64]:
        """Per row, nova's numbers of the host (decision/host_table.py COLUMNS), net of
        pending claims: what nova's filters and weighers read through the vector core.  Kept
        from the first call on (rows refreshed since are derived again here), so an engine
        that never decides with nova's classes never derives them."""
        numbers = self._numbers
        if numbers is None:
            numbers = self._numbers = np.zeros((self._cap, len(COLUMNS)))
            self._numbers_stale = set(np.flatnonzero(self.live[: self.size]).tolist())
        stale, self._numbers_stale = self._numbers_stale, set()
        for row in stale:
            source = self.sources[row]
            if source is None or not self.live[row]:
                continue
            view = self.receiver.sources[source]
            doc = view.doc
            assert doc is not None
            claims, n_inst, _ = pending_counts(view)
            values: Sequence[float] = document_numbers(doc["compute"], service_of(doc),
                                                       doc.get(PCI))
            if claims:
                values = pending_numbers(values, held_usage(view), claims, n_inst)
            numbers[row] = values
            if claims and self._numbers_held is not None:
                self._numbers_held(source, view, numbers[row])
        return numbers

    def instances(self, row: int) -> frozenset[str]:
        """The instances on the row's host: reported, or pending with a claim (ours or a
        live peer's)."""
        return self._row_insts[row]

    def view(self, row: int) -> SourceView:
        source = self.sources[row]
        assert source is not None
        return self.receiver.sources[source]

    def __len__(self) -> int:
        return len(self.row_of)


__all__ = ["HostIndex", "Only", "Exclude", "PASS_ALL", "PassAll", "VectorResult", "WEIGHER_COLUMNS",
           "AGGREGATE_GROUPS", "CAPABILITY_GROUPS", "AggregateStub", "CapabilityStub"]
