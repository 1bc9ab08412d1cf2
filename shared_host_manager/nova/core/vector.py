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
  the group (so the semantics are nova's, not a copy: :mod:`.forms.base`);
* any other filter (a subclass, an out-of-tree plugin, NUMATopologyFilter with a
  requested NUMA topology, PciPassthroughFilter with PCI requests, JsonFilter
  with a query) runs as nova's own class, per host, on the survivors only, in
  nova's order; so does every filter and weigher on a host nova's manager has
  already touched (consumed in a multi-create).

The forms themselves are one module per module of nova's, under nova's module
name: ``forms/filters/<name>.py`` answers for the classes of
``nova/scheduler/filters/<name>.py``, ``forms/weights/<name>.py`` for those of
``nova/scheduler/weights/<name>.py`` (:mod:`.forms`).  This module builds the
registries from them and keeps what runs them: the request's rows
(:class:`HostRows`), nova's wrapper rules (:func:`pre_filter`), the handlers'
loops (:func:`run_filters`, :func:`weigh`), and which class a form stands for
(nova's, as shipped: :func:`is_base_filter_all`, :func:`is_base_weigher`).

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
        rows' names (pre_filter), then the filters in nova's order (run_filters:
        each one's form in forms/filters/, or nova's class) -> a list of shells
    get_weighed_hosts -> weights per weigher (weigh: each one's form in
        forms/weights/, or nova's class), nova.weights.normalize's
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
import operator
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
from nova.scheduler import filters as nova_filters
from nova.scheduler import weights as nova_weights

from shared_host_manager.decision.host_table import (
    COLUMN,
    COLUMNS,
    HostTable,
    add_pending,
    service_down,
)
from shared_host_manager.decision.index import PASS_ALL
from shared_host_manager.nova.core.forms.base import (
    BoolArray,
    Engaged,
    FilterAnswer,
    FloatArray,
    IntArray,
    Probe,
    VectorFilter,
    VectorWeigher,
    option,
)
from shared_host_manager.nova.core.forms.filters import FORMS as FILTER_FORMS
from shared_host_manager.nova.core.forms.weights import FORMS as WEIGHER_FORMS

LOG = logging.getLogger(__name__)

_T = TypeVar("_T")


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

#: nova filter class -> its vector form (exact class only: subclasses run as themselves), for
#: a request that engages the filter (:func:`engaged`; :func:`filter_answer` asks both); one
#: module per module of nova's in forms/filters/
VECTOR_FILTERS: dict[type, VectorFilter] = {cls: form.answer for cls, form in FILTER_FORMS.items()}

#: per nova filter class, whether a request engages it: when not, nova's class passes every
#: host whatever the hosts hold (the request alone decides), and its vector form is not asked
#: (a class without an entry is always engaged)
_ENGAGED: dict[type, Engaged] = {cls: form.engaged for cls, form in FILTER_FORMS.items()
                                 if form.engaged is not None}

#: the classes whose engagement or vector form reads what is set per instance of a request
#: (the instance's uuid, its group's hosts and members); the others read only what requests
#: alike share (flavor, image, project, hints, group policy)
PER_INSTANCE: frozenset[type] = frozenset(
    [cls for cls, form in FILTER_FORMS.items() if form.per_instance]
    + [cls for cls, w_form in WEIGHER_FORMS.items() if w_form.per_instance])


def engaged_key(f: Any) -> Hashable | None:
    """What :func:`engaged` of ``f`` depends on besides the request's own fields that stay
    the same for every instance (its flavor, image, hints, group policy): requests alike
    may share the answer under this key.  None: it reads what is set per instance (of
    that, only the group's)."""
    cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
    form = FILTER_FORMS.get(cls)
    if form is None:
        return cls
    if form.engaged_per_instance:
        return None  # ServerGroupAffinityFilter: engaged once the group has hosts
    if form.engaged_by is not None:
        return cls, form.engaged_by(f)  # ImagePropertiesFilter's default architecture
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


class _Shipped:
    """A class of nova's with a vector form, as nova shipped it (captured at import), and the
    test that it still is: it holds the functions it held then, and it runs its base class's
    handler loop (``filter_all``, ``weigh_objects``: what the vector form replaces).

    The test runs for each such class on every request, so its look-ups are one C call:
    ``attrgetter`` looks every name up through the class (the first dict along the MRO that
    has it, as nothing may shadow nova's function), and each answer must be the very object
    captured.  A name whose look-up builds a new object each time (a classmethod's bound
    method) cannot be told by identity: it is checked in the class dicts themselves."""

    __slots__ = ("_cls", "_loop", "_get", "_expected", "_dicts")

    def __init__(self, cls: type, loop: str, base: Any) -> None:
        self._cls = cls
        #: the class runs ``base`` as its handler loop ``loop`` (else its form never stands
        #: for it; a loop replaced later fails the names' test, as ``loop`` is one of them)
        self._loop = getattr(cls, loop) is base
        dicts = [klass.__dict__ for klass in cls.__mro__]
        names: list[str] = []
        #: per name looked up in the dicts: the dict it is found in, its name, the stored
        #: function or descriptor itself, and the dicts before that one along the MRO
        self._dicts: list[tuple[Any, str, Any, tuple[Any, ...]]] = []
        for name in dir(cls):
            if name.startswith("__") or not callable(getattr(cls, name, None)):
                continue
            if getattr(cls, name) is getattr(cls, name):
                names.append(name)
            else:
                k = next(i for i, d in enumerate(dicts) if name in d)
                self._dicts.append((dicts[k], name, dicts[k][name], tuple(dicts[:k])))
        # the metaclass, one more name: attrgetter of a single name would answer that value
        # alone, not a tuple of one
        names.append("__class__")
        self._get = operator.attrgetter(*names)
        self._expected: tuple[Any, ...] = self._get(cls)

    def unchanged(self) -> bool:
        if not self._loop:
            return False
        try:
            found = self._get(self._cls)
        except AttributeError:  # deleted since
            return False
        if not all(map(operator.is_, found, self._expected)):
            return False
        for where, name, fn, before in self._dicts:
            if where.get(name) is not fn:
                return False
            for d in before:
                if name in d:
                    return False
        return True


#: nova's filter classes with a vector form, as shipped: a vector form stands for *these*. A
#: class whose method was replaced since (a test's mock.patch, a deployment's monkey patch)
#: runs as itself, per host, like a filter without a vector form
_SHIPPED_FILTERS: dict[type, _Shipped] = {
    cls: _Shipped(cls, "filter_all", nova_filters.BaseHostFilter.filter_all)
    for cls in VECTOR_FILTERS}


def is_base_filter_all(f: Any) -> bool:
    """``f`` is nova's class as shipped (its vector form stands for it)."""
    shipped = _SHIPPED_FILTERS.get(type(f))
    return shipped is not None and shipped.unchanged()


def run_filters(filters_: Iterable[Any], rows: HostTable, idx_: list[int], spec: Any,
                index: int, counters: Any = None) -> list[int] | None:
    """nova's BaseFilterHandler.get_filtered_objects over rows (None: a filter said stop),
    with its INFO lines: the filter that returned no host, and the filters' counts when none
    is left (what an operator reads when a request ends in NoValidHost)."""
    host = rows.host
    idx = np.asarray(idx_, dtype=np.int64)
    results: list[str] = []
    for f in filters_:
        if not f.run_filter_for_index(index):
            continue
        start = len(idx)
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
        results.append(f"{type(f).__name__}: (start: {start}, end: {len(idx)})")
        if not len(idx):
            LOG.info("Filter %s returned 0 hosts", type(f).__name__)
            break
    if not len(idx):
        LOG.info("Filtering removed all hosts for the request with instance ID '%s'. "
                 "Filter results: %s", getattr(spec, "instance_uuid", None), results)
    return idx.tolist()


# -- weighers --------------------------------------------------------------------------------

#: nova weigher class -> its vector form (exact class only); one module per module of nova's
#: in forms/weights/
VECTOR_WEIGHERS: dict[type, VectorWeigher] = {cls: form.raw for cls, form in WEIGHER_FORMS.items()}

#: nova's weigher classes with a vector form, as shipped (see _SHIPPED_FILTERS)
_SHIPPED_WEIGHERS: dict[type, _Shipped] = {
    cls: _Shipped(cls, "weigh_objects", nova_weights.BaseHostWeigher.weigh_objects)
    for cls in VECTOR_WEIGHERS}

#: the option each of nova's weighers reads for its multiplier, (group, name): all its
#: answer depends on besides the host's aggregates
_MULTIPLIER_OPTIONS: dict[type, tuple[str, str]] = {
    cls: form.multiplier_option for cls, form in WEIGHER_FORMS.items()}
#: each of those weighers' ``weight_multiplier`` as nova shipped it: a function of that
#: option and the host's aggregates alone (it calls no other method of its class)
_SHIPPED_MULTIPLIER: dict[type, Any] = {cls: cast(Any, cls).weight_multiplier
                                         for cls in WEIGHER_FORMS}
#: (class, option value) -> nova's multiplier for a host in no aggregate
_DEFAULTS: dict[tuple[type, Any], float] = {}


def default_multiplier(w: Any) -> float:
    """nova's multiplier of ``w`` for a host in no aggregate: the key its per-group answers
    are kept under.  nova's class is asked again only when the option it reads changed (it
    reads the option on every call, which costs more than the rest of a weigher), or every
    time once its ``weight_multiplier`` was replaced.  That method alone is looked at, not
    the whole class (:func:`is_base_weigher`): it is all this answer runs, and this is
    asked for every weigher on every decision."""
    cls = type(w)
    setting = _MULTIPLIER_OPTIONS.get(cls)
    if setting is None or cls.weight_multiplier is not _SHIPPED_MULTIPLIER[cls]:
        return float(w.weight_multiplier(Probe([], "", "")))
    key = (cls, option(*setting))
    value = _DEFAULTS.get(key)
    if value is None:
        if len(_DEFAULTS) > 1024:
            _DEFAULTS.clear()
        value = _DEFAULTS[key] = float(w.weight_multiplier(Probe([], "", "")))
    return value


def is_base_weigher(w: Any) -> bool:
    """``w`` is nova's class as shipped (its vector form stands for it)."""
    shipped = _SHIPPED_WEIGHERS.get(type(w))
    return shipped is not None and shipped.unchanged()


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


# the forms' shared names are re-exported: the drop-in, the engine's plugins and the tests
# import them from here
__all__ = ["PER_INSTANCE", "VECTOR_FILTERS", "VECTOR_WEIGHERS", "BoolArray", "FilterAnswer",
           "FloatArray", "HostRows", "Hosts", "IntArray", "Probe", "Snap", "Store", "VectorFilter",
           "VectorWeigher", "candidates", "default_multiplier", "engaged", "engaged_key",
           "filter_answer", "is_base_filter_all", "is_base_weigher", "node_uuid", "pci_taken",
           "pool_counts", "pool_key", "pre_filter", "rows_of", "run_filters", "snapshot",
           "take_over", "weigh", "weigh_rows"]
