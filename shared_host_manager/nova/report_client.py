"""The drop-in scheduler's placement client: allocation candidates from memory when memory answers exactly.

Role
----
nova 34's ``SchedulerManager._select_destinations`` asks placement for
allocation candidates on every request (``placement_client.
get_allocation_candidates(context, resources)``), then claims one of them
(``claim_resources``).  The query is most of a drop-in decision's time.
:class:`SharedReportClient` is nova's ``SchedulerReportClient`` (the
scheduler's placement client, nova's shape) with two methods extended:

* ``get_allocation_candidates``: the querystring nova's method would send
  (``resources.to_querystring()``, microversion ``report.SAME_SUBTREE_VERSION``)
  goes first to the scheduler's copy of placement's providers, a
  ``PlacementView`` (``shared_host_manager/placement/view.py``, fed by the
  placement feed through the stream and held by the
  :class:`~shared_host_manager.service.SchedulerService` as
  ``placement_view``).  When the view answers, the result is what nova's own
  method returns for that body: ``(allocation_requests, provider_summaries,
  version)``.  The view answers once it holds a poll of the feed begun after
  the request arrived at nova's API (the context's ``timestamp``), waiting up
  to ``[shared_host_manager] placement_fresh_wait`` for one: a write to
  placement that returned before the request was made is in the answer
  (read-your-writes; an aggregate's new host, say).  When it does not answer
  (a request outside the covered set, no feed, a stale view, no such poll in
  time: the view's :class:`~shared_host_manager.placement.Unanswered`
  reason), nova's own method asks placement.  Both are counted, the
  fallbacks per reason.
* ``claim_resources``: nova's own method claims in placement, which stays the
  arbiter.  An accepted claim is told to the view (``note_claim``: the
  allocation request's resources per provider), so the next answers count it
  before the feed does.  A refused one (nova's method returns False: capacity,
  or provider generation conflicts beyond nova's retries) means the view may
  have been behind: the providers of that allocation request are read back
  from placement and given to the view (``correct``), so the same provider is
  not offered again for what it cannot hold.  nova itself goes on to the next
  host, as with any refused claim.  A claim the view already knows placement
  refuses (``over_capacity``: the feed's copy and this scheduler's own claims
  leave no room; the host filled while nova worked down its sorted list) is
  not sent: it returns False as placement's refusal would, and is counted
  (``claims_skipped``).

The answers' bodies are the view's cached objects, shared by every answer:
read-only for nova (its manager only reads them; its ``claim_resources``
deep-copies the allocation request it sends).

Placement's options that change the answer (``[placement]
randomize_allocation_candidates``, ``max_allocation_candidates``,
``[workarounds] optimize_for_wide_provider_trees``) are not visible from the
scheduler: ``[shared_host_manager] placement_*`` repeat them in nova.conf
(:mod:`.conf`) and the client makes them the view's ``config`` (a
:class:`~shared_host_manager.placement.PlacementConfig`) when it first
reaches the view.

How it gets into nova (the hook)
--------------------------------
nova's manager reads its client through one property,
``SchedulerManager.placement_client`` (``report.report_client_singleton()``,
one client per process).  The drop-in overrides that property in a subclass,
:class:`SharedSchedulerManager` (which also announces the host nova claims
first, a step after nova's ``_get_sorted_hosts``: :class:`AnnouncingSchedulerManager`,
see :mod:`.host_manager`), and names the subclass in nova's own table of
the class each service binary runs, ``nova.service.SERVICE_MANAGERS
['nova-scheduler']`` (read by ``Service.create``; nova has no configuration
option for it since Rocky): :func:`install`, called by
``nova-scheduler-shared`` (:mod:`.cmd`) before nova builds its service, and
by the functional fixture.  Chosen over the alternatives because it touches
only the scheduler service: replacing ``report.SchedulerReportClient`` or
presetting ``report.PLACEMENTCLIENT`` would also change the client of every
other user of nova's singleton in the process (the conductor and the
computes in an in-process nova), and a singleton must be built before
``nova.conf`` is parsed.  Each manager gets its own client, so several
schedulers in one process (nova's functional tests) each reach their own
view.

Where the view comes from: :func:`set_view_provider` names a function of the
manager's host manager that returns the view (``nova-scheduler-shared``: its
SchedulerService's ``placement_view``; the fixture: the service it built for
that host manager), looked up on every request until it returns one (the
service is built in the worker, after the manager).

Counted (thread-safe; nova runs 64 RPC threads): ``from_memory``,
``from_placement``, ``by_reason`` (fallbacks per reason), ``requests`` (per
kind: ``allocation_candidates`` sent to placement, ``claim``,
``claim_refused``, ``correction_read``) and ``placement_queries`` (the read
requests sent to placement: candidate queries and correction reads);
:class:`ReportClientCollector` shows them as ``shm_placement_requests_total
{kind}`` and ``shm_allocation_candidates_total{source,reason}`` on the
scheduler's ``/metrics``.

Life cycle: built with its manager (nova builds the manager in the parent
process, before it forks its workers: the client holds no view, thread or
connection of ours then); reaches its view on the first request in a worker;
ends with the process.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from nova.scheduler import manager as nova_manager
from nova.scheduler.client import report

from shared_host_manager.nova.host_manager import SharedHostManager
from shared_host_manager.placement import PlacementConfig, Unanswered
from shared_host_manager.placement.view import claimed_resources

LOG = logging.getLogger(__name__)

#: the import path nova's Service.create builds for nova-scheduler once :func:`install` ran
MANAGER_PATH = "shared_host_manager.nova.report_client.SharedSchedulerManager"
#: the kinds of ``requests`` (``shm_placement_requests_total{kind}``)
REQUEST_KINDS = ("allocation_candidates", "claim", "claim_refused", "correction_read")
#: reasons of this client's own (the view's are shm_host_manager.placement's REASONS, 'no_feed',
#: 'stale', ...): the option is off, no view (yet), the view raised
OWN_REASONS = ("disabled", "no_view", "error")
#: times a correction reads a provider again when its five reads disagree on the generation
CORRECTION_ATTEMPTS = 3

ViewProvider = Callable[[Any], Any]

_view_provider: ViewProvider | None = None
_clients: weakref.WeakSet[SharedReportClient] = weakref.WeakSet()
_originals: dict[str, Any] = {}


def _our_conf() -> Any:
    """``CONF.shared_host_manager`` if nova's CONF has our options registered (else None)."""
    import nova.conf

    try:
        return nova.conf.CONF.shared_host_manager
    except Exception:  # not registered (tests, embedded use): constructor arguments decide
        return None


def asked_at(context: Any) -> float | None:
    """When the request arrived at nova's API, wall-clock seconds: its RequestContext's
    ``timestamp`` (nova sets it, naive UTC, when the API makes the context; it travels with
    the context over RPC), or None when there is none."""
    stamp = getattr(context, "timestamp", None)
    if not isinstance(stamp, datetime.datetime):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def placement_config_from_conf(conf: Any = None) -> PlacementConfig:
    """placement's answer-changing options as ``[shared_host_manager] placement_*`` repeat them."""
    conf = _our_conf() if conf is None else conf
    if conf is None:
        return PlacementConfig()
    return PlacementConfig(
        randomize_allocation_candidates=bool(conf.placement_randomize_allocation_candidates),
        max_allocation_candidates=int(conf.placement_max_allocation_candidates),
        optimize_for_wide_provider_trees=bool(conf.placement_optimize_for_wide_provider_trees))


class SharedReportClient(report.SchedulerReportClient):
    """nova's scheduler placement client, answering allocation candidates from memory; see the module
    docstring.

    ``view``: a fixed view (tests, the simulator); else ``view_provider()`` on each request until
    it returns one.  ``from_memory``: None reads ``[shared_host_manager] placement_from_memory``.
    ``placement_config``: None reads the ``placement_*`` options.  ``rng``: placement's random
    choices when it randomizes (a fresh ``random.Random`` by default).
    """

    def __init__(self, adapter: Any = None, *, view: Any = None,
                 view_provider: Callable[[], Any] | None = None, from_memory: bool | None = None,
                 placement_config: PlacementConfig | None = None,
                 rng: random.Random | None = None, fresh_wait: float | None = None) -> None:
        super().__init__(adapter=adapter)
        conf = _our_conf()
        if from_memory is None:
            from_memory = bool(conf.placement_from_memory) if conf is not None else True
        if fresh_wait is None:
            fresh_wait = float(conf.placement_fresh_wait) if conf is not None else 1.0
        #: answer from the view when it can ([shared_host_manager] placement_from_memory)
        self.from_memory_enabled = from_memory
        #: seconds a request waits for a poll of the feed newer than its arrival at nova's API
        #: ([shared_host_manager] placement_fresh_wait)
        self.fresh_wait = fresh_wait
        self.placement_config = placement_config or placement_config_from_conf(conf)
        self._view = view
        self._view_provider = view_provider
        self._configured: Any = None  # the view whose config was set last
        self._rng = rng or random.Random()
        self._count_lock = threading.Lock()
        #: the SharedSchedulerManager this client serves, weakly (None: built outside one)
        self.manager_ref: Callable[[], Any] = lambda: None
        #: answers from memory / queries sent to placement
        self.from_memory = 0
        self.from_placement = 0
        #: fallbacks to placement by reason
        self.by_reason: Counter[str] = Counter()
        #: requests to placement by kind (REQUEST_KINDS)
        self.requests: Counter[str] = Counter()
        #: claims not sent: the view knew placement would refuse them
        self.claims_skipped = 0
        _clients.add(self)

    # -- the view ----------------------------------------------------------------------------
    @property
    def view(self) -> Any:
        """The PlacementView this client answers from (None: none yet)."""
        view = self._view
        if view is None and self._view_provider is not None:
            view = self._view_provider()
            if view is not None:
                self._view = view
        if view is not None and view is not self._configured:
            self._configure(view)
        return view

    def _configure(self, view: Any) -> None:
        """Make the scheduler's copy of placement's options the view's PlacementConfig."""
        current = getattr(view, "config", None)
        if isinstance(current, PlacementConfig) and current != self.placement_config:
            LOG.info("placement view: answering with placement's options as nova.conf repeats them "
                     "(%s)", self.placement_config)
            view.config = self.placement_config
        self._configured = view

    @property
    def placement_queries(self) -> int:
        """Read requests sent to placement: allocation candidate queries and correction reads."""
        with self._count_lock:
            return self.requests["allocation_candidates"] + self.requests["correction_read"]

    def figures(self) -> dict[str, Any]:
        """The counters, copied under their lock (for the simulator and /status)."""
        with self._count_lock:
            return {"from_memory": self.from_memory, "from_placement": self.from_placement,
                    "by_reason": dict(self.by_reason), "requests": dict(self.requests),
                    "claims_skipped": self.claims_skipped,
                    "placement_queries": self.requests["allocation_candidates"]
                    + self.requests["correction_read"]}

    def _count(self, kind: str, n: int = 1) -> None:
        with self._count_lock:
            self.requests[kind] += n

    # -- nova's two scheduler calls ----------------------------------------------------------
    def get_allocation_candidates(self, context: Any, resources: Any) -> Any:
        """nova's method, answered from the view when it can (the same tuple nova's returns)."""
        view = self.view if self.from_memory_enabled else None
        reason = "disabled" if not self.from_memory_enabled else "no_view"
        if view is not None:
            version = report.SAME_SUBTREE_VERSION
            try:
                body = view.answer(resources.to_querystring(), version, self._rng,
                                   asked_at=asked_at(context), wait=self.fresh_wait)
            except Exception:  # the view's fault must not fail nova's request: placement answers
                LOG.exception("placement view: answering %s failed; asking placement", resources)
                body = Unanswered("error")
            if not isinstance(body, Unanswered):
                with self._count_lock:
                    self.from_memory += 1
                return body["allocation_requests"], body["provider_summaries"], version
            reason = body.reason
        with self._count_lock:
            self.from_placement += 1
            self.by_reason[reason] += 1
            self.requests["allocation_candidates"] += 1
        return super().get_allocation_candidates(context, resources)

    def claim_resources(self, context: Any, consumer_uuid: str, alloc_request: Any, project_id: str,
                        user_id: str, allocation_request_version: Any = None,
                        consumer_generation: Any = None) -> Any:
        """nova's claim; accepted: told to the view; refused: the view corrected from placement.
        One the view knows placement refuses (:meth:`.PlacementView.over_capacity`: a host
        filled since nova sorted its hosts) is not sent: False, as placement's refusal, and nova
        claims its next host."""
        view = self.view if self.from_memory_enabled else None
        claimed = claimed_resources(alloc_request)
        if view is not None:
            full = view.over_capacity(claimed)
            if full is not None:
                LOG.debug("placement view: not claiming %s for %s: no room left", full,
                          consumer_uuid)
                with self._count_lock:
                    self.claims_skipped += 1
                return False
        self._count("claim")
        ok = super().claim_resources(context, consumer_uuid, alloc_request, project_id, user_id,
                                     allocation_request_version,
                                     consumer_generation=consumer_generation)
        if ok is True:
            if view is not None:
                view.note_claim(claimed)
        elif ok is False:
            self._count("claim_refused")
            if view is not None:
                self.correct_view(context, view, list(claimed))
        return ok

    # -- corrections -------------------------------------------------------------------------
    def correct_view(self, context: Any, view: Any, providers: Iterable[str]) -> int:
        """Read each provider back from placement and give it to the view; returns how many
        were.  A provider the view holds is read in part (:meth:`read_provider`)."""
        corrected = 0
        for rp in providers:
            try:
                doc = self.read_provider(context, rp, view.provider(rp))
            except Exception:  # a correction is an optimisation: never fail nova's request for it
                LOG.exception("placement view: reading provider %s back from placement failed", rp)
                continue
            if doc is not None:
                view.correct(doc)
                corrected += 1
        return corrected

    def read_provider(self, context: Any, rp: str, held: Mapping[str, Any] | None = None
                      ) -> dict[str, Any] | None:
        """Provider ``rp`` from placement in the ProviderState dict form, or None (gone, or no
        consistent reading in CORRECTION_ATTEMPTS).

        Without ``held``, five reads -- the provider (generation, name, parent and root), its
        inventories, usages, traits and aggregates -- every one of which the state's dict needs
        (a provider is replaced as a whole).  With ``held`` (the view's copy of it), two: the
        inventories and usages, the only parts a claim is refused over; the name, the tree,
        the traits and the aggregates are the held copy's.  Should one of those have changed
        meanwhile, the feed publishes the provider at this generation or a later one, which
        replaces it (newest generation wins; the same generation with other content
        replaces).  A reading counts only when every read names the same generation:
        placement increments it on every change of any of them, allocations included."""
        base = f"/resource_providers/{rp}"
        paths = [("inventories", base + "/inventories"), ("usages", base + "/usages")]
        if held is None:
            paths += [("provider", base), ("traits", base + "/traits"),
                      ("aggregates", base + "/aggregates")]
        version = report.SAME_SUBTREE_VERSION
        gid = getattr(context, "global_id", None)
        for _ in range(CORRECTION_ATTEMPTS):
            parts: dict[str, Any] = {}
            for key, path in paths:
                self._count("correction_read")
                resp = self.get(path, version=version, global_request_id=gid)
                if resp.status_code == 404:
                    return None
                if resp.status_code != 200:
                    LOG.warning("placement view: GET %s: %d %s", path, resp.status_code, resp.text)
                    return None
                parts[key] = resp.json()
            gens = {parts[k]["resource_provider_generation"]
                    for k in ("inventories", "usages", "traits", "aggregates") if k in parts}
            if "provider" in parts:
                gens.add(parts["provider"]["generation"])
            if len(gens) != 1:
                continue
            capacity = {"generation": gens.pop(),
                        "inventories": parts["inventories"]["inventories"],
                        # placement lists every class of an inventory, unused ones at 0; the
                        # dict form (the feed's) lists the classes with allocations
                        "usages": {r: n for r, n in parts["usages"]["usages"].items() if n}}
            if held is not None:
                return {**held, **capacity}
            p = parts["provider"]
            return {"uuid": p["uuid"], "name": p["name"],
                    "parent_provider_uuid": p.get("parent_provider_uuid"),
                    "root_provider_uuid": p.get("root_provider_uuid") or p["uuid"],
                    **capacity,
                    "traits": list(parts["traits"]["traits"]),
                    "aggregates": list(parts["aggregates"]["aggregates"])}
        LOG.info("placement view: provider %s changed during %d readings; not corrected", rp,
                 CORRECTION_ATTEMPTS)
        return None


# -- into nova's scheduler ----------------------------------------------------------------------

#: locks serialising the decisions of one server group's requests, by a hash of its uuid
#: (striped: bounded, and two groups rarely share one)
_GROUP_LOCKS = tuple(threading.Lock() for _ in range(64))


def group_lock(spec_obj: Any) -> Any:
    """The lock the decision of a request of ``spec_obj``'s server group holds (a context
    manager that holds nothing for a request outside any group).  nova's RPC threads decide
    requests side by side, and a member's policy is checked against where the group's other
    members went, which this scheduler records (a pending claim) only once placement has
    accepted the member's claim: two members requested back to back were decided before
    either was recorded, and an anti-affinity group's took the same host, for nova's late
    check on the compute to refuse."""
    group = spec_obj.instance_group if "instance_group" in spec_obj else None
    uuid = group.uuid if group is not None and "uuid" in group else None
    if not uuid:
        return contextlib.nullcontext()
    return _GROUP_LOCKS[hash(uuid) % len(_GROUP_LOCKS)]


class AnnouncingSchedulerManager(nova_manager.SchedulerManager):
    """nova's SchedulerManager with the drop-in's claim announcement as a step of its decision.

    nova's ``_get_sorted_hosts`` filters, weighs and picks the host it claims first (its
    random pick among ``host_subset_size``); then, before nova's ``_schedule`` claims it in
    placement, the host manager announces that host to the peers
    (:meth:`.SharedHostManager.announce_intent`).  The drop-in's managers derive from it
    (:class:`SharedSchedulerManager`, the simulator's), so the step is written once.
    Under nova's own HostManager it does nothing.  The requests of one server group are
    decided and claimed one at a time (:func:`group_lock`).
    """

    def _schedule(self, context: Any, spec_obj: Any, *args: Any, **kwargs: Any) -> Any:
        with group_lock(spec_obj):
            return super()._schedule(context, spec_obj, *args, **kwargs)

    def _get_sorted_hosts(self, spec_obj: Any, host_states: Any, index: int) -> Any:
        hosts = super()._get_sorted_hosts(spec_obj, host_states, index)
        host_manager = self.host_manager
        # after nova's pick, so the intent names the host nova claims first; on every call,
        # the alternates' re-sort of a multi-create too, as when weighing announced it
        if hosts and isinstance(host_manager, SharedHostManager):
            host_manager.announce_intent(hosts[0], spec_obj)
        return hosts


class SharedSchedulerManager(AnnouncingSchedulerManager):
    """nova's SchedulerManager whose ``placement_client`` is its own :class:`SharedReportClient`,
    announcing the host it claims first (:class:`AnnouncingSchedulerManager`).

    Built like nova's (``Service.create`` once :func:`install` named it); the client is built on
    first use, with the errors nova's ``report_client_singleton`` logs and raises (its
    ``__init__`` decides which are fatal), and a view provider bound to this manager's host
    manager.
    """

    _shared_client: SharedReportClient | None = None

    @property
    def placement_client(self) -> Any:
        client = self._shared_client
        if client is None:
            client = self._shared_client = _build_client(self)
        return client


def _build_client(manager: Any) -> SharedReportClient:
    from keystoneauth1 import exceptions as ks_exc

    ref = weakref.ref(manager)

    def view_provider() -> Any:
        m = ref()
        provider = _view_provider
        if m is None or provider is None:
            return None
        return provider(getattr(m, "host_manager", None))

    try:
        client = SharedReportClient(view_provider=view_provider)
    except ks_exc.ClientException as exc:  # as report_client_singleton: logged, raised
        LOG.error("Failed to initialize placement client: %s", exc)
        raise
    client.manager_ref = ref
    return client


def set_view_provider(provider: ViewProvider | None) -> None:
    """``provider(host_manager)`` returns the PlacementView of the scheduler that host manager
    serves (None: none yet); see the module docstring."""
    global _view_provider
    _view_provider = provider


def install() -> None:
    """Make nova's ``Service.create(binary='nova-scheduler')`` build a :class:`SharedSchedulerManager`
    (``nova.service.SERVICE_MANAGERS``).  Idempotent; :func:`uninstall` undoes it."""
    from nova import service

    _originals.setdefault("manager", service.SERVICE_MANAGERS.get("nova-scheduler"))
    service.SERVICE_MANAGERS["nova-scheduler"] = MANAGER_PATH


def uninstall() -> None:
    from nova import service

    if "manager" in _originals:
        service.SERVICE_MANAGERS["nova-scheduler"] = _originals.pop("manager")


def clients() -> list[SharedReportClient]:
    """Every SharedReportClient of this process still in use."""
    return list(_clients)


# -- metrics --------------------------------------------------------------------------------------

class ReportClientCollector:
    """``shm_placement_requests_total{kind}``, ``shm_allocation_candidates_total{source,reason}``
    and ``shm_placement_claims_skipped_total`` of this process's clients (``clients()``),
    read on scrape; registered beside the scheduler's collector on its ``[metrics]`` endpoint
    by :mod:`.cmd`."""

    def __init__(self, source: Callable[[], Iterable[SharedReportClient]] = clients) -> None:
        self.source = source

    def describe(self) -> list[Any]:
        return []  # collected on scrape only (the registry's auto_describe is off)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        kinds: Counter[str] = Counter()
        memory = skipped = 0
        reasons: Counter[str] = Counter()
        for client in self.source():
            f = client.figures()
            kinds.update(f["requests"])
            memory += f["from_memory"]
            skipped += f["claims_skipped"]
            reasons.update(f["by_reason"])
        requests = CounterMetricFamily(
            "shm_placement_requests", "Requests of the scheduler's placement client by kind: "
            "allocation_candidates (queries sent to placement), claim, claim_refused (claims "
            "placement refused), correction_read (provider reads after a refusal).", labels=["kind"])
        for kind in REQUEST_KINDS:
            requests.add_metric([kind], kinds[kind])
        yield requests
        candidates = CounterMetricFamily(
            "shm_allocation_candidates", "Allocation candidate requests by who answered: memory (the "
            "placement view) or placement, and why placement (the view's reason).",
            labels=["source", "reason"])
        candidates.add_metric(["memory", ""], memory)
        for reason, n in sorted(reasons.items()):
            candidates.add_metric(["placement", reason], n)
        yield candidates
        yield CounterMetricFamily(
            "shm_placement_claims_skipped", "Claims not sent to placement: the placement view knew "
            "placement would refuse them (the host filled since nova sorted its hosts).",
            value=skipped)


__all__ = ["MANAGER_PATH", "AnnouncingSchedulerManager", "ReportClientCollector", "SharedReportClient",
           "SharedSchedulerManager", "clients", "install",
           "placement_config_from_conf", "set_view_provider", "uninstall"]
