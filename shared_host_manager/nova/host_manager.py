"""SharedHostManager: nova 34's HostManager served from the shared host-state cache.

Theory of operation
-------------------
nova's SchedulerManager asks its host manager for the hosts of every request
(``get_host_states_by_uuids``), then filters, weighs, claims in placement and
consumes.  nova's own HostManager answers from the cell databases, on every
request, and builds a fresh HostState per host.  This one answers from a
:class:`~shared_host_manager.cache.HostStateCache`, which holds every compute
node's document as the compute nodes published it, and reads no database,
neither in ``__init__`` nor per request.

Three kinds of objects, three life times::

    SourceView (receiver)   one per compute node; changed only by the stream,
        |                   under cache.lock
        | version (epoch, seq) changed?  rebuild once, on the next request:
        v
    _Template               one per source and document version: the nova
        |                   objects rebuilt from the document (NUMATopology,
        |                   PciDeviceStats, MonitorMetricList, Instance stubs,
        |                   Aggregate objects, the numbers) and the attribute
        |                   dict of a HostState.  Never mutated once built.
        |                   Objects of namespaces the delta did not touch (by
        |                   value identity: values are replaced, never mutated)
        |                   are carried over, NUMA cells one by one, so a counter
        |                   change costs ~30 us per host instead of ~1 ms
        |                   (core/template.py).
        | every request: one dict.update
        v
    SharedHostState         one per host per request: the template's attributes
                            by reference, plus what belongs to the request alone:
                            ``limits`` and ``allocation_candidates`` (written by
                            the manager, NUMATopologyFilter, PciPassthroughFilter),
                            ``instances`` (copied on first access; the manager adds
                            stubs to it), ``updated``; and this scheduler's pending
                            claims subtracted.  Dropped with the request
                            (core/host_state.py).

Why per request: the manager *assigns* ``allocation_candidates`` and the
filters write ``limits``; with one shared HostState, concurrent requests (64 RPC
threads by default) would read each other's.  nova itself has built fresh
HostStates per request since Queens for a related reason.

Consumption: ``consume_from_request`` runs nova's own arithmetic on the view
only (PCI pools are copied first: ``apply_requests`` mutates them).  What the
next requests see comes from the cache: the compute's own report once it
includes the instance, and meanwhile, with ``register_claims``, a *pending
claim* (id = instance uuid) this manager records in the receiver's ledger right
after nova's placement claim succeeded; it carries what nova's consumption took
from the host's NUMA cells and PCI pools too (the difference of its before and
after), which every view built meanwhile takes again on copies of the host's
NUMA topology and PCI stats.  A pending claim is subtracted from the
view only while the host's ``instances`` namespace does not list its instance
(nova's ResourceTracker publishes usage and tracked instances in the same
change), so it is never subtracted twice, even if the compute side cannot list
claim ids; otherwise it retires when a delta lists it or at its deadline.  When
nova gives builds up (``SchedulerManager._cleanup_allocations``: a multi-create
that could not place every instance), :func:`install` has it cancel their
pending claims too, so they stop holding the hosts at once.

Claim announcement (design §5.2): with peers to tell (the cache's
``claim_announcer``), the host nova's manager claims first is announced to them
before placement answers, as an *intent* with the instance as claim id, and the
pending claim again once placement accepted it.  The intent is an explicit step
of the drop-in's decision, not of weighing: ``get_weighed_hosts`` only weighs
and orders (nova's order, or this scheduler's own host first with
``host_ownership``, a function of the rows and the live peers), and the
drop-in's manager (``report_client.AnnouncingSchedulerManager``, which
``nova-scheduler-shared``, the functional fixture and the simulator run) calls
:meth:`SharedHostManager.announce_intent` with the host nova's
``_get_sorted_hosts`` put first, after its pick among ``host_subset_size`` and
before ``_schedule`` claims it; only with ``host_subset_size = 1``.  nova's own
SchedulerManager over this host manager announces no intent (the accepted
claims still are).

State from its owners (design §2): each host's document from its compute;
service state, service and compute-node deletions and the aggregate catalogue
from the API-side sources (:mod:`.api_source`), whose newest word per host or
aggregate wins over the compute's copy; a host whose service or node was
deleted is not returned (as nova skips nodes without a service record).
nova's own fanout hints are overlays newer than the documents until a
document includes them: ``update_aggregates`` / ``delete_aggregate`` since
this process started, and ``update_instance_info`` / ``delete_instance_info``
/ ``sync_instance_info`` per host until the host's document lists the change
(at most ``instance_hint_ttl`` seconds).
The same aggregates, all of them (:meth:`SharedHostManager.aggregate_catalogue`),
answer nova's aggregate request filters once an API-side source was heard
(:mod:`.request_filters`, installed by :func:`install`).

Threads: views are built under ``cache.lock`` (so a request sees one version
of each host); filtering and weighing run without it, on objects nobody else
writes.  Templates and the aggregate overlay are changed only under the lock.

Recording: with an update log on the cache, every step nova's manager takes
here (a request's hosts, each filter and weigh outcome, consumption, the
fanout hints) is written to it through :mod:`.decision_log`, so ``shm replay
--decisions`` can re-run it with this same class (:mod:`.replay`); the wall
clock is :attr:`SharedHostManager.wall_clock` for that reason.

The contract: docs/design.md §5.5 (recording: §8).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import weakref
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from nova import objects
from nova.scheduler import host_manager as nova_host_manager

from protocol import hostdoc
from protocol.errors import LocalProtocolError
from protocol.messages import ANNOUNCED_ACCEPTED, ANNOUNCED_ALLOCATIONS, Claim
from shared_host_manager.decision.subset import PeerOwnership
from shared_host_manager.nova import decision_log, request_filters
from shared_host_manager.nova.api_source import ApiState, is_api_source
from shared_host_manager.nova.core import document as ndoc
from shared_host_manager.nova.core import vector
from shared_host_manager.nova.core.host_state import SharedHostState
from shared_host_manager.nova.core.template import USAGE_KEY, _Template, build_template, pending_effect
from shared_host_manager.nova.row_entries import SKIP, RowEntries
from shared_host_manager.placement.view import claimed_resources

LOG = logging.getLogger(__name__)

_EMPTY: dict[str, Any] = {}

# -- where the cache comes from ----------------------------------------------------

_cache_provider: Callable[[], Any] | None = None
_current: SharedHostManager | None = None
_managers: weakref.WeakSet[SharedHostManager] = weakref.WeakSet()
#: how many recorded claims cancel_claims can still find (nova cancels in the same request)
_CLAIMED_MEMORY = 65536
#: seconds an instance info hint overrides the documents at most (their next version
#: normally includes it within a second)
_INSTANCE_HINT_TTL = 60.0


def set_cache_provider(provider: Callable[[], Any] | None) -> None:
    """Tell SharedHostManager() (nova builds it without arguments) where its cache is.

    ``provider`` returns a :class:`~shared_host_manager.cache.HostStateCache`
    (anything with ``.lock``, ``.receiver``, ``.clock`` and, for host ownership,
    ``.peers``); it is called on
    first use, not at construction, so a scheduler that forks workers builds
    the cache (and its connections) in each worker.
    """
    global _cache_provider
    _cache_provider = provider


def current() -> SharedHostManager | None:
    """The SharedHostManager most recently built in this process."""
    return _current


def managers() -> list[SharedHostManager]:
    """Every SharedHostManager of this process still in use (nova builds one per scheduler
    service; an in-process nova may run several)."""
    return list(_managers)


def service_agrees(service: dict[str, Any], api_service: dict[str, Any]) -> bool:
    """True when the API side's record would change nothing of ``service`` (a template's
    service dict) that SharedHostState._make takes from it."""
    return (service["disabled"] is bool(api_service.get("disabled", False))
            and service["forced_down"] is bool(api_service.get("forced_down", False))
            and service["disabled_reason"] == api_service.get("disabled_reason"))


def _announce_allocations(claim: Claim, host: Any, accepted: bool) -> None:
    """Put in ``claim``'s request what its announcement tells the peers' placement views
    (design §11): the allocation request nova claims on ``host`` (the first of its
    ``allocation_candidates``; reading them fills a lazy host, as nova's claim is about to)
    and whether placement accepted it."""
    candidates = getattr(host, "allocation_candidates", None)
    if candidates:
        claim.request[ANNOUNCED_ALLOCATIONS] = claimed_resources(candidates[0])
        if accepted:
            claim.request[ANNOUNCED_ACCEPTED] = True


class LazyHostState(SharedHostState):
    """A SharedHostState that fills itself from its template on first use.

    get_host_states_by_uuids returns these *shells* (request rows + row
    number); the vector core decides from the rows' columns and only the
    hosts nova's manager then touches (the chosen one, alternates, or any host
    a filter without a vector form reads) become full SharedHostStates.
    Attributes set before (the manager's ``allocation_candidates``) win.
    """

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_tpl" in d or "_rows" not in d:
            raise AttributeError(name)
        self._materialize()
        return object.__getattribute__(self, name)

    def _materialize(self) -> None:
        d = self.__dict__
        rows = d["_rows"]
        row = d["_row"]
        rows.touched.add(row)
        rows.manager.counters["hosts_materialized"] += 1  # statistics: a lost increment is harmless
        api_service, hints = rows.overrides.get(row, (None, None))
        full = SharedHostState._make(rows.tpls[row], vector.snapshot(rows, row), rows.manager,
                                     rows.wall_offset, api_service, hints).__dict__
        full["aggregates"] = list(rows.aggs[row])
        cands = vector.candidates(rows, full["uuid"])
        if cands is not None:
            full["allocation_candidates"] = cands
        preset = dict(d)
        d.update(full)
        d.update(preset)

    @property
    def instances(self) -> dict[str, Any]:
        if "_tpl" not in self.__dict__:
            self._materialize()
        return super().instances

    @instances.setter
    def instances(self, value: dict[str, Any]) -> None:
        self.__dict__["_instances"] = value

    @property
    def updated(self) -> datetime.datetime | None:
        if "_tpl" not in self.__dict__:
            self._materialize()
        return self.__dict__["_updated"]

    @updated.setter
    def updated(self, value: datetime.datetime | None) -> None:
        self.__dict__["_updated"] = value


# -- the host manager ------------------------------------------------------------------------

class SharedHostManager(nova_host_manager.HostManager):
    """nova's HostManager, fed by the host-state stream; see the module docstring."""

    def __init__(self, cache: Any = None, *, register_claims: bool | None = None,
                 default_cell_uuid: str | None = None, vector_decisions: bool | None = None,
                 host_ownership: bool | None = None) -> None:
        global _current
        self._cache = cache
        self._cache_lock = threading.Lock()
        conf = _our_conf()
        if vector_decisions is None:
            vector_decisions = conf.vector_decisions if conf is not None else True
        #: decide with the vector core (vector.py); False: nova's handlers per host
        self.vector_decisions = bool(vector_decisions)
        self._vector_store = vector.Store()
        #: each source's request row, kept until it changes (row_entries.py)
        self._entries = RowEntries()
        if register_claims is None:
            register_claims = conf.register_claims if conf is not None else True
        self.register_claims = bool(register_claims)
        self.default_cell_uuid = default_cell_uuid or (conf.default_cell_uuid if conf is not None
                                                       else None)
        if host_ownership is None:
            host_ownership = conf.host_ownership if conf is not None else False
        #: put this scheduler's own best host first among the best (design §5.6)
        self.host_ownership = bool(host_ownership)
        self._ownership: PeerOwnership | None = None
        self._templates: dict[str, _Template] = {}
        #: ((applied, snapshots, sources), answer) of the last minimum_compute_version
        self._min_version: tuple[tuple[int, int, int], int | None] | None = None
        #: instance uuid -> host (source) of the pending claims this manager recorded, newest
        #: last; bounded: nova cancels within the request that claimed
        self._claimed: OrderedDict[str, str] = OrderedDict()
        self._agg_overlay: dict[str, Any] = {}
        self._agg_deleted: set[str] = set()
        self._agg_gen = 0
        #: (_agg_gen, every known aggregate) of the last _known_aggregates
        self._known: tuple[int, dict[str, Any]] | None = None
        #: what the API-side sources say (design §2), rebuilt when one of their versions changes
        self._api = ApiState()
        self._api_sources: list[str] = []
        #: (sources, snapshots applied) at the last scan for API-side sources; None: scan again
        self._api_scanned: tuple[int, int] | None = None
        self._deletion_epochs: dict[tuple[str, str], int | None] = {}
        #: nova's instance info fanout per host: {uuid: (added, retire after)}; see _hints_for
        self._inst_hints: dict[str, dict[str, tuple[bool, float]]] = {}
        self.instance_hint_ttl = _INSTANCE_HINT_TTL
        self.counters: Counter[str] = Counter()
        #: seconds spent per phase ("host_states", "filter", "weigh"), for benchmarks and metrics
        self.phase_seconds: defaultdict[str, float] = defaultdict(float)
        #: the wall clock (nova's service liveness is wall time); replay sets the recorded one
        self.wall_clock: Callable[[], float] = time.time
        #: this manager's steps in the cache's update log, if it has one (decision_log.py)
        self._steps = decision_log.StepLog(self)
        super().__init__()
        _current = self
        _managers.add(self)

    # -- the cache ---------------------------------------------------------------
    @property
    def cache(self) -> Any:
        """The host-state cache, built on first use: once, even when nova's RPC threads (a
        burst of ``sync_instance_info`` casts) all use it first at once."""
        if self._cache is None:
            with self._cache_lock:
                if self._cache is None:
                    if _cache_provider is None:
                        raise RuntimeError(
                            "SharedHostManager has no host-state cache: call "
                            "shared_host_manager.nova.host_manager.set_cache_provider() first "
                            "(nova-scheduler-shared does)")
                    self._cache = _cache_provider()
        return self._cache

    @property
    def built_cache(self) -> Any:
        """The cache if it was built (None: not used yet); builds nothing."""
        return self._cache

    # -- nova's start-up hooks: no database ------------------------------------------
    def refresh_cells_caches(self) -> None:
        """The cells the held hosts belong to (nova: CellMappingList from the API DB).

        Called by nova's ``__init__`` (the cache may not exist yet there: then no
        cells) and on SIGHUP.  Cell stubs carry uuid and name only.
        """
        uuids: set[str] = set()
        if self._cache is not None:
            with self._cache.lock:
                for view in self._cache.receiver.sources.values():
                    c = (view.doc or _EMPTY).get(hostdoc.COMPUTE)
                    if c:
                        cell = c.get("cell_uuid") or self.default_cell_uuid
                        if cell:
                            uuids.add(cell)
        elif self.default_cell_uuid:
            uuids.add(self.default_cell_uuid)
        self.cells = {u: objects.CellMapping(uuid=u, name=u, disabled=False) for u in sorted(uuids)}
        self.enabled_cells = list(self.cells.values())
        self.host_to_cell_uuid: dict[str, str] = {}

    def _init_aggregates(self) -> None:
        """nova loads every aggregate from the API DB here; ours come with the stream."""

    def _init_instance_info(self, computes_by_cell: Any = None) -> None:
        """nova loads every instance from the cell DBs here; ours come with the stream."""

    # -- the decision path -----------------------------------------------------------------
    def get_host_states_by_uuids(self, context: Any, compute_uuids: list[str] | None,
                                 spec_obj: Any) -> Iterator[SharedHostState]:
        """Per-request HostStates of the given compute nodes (None: all), from the cache.

        Only hosts the cache holds and hears from (ACTIVE) are returned: a source
        that went silent is not eligible.  The requested cell restriction is
        nova's (a requested_destination cell without allow_cross_cell_move).
        """
        only_cell = None
        if (spec_obj and "requested_destination" in spec_obj and spec_obj.requested_destination
                and "cell" in spec_obj.requested_destination
                and not spec_obj.requested_destination.allow_cross_cell_move):
            only_cell = spec_obj.requested_destination.cell.uuid
        started = time.perf_counter()
        cache = self.cache
        logged_spec = self._steps.spec(spec_obj)
        with cache.lock:
            # a service change an API call has returned from counts in this request (its
            # fence, design §2); the lock is released while the stream brings it
            cache.await_fences()
            # the peers' claims that arrived while the lock was taken count in this request
            cache.apply_peer_claims()
            sources = cache.receiver.sources
            now = cache.clock()
            wall_offset = self.wall_clock() - now
            api = self._api_state(sources)
            out = vector.HostRows(self, self._vector_store, wall_offset, LazyHostState,
                                  pending_effect)
            kept = self._entries
            kept.begin(cache.receiver, (api, self._agg_gen, self.default_cell_uuid),
                       self._inst_hints)
            uuids = list(sources) if compute_uuids is None else compute_uuids
            held = kept.held.get
            found = [held(u) for u in uuids]
            # every kept entry is looked up before the first new one is kept
            entries = [self._entry(u, sources.get(u), api, now, kept) if e is None else e
                       for u, e in zip(uuids, found, strict=True)]
            entries = [e for e in entries if e is not SKIP]
            if only_cell is not None:
                entries = [e for e in entries if e[0][0].cell_uuid == only_cell]
            out.add_entries(entries)
            templates = self._templates
            if len(templates) > 2 * len(sources) + 64:
                for source in [s for s in templates if s not in sources]:
                    del templates[source]
            out.seal()
            self.counters["requests"] += 1
            self._steps.hosts(out, logged_spec, now, wall_offset + now, cache.peers)
        self.phase_seconds["host_states"] += time.perf_counter() - started
        return out

    def get_filtered_hosts(self, hosts: Any, spec_obj: Any, index: int = 0) -> Any:
        """nova's get_filtered_hosts, decided by the vector core on our hosts (see vector.py).

        Hosts that are not this manager's per-request rows go to nova's handler.
        """
        started = time.perf_counter()
        wall = self.wall_clock()
        try:
            out, rows = self._filtered(hosts, spec_obj, index)
        finally:
            self.phase_seconds["filter"] += time.perf_counter() - started
        self._steps.filtered(rows, spec_obj, index, out, wall)
        return out

    def _filtered(self, hosts: Any, spec_obj: Any, index: int) -> tuple[Any, vector.HostRows | None]:
        """(get_filtered_hosts' answer, the request rows the hosts are, if they are ours)."""
        hosts = vector.take_over(hosts)
        idx: list[int] | None = None
        rows: vector.HostRows | None
        if type(hosts) is vector.HostRows:
            rows = hosts
            hosts = rows.shells[rows._pos:]
            idx = list(range(rows._pos, len(rows.shells)))
            if rows.alloc_reqs is not None:
                self.counters["candidates_taken_over"] += 1
        else:
            hosts = list(hosts)
            rows = vector.rows_of(hosts)
        if rows is None or not self.vector_decisions:
            return super().get_filtered_hosts(hosts, spec_obj, index), rows
        self.counters["vector_filtered"] += 1
        if idx is None:
            idx = [h.__dict__["_row"] for h in hosts]
        idx, skip_filters = vector.pre_filter(rows, idx, spec_obj)
        if not skip_filters:
            left = vector.run_filters(self.enabled_filters, rows, idx, spec_obj, index, self.counters)
            if left is None:
                return None, rows
            idx = left
        shells = rows.shells
        out = vector.Hosts(shells if len(idx) == len(shells) and idx == list(range(len(shells)))
                           else [shells[i] for i in idx])
        out.rows, out.idx = rows, idx
        return out, rows

    def get_weighed_hosts(self, hosts: Any, spec_obj: Any) -> Any:
        """nova's get_weighed_hosts, by the vector core on our hosts (see vector.py)."""
        started = time.perf_counter()
        try:
            weighed = self._weighed(hosts, spec_obj)
        finally:
            self.phase_seconds["weigh"] += time.perf_counter() - started
        if weighed:
            self._steps.weighed(weighed[0].obj.__dict__.get("_rows"), weighed)
        return weighed

    def announce_intent(self, host: Any, spec_obj: Any) -> bool:
        """Tell the peers ``host`` is the one nova's manager claims first in placement for
        ``spec_obj``'s instance; returns whether it was announced.

        The drop-in's manager calls it once nova's ``_get_sorted_hosts`` put ``host`` first
        (``report_client.AnnouncingSchedulerManager``), so the peers deduct it from now, not
        from when placement answered, hundreds of milliseconds later (design §5.2), in their
        host states and, through the allocation request it carries, in their placement views
        (design §11).  The claim recorded after placement accepted has the same id, so a peer
        holds it once; an intent placement refused is held until peer_claim_ttl (in a
        placement view at most placement_max_staleness, or until nova's next host accepted
        it)."""
        announce = self.cache.claim_announcer
        instance = spec_obj.instance_uuid if "instance_uuid" in spec_obj else None
        # only with nova's host_subset_size = 1, the setting the intent was measured with
        # (design §5.2); a larger subset is nova's own spreading of racing schedulers.  An
        # instance claimed already (nova sorts the hosts again for its alternates) claims
        # nothing more: an intent would hold that host at every peer for nothing.  (A move of
        # an instance this scheduler placed lately goes unannounced too; its claim after
        # placement's answer is still announced)
        if announce is None or not instance or instance in self._claimed \
                or nova_host_manager.CONF.filter_scheduler.host_subset_size != 1:
            return False
        d = host.__dict__
        tpl = d["_rows"].tpls[d["_row"]] if "_rows" in d and "_tpl" not in d else d.get("_tpl")
        if tpl is None:
            return False  # not one of our hosts (nova's own HostState): no version to claim on
        claim = self._claim(vector.node_uuid(host), tpl.version, spec_obj, instance)
        _announce_allocations(claim, host, accepted=False)
        announce(claim)
        self.counters["intents_announced"] += 1
        return True

    def _claim(self, source: str, version: tuple[int, int], spec_obj: Any, instance: str,
               usage: dict[str, Any] | None = None) -> Claim:
        """This scheduler's claim of ``spec_obj``'s resources on ``source`` for ``instance``
        (id = the instance), against the host's version it decided on."""
        epoch, seq = version
        return Claim(claim_id=instance, scheduler=self.cache.receiver.name, source=source,
                     epoch=epoch, seq=seq,
                     resources={"vcpus": spec_obj.vcpus, "memory_mb": spec_obj.memory_mb,
                                "disk_gb": spec_obj.root_gb + spec_obj.ephemeral_gb},
                     instance=instance, request={USAGE_KEY: usage} if usage else {})

    def _weighed(self, hosts: Any, spec_obj: Any) -> Any:
        weighed = self._weighed_as_nova(hosts, spec_obj)
        return self._owned_first(weighed) if self.host_ownership else weighed

    def _owned_first(self, weighed: list[Any]) -> list[Any]:
        """The best host this scheduler owns among the live peers, moved to the front, if it
        is among the best 2 x peers (design §5.6); nova's order otherwise and behind it."""
        cache = self.cache
        me = cache.receiver.name
        peers = cache.peers
        if len(set(peers) | {me}) < 2 or len(weighed) < 2:
            return weighed
        ownership = self._ownership
        if ownership is None or ownership.peers != sorted(set(peers) | {me}):
            ownership = self._ownership = PeerOwnership(me, list(peers))
        for j in range(min(len(weighed), 2 * len(ownership.peers))):
            if ownership.owns(vector.node_uuid(weighed[j].obj)):
                self.counters["owned_choices"] += 1
                return [weighed[j], *weighed[:j], *weighed[j + 1:]] if j else weighed
        self.counters["no_owned_choice"] += 1
        return weighed

    def _weighed_as_nova(self, hosts: Any, spec_obj: Any) -> Any:
        if type(hosts) is vector.Hosts and self.vector_decisions:
            self.counters["vector_weighed"] += 1
            return vector.weigh(self.weighers, hosts.rows, hosts.idx, spec_obj, self.counters)
        hosts = list(hosts)
        rows = vector.rows_of(hosts) if self.vector_decisions else None
        if rows is None:
            return super().get_weighed_hosts(hosts, spec_obj)
        self.counters["vector_weighed"] += 1
        return vector.weigh(self.weighers, rows, [h.__dict__["_row"] for h in hosts], spec_obj,
                            self.counters)

    def _entry(self, source: str, view: Any, api: ApiState, now: float,
               kept: RowEntries) -> tuple[Any, ...]:
        """One source's request row (vector.HostRows.add_entries), or SKIP where nova would not
        list it; kept for the next requests when clean (row_entries.py)."""
        if view is None:
            return SKIP
        entry: tuple[Any, ...] = SKIP
        if view.doc is not None and not view.down:
            tpl = self._templates.get(source)
            if tpl is None or tpl.version != view.version:
                tpl = self._rebuild(view, tpl)
            if tpl is not None:
                entry = self._row_of(tpl, view, api, now)
            if len(entry) > 3:
                return entry
        kept.keep(source, entry[0][0].host if entry is not SKIP else None, entry)
        return entry

    def _row_of(self, tpl: _Template, view: Any, api: ApiState, now: float) -> tuple[Any, ...]:
        api_service = api.services.get(tpl.host)
        if api_service is not None and api_service.get("deleted") \
                and self._still_deleted(("service", tpl.host), api_service, view, tpl):
            return SKIP  # nova skips compute nodes without a service record
        if api_service is not None and service_agrees(tpl.service, api_service):
            # nova-conductor records every compute's service when it is created: most rows
            # have a record that says what the compute's own document says, and an override
            # that changes nothing would cost every request a per-row step (design §5.6)
            api_service = None
        node = api.nodes.get(view.source)
        if node is not None and node.get("deleted") \
                and self._still_deleted(("node", view.source), node, view, tpl):
            return SKIP
        if tpl.agg_gen != self._agg_gen:
            tpl.aggregates = self._aggregates_for(tpl.host, view.doc)
            tpl.agg_gen = self._agg_gen
        rec = self._vector_store.record(tpl, self._agg_gen)
        hints = self._hints_for(tpl, now) if self._inst_hints else None
        if hints or view.pending or view.peer:
            return (rec, api_service, view, hints or None)
        return (rec, api_service, view)

    def get_all_host_states(self, context: Any) -> Iterator[SharedHostState]:
        """Every eligible host (nova 34 has no such method any more; kept for callers that do)."""
        return self.get_host_states_by_uuids(context, None, None)

    def _api_state(self, sources: Any) -> ApiState:
        """The API-side sources' merged state (design §2), rebuilt when one of them changed.

        Which sources are API-side is rescanned when a source comes, when any source
        takes a snapshot (a new epoch's document may say otherwise), and on every
        request while a source that is not known as API-side has an empty document (a
        source that predates the ``api`` namespace says what it is with its first change)."""
        receiver = self.cache.receiver
        scan_key = (len(sources), receiver.stats["snapshots"])
        if scan_key != self._api_scanned:
            found = []
            unsettled = False
            for source, view in sources.items():
                if is_api_source(view.doc):
                    found.append(source)
                elif not view.doc:
                    unsettled = True
            self._api_sources = found
            self._api_scanned = None if unsettled else scan_key
        views = [sources[s] for s in self._api_sources if s in sources]
        key = tuple((v.source, v.version) for v in views)
        if key != self._api.key:
            catalogue = self._api.catalogue
            previous = self._api
            self._api = ApiState.from_views(views)
            self._note_deletions(sources, previous)
            if self._api.catalogue != catalogue:
                self._agg_gen += 1
                self._retire_aggregate_hints()
            self.counters["api_state_builds"] += 1
        return self._api

    def _note_deletions(self, sources: Any, previous: ApiState) -> None:
        """Remember, per deleted service or node, the newest epoch its hosts had when the
        deletion was learnt: nova revives a deleted compute node (and creates a service again)
        when the compute starts again, which the compute publishes in a newer epoch."""
        marks: dict[tuple[str, str], int | None] = {}
        host_epochs: dict[str, int] | None = None
        for kind, entries, old in (("service", self._api.services, previous.services),
                                   ("node", self._api.nodes, previous.nodes)):
            for key, entry in entries.items():
                if not entry.get("deleted"):
                    continue
                mark_key = (kind, key)
                held = old.get(key)
                if held is not None and held.get("changed") == entry.get("changed") \
                        and mark_key in self._deletion_epochs:
                    marks[mark_key] = self._deletion_epochs[mark_key]
                elif kind == "node":
                    view = sources.get(key)
                    marks[mark_key] = view.epoch if view is not None and view.doc is not None else None
                else:
                    if host_epochs is None:
                        host_epochs = {}
                        for view in sources.values():
                            c = (view.doc or _EMPTY).get(hostdoc.COMPUTE)
                            if c and c.get("host"):
                                host = c["host"]
                                host_epochs[host] = max(host_epochs.get(host, view.epoch), view.epoch)
                    marks[mark_key] = host_epochs.get(key)
        self._deletion_epochs = marks

    def _still_deleted(self, mark_key: tuple[str, str], entry: dict[str, Any], view: Any,
                       tpl: _Template) -> bool:
        """A deletion holds until the host publishes a newer epoch than it had when the
        deletion was learnt, or a node record updated after the deletion."""
        epoch = self._deletion_epochs.get(mark_key)
        if epoch is not None and view.epoch > epoch:
            return False
        updated = tpl.attrs.get("_updated")
        changed = entry.get("changed")
        return not (updated is not None and type(changed) in (int, float) and updated.timestamp() > changed)

    def _retire_aggregate_hints(self) -> None:
        """The fanout's aggregates the catalogue now includes stop overriding it."""
        catalogue = self._api.catalogue
        for agg_uuid, agg in list(self._agg_overlay.items()):
            entry = catalogue.get(agg_uuid)
            if entry is not None and not entry.get("deleted") and entry.get("name") == agg.name \
                    and entry.get("metadata") == dict(agg.metadata or {}) \
                    and sorted(entry.get("hosts") or ()) == sorted(agg.hosts or ()):
                del self._agg_overlay[agg_uuid]
        for agg_uuid in list(self._agg_deleted):
            entry = catalogue.get(agg_uuid)
            if entry is not None and entry.get("deleted"):
                self._agg_deleted.discard(agg_uuid)

    def _hints_for(self, tpl: _Template, now: float) -> dict[str, bool] | None:
        """The host's live instance hints, retiring those the document now includes
        (an added instance it lists) or that outlived ``instance_hint_ttl``."""
        hints = self._inst_hints.get(tpl.host)
        if not hints:
            return None
        listed = tpl.doc_instances
        live: dict[str, bool] = {}
        for uuid, (added, until) in list(hints.items()):
            if until <= now or (added and uuid in listed):
                del hints[uuid]
            else:
                live[uuid] = added
        if not hints:
            del self._inst_hints[tpl.host]
        return live

    def _rebuild(self, view: Any, previous: _Template | None) -> _Template | None:
        try:
            tpl = build_template(view.source, view, self.default_cell_uuid, previous)
        except Exception:  # one bad document must not take every request down
            LOG.exception("cannot build a HostState from the document of %s at version %s",
                          view.source, view.version)
            self.counters["bad_documents"] += 1
            return None
        self.counters["templates_built"] += 1
        if tpl is None:
            self._templates.pop(view.source, None)
        else:
            self._templates[view.source] = tpl
        return tpl

    def _aggregates_for(self, host: str, doc: Any) -> list[Any]:
        """The host's aggregates: those of :meth:`_known_aggregates` it is in, and those of
        the host's document nothing newer knows of (design §2)."""
        overlay = self._agg_overlay
        deleted = self._agg_deleted
        catalogue = self._api.catalogue
        out: dict[str, Any] = {}
        for agg_uuid, entry in (doc.get(hostdoc.AGGREGATES) or _EMPTY).items():
            if agg_uuid in overlay or agg_uuid in deleted or agg_uuid in catalogue \
                    or type(entry) is not dict:
                continue
            out[agg_uuid] = _aggregate(agg_uuid, entry, [host])
        for agg_uuid, agg in self._known_aggregates().items():
            if host in (agg.hosts or ()):
                out[agg_uuid] = agg
        return [out[u] for u in sorted(out)]

    def _known_aggregates(self) -> dict[str, Any]:
        """Every aggregate the API side's catalogue and nova's fanout since start know of, as
        nova Aggregate objects (shared by every host in them, as nova's HostManager shares
        its own), rebuilt when ``_agg_gen`` moves (caller holds the cache's lock).

        The API side's catalogue is newer than the compute's periodic re-read, and ordered
        (a versioned source): nova's fanout casts are not, one cast of a create, a metadata
        change and an add_host may arrive after the next, so the fanout counts only for the
        aggregates the catalogue does not have (no API-side source, or one not heard yet)."""
        memo = self._known
        if memo is not None and memo[0] == self._agg_gen:
            return memo[1]
        deleted = self._agg_deleted
        catalogue = self._api.catalogue
        known: dict[str, Any] = {}
        for agg_uuid, entry in catalogue.items():
            if agg_uuid in deleted or entry.get("deleted"):
                continue
            known[agg_uuid] = _aggregate(agg_uuid, entry, list(entry.get("hosts") or ()))
        for agg_uuid, agg in self._agg_overlay.items():
            if agg_uuid not in catalogue:
                known[agg_uuid] = agg
        self._known = (self._agg_gen, known)
        return known

    def aggregate_catalogue(self) -> list[Any] | None:
        """Every host aggregate, for nova's request filters (:mod:`.request_filters`): the
        aggregates :meth:`_known_aggregates` holds once an API-side source was heard (its
        document holds every aggregate from its start, hosts or not); None before, when
        they would be only those nova's fanout told of since this process started.

        As a request's hosts are (:meth:`get_host_states_by_uuids`), after the fences of
        the API calls that returned (design §2)."""
        cache = self.cache
        with cache.lock:
            cache.await_fences()
            api = self._api_state(cache.receiver.sources)
            if not api.key:
                return None
            return list(self._known_aggregates().values())

    def _consumed(self, host_state: SharedHostState, spec_obj: Any,
                  usage: dict[str, Any] | None = None) -> None:
        """Record the placement-claimed instance as pending on the host (register_claims)."""
        if not self.register_claims:
            return
        instance = spec_obj.instance_uuid if "instance_uuid" in spec_obj else None
        if not instance:
            return
        claim = self._claim(host_state.uuid, host_state._tpl.version, spec_obj, instance, usage)
        cache = self.cache
        with cache.lock:
            try:
                cache.receiver.add_claim(claim, cache.clock())
            except LocalProtocolError as exc:  # already pending (a retry), or the host just vanished
                LOG.debug("pending claim for %s not recorded: %s", instance, exc)
                self.counters["claims_not_recorded"] += 1
                return
            self.counters["claims_recorded"] += 1
            self._claimed[instance] = host_state.uuid
            self._claimed.move_to_end(instance)
            while len(self._claimed) > _CLAIMED_MEMORY:
                self._claimed.popitem(last=False)
        host_state._claim_id = instance
        announce = cache.claim_announcer
        if announce is not None:
            # placement accepted it: the peer schedulers deduct it until the host lists the
            # instance (design §5.2), instead of choosing the same host until then
            _announce_allocations(claim, host_state, accepted=True)
            announce(claim)
            self.counters["claims_announced"] += 1

    def cancel_claims(self, instance_uuids: Any) -> int:
        """Stop deducting our pending claims of these instances (their builds were given up).

        Returns how many were still pending."""
        cache = self.cache
        cancelled = 0
        with cache.lock:
            for instance in instance_uuids:
                source = self._claimed.pop(instance, None)
                if source is not None and cache.receiver.cancel_claim(source, instance):
                    cancelled += 1
        self.counters["claims_cancelled"] += cancelled
        return cancelled

    # -- forced hosts and nodes ------------------------------------------------------------
    def get_compute_nodes_by_host_or_node(self, ctxt: Any, host: str | None, node: str | None,
                                          cell: Any = None) -> Any:
        """ComputeNodes matching a forced/requested host and/or node, rebuilt from the documents."""
        cell_uuid = cell.uuid if cell is not None else None
        found = []
        cache = self.cache
        with cache.lock:
            for view in cache.receiver.sources.values():
                doc = view.doc
                c = (doc or _EMPTY).get(hostdoc.COMPUTE)
                if not c:
                    continue
                if host and c.get("host") != host:
                    continue
                if node and c.get("nodename") != node:
                    continue
                if cell_uuid and (c.get("cell_uuid") or self.default_cell_uuid) != cell_uuid:
                    continue
                found.append((view.source, doc))
            nodes = [ndoc.compute_node_from_document(source, doc) for source, doc in found]
        return objects.ComputeNodeList(objects=nodes)

    # -- RPC feeds ---------------------------------------------------------------------------
    def update_aggregates(self, aggregates: Any) -> None:
        """nova's update_aggregates fanout: newer than any document, applied at once."""
        aggs = aggregates if isinstance(aggregates, (list, objects.AggregateList)) else [aggregates]
        cache = self.cache
        with cache.lock:
            self._steps.feed("aggregates", cache.clock(),
                             aggregates=[agg.obj_to_primitive() for agg in aggs])
            for agg in aggs:
                self._agg_overlay[agg.uuid] = agg
                self._agg_deleted.discard(agg.uuid)
            self._agg_gen += 1
            self.counters["aggregate_updates"] += 1

    def delete_aggregate(self, aggregate: Any) -> None:
        cache = self.cache
        with cache.lock:
            self._steps.feed("delete_aggregate", cache.clock(), uuid=aggregate.uuid)
            self._agg_overlay.pop(aggregate.uuid, None)
            self._agg_deleted.add(aggregate.uuid)
            self._agg_gen += 1
            self.counters["aggregate_deletes"] += 1

    # nova-compute casts these (rpcapi 4.2) to every scheduler.  The host's ``instances``
    # namespace carries the same information, versioned, but may come later (a move is
    # confirmed before the source's tracker publishes it): each one is an overlay on the
    # host's documents until a document includes it, at most ``instance_hint_ttl`` seconds.
    def update_instance_info(self, context: Any, host_name: str, instance_info: Any) -> None:
        objs = instance_info.objects if hasattr(instance_info, "objects") else (
            instance_info if isinstance(instance_info, list) else [instance_info])
        self._hint(host_name, {inst.uuid: True for inst in objs})

    def delete_instance_info(self, context: Any, host_name: str, instance_uuid: str) -> None:
        self._hint(host_name, {instance_uuid: False})

    def sync_instance_info(self, context: Any, host_name: str, instance_uuids: list[str]) -> None:
        """The compute's full list: what the documents of the host list beyond it is hidden,
        what they miss is added, each until a document agrees."""
        wanted = set(instance_uuids)
        cache = self.cache
        with cache.lock:
            listed: set[str] = set()
            for view in cache.receiver.sources.values():
                c = (view.doc or _EMPTY).get(hostdoc.COMPUTE)
                if c and c.get("host") == host_name:
                    listed.update(view.doc.get(hostdoc.INSTANCES) or _EMPTY)
        hints = {u: True for u in wanted - listed}
        hints.update({u: False for u in listed - wanted})
        self._hint(host_name, hints, replace=True)

    def _hint(self, host: str, hints: dict[str, bool], replace: bool = False) -> None:
        cache = self.cache
        with cache.lock:
            self._steps.feed("hint", cache.clock(), host=host, hints=hints, replace=replace)
            until = cache.clock() + self.instance_hint_ttl
            held = self._inst_hints.setdefault(host, {})
            if replace:
                held.clear()
            for uuid, added in hints.items():
                held[uuid] = (added, until)
            if not held:
                del self._inst_hints[host]
            self.counters["instance_info_hints"] += 1

    # -- request filter support -----------------------------------------------------------
    def minimum_compute_version(self) -> int | None:
        """Lowest nova-compute service version the held hosts publish (None: someone does not)."""
        with self.cache.lock:
            receiver = self.cache.receiver
            sources = receiver.sources
            # nova asks on every request; a document changes only by an applied delta or
            # snapshot, and a source comes or goes only with the count or a snapshot
            key = (receiver.stats["applied"], receiver.stats["snapshots"], len(sources))
            memo = self._min_version
            if memo is not None and memo[0] == key:
                return memo[1]
            versions: list[int] = []
            lowest: int | None = None
            for view in sources.values():
                doc = view.doc
                if not doc or not doc.get(hostdoc.COMPUTE):
                    continue
                version = (doc.get(hostdoc.SERVICE) or _EMPTY).get("version")
                if type(version) is not int:
                    break
                versions.append(version)
            else:
                lowest = min(versions) if versions else None
            self._min_version = (key, lowest)
            return lowest


def _aggregate(agg_uuid: str, entry: dict[str, Any], hosts: list[str]) -> Any:
    meta = entry.get("metadata")
    agg = objects.Aggregate(uuid=agg_uuid, name=str(entry.get("name") or ""),
                            metadata={str(k): str(v) for k, v in (meta or {}).items()},
                            hosts=hosts)
    if type(entry.get("id")) is int:
        agg.id = entry["id"]
    return agg


def _our_conf() -> Any:
    """``CONF.shared_host_manager`` if nova's CONF has our options registered."""
    import nova.conf

    try:
        return nova.conf.CONF.shared_host_manager
    except Exception:  # not registered (tests, embedded use): constructor arguments decide
        return None


# -- installing into nova -------------------------------------------------------------------

_originals: dict[str, Any] = {}


def install(*, min_version_from_stream: bool = True, request_filters_from_stream: bool = True,
            ) -> None:
    """Make nova's SchedulerManager build a SharedHostManager (and serve the owner filter's
    minimum-version question from the stream, answer the aggregate request filters from the
    aggregate catalogue (:mod:`.request_filters`), and cancel our pending claims of the
    instances whose allocations it cleans up).  Idempotent; :func:`uninstall` undoes it.

    ``SchedulerManager.__init__`` looks ``host_manager.HostManager`` up at call
    time, so this must run before the manager is built.
    """
    from nova.scheduler import manager as nova_manager
    from nova.scheduler import request_filter

    if "HostManager" not in _originals:
        _originals["HostManager"] = nova_host_manager.HostManager
        _originals["_should_filter_by_owner"] = request_filter._should_filter_by_owner
        _originals["_cleanup_allocations"] = nova_manager.SchedulerManager._cleanup_allocations
    nova_host_manager.HostManager = SharedHostManager
    nova_manager.SchedulerManager._cleanup_allocations = _cleanup_allocations
    if min_version_from_stream:
        request_filter._should_filter_by_owner = _should_filter_by_owner
    else:
        request_filter._should_filter_by_owner = _originals["_should_filter_by_owner"]
    if request_filters_from_stream:
        request_filters.install(_aggregate_catalogue)
    else:
        request_filters.uninstall()


def uninstall() -> None:
    from nova.scheduler import manager as nova_manager
    from nova.scheduler import request_filter

    if "HostManager" in _originals:
        nova_host_manager.HostManager = _originals.pop("HostManager")
        request_filter._should_filter_by_owner = _originals.pop("_should_filter_by_owner")
        nova_manager.SchedulerManager._cleanup_allocations = _originals.pop("_cleanup_allocations")
    request_filters.uninstall()


def _aggregate_catalogue() -> list[Any] | None:
    """The aggregate request filters' catalogue: the current manager's (None: none built yet,
    or no API-side source heard)."""
    manager = _current
    return manager.aggregate_catalogue() if manager is not None else None


def _cleanup_allocations(manager: Any, context: Any, instance_uuids: Any) -> None:
    """nova's SchedulerManager._cleanup_allocations, then our pending claims of those instances.

    nova calls it when a multi-create cannot place every instance: the builds
    that were claimed in placement will not happen, so their pending claims
    must stop holding the hosts' resources (else they would until their deadline).
    """
    try:
        _originals["_cleanup_allocations"](manager, context, instance_uuids)
    finally:
        host_manager = getattr(manager, "host_manager", None)
        if isinstance(host_manager, SharedHostManager) and instance_uuids:
            host_manager.cancel_claims(instance_uuids)


def _should_filter_by_owner(context: Any) -> bool:
    """nova's request_filter._should_filter_by_owner, answered from the stream when it can."""
    from nova.scheduler import request_filter

    manager = _current
    conf = _our_conf()
    use_stream = conf.min_compute_version_from_stream if conf is not None else True
    version = manager.minimum_compute_version() if manager is not None and use_stream else None
    if version is None:
        return _originals["_should_filter_by_owner"](context)
    if version < request_filter.MIN_COMPUTE_VERSION_OWNER_TRAIT:
        LOG.warning("OWNER_NOVA trait not added to scheduling request: not all nova-compute "
                    "services are upgraded (min_version=%d, need %d).",
                    version, request_filter.MIN_COMPUTE_VERSION_OWNER_TRAIT)
        return False
    return True


__all__ = ["SharedHostManager", "current", "install", "set_cache_provider", "uninstall"]
