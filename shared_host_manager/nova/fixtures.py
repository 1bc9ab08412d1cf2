"""The drop-in wired into an in-process nova, for nova's functional tests.

``from shared_host_manager.nova.fixtures import SharedHostManagerFixture`` in a
nova functional test runs nova's scheduler on the shared host state (see the class).
The pieces the project's own tests and benchmarks build from -- nova objects, a cache
fed from documents, a fake placement, a nova database -- are
:mod:`shared_host_manager.nova.testing.fixtures`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any

# imported with this module, not on the fixture's first use: a fixture used after nova's
# TestCase.setUp meets nova's poison fixtures, and numpy's first import calls os.uname
import numpy  # noqa: F401

try:
    import fixtures as _fixtures
    _FixtureBase: Any = _fixtures.Fixture
except ImportError:  # the fixtures library comes with nova's test requirements
    _FixtureBase = object

LOG = logging.getLogger(__name__)


class SharedHostManagerFixture(_FixtureBase):
    """nova's scheduler on the shared host state, inside one in-process nova.

    Used like nova's own fixtures (``self.useFixture(SharedHostManagerFixture())``
    before the services start; nova's ``nova/tests/fixtures`` are the model),
    it wires every piece a deployment has, on one in-process bus:

    * each scheduler service nova starts gets its own cache
      (:class:`~shared_host_manager.service.SchedulerService`), built when its
      SharedHostManager first needs it;
    * each nova-compute that starts (``ComputeManager.pre_start_hook``) gets its own
      :class:`~shared_host_manager.nova.compute_hook.ComputeHook` and reporter,
      which says goodbye when the compute stops (``graceful_shutdown``);
    * one API-side source (:mod:`.api_source`) publishes what nova-api and
      nova-conductor change: service state, service and node deletions, aggregates;
    * each scheduler's manager is the drop-in's (:mod:`.report_client`): its placement
      client answers allocation candidates from the scheduler service's placement view
      when the service has one and it answers, and asks placement otherwise (counted in
      ``figures()``: ``candidates_from_memory``, ``candidates_from_placement``,
      ``candidates_by_reason``);
    * when the test sets up placement's database (placement's own fixture,
      ``placement.tests.fixtures.Database``, which nova's ``PlacementFixture`` uses),
      a placement feed (:class:`~shared_host_manager.placement.feed_service.PlacementFeed`)
      reads it through the engine placement itself uses, served by a reporter on the
      same bus: the schedulers' placement views are fed from it, as in a deployment
      (docs/design.md §11).  The feed has no thread of its own: it is polled before
      each decision, on the deciding thread (see below); without placement's database
      fixture there is no feed, and placement answers every request (``no_feed``);
    * before each ``select_destinations`` the feed reads what placement changed, every
      reporter's pending changes are published and the bus delivered, so a decision
      sees every change nova made before it asked (as nova's own scheduler does
      through its database), allocation candidates included.

    Nothing of nova's private state is touched: public methods of nova's classes
    are wrapped and restored at cleanup, which also stops every service started.
    ``figures()`` tells what the drop-in served (decisions, host-state requests) and how
    its schedulers' claims retired (``claims_by_outcome``).
    With ``record_dir`` each scheduler keeps an update log there (closed when it
    stops), which ``shm replay --decisions`` can re-run: :attr:`logs`.
    """

    def __init__(self, *, heartbeat_interval: float = 5.0, down_interval: float = 30.0,
                 record_dir: str | None = None) -> None:
        if _FixtureBase is object:
            raise RuntimeError("SharedHostManagerFixture needs the 'fixtures' library "
                               "(pip install fixtures)")
        super().__init__()
        self.heartbeat_interval = heartbeat_interval
        self.down_interval = down_interval
        self.record_dir = record_dir
        #: each recording scheduler's log (base path; its parts are ``<base>.NNNN``)
        self.logs: list[str] = []

    def _setUp(self) -> None:
        from nova.compute import manager as compute_manager
        from nova.scheduler import manager as scheduler_manager

        from shared_host_manager.nova import api_source, compute_hook, host_manager, report_client
        from transport.inprocess import InProcessBus

        self._lock = threading.RLock()
        self.bus = InProcessBus(threaded=False)
        self.topics = ("shm-reporter", "shm-scheduler")
        self.schedulers: list[Any] = []
        self.reporters: dict[str, Any] = {}  # compute host -> its reporter
        self.hooks: dict[str, Any] = {}
        self.decisions = 0
        #: the placement feed on the test's placement database and its reporter (None: none)
        self.feed: Any = None
        self.feed_reporter: Any = None
        #: placement feeds this test ran (one per placement database fixture set up)
        self.feeds_started = 0
        #: figures() as of cleanup (None while the test runs)
        self._final: dict[str, Any] | None = None
        self._names = itertools.count(1)
        self.addCleanup(self._stop_all)

        from shared_host_manager.nova import cmd

        cmd._register_nova_opts()  # [shared_host_manager]: a test may set the drop-in's options
        host_manager.install()
        self.addCleanup(host_manager.uninstall)
        host_manager.set_cache_provider(self._new_cache)
        self.addCleanup(host_manager.set_cache_provider, None)
        # the scheduler's placement client: allocation candidates from each scheduler's
        # placement view when it has one (report_client.py)
        report_client.install()
        self.addCleanup(report_client.uninstall)
        report_client.set_view_provider(self._placement_view)
        self.addCleanup(report_client.set_view_provider, None)
        compute_hook.install()
        self.addCleanup(compute_hook.uninstall)
        self.api = api_source.ApiStateSource("nova-api")
        self.api_reporter = self._reporter("nova-api", self.api)
        api_source.install(self.api)
        self.addCleanup(api_source.uninstall)

        fixture = self
        cm = compute_manager.ComputeManager
        sm = scheduler_manager.SchedulerManager
        originals = [(cm, "pre_start_hook", cm.pre_start_hook),
                     (cm, "graceful_shutdown", cm.graceful_shutdown),
                     (sm, "select_destinations", sm.select_destinations)]
        for cls, name, original in originals:
            self.addCleanup(setattr, cls, name, original)
        pre_start, shutdown, select = (o[2] for o in originals)
        self._watch_placement_database()

        def pre_start_hook(manager: Any, service_ref: Any) -> Any:
            hook = fixture._compute_started(manager.host)
            result = pre_start(manager, service_ref)  # nova's first update_available_resource
            fixture._serve(manager.host, hook)
            return result

        def graceful_shutdown(manager: Any, timeout: Any) -> Any:
            try:
                return shutdown(manager, timeout)
            finally:
                fixture._compute_stopped(manager.host)

        def select_destinations(manager: Any, *args: Any, **kwargs: Any) -> Any:
            fixture.sync()
            with fixture._lock:
                fixture.decisions += 1
            return select(manager, *args, **kwargs)

        cm.pre_start_hook = pre_start_hook
        cm.graceful_shutdown = graceful_shutdown
        sm.select_destinations = select_destinations

    def _watch_placement_database(self) -> None:
        """Start the placement feed when placement's database fixture creates the test's database
        (``Database.generate_schema_create_all(engine)``, with the engine placement then uses),
        stop it at that fixture's cleanup.  Without placement's test fixtures: no feed."""
        try:
            from placement.tests import fixtures as placement_fixtures
        except ImportError:
            return
        database = placement_fixtures.Database
        original = database.generate_schema_create_all
        self.addCleanup(setattr, database, "generate_schema_create_all", original)
        fixture = self

        def generate_schema_create_all(db_fixture: Any, engine: Any) -> Any:
            result = original(db_fixture, engine)  # the schema, traits and resource classes
            fixture._start_feed(engine)
            db_fixture.addCleanup(fixture._stop_feed)  # before the engine is disposed of
            return result

        setattr(database, "generate_schema_create_all", generate_schema_create_all)  # noqa: B010

    # -- parties -----------------------------------------------------------------------
    def _reporter(self, name: str, tracker: Any) -> Any:
        from compute_reporter.service import ReporterService

        reporter = ReporterService(
            f"{name}-{next(self._names)}", tracker, self.bus, self.bus,
            reporter_topic=self.topics[0], scheduler_topic=self.topics[1],
            coalesce_window=0.0, heartbeat_interval=self.heartbeat_interval)
        reporter.start()
        return reporter

    def _start_feed(self, engine: Any) -> None:
        """A placement feed on placement's database (``engine``: placement's own), no thread of its
        own (:meth:`sync` polls it), published by a reporter on the bus.  A feed that cannot start
        leaves the test without one: placement answers (``no_feed``)."""
        from compute_reporter.service import ReporterService
        from shared_host_manager.placement.database import PlacementDatabase
        from shared_host_manager.placement.feed_service import PlacementFeed

        self._stop_feed()
        with self._lock:
            try:
                # one source name: a feed started again is the same source, a newer epoch
                feed = PlacementFeed(PlacementDatabase(str(engine.url), engine=engine),
                                     poll_interval=None)
                reporter = ReporterService(
                    f"placement-feed-{next(self._names)}", feed, self.bus, self.bus,
                    reporter_topic=self.topics[0], scheduler_topic=self.topics[1],
                    coalesce_window=0.0, heartbeat_interval=self.heartbeat_interval)
                feed.confirm = lambda: self._publish_feed(reporter)
                reporter.start()  # reads every provider: the source's first document
            except Exception:
                LOG.exception("placement feed not started: placement answers every request")
                return
            self.feed, self.feed_reporter = feed, reporter
            self.feeds_started += 1

    @staticmethod
    def _publish_feed(reporter: Any) -> bool:
        """The feed's confirm: its changes published now, in the calling thread (the in-process
        bus stores them at once); True unless a publish failed."""
        errors = reporter.stats["publish_errors"]
        reporter.flush()
        return bool(reporter.stats["publish_errors"] == errors)

    def _poll_feed(self) -> None:
        """One look at placement's database (under the lock).  A poll that fails stops the feed
        with its goodbye: the views answer ``stale`` (placement does) rather than from a
        database they no longer follow."""
        feed = self.feed
        if feed is None:
            return
        try:
            feed.poll_once()
        except Exception:
            LOG.exception("placement feed: poll failed; stopping it (placement answers)")
            self._stop_feed()

    def _stop_feed(self) -> None:
        with self._lock:
            reporter, self.feed, self.feed_reporter = self.feed_reporter, None, None
        if reporter is not None:
            reporter.stop()  # its goodbye: the views stop answering from it
            self.bus.pump()

    def _new_cache(self) -> Any:
        """One cache per scheduler service (called by each SharedHostManager on first use)."""
        from shared_host_manager.service import SchedulerService
        from shared_host_manager.updatelog.recorder import Recorder

        name = f"scheduler-{next(self._names)}"
        recorder = Recorder(self.record_dir) if self.record_dir else None
        service = SchedulerService(
            name, self.bus, self.bus, reporter_topic=self.topics[0],
            scheduler_topic=self.topics[1], down_interval=self.down_interval, recorder=recorder,
            # the feed is read before each decision (sync): its source is judged by its
            # heartbeats, as every other source here, not by the deployment's 5 s
            placement_max_staleness=self.down_interval)
        service.start()
        with self._lock:
            self.schedulers.append(service)
            if recorder is not None:
                self.logs.append(os.path.join(recorder.directory, f"scheduler-{name}.ulog"))
        self.sync()
        return service.cache

    def _placement_view(self, host_manager: Any) -> Any:
        """The placement view of the scheduler service serving ``host_manager`` (None: none)."""
        cache = getattr(host_manager, "built_cache", None)
        with self._lock:
            for service in self.schedulers:
                if service.cache is cache:
                    return getattr(service, "placement_view", None)
        return None

    def _compute_started(self, host: str) -> Any:
        from shared_host_manager.nova import compute_hook

        hook = compute_hook.ComputeHook(aggregate_refresh_interval=0)
        compute_hook.register(host, hook)
        with self._lock:
            self.hooks[host] = hook
        return hook

    def _serve(self, host: str, hook: Any) -> None:
        from shared_host_manager.nova import compute_hook

        reporter = self._reporter(f"compute-{host}", compute_hook.NovaTracker(hook))
        with self._lock:
            old = self.reporters.pop(host, None)
            self.reporters[host] = reporter
        if old is not None:
            old.stop()

    def _compute_stopped(self, host: str) -> None:
        from shared_host_manager.nova import compute_hook

        with self._lock:
            reporter = self.reporters.pop(host, None)
            if self.hooks.get(host) is compute_hook.hook_for(host):
                compute_hook.unregister(host)
            self.hooks.pop(host, None)
        if reporter is not None:
            reporter.stop()  # a clean stop: the goodbye takes the host out at once
            self.bus.pump()

    # -- synchronisation -----------------------------------------------------------------
    def sync(self) -> None:
        """Read placement's changes, publish every pending change and deliver the bus: decisions
        see all that happened (the bus delivers in this thread: every view is current after)."""
        with self._lock:
            self._resolve_cells()
            self._poll_feed()
            for reporter in [self.api_reporter, *self.reporters.values()]:
                reporter.flush()
            self.bus.pump()

    def _resolve_cells(self) -> None:
        """Tell each compute its cell (nova-compute-shared: ``[shared_host_manager] cell_uuid``):
        the host mapping nova's test creates once the compute has started."""
        from nova import context as nova_context
        from nova import exception, objects

        ctxt = None
        for host, hook in self.hooks.items():
            if hook.cell_uuid is not None:
                continue
            ctxt = ctxt or nova_context.get_admin_context()
            try:
                hook.set_cell(objects.HostMapping.get_by_host(ctxt, host).cell_mapping.uuid)
                continue
            except exception.HostMappingNotFound:
                pass
            # no mapping (a test deleted the service, then started the compute again):
            # the cell whose database holds the compute's service record
            for cell in objects.CellMappingList.get_all(ctxt):
                with nova_context.target_cell(ctxt, cell) as cctxt:
                    try:
                        objects.Service.get_by_compute_host(cctxt, host)
                    except exception.ComputeHostNotFound:
                        continue
                hook.set_cell(cell.uuid)
                break

    def figures(self) -> dict[str, Any]:
        """What the drop-in served: decisions, and host-state requests of its host managers
        (during the test, or as they were when cleanup stopped them)."""
        from shared_host_manager.nova import host_manager

        with self._lock:
            if self._final is not None:
                return dict(self._final)
            caches = {id(service.cache) for service in self.schedulers}
            schedulers = len(self.schedulers)
        requests = sum(m.counters["requests"] for m in host_manager.managers()
                       if id(m.built_cache) in caches)
        return {"decisions": self.decisions, "host_state_requests": requests,
                "schedulers": schedulers, "placement_feeds": self.feeds_started,
                "claims_by_outcome": self._claims(), **self._candidates()}

    def _claims(self) -> dict[str, int]:
        """The claims this test's schedulers retired, by outcome (their receivers' counters)."""
        from protocol.receiver import OUTCOME_STATS

        with self._lock:
            receivers = [service.cache.receiver for service in self.schedulers]
        return {outcome.value: sum(r.stats[key] for r in receivers)
                for outcome, key in OUTCOME_STATS.items()}

    def _candidates(self) -> dict[str, Any]:
        """Allocation candidates of this test's schedulers: from memory, from placement, and
        why placement (report_client.py's counters)."""
        from shared_host_manager.nova import report_client

        memory = placement = 0
        reasons: dict[str, int] = {}
        with self._lock:
            caches = {id(service.cache) for service in self.schedulers}
        for client in report_client.clients():
            manager = client.manager_ref()
            if manager is None or id(getattr(manager.host_manager, "built_cache", None)) not in caches:
                continue
            f = client.figures()
            memory += f["from_memory"]
            placement += f["from_placement"]
            for reason, n in f["by_reason"].items():
                reasons[reason] = reasons.get(reason, 0) + n
        return {"candidates_from_memory": memory, "candidates_from_placement": placement,
                "candidates_by_reason": reasons}

    def _stop_all(self) -> None:
        from shared_host_manager.nova import compute_hook

        final = self.figures()  # the managers may be gone once nova's services are
        self._stop_feed()
        with self._lock:
            self._final = final
            reporters = list(self.reporters.values())
            self.reporters.clear()
            schedulers, self.schedulers = self.schedulers, []
            for host, hook in self.hooks.items():  # computes the test left running
                if compute_hook.hook_for(host) is hook:
                    compute_hook.unregister(host)
            self.hooks.clear()
        for reporter in [*reporters, self.api_reporter]:
            reporter.stop(goodbye=False)
        for service in schedulers:
            service.stop()
        self.bus.close()


__all__ = ["SharedHostManagerFixture"]
