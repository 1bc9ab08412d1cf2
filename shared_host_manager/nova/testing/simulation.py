"""A whole nova cloud in one process for ``shm sim --scheduler nova``: placement, nova's DB, schedulers.

Role
----
The simulator (:mod:`simulator.nova_sim`) never imports nova; it hands this
module plain host and request descriptions and gets plain outcomes back.  Here
they meet nova 34's real code on its whole scheduling path:

* **placement** -- ``openstack-placement`` on its own database, in-process
  (:class:`~shared_host_manager.nova.testing.placement_server.InProcessPlacement`:
  placement's WSGI app behind wsgi-intercept, as
  ``placement.direct.PlacementDirect`` and nova's functional tests run it) or, with
  ``placement_processes``, served by worker processes of its own over HTTP
  (:class:`~shared_host_manager.nova.testing.placement_server.PlacementProcesses`), one
  resource provider per compute node with the VCPU / MEMORY_MB / DISK_GB
  inventories nova-compute reports, and the allocations of the servers already
  running;
* **nova's database** -- the API and cell schemas (SQLite files, or a server
  through ``db_url``) with the cell mapping, one Service and one ComputeNode per
  host and the running instances (:class:`~.fixtures.NovaDatabase`);
* **host aggregates** -- as nova's aggregate API leaves them: the aggregate,
  its metadata (``availability_zone`` among it) and its hosts in the API
  database, the membership mirrored to placement by nova's own
  ``SchedulerReportClient.aggregate_add_host``, so that nova's request filter
  ``map_az_to_placement_aggregate`` (what is left of the AvailabilityZoneFilter
  in nova 34) asks placement for the zone's providers, and the Aggregate*
  filters see each host's aggregates (legacy: nova's HostManager reads them
  from the API database; shared: the compute hooks publish them, and nova-api's
  API-side source publishes the whole catalogue, which the drop-in's request
  filters answer from);
* **schedulers** -- ``schedulers`` instances of nova's own ``SchedulerManager``,
  each with its own ``SchedulerReportClient`` on placement.  ``legacy``: nova's
  HostManager reading nova's database on every request.  ``shared``: the
  drop-in (:func:`.host_manager.install`), each scheduler with its own
  :class:`~shared_host_manager.service.SchedulerService` cache fed by the stream;
* **computes** -- the resource tracker's part of a build and of a deletion, on
  the ComputeNode objects nova loaded from the database: usage, free amounts,
  ``running_vms`` and stats changed and ``ComputeNode.save()``d under a per-host
  lock (nova's COMPUTE_RESOURCE_SEMAPHORE); the instance info fanout every
  scheduler receives (``update_instance_info`` / ``delete_instance_info``); a
  deletion removes the server's placement allocation; after a build's claim, the
  late server-group check (nova-compute's ``_validate_instance_group_policy``),
  whose refusal undoes the claim; and, for ``shared``, the compute hook publishes
  the node through its reporter, as nova-compute-shared does.

Time per phase, per request, through explicit subclasses only (nothing of
nova's is replaced beyond what the drop-in's ``install`` documents):
``placement_query`` (``get_allocation_candidates``), ``host_states``
(``get_host_states_by_uuids``), ``filter_weigh`` (``get_filtered_hosts`` +
``get_weighed_hosts``, which consume nova's per-host allocation-request
generator, and the drop-in's ``announce_intent``), ``placement_claim``
(``claim_resources``), and ``compute`` (the builds at the chosen hosts).
What ``select_destinations`` spends beyond the first four (request filters,
Selection objects, notifications) is ``other``.

Life cycle: ``NovaCloud(hosts, mode=...)`` builds everything (nova's global
configuration and DB context managers are per process: one cloud per
process; the simulator runs each in a process of its own), then
``schedule``/``delete`` from many threads, ``check()`` at the end, ``close()``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared_host_manager.nova.testing.placement_server import (
    InProcessPlacement,
    PlacementClient,
    PlacementProcesses,
)

#: the modules ``--scheduler nova`` needs beyond the project's own
NEEDED = ("nova", "placement", "wsgi_intercept")
#: the extra that installs them
EXTRA = "nova-sim"

PHASES = ("placement_query", "memory_candidates", "host_states", "filter_weigh", "placement_claim")


def missing() -> str | None:
    """The first module ``--scheduler nova`` needs that is not installed (None: all are)."""
    for name in NEEDED:
        if importlib.util.find_spec(name) is None:
            return name
    return None


# -- per-request phase clocks ----------------------------------------------------------------

_local = threading.local()


def _phases() -> dict[str, float]:
    spent = getattr(_local, "spent", None)
    if spent is None:
        spent = _local.spent = {}
    return spent


class _Phase:
    """Adds the time of a ``with`` block to this thread's current request, under ``name``."""

    __slots__ = ("name", "_t")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self._t = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        spent = _phases()
        spent[self.name] = spent.get(self.name, 0.0) + time.perf_counter() - self._t


def _timed_host_manager(base: type) -> type:
    """``base`` (nova's HostManager or SharedHostManager) with its decision phases timed."""

    class Timed(base):
        def get_host_states_by_uuids(self, context: Any, compute_uuids: Any, spec_obj: Any) -> Any:
            with _Phase("host_states"):
                return super().get_host_states_by_uuids(context, compute_uuids, spec_obj)

        def get_filtered_hosts(self, hosts: Any, spec_obj: Any, index: int = 0) -> Any:
            with _Phase("filter_weigh"):
                return super().get_filtered_hosts(hosts, spec_obj, index)

        def get_weighed_hosts(self, hosts: Any, spec_obj: Any) -> Any:
            with _Phase("filter_weigh"):
                return super().get_weighed_hosts(hosts, spec_obj)

        def announce_intent(self, host: Any, spec_obj: Any) -> bool:
            # timed where weighing announced it before it was a step of its own, so that
            # the phases stay comparable with earlier runs (only SharedHostManager has it)
            with _Phase("filter_weigh"):
                return bool(super().announce_intent(host, spec_obj))

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


def _report_client_class(shared: bool = False) -> type:
    """nova's report client (``shared``: the drop-in's, answering from the placement view), timed."""
    from nova.scheduler.client import report

    base: type = report.SchedulerReportClient
    if shared:
        from shared_host_manager.nova.report_client import SharedReportClient

        base = SharedReportClient

    class TimedReportClient(base):
        """The scheduler's two placement calls timed; ``GET /allocation_candidates`` placement
        served counted (the candidates phase is ``placement_query`` when placement answered,
        ``memory_candidates`` when the view did); refused claims, claims the drop-in did not
        send (its view knew them refused) and provider generation conflicts counted."""

        def __init__(self, adapter: Any, **kwargs: Any) -> None:
            super().__init__(adapter=adapter, **kwargs)
            self.refused = 0
            self._count_lock = threading.Lock()

        def get(self, url: str, *args: Any, **kwargs: Any) -> Any:
            if url.startswith("/allocation_candidates"):
                _local.candidate_queries = getattr(_local, "candidate_queries", 0) + 1
            return super().get(url, *args, **kwargs)

        def get_allocation_candidates(self, context: Any, resources: Any) -> Any:
            before = getattr(_local, "candidate_queries", 0)
            t = time.perf_counter()
            try:
                return super().get_allocation_candidates(context, resources)
            finally:
                asked = getattr(_local, "candidate_queries", 0) > before
                spent = _phases()
                name = "placement_query" if asked else "memory_candidates"
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

        def claim_resources(self, context: Any, consumer_uuid: str, alloc_request: Any,
                            project_id: str, user_id: str, allocation_request_version: Any = None,
                            consumer_generation: Any = None) -> bool:
            puts = getattr(_local, "puts", 0)
            with _Phase("placement_claim"):
                ok = super().claim_resources(context, consumer_uuid, alloc_request, project_id,
                                             user_id, allocation_request_version,
                                             consumer_generation=consumer_generation)
            if not ok and getattr(_local, "puts", 0) == puts:
                # the drop-in's view knew placement would refuse it: nothing was sent
                _local.skipped = getattr(_local, "skipped", 0) + 1
            elif not ok:
                with self._count_lock:
                    self.refused += 1
                # this thread's request (several client threads share a scheduler)
                _local.refused = getattr(_local, "refused", 0) + 1
            return bool(ok)

        def _put_allocations(self, context: Any, consumer_uuid: str, payload: Any,
                             version: str = report.CONSUMER_GENERATION_VERSION) -> Any:
            _local.puts = getattr(_local, "puts", 0) + 1
            r = super()._put_allocations(context, consumer_uuid, payload, version=version)
            # a provider generation conflict, which claim_resources retries (a consumer
            # generation conflict it does not retry)
            if (r.status_code == 409 and "placement.concurrent_update" in r.text
                    and "consumer generation conflict" not in r.text):
                _local.conflicts = getattr(_local, "conflicts", 0) + 1
            return r

    return TimedReportClient


def _scheduler_manager_class() -> type:
    from shared_host_manager.nova.report_client import AnnouncingSchedulerManager

    class SimSchedulerManager(AnnouncingSchedulerManager):
        """nova's SchedulerManager with its own report client and a timed host manager.

        nova's reads ``report_client_singleton()``: one client per process.  Here
        every scheduler is a process of its own in a deployment, so each gets
        its own client (the property is nova's interface for it).  The drop-in's
        step after nova's sort (the claim announcement) is the deployment's; under
        nova's own HostManager (``legacy``) it does nothing.
        """

        def __init__(self, placement_client: Any, host_manager: Callable[[], Any]) -> None:
            self._sim_client = placement_client
            super().__init__()
            # nova's __init__ built a host manager of the installed class; ours is the same
            # class with its phases timed (built last: the drop-in's request filter asks the
            # most recent one)
            self.host_manager = host_manager()

        @property
        def placement_client(self) -> Any:
            return self._sim_client

    return SimSchedulerManager


# -- SQL the scheduler runs while deciding ---------------------------------------------------

class _SqlTally:
    statements = 0


class _SqlCounter:
    """SQL statements a thread runs on any database but placement's while in :meth:`counting`.

    placement runs in-process (its WSGI app behind wsgi-intercept, on the scheduler's thread
    during a request): its statements are placement's, not the scheduler's, and are told
    apart by the database they go to.  Counted through SQLAlchemy's ``before_cursor_execute``
    event on every engine of the process.
    """

    def __init__(self, placement_url: str) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine, make_url

        url = make_url(placement_url)
        self._placement = (url.get_backend_name(), url.host, url.port, url.database)
        self._local = threading.local()
        self._event, self._engine_cls = event, Engine
        event.listen(Engine, "before_cursor_execute", self._executed)

    def _executed(self, conn: Any, *_: Any) -> None:
        tally = getattr(self._local, "tally", None)
        if tally is None:
            return
        url = conn.engine.url
        if (url.get_backend_name(), url.host, url.port, url.database) != self._placement:
            tally.statements += 1

    @contextlib.contextmanager
    def counting(self) -> Any:
        tally = self._local.tally = _SqlTally()
        try:
            yield tally
        finally:
            self._local.tally = None

    def close(self) -> None:
        self._event.remove(self._engine_cls, "before_cursor_execute", self._executed)


# -- descriptions the simulator hands over ---------------------------------------------------

@dataclass
class SimHost:
    """One compute node as the simulator draws it (capacities, servers already running)."""

    source: str  # the compute node uuid (= resource provider uuid)
    host: str
    vcpus: int
    memory_mb: int
    disk_gb: int
    cpu_allocation_ratio: float = 4.0
    ram_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0
    reserved_memory_mb: int = 512
    #: instance uuid -> {"vcpus", "memory_mb", "disk_gb"}
    instances: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class SimAggregate:
    """One host aggregate as the simulator draws it (an availability zone is one with
    ``availability_zone`` in its metadata)."""

    name: str
    metadata: dict[str, str]
    hosts: list[str]  # host names


@dataclass
class SimRequest:
    instance_uuids: list[str]
    vcpus: int
    memory_mb: int
    root_gb: int
    project_id: str = "project"
    user_id: str = "user"
    #: the server's availability zone (None: any)
    availability_zone: str | None = None
    #: the flavor's extra specs (``aggregate_instance_extra_specs:<key>`` among them)
    extra_specs: dict[str, str] = field(default_factory=dict)
    #: server group: uuid, policy ("affinity" / "anti-affinity"), members, and the hosts
    #: (names) its running members are on -- what nova's conductor fills in
    group_uuid: str | None = None
    group_policy: str | None = None
    group_members: list[str] = field(default_factory=list)
    group_hosts: list[str] = field(default_factory=list)


#: why nova-compute refused a build: the instance claim did not fit, or the late server-group
#: check found the group's policy broken by another member (decided at the same time)
RESOURCES = "resources"
GROUP_POLICY = "server group policy"


@dataclass
class SimOutcome:
    placed: dict[str, str] = field(default_factory=dict)  # instance -> source
    failed: dict[str, str] = field(default_factory=dict)  # instance -> reason
    #: builds the compute refused (their allocation removed); counted in failed too
    compute_rejected: int = 0
    #: of those, the builds nova-compute's late server-group check refused (two members of a
    #: group decided at once, neither seeing the other: nova's safety net, which reschedules)
    group_rejected: int = 0
    #: placement claims made / refused by placement (another scheduler got there first)
    claims: int = 0
    claims_refused: int = 0
    #: claims the drop-in did not send: its placement view knew placement would refuse them
    claims_skipped: int = 0
    #: claims placement answered with a provider generation conflict (nova retried them)
    claim_conflicts: int = 0
    #: GET /allocation_candidates placement served for this request (0: answered from memory)
    candidate_queries: int = 0
    #: SQL statements the scheduler ran on nova's databases while deciding
    sql_statements: int = 0
    decision_s: float = 0.0
    #: seconds per phase of this request (PHASES, "compute", "other")
    phases: dict[str, float] = field(default_factory=dict)


# -- the cloud -------------------------------------------------------------------------------

class NovaCloud:
    """Placement, nova's database, ``schedulers`` SchedulerManagers and the computes; see the module
    docstring."""

    def __init__(self, hosts: list[SimHost], *, mode: str, schedulers: int, directory: str,
                 cell_uuid: str, filters: list[str] | None = None, db_url: str | None = None,
                 aggregates: list[SimAggregate] | None = None, extra_filters: list[str] | None = None,
                 hosts_per_reporter: int = 500, coalesce_window: float = 0.02,
                 host_ownership: bool = False, announce_claims: bool = False,
                 placement_processes: int = 0) -> None:
        """``filters``: nova's [filter_scheduler] enabled_filters (None: nova's defaults), with
        ``extra_filters`` appended (those not in it already); ``placement_processes``: serve
        placement from that many processes of its own (0: in this process)."""
        if mode not in ("legacy", "shared"):
            raise ValueError(f"mode must be legacy or shared, not {mode!r}")
        from nova import context as nova_context
        from nova import objects

        from shared_host_manager.nova import host_manager as shm
        from shared_host_manager.nova.testing import fixtures as fx

        self.mode = mode
        overrides: dict[str, Any] = {"service_down_time": 86400}
        if filters:
            overrides["filter_scheduler.enabled_filters"] = filters
        conf = fx.setup_nova(**overrides)
        enabled = list(conf.filter_scheduler.enabled_filters)
        added = [f for f in extra_filters or () if f not in enabled]
        if added:
            conf.set_override("enabled_filters", enabled + added, group="filter_scheduler")
        self.filters = list(conf.filter_scheduler.enabled_filters)
        self.cell_uuid = cell_uuid
        self.hosts = {h.source: h for h in hosts}
        self._ctx = nova_context.get_admin_context()
        self._closers: list[Any] = []
        self.setup_s: dict[str, float] = {}

        t = time.perf_counter()
        placement_url = self.placement_url = _placement_url(directory, db_url)
        self.placement: PlacementClient
        if placement_processes:
            self.placement = PlacementProcesses(placement_url, placement_processes)
        else:
            self.placement = InProcessPlacement(placement_url)
        self._closers.append(self.placement.close)
        self._load_placement(hosts)
        self.setup_s["placement"] = time.perf_counter() - t

        t = time.perf_counter()
        self.db = fx.NovaDatabase(directory, api_url=_db_url(db_url, "nova_api"),
                                  cell_url=_db_url(db_url, "nova_cell1"))
        self.db.configure()
        nodes = [_compute_node(i, h) for i, h in enumerate(hosts)]
        made = self.db.populate(
            nodes, cell_uuid=cell_uuid, instances={h.host: list(h.instances) for h in hosts},
            aggregates=[(a.name, dict(a.metadata), list(a.hosts)) for a in aggregates or ()])
        #: host name -> the nova Aggregates it is in (what nova-compute-shared's hook reads)
        self.host_aggregates: dict[str, list[Any]] = {}
        for agg in made:
            for host in agg.hosts:
                self.host_aggregates.setdefault(host, []).append(agg)
        cell = objects.CellMapping.get_by_uuid(self._ctx, cell_uuid)
        with nova_context.target_cell(self._ctx, cell) as cctxt:
            loaded = objects.ComputeNodeList.get_all(cctxt)
        #: the resource tracker's ComputeNode of every host (what it saves)
        self.nodes: dict[str, Any] = {cn.uuid: cn for cn in loaded}
        self._locks = {s: threading.Lock() for s in self.nodes}
        # SQLite: one writer at a time (see placement_server.InProcessPlacement); a server waits
        # on row locks
        self._db_write_lock: Any = threading.Lock() if db_url is None else contextlib.nullcontext()
        #: instance -> (source, resources): what each compute tracks
        self.tracked: dict[str, dict[str, dict[str, int]]] = {
            h.source: {u: dict(r) for u, r in h.instances.items()} for h in hosts}
        self._where: dict[str, str] = {u: h.source for h in hosts for u in h.instances}
        #: for the late server-group check: each group's members built here (the pre-filled
        #: instances are in none), the group of each, and the group's lock
        self._members: dict[str, set[str]] = {}
        self._group_of: dict[str, str] = {}
        self._group_locks: dict[str, threading.Lock] = {}
        self.setup_s["nova_db"] = time.perf_counter() - t

        self.compute_client = _report_client_class()(self.placement.adapter())
        t = time.perf_counter()
        # what nova's aggregate API does after adding a host to an aggregate in the API database
        # (compute.api.AggregateAPI.add_host_to_aggregate): the node's provider joins the
        # placement aggregate of the same uuid, through nova's report client
        for agg in made:
            for host in agg.hosts:
                self.compute_client.aggregate_add_host(self._ctx, agg.uuid, host_name=host)
        self.setup_s["aggregates"] = time.perf_counter() - t

        t = time.perf_counter()
        self.hooks: dict[str, Any] = {}
        self.reporters: list[Any] = []
        self.services: list[Any] = []
        self.feed: Any = None
        if mode == "shared":
            self._start_stream(hosts, hosts_per_reporter, coalesce_window)
            self._start_api_source()
            self._start_placement_feed(placement_url)
            # with ownership or announcements, each scheduler's own entry on the stream (its
            # live peers)
            peers = host_ownership or announce_claims
            for i in range(schedulers):
                self._new_cache_service(f"scheduler-{i}", 1.0 if peers else None,
                                        announce_claims=announce_claims)
            shm.install()
            self._closers.append(shm.uninstall)
        # each scheduler's own placement client (shared: answering from its service's view)
        client_cls = _report_client_class(shared=mode == "shared")
        self.clients = [
            client_cls(self.placement.adapter(), view=self.services[i].placement_view)
            if mode == "shared" else client_cls(self.placement.adapter())
            for i in range(schedulers)]
        manager_cls = _scheduler_manager_class()
        self.schedulers: list[Any] = []
        for i in range(schedulers):
            if mode == "shared":
                cls = _timed_host_manager(shm.SharedHostManager)
                cache = self.services[i].cache
                hm: Callable[[], Any] = functools.partial(
                    cls, cache, default_cell_uuid=cell_uuid, host_ownership=host_ownership)
            else:
                from nova.scheduler import host_manager as nova_hm

                hm = _timed_host_manager(nova_hm.HostManager)
            self.schedulers.append(manager_cls(self.clients[i], hm))
        if mode == "legacy":
            self._sync_instance_info()
        else:
            self._wait_for_hosts()
            self._wait_for_providers(len(hosts))
            if peers:
                self._wait_for_peers()
        self.setup_s["schedulers"] = time.perf_counter() - t
        self._sql = _SqlCounter(placement_url)
        self._closers.append(self._sql.close)

    # -- set-up -------------------------------------------------------------------------
    def _load_placement(self, hosts: list[SimHost]) -> None:
        """Providers and inventories as nova-compute reports them; running servers' allocations."""
        p = self.placement
        for h in hosts:
            p.request("POST", "/resource_providers", {"uuid": h.source, "name": h.host})
            inv = {
                "VCPU": {"total": h.vcpus, "reserved": 0, "min_unit": 1, "max_unit": h.vcpus,
                         "step_size": 1, "allocation_ratio": h.cpu_allocation_ratio},
                "MEMORY_MB": {"total": h.memory_mb, "reserved": h.reserved_memory_mb,
                              "min_unit": 1, "max_unit": h.memory_mb, "step_size": 1,
                              "allocation_ratio": h.ram_allocation_ratio},
                "DISK_GB": {"total": h.disk_gb, "reserved": 0, "min_unit": 1,
                            "max_unit": h.disk_gb, "step_size": 1,
                            "allocation_ratio": h.disk_allocation_ratio},
            }
            got = p.request("PUT", f"/resource_providers/{h.source}/inventories",
                            {"resource_provider_generation": 0, "inventories": inv})
            # nova-compute's provider traits the scheduler's request filters ask for
            # (root_required=OWNER_NOVA, !COMPUTE_STATUS_DISABLED)
            p.request("PUT", f"/resource_providers/{h.source}/traits",
                      {"resource_provider_generation": got["resource_provider_generation"],
                       "traits": ["COMPUTE_NODE", "OWNER_NOVA"]})
        self._prefill_allocations(hosts)

    def _prefill_allocations(self, hosts: list[SimHost]) -> None:
        """The running servers' allocations, written into placement's tables at once.

        Through the REST API (``POST /allocations``) placement looks up the project
        and user and creates each consumer in a transaction of its own: tens of
        minutes for the ~20 000 servers of a prefilled 1 000-node cloud.  Here one
        transaction writes the same rows: a consumer per server (its uuid, the
        ``project`` / ``user`` of the set-up, generation 1 as placement leaves
        it) and an allocation per resource class; placement's own queries see no
        difference.  The providers' generations move as placement's would.
        """
        import datetime

        import sqlalchemy as sa

        rows = [(h.source, instance, _rc(res)) for h in hosts for instance, res in h.instances.items()]
        if not rows:
            return
        engine = sa.create_engine(self.placement_url)
        try:
            with engine.begin() as conn:
                def ids(table: str, column: str = "external_id") -> dict[str, int]:
                    return {r[1]: r[0] for r in conn.execute(sa.text(
                        f"SELECT id, {column} FROM {table}"))}

                for table in ("projects", "users"):
                    name = table[:-1]
                    if name not in ids(table):
                        conn.execute(sa.text(f"INSERT INTO {table} (external_id) VALUES (:n)"),
                                     {"n": name})
                project, user = ids("projects")["project"], ids("users")["user"]
                rps = ids("resource_providers", "uuid")
                rcs = ids("resource_classes", "name")
                # placement's timestamps: naive UTC (its Last-Modified compares them)
                now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
                conn.execute(sa.text(
                    "INSERT INTO consumers (uuid, project_id, user_id, generation, created_at) "
                    "VALUES (:u, :p, :us, 1, :t)"),
                    [{"u": instance, "p": project, "us": user, "t": now} for _, instance, _ in rows])
                conn.execute(sa.text(
                    "INSERT INTO allocations (resource_provider_id, consumer_id, resource_class_id, "
                    "used, created_at) VALUES (:rp, :c, :rc, :used, :t)"),
                    [{"rp": rps[source], "c": instance, "rc": rcs[rc], "used": used, "t": now}
                     for source, instance, res in rows for rc, used in res.items()])
                conn.execute(sa.text(
                    "UPDATE resource_providers SET generation = generation + 1 WHERE uuid IN "
                    "(SELECT DISTINCT rp.uuid FROM resource_providers rp JOIN allocations a "
                    "ON a.resource_provider_id = rp.id)"))
        finally:
            engine.dispose()

    def _start_stream(self, hosts: list[SimHost], per_reporter: int, coalesce_window: float) -> None:
        """Each group of hosts a nova-compute-shared with its hook and reporter; a cache per
        scheduler; all on one in-process bus delivering from its own threads."""
        import nova.conf

        from compute_reporter.service import ReporterService
        from shared_host_manager.nova import compute_hook
        from shared_host_manager.nova.core import document as ndoc
        from shared_host_manager.nova.testing import fixtures as fx
        from transport.inprocess import InProcessBus

        self.bus = InProcessBus(threaded=True)
        topics = ("shm-reporter", "shm-scheduler")
        reserved = ndoc.Reserved.from_conf(nova.conf.CONF)
        sources = [h.source for h in hosts]
        for n, i in enumerate(range(0, len(sources), per_reporter)):
            hook = compute_hook.ComputeHook(cell_uuid=self.cell_uuid, reserved=reserved,
                                            aggregate_refresh_interval=0)
            for s in sources[i:i + per_reporter]:
                cn = self.nodes[s]
                hook.report(cn, instances=sorted(self.tracked[s]), service=fx.service_dict(cn.host),
                            aggregates=self.host_aggregates.get(cn.host, []))
                self.hooks[s] = hook
            reporter = ReporterService(
                f"compute-{n}", compute_hook.NovaTracker(hook), self.bus, self.bus,
                reporter_topic=topics[0], scheduler_topic=topics[1],
                coalesce_window=coalesce_window, heartbeat_interval=10.0)
            reporter.start()
            self.reporters.append(reporter)
        self._topics = topics

    def _start_api_source(self) -> None:
        """nova-api's API-side source, as the drop-in's WSGI application starts it in each API
        worker: every compute service and aggregate read from nova's databases, published on the
        same bus (the catalogue nova's aggregate request filters answer from)."""
        from compute_reporter.service import ReporterService
        from shared_host_manager.nova import api_publisher
        from shared_host_manager.nova.api_source import ApiStateSource

        self.api_source = ApiStateSource("nova-api-0", role="nova-api")
        self.api_source.preload(*api_publisher.load_from_nova())
        reporter = ReporterService("nova-api-0", self.api_source, self.bus, self.bus,
                                   reporter_topic=self._topics[0], scheduler_topic=self._topics[1],
                                   coalesce_window=0.0, heartbeat_interval=10.0)
        reporter.start()
        self.reporters.append(reporter)

    def _start_placement_feed(self, placement_url: str) -> None:
        """``shm placement-feed`` on placement's database, publishing on the same bus: every
        scheduler's placement view is fed from it (docs/design.md §11)."""
        from compute_reporter.service import ReporterService
        from shared_host_manager.placement.database import PlacementDatabase
        from shared_host_manager.placement.feed_service import PlacementFeed

        database = PlacementDatabase(placement_url)
        self._closers.append(database.close)
        self.feed = PlacementFeed(database, poll_interval=0.05)
        reporter = ReporterService("placement-feed", self.feed, self.bus, self.bus,
                                   reporter_topic=self._topics[0], scheduler_topic=self._topics[1],
                                   coalesce_window=0.0, heartbeat_interval=1.0)
        self.feed.confirm = lambda: reporter.publish_now(2.0)
        reporter.start()
        self.reporters.append(reporter)

    def _wait_for_providers(self, want: int, timeout: float = 120.0) -> None:
        """Every scheduler's placement view holds every provider before the run."""
        deadline = time.monotonic() + timeout
        for service in self.services:
            while (held := service.placement_view.status()["providers"]) < want:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{service.name}'s placement view holds {held} of {want} "
                                       f"providers after {timeout} s")
                time.sleep(0.05)

    def placement_figures(self) -> dict[str, Any]:
        """What the schedulers' placement clients and the feed counted."""
        out: dict[str, Any] = {}
        figures = [c.figures() for c in self.clients if hasattr(c, "figures")]
        if figures:
            by_reason: dict[str, int] = {}
            for f in figures:
                for reason, n in f["by_reason"].items():
                    by_reason[reason] = by_reason.get(reason, 0) + n
            out["candidates_from_memory"] = sum(f["from_memory"] for f in figures)
            out["candidates_from_placement_by_reason"] = by_reason
            out["placement_correction_reads"] = sum(
                f["requests"].get("correction_read", 0) for f in figures)
        if self.feed is not None:
            out["placement_feed"] = self.feed.figures()
        return out

    def request_filter_figures(self) -> dict[str, Any]:
        """How nova's aggregate request filters answered in this process (shared: from the
        catalogue, or nova's database when no API-side source was heard)."""
        from shared_host_manager.nova import request_filters

        if self.mode != "shared":
            return {}
        figures = request_filters.figures()
        return {"request_filters_from_catalogue": figures["from_catalogue"],
                "request_filter_db_fallbacks": figures["db_fallbacks"]}

    def _new_cache_service(self, name: str, membership_interval: float | None = None, *,
                           announce_claims: bool = False) -> Any:
        from shared_host_manager.service import SchedulerService

        service = SchedulerService(name, self.bus, self.bus, reporter_topic=self._topics[0],
                                   scheduler_topic=self._topics[1], down_interval=60.0,
                                   membership_interval=membership_interval,
                                   announce_claims=announce_claims)
        service.start()
        self.services.append(service)
        return service

    def _wait_for_peers(self, timeout: float = 30.0) -> None:
        """Every scheduler knows every other (membership on the stream) before the run."""
        deadline = time.monotonic() + timeout
        want = len(self.services)
        while any(len(s.peers) < want for s in self.services):
            if time.monotonic() > deadline:
                raise RuntimeError(f"schedulers see {[len(s.peers) for s in self.services]} of "
                                   f"{want} peers after {timeout} s")
            time.sleep(0.05)

    def _wait_for_hosts(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        want = [*self.nodes.keys(), "nova-api-0"]
        for service in self.services:
            while time.monotonic() < deadline:
                with service.cache.lock:
                    sources = service.cache.receiver.sources
                    held = sum(1 for s in want if (v := sources.get(s)) is not None
                               and v.doc is not None)
                if held >= len(want):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{service.name} holds {held} of {len(want)} hosts after "
                                   f"{timeout} s")

    def _sync_instance_info(self, timeout: float = 120.0) -> None:
        """nova's HostManager loads every host's instances at start (asynchronously); then the
        computes' periodic ``sync_instance_info`` marks them current, so requests do not query
        instances per host (as in a deployment with track_instance_changes)."""
        by_host = {self.nodes[s].host: list(t) for s, t in self.tracked.items()}
        with_instances = sum(1 for u in by_host.values() if u)
        for sched in self.schedulers:
            hm = sched.host_manager
            deadline = time.monotonic() + timeout
            while len(hm._instance_info) < with_instances and time.monotonic() < deadline:
                time.sleep(0.05)
            for host, uuids in by_host.items():
                hm.sync_instance_info(self._ctx, host, uuids)
                hm.sync_instance_info(self._ctx, host, uuids)

    # -- the run ----------------------------------------------------------------------------
    def schedule(self, scheduler: int, req: SimRequest) -> SimOutcome:
        """One request through scheduler ``scheduler``'s select_destinations, then the builds."""
        import oslo_messaging as messaging
        from nova import exception

        out = SimOutcome()
        sched = self.schedulers[scheduler]
        spec = self._spec(req)
        _local.spent = {}
        _local.refused = 0
        _local.skipped = 0
        _local.conflicts = 0
        _local.candidate_queries = 0
        start = time.perf_counter()
        try:
            with self._sql.counting() as sql:
                selections = sched.select_destinations(
                    self._ctx, spec_obj=spec, instance_uuids=list(req.instance_uuids),
                    return_objects=True, return_alternates=True)
        except messaging.ExpectedException as wrapped:
            # nova's RPC layer wraps the exceptions its callers expect (NoValidHost)
            exc = wrapped.exc_info[1]
            if not isinstance(exc, exception.NoValidHost):
                raise exc from None
            selections = None
            reason = str(exc)
        except exception.NoValidHost as exc:
            selections = None
            reason = str(exc)
        out.decision_s = time.perf_counter() - start
        out.candidate_queries = _local.candidate_queries
        out.sql_statements = sql.statements
        phases = dict(_phases())
        out.claims_refused = _local.refused
        out.claims_skipped = _local.skipped
        out.claim_conflicts = _local.conflicts
        out.claims = out.claims_refused
        if selections is None:
            out.failed = {u: reason for u in req.instance_uuids}
        else:
            out.claims += len(req.instance_uuids)
            t = time.perf_counter()
            res = {"vcpus": req.vcpus, "memory_mb": req.memory_mb, "disk_gb": req.root_gb}
            for instance, alternates in zip(req.instance_uuids, selections, strict=True):
                source = alternates[0].compute_node_uuid
                refused = self._build(source, instance, res, req)
                if refused is None:
                    out.placed[instance] = source
                else:
                    out.compute_rejected += 1
                    out.group_rejected += refused == GROUP_POLICY
                    out.failed[instance] = f"refused at the compute ({refused})"
                    self.compute_client.delete_allocation_for_instance(self._ctx, instance, force=True)
            phases["compute"] = time.perf_counter() - t
        known = sum(v for k, v in phases.items() if k in PHASES)
        phases["other"] = max(0.0, out.decision_s - known)
        out.phases = phases
        return out

    def delete(self, instance: str) -> None:
        """A server deleted: the compute forgets it, the allocation goes, the schedulers hear."""
        group = self._group_of.pop(instance, None)
        if group is not None:
            with self._group_locks[group]:
                self._members[group].discard(instance)
        source = self._where.pop(instance, None)
        if source is None:
            return
        cn = self.nodes[source]
        with self._locks[source]:
            res = self.tracked[source].pop(instance)
            self._account(cn, source, res, -1)
        self.compute_client.delete_allocation_for_instance(self._ctx, instance, force=True)
        for sched in self.schedulers:
            sched.delete_instance_info(self._ctx, cn.host, instance)

    def _build(self, source: str, instance: str, res: Mapping[str, int],
               req: SimRequest | None = None) -> str | None:
        """nova-compute's build at ``source``: the resource tracker's instance claim, then the
        late server-group check of ``req``'s group; None, or why the build was refused
        (RESOURCES, GROUP_POLICY; the claim is then undone)."""
        from nova import objects

        cn = self.nodes[source]
        with self._locks[source]:
            if (cn.vcpus_used + res["vcpus"] > cn.vcpus * cn.cpu_allocation_ratio
                    or cn.memory_mb_used + res["memory_mb"] > cn.memory_mb * cn.ram_allocation_ratio
                    or cn.local_gb_used + res["disk_gb"] > cn.local_gb * cn.disk_allocation_ratio):
                return RESOURCES
            self.tracked[source][instance] = dict(res)
            self._where[instance] = source
            self._account(cn, source, res, +1)
        if req is not None and req.group_uuid and not self._group_allows(source, instance, req):
            with self._locks[source]:
                del self.tracked[source][instance]
                self._account(cn, source, res, -1)
            self._where.pop(instance, None)
            return GROUP_POLICY
        info = objects.InstanceList(objects=[objects.Instance(uuid=instance, host=cn.host,
                                                              node=cn.hypervisor_hostname)])
        for sched in self.schedulers:
            sched.update_instance_info(self._ctx, cn.host, info)
        return None

    def _group_allows(self, source: str, instance: str, req: SimRequest) -> bool:
        """nova-compute's ``_validate_instance_group_policy``, after the instance claim set the
        instance's host and under the group's lock: anti-affinity, no other member on this
        host (``max_server_per_host`` is not used by the workload); affinity, this host if
        another member has one.  Unlike nova, whose lock is per compute process, the one
        process here serialises the affinity check too."""
        group = req.group_uuid
        assert group is not None
        with self._group_locks.setdefault(group, threading.Lock()):
            # a member keeps its host while it is one (delete() drops the membership first)
            where = self._where
            hosts = {where[u] for u in self._members.get(group, ())}
            if req.group_policy == "anti-affinity":
                ok = source not in hosts
            elif req.group_policy == "affinity":
                ok = not hosts or source in hosts
            else:
                ok = True
            if ok:
                self._members.setdefault(group, set()).add(instance)
                self._group_of[instance] = group
            return ok

    def _account(self, cn: Any, source: str, res: Mapping[str, int], sign: int) -> None:
        """Usage changed by one instance, saved as the tracker saves it, published (caller holds
        the host's lock)."""
        cn.vcpus_used += sign * res["vcpus"]
        cn.memory_mb_used += sign * res["memory_mb"]
        cn.local_gb_used += sign * res["disk_gb"]
        cn.free_ram_mb = cn.memory_mb - cn.memory_mb_used
        cn.free_disk_gb = cn.local_gb - cn.local_gb_used
        # what the driver's periodic audit reports (thin images: the same as free here)
        cn.disk_available_least = cn.free_disk_gb
        cn.running_vms = len(self.tracked[source])
        stats = dict(cn.stats or {})
        stats["num_instances"] = str(cn.running_vms)
        stats["num_vm_active"] = str(cn.running_vms)
        stats["num_task_None"] = str(cn.running_vms)
        cn.stats = stats
        with self._db_write_lock:
            cn.save()
        hook = self.hooks.get(source)
        if hook is not None:
            hook.report(cn, instances=sorted(self.tracked[source]))

    def _spec(self, req: SimRequest) -> Any:
        from nova import objects

        from shared_host_manager.nova.testing import fixtures as fx

        group = None
        if req.group_uuid:
            # as the conductor loads it from the API DB: policy, and the legacy policies list
            # nova's affinity filter still reads
            group = objects.InstanceGroup(uuid=req.group_uuid, policy=req.group_policy,
                                          policies=[req.group_policy],
                                          members=list(req.group_members),
                                          hosts=sorted(set(req.group_hosts)), rules={})
        spec = fx.request_spec(instance_uuid=req.instance_uuids[0], memory_mb=req.memory_mb,
                               vcpus=req.vcpus, root_gb=req.root_gb, group=group,
                               num_instances=len(req.instance_uuids), extra_specs=req.extra_specs)
        spec.project_id, spec.user_id = req.project_id, req.user_id
        # as nova's API records the server's zone (nova's request filter maps it to placement)
        spec.availability_zone = req.availability_zone
        return spec

    # -- the end -----------------------------------------------------------------------------
    def check(self) -> dict[str, Any]:
        """Overcommitted hosts at the computes and in placement, and whether every server the
        computes run has its placement allocation (and no other consumer has one)."""
        compute_over = 0
        for cn in self.nodes.values():
            if (cn.vcpus_used > cn.vcpus * cn.cpu_allocation_ratio
                    or cn.memory_mb_used > cn.memory_mb * cn.ram_allocation_ratio
                    or cn.local_gb_used > cn.local_gb * cn.disk_allocation_ratio):
                compute_over += 1
        placement_over = 0
        mismatched = 0
        for source, h in self.hosts.items():
            allocs = self.placement.request("GET", f"/resource_providers/{source}/allocations")
            usages: dict[str, int] = {}
            for alloc in allocs["allocations"].values():
                for rc, amount in alloc["resources"].items():
                    usages[rc] = usages.get(rc, 0) + amount
            caps = {"VCPU": h.vcpus * h.cpu_allocation_ratio,
                    "MEMORY_MB": (h.memory_mb - h.reserved_memory_mb) * h.ram_allocation_ratio,
                    "DISK_GB": h.disk_gb * h.disk_allocation_ratio}
            if any(usages.get(rc, 0) > cap for rc, cap in caps.items()):
                placement_over += 1
            consumers = set(allocs["allocations"])
            if consumers != set(self.tracked[source]):
                mismatched += 1
        def counted(name: str) -> int:
            return sum(getattr(s.host_manager, "counters", {}).get(name, 0) for s in self.schedulers)

        # decisions that put this scheduler's own host first ([shared_host_manager]
        # host_ownership), and the claims placement accepted that peers were told of
        return {"overcommitted_hosts": compute_over, "placement_overcommitted_hosts": placement_over,
                "allocation_mismatched_hosts": mismatched, "owned_choices": counted("owned_choices"),
                "claims_announced": counted("claims_announced")}

    def close(self) -> None:
        for reporter in self.reporters:
            try:
                reporter.stop(goodbye=False)
            except Exception:  # stopping must go on
                pass
        for service in self.services:
            try:
                service.stop()
            except Exception:
                pass
        if getattr(self, "bus", None) is not None:
            self.bus.close()
        for close in reversed(self._closers):
            close()


def _rc(res: Mapping[str, int]) -> dict[str, int]:
    return {"VCPU": res["vcpus"], "MEMORY_MB": res["memory_mb"], "DISK_GB": res["disk_gb"]}


def _compute_node(i: int, h: SimHost) -> Any:
    """The ComputeNode nova-compute's ResourceTracker writes for ``h`` (reserved memory in use)."""
    from nova import objects
    from oslo_serialization import jsonutils

    from shared_host_manager.nova.testing import fixtures as fx

    vcpus = sum(r["vcpus"] for r in h.instances.values())
    memory = h.reserved_memory_mb + sum(r["memory_mb"] for r in h.instances.values())
    disk = sum(r["disk_gb"] for r in h.instances.values())
    n = len(h.instances)
    return objects.ComputeNode(
        id=i + 1, uuid=h.source, host=h.host, hypervisor_hostname=h.host,
        memory_mb=h.memory_mb, memory_mb_used=memory, free_ram_mb=h.memory_mb - memory,
        local_gb=h.disk_gb, local_gb_used=disk, free_disk_gb=h.disk_gb - disk,
        disk_available_least=h.disk_gb - disk, vcpus=h.vcpus, vcpus_used=vcpus,
        hypervisor_type="QEMU", hypervisor_version=8002000,
        cpu_info=jsonutils.dumps({"arch": "x86_64", "model": "Skylake", "vendor": "Intel",
                                  "topology": {"cells": 1, "sockets": 1, "cores": h.vcpus,
                                               "threads": 1}, "features": []}),
        host_ip=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
        supported_hv_specs=[objects.HVSpec(arch="x86_64", hv_type="kvm", vm_mode="hvm")],
        numa_topology=None, pci_device_pools=objects.PciDevicePoolList(),
        stats={"num_instances": str(n), "io_workload": "0", "failed_builds": "0",
               "num_vm_active": str(n), "num_task_None": str(n)},
        metrics="[]", cpu_allocation_ratio=h.cpu_allocation_ratio,
        ram_allocation_ratio=h.ram_allocation_ratio, disk_allocation_ratio=h.disk_allocation_ratio,
        running_vms=n, current_workload=0, service_id=i + 1, mapped=1, updated_at=fx.NOW)


def _db_url(db_url: str | None, name: str) -> str | None:
    """``db_url`` with its database named ``<its name>_<name>`` (None: SQLite files)."""
    if db_url is None:
        return None
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    return url.set(database=f"{url.database or 'shm'}_{name}").render_as_string(hide_password=False)


def _placement_url(directory: str, db_url: str | None) -> str:
    if db_url is None:
        path = os.path.join(directory, "placement.sqlite")
        import sqlite3

        with sqlite3.connect(path) as conn:  # WAL, as nova's database (fixtures.NovaDatabase)
            conn.execute("PRAGMA journal_mode=WAL")
        return "sqlite:///" + path
    from shared_host_manager.nova.testing import fixtures as fx

    url = _db_url(db_url, "placement")
    assert url is not None
    fx.recreate_database(url)
    return url


__all__ = ["EXTRA", "NovaCloud", "PHASES", "SimAggregate", "SimHost", "SimOutcome", "SimRequest",
           "missing"]
