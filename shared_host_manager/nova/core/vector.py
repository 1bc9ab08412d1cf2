"""The drop-in's decision core: nova's filters and weighers over the request's hosts as arrays.

Role
----
nova's handlers call every filter and every weigher once per host per request,
on HostState objects; at 1 000 hosts that is most of a request's time.
:class:`SharedHostManager` answers ``get_filtered_hosts`` and
``get_weighed_hosts`` here instead, with the same results (the differential
tests in tests/nova/test_nova_vector.py are the definition of "same"):

* a filter or weigher of nova's own, of exactly that class, with a *vector
  form* (:data:`VECTOR_FILTERS`, :data:`VECTOR_WEIGHERS`) decides for all
  hosts at once, from numpy columns of the request's hosts; a filter the
  request does not engage (:func:`engaged`: no group policy, hint or image
  property for it to check) passes every host without a look at them;
* what depends only on what few hosts differ in (aggregate metadata,
  capabilities, supported instances, metrics names) runs nova's own code once
  per *distinct* input, on one host of each group, and the answer is spread to
  the group (so the semantics are nova's, not a copy);
* any other filter (a subclass, an out-of-tree plugin, NUMATopologyFilter with a
  requested NUMA topology, PciPassthroughFilter with PCI requests, JsonFilter
  with a query) runs as nova's own class, per host, on the survivors only, in
  nova's order; so does every filter and weigher on a host nova's manager has
  already touched (consumed in a multi-create).

The forms read their hosts through
:class:`~shared_host_manager.decision.host_table.HostTable` only (design §5.8):
the drop-in's :class:`HostRows` below, or the engine's index
(:mod:`.index_table`), so the same forms decide for nova-scheduler-shared and,
when it loads nova's classes (:mod:`.plugins`), for the project's engine.

Life cycle (one request)::

    get_host_states_by_uuids (under cache.lock)
        HostRows.add_entries (row_entries.py keeps each source's entry across
        requests), then HostRows.seal: per host a LazyHostState
        shell (host_manager.py: request rows + row number, no HostState
        attributes yet), and a copy of what the lock protects (liveness,
        pending claims, aggregates, the numbers of COLUMNS from the Store)
    get_filtered_hosts -> nova's force/ignore/requested_destination rules on the
        rows' names, then the filters in nova's order -> a list of shells
    get_weighed_hosts -> weights per weigher, nova.weights.normalize's
        arithmetic, multipliers per aggregate group -> WeighedHosts, sorted as
        nova sorts (stable, descending)
    the manager touches the chosen host and alternates: only those shells
        become full SharedHostStates (``__getattr__`` materialises them); their
        allocation candidates are deep-copied then, not for every host

nova's ``_schedule`` wraps the host iterator in a generator that deep-copies
every host's allocation candidates before any filter runs; when
``get_filtered_hosts`` receives exactly that generator (nova's code object)
unstarted around our rows, it takes the candidates from it and copies them
lazily instead (design §5.6).

Floats: every weight is computed with the same IEEE operations in the same
order as nova's handler (``obj.weight += multiplier * normalized``, weigher by
weigher), so weights are bit-identical, not just close.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from nova import conf as nova_conf
from nova.scheduler import filters as nova_filters
from nova.scheduler import utils as nova_utils
from nova.scheduler import weights as nova_weights
from nova.scheduler.filters import (
    affinity_filter,
    aggregate_image_properties_isolation,
    aggregate_instance_extra_specs,
    aggregate_multitenancy_isolation,
    all_hosts_filter,
    compute_capabilities_filter,
    compute_filter,
    image_props_filter,
    io_ops_filter,
    isolated_hosts_filter,
    json_filter,
    metrics_filter,
    num_instances_filter,
    numa_topology_filter,
    pci_passthrough_filter,
    type_filter,
)
from nova.scheduler.weights import (
    affinity as w_affinity,
)
from nova.scheduler.weights import (
    compute as w_compute,
)
from nova.scheduler.weights import (
    cpu as w_cpu,
)
from nova.scheduler.weights import (
    cross_cell as w_cross_cell,
)
from nova.scheduler.weights import (
    disk as w_disk,
)
from nova.scheduler.weights import (
    hypervisor_version as w_hv,
)
from nova.scheduler.weights import (
    image_props as w_image_props,
)
from nova.scheduler.weights import (
    io_ops as w_io_ops,
)
from nova.scheduler.weights import (
    metrics as w_metrics,
)
from nova.scheduler.weights import (
    num_instances as w_num_instances,
)
from nova.scheduler.weights import (
    pci as w_pci,
)
from nova.scheduler.weights import (
    ram as w_ram,
)

from shared_host_manager.decision.host_table import (
    COLUMN,
    COLUMNS,
    HostTable,
    add_pending,
    service_down,
)
from shared_host_manager.decision.index import PASS_ALL, PassAll

LOG = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
_T = TypeVar("_T")

#: the numbers this scheduler's pending claims change (host_state.SharedHostState._make does the same)
_ADJUSTED = frozenset({"free_ram_mb", "free_disk_mb", "disk_mb_used", "vcpus_used",
                       "num_instances", "num_io_ops", "pci_free"})


def pool_key(pool: Any) -> str:
    """A PCI pool's identity: every key but what consumption changes."""
    return repr(sorted((k, repr(v)) for k, v in pool.items() if k not in ("count", "devices")))


def pool_counts(pools: Any) -> dict[str, int]:
    """Free devices per pool identity (two pools may share one)."""
    counts: dict[str, int] = {}
    for pool in pools:
        key = pool_key(pool)
        counts[key] = counts.get(key, 0) + pool["count"]
    return counts


def pci_taken(tpl: Any, usages: list[dict[str, Any]]) -> int:
    """How many of the host's free devices the pending usages take: per pool identity, what
    they ask for, at most what is there (host_state._apply_numa_pci takes them the same way)."""
    asked: dict[str, int] = {}
    for usage in usages:
        for key, n in usage.get("pci", {}).items():
            asked[key] = asked.get(key, 0) + n
    if not asked:
        return 0
    ps = tpl.attrs["pci_stats"]
    have = pool_counts(ps.pools) if ps else {}
    return sum(min(n, have.get(key, 0)) for key, n in asked.items() if n > 0)


# -- the per-request rows ---------------------------------------------------------------

#: template.pending_effect: (resources, claims, instances, NUMA/PCI usages) of the
#: pending claims; the usages reach nova's classes through SharedHostState._make only
PendingEffect = tuple[dict[str, int], int, list[str], list[dict[str, Any]]]


#: Store.record's tuple
Record = tuple[Any, int, list[Any], int, Any]


class Snap:
    """What SharedHostState._make reads from a SourceView, as it was under the lock."""

    __slots__ = ("last_heard", "pending")

    def __init__(self, last_heard: float, pending: dict[str, Any]) -> None:
        self.last_heard = last_heard
        self.pending = pending


class Store:
    """The manager's numbers of every template it has seen, one row per source (COLUMNS).

    Written under the cache lock only (by :meth:`record`); a request copies its rows out
    under the same lock (HostRows.seal), so filters and weighers read a consistent copy.
    One slot per source ever seen (a forgotten source's slot is reused if it returns).

    Aggregate keys are interned: equal aggregate metadata, one small integer, so a
    request groups its rows by aggregates with one numpy call instead of hashing a
    nested tuple per row.  The numbers are valid for one aggregate generation of the
    manager (every row is derived again when it changes), and the table starts again
    with each generation, which bounds it by the distinct keys of one generation.
    """

    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self.table = np.zeros((1024, len(COLUMNS)))
        self._agg_ids: dict[Any, int] = {}
        self._agg_gen: Any = None

    def slot(self, tpl: Any) -> int:
        memo = tpl.vec
        s = memo.get("slot")
        if s is None:
            source = tpl.attrs["uuid"]
            s = self.slots.get(source)
            if s is None:
                s = self.slots[source] = len(self.slots)
                if s >= len(self.table):
                    grown = np.zeros((2 * len(self.table), len(COLUMNS)))
                    grown[:len(self.table)] = self.table
                    self.table = grown
            self.table[s] = tpl.numbers
            memo["slot"] = s
        return s

    def record(self, tpl: Any, agg_gen: Any) -> Record:
        """(template, store slot, aggregates, their key's interned id, ``agg_gen``): a request
        row's part that only a new version or new aggregates change, memoised on the
        template.  ``agg_gen``: the manager's aggregate generation (a template's aggregates
        change only with it)."""
        rec = tpl.vec.get("rec")
        if rec is None or rec[4] != agg_gen:
            if agg_gen != self._agg_gen:
                self._agg_ids, self._agg_gen = {}, agg_gen
            aggs = tpl.aggregates
            key = tuple((a.uuid, tuple(sorted((a.metadata or {}).items()))) for a in aggs)
            gid = self._agg_ids.setdefault(key, len(self._agg_ids))
            rec = tpl.vec["rec"] = (tpl, self.slot(tpl), aggs, gid, agg_gen)
        return rec


class Hosts(list[Any]):
    """get_filtered_hosts' answer: the hosts, and which request rows they are."""

    rows: HostRows
    idx: list[int]


class HostRows:
    """The hosts of one request: templates, snapshots, lazily built columns, the shells.

    A :class:`~shared_host_manager.decision.host_table.HostTable`: the vector forms read it
    through that interface only.
    """

    def __init__(self, manager: Any, store: Store, wall_offset: float, shell_cls: type[object],
                 pending_effect: Callable[[Any, Any], PendingEffect]) -> None:
        self.manager = manager
        self.store = store
        self.shell_cls = shell_cls
        self._pending_effect = pending_effect
        self.wall_offset = wall_offset
        self.tpls: list[Any] = []
        self.shells: list[Any] = []
        self.last_heard: list[float] = []
        self.aggs: list[list[Any]] = []
        #: row -> (pending claims copy, (resources, claims, instances)) for rows with pending claims
        self.pending: dict[int, tuple[dict[str, Any], PendingEffect]] = {}
        #: row -> (the API side's service record, nova's instance hints) for rows that have
        #: either: both are newer than the document (design §2), and SharedHostState._make
        #: applies them the same way
        self.overrides: dict[int, tuple[dict[str, Any] | None, dict[str, bool] | None]] = {}
        #: nova's alloc_reqs_by_rp_uuid when we took it over from nova's generator
        self.alloc_reqs: Any = None
        self._recs: list[Record] = []
        #: per row, its aggregate key's interned id (Store.record)
        self.agg_ids: IntArray = np.zeros(0, dtype=np.int64)
        self._table: FloatArray | None = None
        #: rows whose shell became a full SharedHostState (the manager may have changed it)
        self.touched: set[int] = set()
        self._gids: IntArray | None = None
        #: per aggregate group id, one row of that group
        self._group_rep: list[int] = []
        self._cols: dict[str, Any] = {}
        self._pos = 0
        #: this request's id in the update log (decision_log.py), when one records it
        self.log_id: int | None = None

    # nova iterates what get_host_states_by_uuids returns (through its generator)
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        pos = self._pos
        if pos >= len(self.shells):
            raise StopIteration
        self._pos = pos + 1
        return self.shells[pos]

    def add_entries(self, entries: list[tuple[Any, ...]]) -> None:
        """The request's rows, in order (under the cache lock): per host ``(record, API-side
        service record or None, view)``, with a fourth item (its live instance hints, or
        None) when the view has pending claims or hints (row_entries.py: a kept entry has
        neither).  Pending claims, ours and the peers', are copied here: held alike
        (design §5.2)."""
        start = len(self._recs)
        self._recs.extend([e[0] for e in entries])
        self.last_heard.extend([e[2].last_heard for e in entries])
        for j in [j for j, e in enumerate(entries) if e[1] is not None or len(e) > 3]:
            rec, api_service, view, *rest = entries[j]
            hints = rest[0] if rest else None
            row = start + j
            if api_service is not None or hints:
                self.overrides[row] = (api_service, hints or None)
            if view.pending or view.peer:
                pending = {**view.pending, **view.peer} if view.peer else dict(view.pending)
                effect = self._pending_effect(Snap(view.last_heard, pending), rec[0].doc_instances)
                self.pending[row] = (pending, effect)

    def seal(self) -> None:
        """The rows' columns and shells; the numbers copied out of the store (under the cache
        lock), net of pending claims."""
        recs = self._recs
        if recs:
            tpls, slots, aggs, agg_ids, _ = zip(*recs, strict=True)
            self.tpls, self.aggs = list(tpls), list(aggs)
            self.agg_ids = np.asarray(agg_ids, dtype=np.int64)
        else:
            slots = ()
        new = self.shell_cls.__new__
        cls = self.shell_cls
        shells = self.shells = [new(cls) for _ in recs]
        for row, shell in enumerate(shells):
            shell.__dict__ = {"_rows": self, "_row": row}
        table = self._table = self.store.table[np.asarray(slots, dtype=np.int64)].reshape(
            -1, len(COLUMNS))
        for row, (_, (res, claims, insts, usages)) in self.pending.items():
            if claims and usages:
                table[row, COLUMN["pci_free"]] -= pci_taken(self.tpls[row], usages)
            add_pending(table[row], res, claims, len(insts))
        for row, (api_service, _) in self.overrides.items():
            if api_service is not None:  # the API side owns service state (ComputeFilter's column)
                table[row, COLUMN["down"]] = 1.0 if service_down(api_service) else 0.0

    def col(self, name: str) -> FloatArray:
        """A number of every row as float64, as the (unconsumed) SharedHostState would have it."""
        assert self._table is not None, "HostRows.seal() first"
        return self._table[:, COLUMN[name]]

    def group_ids(self) -> IntArray:
        """Per row, a group number 0..groups-1 naming its aggregate metadata (equal metadata,
        equal number); :meth:`group_rep` gives one row of each group."""
        gids = self._gids
        if gids is None:
            _, first, gids = np.unique(self.agg_ids, return_index=True, return_inverse=True)
            self._group_rep = first.tolist()
            self._gids = gids = gids.astype(np.int64, copy=False).reshape(-1)
        return gids

    def group_rep(self) -> list[int]:
        return self._group_rep

    #: per request: no answers kept across requests
    keeps_group_answers = False

    def group_answers(self, key: Any, answer: Callable[[Any], Any]) -> None:
        return None

    def derived(self, key: Hashable, derive: Callable[[], _T]) -> _T:
        return derive()  # one request: nothing alike to keep it for

    def value_ids(self, name: str, fn: Callable[[Any], Any]) -> IntArray:
        """Per row a number naming ``fn(template)`` (equal values, equal numbers)."""
        ids: dict[Any, int] = {}
        out = np.fromiter((ids.setdefault(v, len(ids)) for v in self.values(name, fn)),
                          dtype=np.int64, count=len(self.tpls))
        self._cols["n:" + name] = len(ids)
        return out

    def value_count(self, name: str) -> int:
        return self._cols["n:" + name]

    def value_answers(self, name: str, key: Any) -> None:
        return None  # rows of one request: nothing outlives it

    def values(self, name: str, fn: Callable[[Any], Any]) -> list[Any]:
        """fn(template) of every row, memoised per template (for what only a new version changes)."""
        key = "v:" + name
        out = self._cols.get(key)
        if out is None:
            out = []
            for t in self.tpls:
                memo = t.vec
                v = memo.get(key, memo)
                if v is memo:
                    v = memo[key] = fn(t)
                out.append(v)
            self._cols[key] = out
        return out

    def instances_of(self, row: int) -> Any:
        """The keys of the row's ``instances`` as the unconsumed SharedHostState has them."""
        base = self.tpls[row].instances
        p = self.pending.get(row)
        o = self.overrides.get(row)
        hints = o[1] if o is not None else None
        if (p is None or not p[1][2]) and not hints:
            return base
        keys = set(base)
        if hints:  # as SharedHostState.instances: hidden ones go, added ones come
            listed = self.tpls[row].doc_instances
            keys.difference_update(u for u, added in hints.items() if not added and u in listed)
            keys.update(u for u, added in hints.items() if added and u not in listed)
        if p is not None:
            keys.update(p[1][2])
        return keys

    def rows_with_instances(self, uuids: Collection[str], among: IntArray) -> set[int]:
        """Those of ``among`` holding any of ``uuids`` (a scan: the rows have no inverted map)."""
        wanted = uuids if isinstance(uuids, (set, frozenset)) else set(uuids)
        return {r for r in among.tolist() if not wanted.isdisjoint(self.instances_of(r))}

    def name(self, row: int) -> str:
        return self.tpls[row].host

    def nodename(self, row: int) -> str:
        return self.tpls[row].attrs["nodename"]

    def cell_uuid(self, row: int) -> str | None:
        return self.tpls[row].cell_uuid

    def aggregates(self, row: int) -> list[Any]:
        return self.aggs[row]

    def heard_within(self, rows: IntArray, seconds: float) -> BoolArray:
        # last_seen_up: the wall-clock time of each row's last message
        seen_up = self.wall_offset + np.asarray(self.last_heard, dtype=np.float64)[rows]
        return np.abs(float(self.manager.wall_clock()) - seen_up) <= seconds

    def per_request_attribute(self, name: str) -> bool:
        return bool(self.tpls) and name not in self.tpls[0].attrs and hasattr(self.shell_cls, name)

    def host(self, row: int) -> Any:
        return self.shells[row]

    def row_of(self, host: Any) -> int:
        return host.__dict__["_row"]


def node_uuid(host: Any) -> str:
    """A host's compute node uuid, read without materialising one of our shells."""
    d = host.__dict__
    if "_rows" in d and "_tpl" not in d:
        return str(d["_rows"].tpls[d["_row"]].attrs["uuid"])
    return str(host.uuid)


def snapshot(rows: HostRows, row: int) -> Snap:
    """What SharedHostState._make reads from the row's SourceView, as it was under the lock."""
    p = rows.pending.get(row)
    return Snap(rows.last_heard[row], p[0] if p is not None else {})


def candidates(rows: HostRows, uuid: str) -> Any:
    """nova's deep copy of a host's allocation candidates, made when the host is first used."""
    return copy.deepcopy(rows.alloc_reqs[uuid]) if rows.alloc_reqs is not None else None


class Probe:
    """What a group-wise filter or multiplier reads (aggregates), for nova's own code."""

    __slots__ = ("aggregates", "host", "nodename")

    def __init__(self, aggregates: Sequence[Any], host: str, nodename: str) -> None:
        self.aggregates = aggregates
        self.host = host
        self.nodename = nodename

    def __repr__(self) -> str:
        return f"({self.host}, {self.nodename})"


class MetricsProbe(Probe):
    __slots__ = ("metrics",)

    def __init__(self, aggregates: Sequence[Any], host: str, nodename: str, metrics: Any) -> None:
        super().__init__(aggregates, host, nodename)
        self.metrics = metrics


def rows_of(hosts: Any) -> HostRows | None:
    """The request rows all of ``hosts`` belong to, or None (then nova's handlers decide)."""
    rows = None
    for h in hosts:
        d = getattr(h, "__dict__", None)
        r = d.get("_rows") if d is not None else None
        if r is None or (rows is not None and r is not rows):
            return None
        rows = r
    return rows


def take_over(hosts: Any) -> Any:
    """nova's unstarted ``hosts_with_alloc_reqs`` generator around our rows -> the rows, with
    nova's candidates attached to copy lazily; anything else unchanged."""
    if inspect.isgenerator(hosts) and inspect.getgeneratorstate(hosts) == inspect.GEN_CREATED \
            and hosts.gi_code in _nova_generator_codes():
        frame = hosts.gi_frame
        assert frame is not None  # an unstarted generator has its frame
        local = frame.f_locals
        inner = local.get("hosts_gen")
        if type(inner) is HostRows and inner._pos == 0 and "alloc_reqs_by_rp_uuid" in local:
            inner.alloc_reqs = local["alloc_reqs_by_rp_uuid"]
            hosts.close()
            return inner
    return hosts


_GEN_CODES: list[Any] = []


def _nova_generator_codes() -> list[Any]:
    if not _GEN_CODES:
        from nova.scheduler import manager as nova_manager

        code = nova_manager.SchedulerManager._schedule.__code__
        _GEN_CODES.extend(c for c in code.co_consts
                          if inspect.iscode(c) and c.co_name == "hosts_with_alloc_reqs")
    return _GEN_CODES


# -- nova's wrapper rules (ignore / force / requested_destination) on rows -------------------

def pre_filter(rows: HostTable, idx: list[int], spec_obj: Any) -> tuple[list[int], bool]:
    """nova's HostManager.get_filtered_hosts before the filters: (rows left, skip the filters)."""
    ignore_hosts = spec_obj.ignore_hosts or []
    force_hosts = spec_obj.force_hosts or []
    force_nodes = spec_obj.force_nodes or []
    requested = spec_obj.requested_destination
    if requested is not None and "host" in requested:
        host, node = requested.host, requested.node
        if node:
            idx = [i for i in idx if rows.name(i) == host and rows.nodename(i) == node]
        else:
            idx = [i for i in idx if rows.name(i) == host]
    if ignore_hosts or force_hosts or force_nodes:
        by_name: dict[tuple[str, str], int] = {}
        for i in idx:
            by_name[(rows.name(i), rows.nodename(i))] = i
        if ignore_hosts:
            lowered = {h.lower() for h in ignore_hosts}
            by_name = {k: v for k, v in by_name.items() if k[0].lower() not in lowered}
            if not by_name:
                return [], True
        if force_hosts:
            lowered = {h.lower() for h in force_hosts}
            by_name = {k: v for k, v in by_name.items() if k[0].lower() in lowered}
        if force_nodes:
            by_name = {k: v for k, v in by_name.items() if k[1] in force_nodes}
        check_type = "scheduler_hints" in spec_obj and spec_obj.scheduler_hints.get("_nova_check_type")
        idx = list(by_name.values())
        if not check_type and (force_hosts or force_nodes):
            return idx, True
    return idx, False


# -- filters ---------------------------------------------------------------------------------

#: a vector filter, asked only for a request that engages its filter (:func:`engaged`):
#: (filter, rows, row numbers (lazy rows only), spec) -> pass mask, PASS_ALL when it knows
#: that no row is removed (every kept group answer passes), or None when this request needs
#: nova's per-host class (then the filter runs per host)
FilterAnswer = BoolArray | PassAll | None
VectorFilter = Callable[[Any, HostTable, IntArray, Any], FilterAnswer]


def _grouped(f: Any, rows: HostTable, idx: IntArray, spec: Any, name: str,
             value: Callable[[Any], Any], key: Hashable) -> BoolArray | PassAll:
    """nova's own ``f._filter_one`` once per distinct ``value`` of the rows' templates, on
    one host of the group; kept across decisions under ``key`` (what ``f`` reads of the
    request) where the holder keeps such answers.  PASS_ALL: every value has its kept
    answer, and each passes."""
    ids = rows.value_ids(name, value)
    kept = rows.value_answers(name, (type(f), key))
    if kept is not None and len(kept) == rows.value_count(name) and all(kept.values()):
        return PASS_ALL  # whichever rows the filters before left
    return _once_per_group(idx, ids, lambda row: f._filter_one(rows.host(row), spec),
                           kept=kept)


def _once_per_group(idx: IntArray, gids: IntArray, decide: Callable[[int], Any],
                    dtype: Any = bool, kept: dict[int, Any] | None = None
                    ) -> npt.NDArray[Any]:
    """``decide(row)`` for one row per distinct ``gids[row]`` (small numbers), spread to the
    rows sharing it (no sort: the groups are few, the rows many); with ``kept``, the
    answers of earlier decisions by group number, taken from and added to it."""
    if not len(idx):
        return np.empty(0, dtype=dtype)
    g = gids[idx]
    first = np.full(int(g.max()) + 1, -1, dtype=np.int64)
    first[g[::-1]] = idx[::-1]  # the last write wins: each group's first row in idx
    present = np.flatnonzero(first >= 0)
    answers = np.zeros(len(first), dtype=dtype)
    if kept is None:
        answers[present] = np.fromiter((decide(row) for row in first[present].tolist()),
                                       dtype=dtype, count=len(present))
    else:
        for gid, row in zip(present.tolist(), first[present].tolist(), strict=True):
            answer = kept.get(gid, kept)
            if answer is kept:
                answer = kept[gid] = decide(row)
            answers[gid] = answer
    return answers[g]


def _agg_probe(rows: HostTable) -> Callable[[int], Any]:
    return lambda row: Probe(rows.aggregates(row), rows.name(row), rows.nodename(row))


def _rebuild_skips(f: Any, spec: Any) -> bool:
    return not f.RUN_ON_REBUILD and nova_utils.request_is_rebuild(spec)


def _compute_filter(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    if type(f.servicegroup_api._driver).__name__ != "DbDriver":
        return None  # another servicegroup driver: nova's class asks it per host
    # nova: abs(utcnow - last_seen_up) <= service_down_time, with last_seen_up = wall clock of
    # the last message (host_state.SharedHostState._make); microsecond rounding aside, the same comparison
    up = rows.heard_within(idx, nova_conf.CONF.service_down_time)
    return (rows.col("down")[idx] == 0.0) & up


def _capability_names(spec: Any) -> tuple[str, ...]:
    """The host attributes the flavor's extra specs ask ComputeCapabilitiesFilter about."""
    flavor = spec.flavor
    if "extra_specs" not in flavor:
        return ()
    tops: list[str] = []
    for key in flavor.extra_specs:
        if key == "hw:maxphysaddr_bits":
            tops.append("cpu_info")
            continue
        scope = key.split(":")
        if len(scope) == 1:
            tops.append(key)
        elif scope[0] == "capabilities" and len(scope) > 1:
            tops.append(scope[1])
    return tuple(sorted(set(tops)))


def _capabilities(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
    names, extra_specs = rows.derived(cls, lambda: (
        _capability_names(spec), tuple(sorted(spec.flavor.extra_specs.items()))))
    for name in names:
        # a number this scheduler's claims change, or a per-request attribute: per host
        if name in _ADJUSTED or rows.per_request_attribute(name):
            return None
        if name in ("limits", "allocation_candidates", "instances", "aggregates", "service",
                    "updated", "stats", "metrics", "numa_topology", "pci_stats", "host_ip"):
            return None
    # nova's class reads the flavor's extra specs of the request, nothing else
    return _grouped(f, rows, idx, spec, "cap:" + ",".join(names), lambda t: repr(tuple(
        (t.attrs.get(n), t.attrs["stats"].get(n)) for n in names)), extra_specs)


def _checked_image(f: Any, spec: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    """The image properties, and the three ImagePropertiesFilter checks (nova's default
    architecture counted in): none set, the filter passes every host."""
    from nova.objects import fields

    props = spec.image.properties if spec.image else {}
    return props, (fields.Architecture.canonicalize(props.get(
        "hw_architecture", f._get_default_architecture())),
        fields.HVType.canonicalize(props.get("img_hv_type")),
        fields.VMMode.canonicalize(props.get("hw_vm_mode")))


def _image_keys(f: Any, spec: Any) -> Hashable:
    """What ImagePropertiesFilter reads of the request: the checked properties (the default
    architecture counted in), the requested hypervisor version, the address bits."""
    props, checked = _checked_image(f, spec)
    return checked, props.get("img_hv_requested_version"), props.get("hw_maxphysaddr_bits")


def _image_props(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    key = rows.derived((type(f), f._get_default_architecture()), lambda: _image_keys(f, spec))
    return _grouped(f, rows, idx, spec, "image", lambda t: repr((
        t.attrs["supported_instances"], t.attrs["hypervisor_version"], t.attrs["cpu_info"])),
        key)


def _anti_affinity(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    group = spec.instance_group
    members = set(group.members)
    rules = group.rules
    limit = rules["max_server_per_host"] if rules and "max_server_per_host" in rules else 1
    me = spec.instance_uuid
    if limit < 1:  # no row passes for holding none: every row's own answer
        candidates = np.arange(len(idx))
        out = np.empty(len(idx), dtype=bool)
    else:  # a row holding no member passes: only the holders are asked
        candidates = np.flatnonzero(_holding(rows, idx, members))
        out = np.ones(len(idx), dtype=bool)
    for j in candidates.tolist():
        insts = rows.instances_of(int(idx[j]))
        out[j] = me in insts or len(members.intersection(insts)) < limit
    return out


def _holding(rows: HostTable, idx: IntArray, uuids: Collection[str]) -> BoolArray:
    """Per row of ``idx``: does it hold any of ``uuids``."""
    holders = rows.rows_with_instances(uuids, idx)
    if not holders:
        return np.zeros(len(idx), dtype=bool)
    return np.isin(idx, np.fromiter(holders, dtype=np.int64, count=len(holders)))


def _affinity(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    group_hosts = spec.instance_group.hosts
    return np.fromiter((rows.name(r) in group_hosts for r in idx.tolist()), dtype=bool,
                       count=len(idx))


def _overlap(hint: str, same: bool) -> VectorFilter:
    def vf(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
        uuids = spec.get_scheduler_hint(hint)
        wanted = {uuids} if isinstance(uuids, str) else set(uuids)
        hit = _holding(rows, idx, wanted)
        return hit if same else ~hit
    return vf


def _per_host(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    return None  # rare (a CIDR or JSON query hint): nova's class per host


def _per_group(rows: HostTable, idx: IntArray, key: Any, answer: Callable[[Any], Any],
               dtype: Any = bool) -> npt.NDArray[Any] | PassAll:
    """``answer(host)`` for the rows of ``idx``, asked once per aggregate group on a probe
    holding the group's aggregates; kept across decisions under ``key`` where the holder
    keeps such answers (``key``: what ``answer`` reads besides the aggregates; None: not
    known, asked again).  PASS_ALL: every kept bool answer is True."""
    kept = None
    if key is not None and rows.keeps_group_answers:
        try:
            kept = rows.group_answers(key, lambda aggregates: answer(Probe(aggregates, "", "")))
        except Exception:  # noqa: BLE001 - nova's code raised for some group: ask the groups
            kept = None    # of these rows only, as nova's handler would (and raise if it does)
    if kept is not None:
        if dtype is bool and all(kept.tolist()):  # a few groups: cheaper than numpy's all
            return PASS_ALL
        return kept[rows.group_ids()[idx]].astype(dtype, copy=False)
    probe = _agg_probe(rows)
    return _once_per_group(idx, rows.group_ids(), lambda row: answer(probe(row)), dtype=dtype)


def _limit(column: str, getter: str, option: str) -> VectorFilter:
    """NumInstances/IoOps (and their aggregate forms): the limit per aggregate group, by nova."""
    def vf(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
        get_max = getattr(f, getter)
        # nova's getters read the option and the aggregates, not the request
        key = (type(f), getattr(nova_conf.CONF.filter_scheduler, option))
        lim = _per_group(rows, idx, key, lambda host: get_max(host, spec), dtype=np.float64)
        assert lim is not PASS_ALL  # numbers, not answers
        return rows.col(column)[idx] < lim
    return vf


#: what nova's aggregate filters read of a request besides the hosts' aggregates: their
#: per-group answers are kept across decisions under it (a class without an entry is asked
#: every request)
_REQUEST_KEYS: dict[type, Callable[[Any], Any]] = {
    aggregate_instance_extra_specs.AggregateInstanceExtraSpecsFilter: lambda spec: tuple(
        sorted(spec.flavor.extra_specs.items())) if "extra_specs" in spec.flavor else None,
    aggregate_multitenancy_isolation.AggregateMultiTenancyIsolation: lambda spec: (
        spec.project_id,),
}


def _aggregates_key(f: Any, spec: Any) -> Hashable | None:
    request_key = _REQUEST_KEYS.get(type(f))
    if request_key is None or _rebuild_skips(f, spec):
        return None
    return type(f), request_key(spec)


def _by_aggregates(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
    key = rows.derived(cls, lambda: _aggregates_key(f, spec))
    return _per_group(rows, idx, key, lambda host: bool(f._filter_one(host, spec)))


def _isolated(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    c = nova_conf.CONF.filter_scheduler
    isolated_hosts = c.isolated_hosts
    restrict = c.restrict_isolated_hosts_to_isolated_images
    host_isolated = np.fromiter((rows.name(r) in isolated_hosts for r in idx.tolist()), dtype=bool,
                                count=len(idx))
    if not c.isolated_images:
        return ~host_isolated if restrict else PASS_ALL
    image_ref = spec.image.id if spec.image and "id" in spec.image else None
    image_isolated = image_ref in c.isolated_images
    if restrict:
        return host_isolated == image_isolated
    return host_isolated if image_isolated else PASS_ALL


def _metrics(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    # nova's class reads the metric names it parsed from its option, not the request
    return _grouped(f, rows, idx, spec, "metric_names",
                    lambda t: tuple(sorted(m.name for m in t.attrs["metrics"])),
                    tuple(sorted(f.keys)))


def _numa(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    if spec.numa_topology:
        return None  # a NUMA fit per host and candidate: nova's class
    extra_specs = spec.flavor.extra_specs
    image_props = spec.image.properties
    ids = rows.value_ids("numa_policy", lambda t: (bool(t.attrs["numa_topology"]), bool(
        t.attrs["numa_topology"].has_threads) if t.attrs["numa_topology"] else None))
    return _once_per_group(idx, ids, lambda row: f._satisfies_cpu_policy(
        rows.host(row), extra_specs, image_props))


def _pci(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    return None  # PCI devices asked for: nova's class per host, on its candidates


#: nova filter class -> its vector form (exact class only: subclasses run as themselves), for
#: a request that engages the filter (:func:`engaged`; :func:`filter_answer` asks both)
VECTOR_FILTERS: dict[type, VectorFilter] = {
    compute_filter.ComputeFilter: _compute_filter,
    compute_capabilities_filter.ComputeCapabilitiesFilter: _capabilities,
    image_props_filter.ImagePropertiesFilter: _image_props,
    affinity_filter.ServerGroupAntiAffinityFilter: _anti_affinity,
    affinity_filter.ServerGroupAffinityFilter: _affinity,
    affinity_filter.SameHostFilter: _overlap("same_host", True),
    affinity_filter.DifferentHostFilter: _overlap("different_host", False),
    affinity_filter.SimpleCIDRAffinityFilter: _per_host,
    aggregate_instance_extra_specs.AggregateInstanceExtraSpecsFilter: _by_aggregates,
    aggregate_image_properties_isolation.AggregateImagePropertiesIsolation: _by_aggregates,
    aggregate_multitenancy_isolation.AggregateMultiTenancyIsolation: _by_aggregates,
    type_filter.AggregateTypeAffinityFilter: _by_aggregates,
    num_instances_filter.NumInstancesFilter: _limit("num_instances", "_get_max_instances_per_host",
                                                    "max_instances_per_host"),
    num_instances_filter.AggregateNumInstancesFilter: _limit(
        "num_instances", "_get_max_instances_per_host", "max_instances_per_host"),
    io_ops_filter.IoOpsFilter: _limit("num_io_ops", "_get_max_io_ops_per_host", "max_io_ops_per_host"),
    io_ops_filter.AggregateIoOpsFilter: _limit("num_io_ops", "_get_max_io_ops_per_host",
                                               "max_io_ops_per_host"),
    isolated_hosts_filter.IsolatedHostsFilter: _isolated,
    json_filter.JsonFilter: _per_host,
    metrics_filter.MetricsFilter: _metrics,
    all_hosts_filter.AllHostsFilter: lambda f, rows, idx, spec: PASS_ALL,
    numa_topology_filter.NUMATopologyFilter: _numa,
    pci_passthrough_filter.PciPassthroughFilter: _pci,
}




def _runs(f: Any, spec: Any) -> bool:
    """nova's class runs for this request (a rebuild skips the classes not RUN_ON_REBUILD)."""
    return not _rebuild_skips(f, spec)


def _group_policy(f: Any, spec: Any) -> bool:
    group = spec.instance_group
    return _runs(f, spec) and group is not None and f.policy_name == group.policy


def _hint(name: str) -> Callable[[Any, Any], bool]:
    return lambda f, spec: _runs(f, spec) and bool(spec.get_scheduler_hint(name))


#: per nova filter class, whether a request engages it: when not, nova's class passes every
#: host whatever the hosts hold (the request alone decides), and its vector form is not asked
#: (a class without an entry is always engaged)
_ENGAGED: dict[type, Callable[[Any, Any], bool]] = {
    compute_filter.ComputeFilter: _runs,
    compute_capabilities_filter.ComputeCapabilitiesFilter: lambda f, spec: _runs(f, spec)
    and bool(_capability_names(spec)),
    image_props_filter.ImagePropertiesFilter: lambda f, spec: _runs(f, spec)
    and any(_checked_image(f, spec)[1]),
    affinity_filter.ServerGroupAntiAffinityFilter: _group_policy,
    affinity_filter.ServerGroupAffinityFilter: lambda f, spec: _runs(f, spec)
    and spec.instance_group is not None and f.policy_name in spec.instance_group.policies
    and bool(spec.instance_group.hosts),
    affinity_filter.SameHostFilter: _hint("same_host"),
    affinity_filter.DifferentHostFilter: _hint("different_host"),
    affinity_filter.SimpleCIDRAffinityFilter: _hint("build_near_host_ip"),
    json_filter.JsonFilter: _hint("query"),
    num_instances_filter.NumInstancesFilter: _runs,
    num_instances_filter.AggregateNumInstancesFilter: _runs,
    io_ops_filter.IoOpsFilter: _runs,
    io_ops_filter.AggregateIoOpsFilter: _runs,
    isolated_hosts_filter.IsolatedHostsFilter: _runs,
    metrics_filter.MetricsFilter: _runs,
    numa_topology_filter.NUMATopologyFilter: _runs,
    pci_passthrough_filter.PciPassthroughFilter: lambda f, spec: _runs(f, spec)
    and bool(spec.pci_requests) and bool(spec.pci_requests.requests),
    all_hosts_filter.AllHostsFilter: lambda f, spec: False,
}


#: the classes whose engagement or vector form reads what is set per instance of a request
#: (the instance's uuid, its group's hosts and members); the others read only what requests
#: alike share (flavor, image, project, hints, group policy)
PER_INSTANCE: frozenset[type] = frozenset({
    affinity_filter.ServerGroupAffinityFilter, affinity_filter.ServerGroupAntiAffinityFilter,
    w_affinity.ServerGroupSoftAffinityWeigher, w_affinity.ServerGroupSoftAntiAffinityWeigher})


def engaged_key(f: Any) -> Hashable | None:
    """What :func:`engaged` of ``f`` depends on besides the request's own fields that stay
    the same for every instance (its flavor, image, hints, group policy): requests alike
    may share the answer under this key.  None: it reads what is set per instance (of
    that, only the group's)."""
    cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
    if cls is affinity_filter.ServerGroupAffinityFilter:
        return None  # engaged once the group has hosts
    if cls is image_props_filter.ImagePropertiesFilter:
        return cls, f._get_default_architecture()  # counted in when the image has none
    return cls


def engaged(f: Any, spec: Any) -> bool:
    """Whether the request engages nova's filter ``f`` (a class with a vector form): when
    not, nova's class would pass every host, so a caller may leave it out altogether."""
    decide = _ENGAGED.get(type(f))
    return True if decide is None else decide(f, spec)


def filter_answer(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    """The vector form's answer of ``f`` (a class with one) for the rows ``idx``: PASS_ALL
    when the request does not engage it."""
    return VECTOR_FILTERS[type(f)](f, rows, idx, spec) if engaged(f, spec) else PASS_ALL


_Shipped = list[tuple[Any, str, Any, tuple[Any, ...]]]


def _shipped(cls: type) -> _Shipped:
    """The functions a class defines or inherits, as nova shipped them (captured at import):
    per function, the class dict it is found in, its name, the function itself, and the
    dicts before that one along the MRO (where nothing may shadow it)."""
    dicts = [klass.__dict__ for klass in cls.__mro__]
    out = []
    for name in dir(cls):
        if name.startswith("__") or not callable(getattr(cls, name, None)):
            continue
        # the stored function or descriptor itself, as inspect.getattr_static finds it
        # (getattr would build a new bound method of a classmethod every time)
        k = next(i for i, d in enumerate(dicts) if name in d)
        out.append((dicts[k], name, dicts[k][name], tuple(dicts[:k])))
    return out


#: nova's methods of every class with a vector form: a vector form stands for *these*. A class
#: whose method was replaced since (a test's mock.patch, a deployment's monkey patch) runs as
#: itself, per host, like a filter without a vector form
_SHIPPED: dict[type, _Shipped] = {cls: _shipped(cls) for cls in VECTOR_FILTERS}


def _unchanged(cls: type) -> bool:
    """``cls`` holds nova's methods as shipped (a few dict lookups per class, no call: it
    runs for every class on every request)."""
    shipped = _SHIPPED.get(cls)
    if shipped is None:
        return False
    for where, name, fn, before in shipped:
        if where.get(name) is not fn:
            return False
        for d in before:
            if name in d:
                return False
    return True


def is_base_filter_all(f: Any) -> bool:
    """``f`` is nova's class as shipped (its vector form stands for it)."""
    return type(f).filter_all is nova_filters.BaseHostFilter.filter_all and _unchanged(type(f))


def run_filters(filters_: Iterable[Any], rows: HostTable, idx_: list[int], spec: Any,
                index: int, counters: Any = None) -> list[int] | None:
    """nova's BaseFilterHandler.get_filtered_objects over rows (None: a filter said stop)."""
    host = rows.host
    idx = np.asarray(idx_, dtype=np.int64)
    for f in filters_:
        if not f.run_filter_for_index(index):
            continue
        vf = VECTOR_FILTERS.get(type(f))
        mask = None
        if vf is not None and is_base_filter_all(f):
            touched = rows.touched
            if not touched:
                mask = filter_answer(f, rows, idx, spec)
                if mask is not None and mask is not PASS_ALL:
                    idx = idx[mask]
            else:  # hosts the manager has touched go through nova's class, one by one
                is_touched = np.fromiter((i in touched for i in idx.tolist()), dtype=bool,
                                         count=len(idx))
                mask = filter_answer(f, rows, idx[~is_touched], spec)
                if mask is not None:
                    keep = np.empty(len(idx), dtype=bool)
                    keep[~is_touched] = True if mask is PASS_ALL else mask
                    for j in np.flatnonzero(is_touched).tolist():
                        keep[j] = bool(f._filter_one(host(int(idx[j])), spec))
                    idx = idx[keep]
        if mask is None:  # nova's own class, per host, on the survivors
            if counters is not None:
                counters["filter_fallback_runs"] += 1
            objs = f.filter_all([host(i) for i in idx.tolist()], spec)
            if objs is None:
                return None
            idx = np.asarray([rows.row_of(o) for o in objs], dtype=np.int64)
        if not len(idx):
            LOG.info("Filter %s returned 0 hosts", type(f).__name__)
            break
    return idx.tolist()


# -- weighers --------------------------------------------------------------------------------

#: a vector weigher: (weigher, rows, lazy row numbers, spec) -> raw weights (before the clamp)
VectorWeigher = Callable[[Any, HostTable, IntArray, Any], "FloatArray | None"]


def _column(name: str) -> VectorWeigher:
    return lambda w, rows, idx, spec: rows.col(name)[idx]


def _pci_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    # nova.scheduler.weights.pci: MAX_DEVS - min(free, MAX_DEVS - 1)
    free = rows.col("pci_free")[idx]
    return w_pci.MAX_DEVS - np.minimum(free, w_pci.MAX_DEVS - 1)


def _cpu(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    return rows.col("vcpus_total")[idx] * rows.col("cpu_allocation_ratio")[idx] \
        - rows.col("vcpus_used")[idx]


def _cross_cell(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    rd = spec.requested_destination if "requested_destination" in spec else None
    if rd and "cell" in rd and rd.cell and rd.allow_cross_cell_move:
        cell = rd.cell.uuid
        return np.fromiter((1.0 if rows.cell_uuid(r) == cell else -1.0 for r in idx.tolist()),
                           dtype=np.float64, count=len(idx))
    return np.zeros(len(idx))


def _soft(sign: float) -> VectorWeigher:
    def vw(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
        group = spec.instance_group
        if not group or w.policy_name != group.policy:
            return np.zeros(len(idx))
        members = set(group.members)
        out = np.zeros(len(idx))
        for j in np.flatnonzero(_holding(rows, idx, members)).tolist():
            out[j] = sign * len(members.intersection(rows.instances_of(int(idx[j]))))
        return out
    return vw


def _image_props_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray | None:
    if nova_conf.CONF.filter_scheduler.image_props_weight_multiplier == 0.0:
        return np.zeros(len(idx))
    return None  # reads instances' image metadata from the cell DB: nova's class per host


def _metrics_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray | None:
    if not w.setting:
        return np.zeros(len(idx))
    metrics = rows.values("metrics", lambda t: t.attrs["metrics"])
    out = np.empty(len(idx), dtype=np.float64)
    for j, row in enumerate(idx.tolist()):
        out[j] = w._weigh_object(MetricsProbe(rows.aggregates(row), rows.name(row),
                                               rows.nodename(row), metrics[row]), spec)
    return out


VECTOR_WEIGHERS: dict[type, VectorWeigher] = {
    w_ram.RAMWeigher: _column("free_ram_mb"),
    w_disk.DiskWeigher: _column("free_disk_mb"),
    w_cpu.CPUWeigher: _cpu,
    w_io_ops.IoOpsWeigher: _column("num_io_ops"),
    w_num_instances.NumInstancesWeigher: _column("num_instances"),
    w_compute.BuildFailureWeigher: _column("failed_builds"),
    w_hv.HypervisorVersionWeigher: _column("hypervisor_version"),
    w_pci.PCIWeigher: _pci_weight,
    w_cross_cell.CrossCellWeigher: _cross_cell,
    w_affinity.ServerGroupSoftAffinityWeigher: _soft(1.0),
    w_affinity.ServerGroupSoftAntiAffinityWeigher: _soft(-1.0),
    w_image_props.ImagePropertiesWeigher: _image_props_weight,
    w_metrics.MetricsWeigher: _metrics_weight,
}


_SHIPPED.update({cls: _shipped(cls) for cls in VECTOR_WEIGHERS})

#: the option each of nova's weighers reads for its multiplier, (group, name): all its
#: answer depends on besides the host's aggregates
_MULTIPLIER_OPTIONS: dict[type, tuple[str, str]] = {
    w_ram.RAMWeigher: ("filter_scheduler", "ram_weight_multiplier"),
    w_disk.DiskWeigher: ("filter_scheduler", "disk_weight_multiplier"),
    w_cpu.CPUWeigher: ("filter_scheduler", "cpu_weight_multiplier"),
    w_io_ops.IoOpsWeigher: ("filter_scheduler", "io_ops_weight_multiplier"),
    w_num_instances.NumInstancesWeigher: ("filter_scheduler", "num_instances_weight_multiplier"),
    w_compute.BuildFailureWeigher: ("filter_scheduler", "build_failure_weight_multiplier"),
    w_hv.HypervisorVersionWeigher: ("filter_scheduler", "hypervisor_version_weight_multiplier"),
    w_pci.PCIWeigher: ("filter_scheduler", "pci_weight_multiplier"),
    w_cross_cell.CrossCellWeigher: ("filter_scheduler", "cross_cell_move_weight_multiplier"),
    w_affinity.ServerGroupSoftAffinityWeigher: ("filter_scheduler",
                                                "soft_affinity_weight_multiplier"),
    w_affinity.ServerGroupSoftAntiAffinityWeigher: ("filter_scheduler",
                                                    "soft_anti_affinity_weight_multiplier"),
    w_image_props.ImagePropertiesWeigher: ("filter_scheduler", "image_props_weight_multiplier"),
    w_metrics.MetricsWeigher: ("metrics", "weight_multiplier"),
}
#: (class, option value) -> nova's multiplier for a host in no aggregate
_DEFAULTS: dict[tuple[type, Any], float] = {}


def default_multiplier(w: Any) -> float:
    """nova's multiplier of ``w`` for a host in no aggregate: the key its per-group answers
    are kept under.  nova's class is asked again only when the option it reads changed (it
    reads the option on every call, which costs more than the rest of a weigher)."""
    option = _MULTIPLIER_OPTIONS.get(type(w))
    if option is None or not is_base_weigher(w):
        return float(w.weight_multiplier(Probe([], "", "")))
    group, name = option
    key = (type(w), getattr(getattr(nova_conf.CONF, group), name))
    value = _DEFAULTS.get(key)
    if value is None:
        if len(_DEFAULTS) > 1024:
            _DEFAULTS.clear()
        value = _DEFAULTS[key] = float(w.weight_multiplier(Probe([], "", "")))
    return value


def is_base_weigher(w: Any) -> bool:
    """``w`` is nova's class as shipped (its vector form stands for it)."""
    return type(w).weigh_objects is nova_weights.BaseHostWeigher.weigh_objects \
        and _unchanged(type(w))


def _normalize(weights: FloatArray, minval: Any, maxval: Any) -> FloatArray:
    """nova.weights.normalize, element for element."""
    hi = float(weights.max()) if maxval is None else float(maxval)
    lo = float(weights.min()) if minval is None else float(minval)
    if lo == hi:
        return np.zeros(len(weights))
    return (weights - lo) / (hi - lo)


def weigh(weighers: Iterable[Any], rows: HostTable, idx: list[int], spec: Any,
          counters: Any = None) -> list[Any]:
    """nova's BaseWeightHandler.get_weighed_objects over rows -> sorted WeighedHosts."""
    order, weights = weigh_rows(weighers, rows, idx, spec, counters)
    host = rows.host
    return [nova_weights.WeighedHost(host(r), w) for r, w in zip(order, weights, strict=True)]


def weigh_rows(weighers: Iterable[Any], rows: HostTable, idx: list[int], spec: Any,
               counters: Any = None) -> tuple[list[int], list[float]]:
    """The rows of ``idx`` in nova's order (stable, by descending weight), and their weights.

    A host object (``rows.host``) is asked for only where nova's own code runs per host: a
    weigher without a vector form, or a touched row."""
    n = len(idx)
    if n <= 1:
        return list(idx), [0.0] * n
    objs: list[Any] = []

    def hosts() -> list[Any]:
        if not objs:
            objs.extend(rows.host(i) for i in idx)
        return objs

    arr = np.asarray(idx, dtype=np.int64)
    touched = [j for j, i in enumerate(idx) if i in rows.touched] if rows.touched else []
    lazy_pos = np.asarray([j for j, i in enumerate(idx) if i not in rows.touched],
                          dtype=np.int64) if touched else None
    total = np.zeros(n)
    wrapped = None
    for w in weighers:
        vw = VECTOR_WEIGHERS.get(type(w))
        raw = None
        if vw is not None and is_base_weigher(w):
            if lazy_pos is None:
                raw = vw(w, rows, arr, spec)
            else:
                sub = vw(w, rows, arr[lazy_pos], spec) if len(lazy_pos) else np.zeros(0)
                if sub is not None:
                    raw = np.empty(n)
                    raw[lazy_pos] = sub
                    for j in touched:
                        raw[j] = w._weigh_object(rows.host(idx[j]), spec)
            if raw is not None:
                if w.minval is not None:
                    raw = np.maximum(raw, w.minval)
                if w.maxval is not None:
                    raw = np.minimum(raw, w.maxval)
        if raw is None:  # nova's own weigher over every host
            if counters is not None:
                counters["weigher_fallback_runs"] += 1
            if wrapped is None:
                wrapped = [nova_weights.WeighedHost(o, 0.0) for o in hosts()]
            raw = np.asarray(w.weigh_objects(wrapped, spec), dtype=np.float64)
        norm = _normalize(raw, w.minval, w.maxval)
        total += _multipliers(w, rows, idx, arr, hosts, touched) * norm
    order = np.argsort(-total, kind="stable")
    return arr[order].tolist(), total[order].tolist()


def _multipliers(w: Any, rows: HostTable, idx: list[int], arr: IntArray,
                 hosts: Callable[[], list[Any]], touched: list[int]) -> FloatArray:
    """w.weight_multiplier per host, asked once per distinct aggregate metadata."""
    if type(w) not in VECTOR_WEIGHERS:  # a weigher of its own: asked per host, as nova does
        return np.fromiter((w.weight_multiplier(o) for o in hosts()), dtype=np.float64,
                           count=len(idx))
    gids = rows.group_ids()
    # the multiplier nova reads from its options when no aggregate overrides it: with the
    # class, all the answer depends on besides the aggregates
    kept = rows.group_answers((type(w), default_multiplier(w)),
                              lambda aggregates: w.weight_multiplier(Probe(aggregates, "", ""))) \
        if rows.keeps_group_answers else None
    if kept is not None:
        out = kept[gids[arr]].astype(np.float64)
        for j in touched:
            out[j] = w.weight_multiplier(rows.host(idx[j]))
        return out
    reps = rows.group_rep()
    per_group = np.zeros(len(reps))
    for g, row in enumerate(reps):
        if row >= 0:
            per_group[g] = w.weight_multiplier(Probe(rows.aggregates(row), rows.name(row),
                                                      rows.nodename(row)))
    out = per_group[gids[arr]]
    for j in touched:
        out[j] = w.weight_multiplier(rows.host(idx[j]))
    return out


__all__ = ["VECTOR_FILTERS", "VECTOR_WEIGHERS", "HostRows", "Hosts", "Store", "candidates", "pre_filter",
           "rows_of", "run_filters", "snapshot", "take_over", "weigh", "weigh_rows"]
