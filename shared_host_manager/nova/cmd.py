"""``nova-scheduler-shared`` and ``nova-compute-shared``: nova's services with the shared host state.

nova 34 has no option or entry point for a custom host manager (removed in
Rocky, see the nova notes), so these wrappers do what the nova scheduler and
compute starters do, plus two things, and then call nova's own ``main()``:

nova-scheduler-shared::

    monkey_patch.patch(backend='threading')      # nova's first line, first
    register [shared_host_manager] in nova's CONF
    nova.scheduler.host_manager.HostManager = SharedHostManager
    SchedulerManager.select_destinations: timed (shm_decision_seconds)
    nova-scheduler's manager: SharedSchedulerManager, whose placement client answers
        allocation candidates from the service's placement view (report_client.install)
    request_filter._should_filter_by_owner -> answered from the stream
    request_filter.ALL_REQUEST_FILTERS: the aggregate filters answered from the catalogue
        (request_filters.py)
    SchedulerManager.pre_start_hook  += start the host-state cache service and its
                                        [metrics] endpoint (port 9468)
    SchedulerManager.graceful_shutdown += stop it (last snapshot to state_dir)
    nova.cmd.scheduler.main(), checked right after it parses nova.conf (see below)

The cache service (:class:`~shared_host_manager.service.SchedulerService`) is
built and started in ``pre_start_hook``, i.e. in each worker process after
nova forked it, before the RPC server starts: connections and threads are
never inherited across a fork.  With ``[scheduler] workers`` > 1 every worker
runs its own cache under the name ``<[cache] name>-<pid>`` and without a
``state_dir`` (names change on restart); one worker per scheduler host keeps
warm restarts.

nova-compute-shared::

    monkey_patch.patch(backend='threading')
    register [shared_host_manager] in nova's CONF
    wrap ResourceTracker._update and ComputeManager.set_host_enabled (compute_hook.install)
    ComputeManager.pre_start_hook += after nova's first update_available_resource,
                                     start a ReporterService serving this host's nodes
                                     and its [metrics] endpoint (port 9467)
    ComputeManager.set_shutdown_in_progress += stop it (last changes flushed, goodbye):
                                     the first step of nova's Service.stop, before nova
                                     stops taking builds
    ComputeManager.graceful_shutdown += stop the [metrics] endpoint after nova's own
    nova.cmd.compute.main(), checked right after it parses nova.conf (see below)

nova-api (uWSGI ``module = shared_host_manager.nova.wsgi.osapi_compute:application``)
and nova-conductor-shared::

    Service.create/save/destroy, ComputeNode.create/destroy, Aggregate changes
        -> the API-side source (shared_host_manager.nova.api_source) on the stream,
           started in each worker after the fork (shared_host_manager.nova.api_publisher)
    nova-conductor-shared: nova.service.Service.start/stop += start it / say goodbye

Errors at start
---------------
nova-scheduler-shared and nova-compute-shared end like the ``shm`` services
(``transport.startup``): an operator's mistake prints one line on stderr,
``<prog>: error: <what, and what to do>``, no traceback (``--debug`` adds it),
and exits 78 (configuration or state, a login the broker refuses) or 69 (the
broker unreachable for ``[DEFAULT] broker_start_timeout`` of the stream
configuration); systemd units restart on 69, not on 78.

What can fail is checked in the parent, once, before nova builds its service
(:func:`run_checked` wraps nova's ``config.parse_args``): our options in
nova.conf, every value of the stream configuration, the required broker URLs,
signing keys, the update log, the state directory (the scheduler's with one
worker, the compute's epochs file) and a login to the stream's broker(s),
bounded by ``broker_start_timeout``.  Not in the worker, because nova's
scheduler always runs its service in workers forked by oslo.service's
process manager (cotyledon, also for ``workers = 1``), which forks a worker
again whenever one exits, at most about once a second, and never exits
itself: a check that fails in every worker is a respawn loop whose parent
keeps running (and a wrong broker password, found only by the service's
reconnecting consumer, is never fatal at all).  In the parent it runs before
any fork, so the process exits with the check's code; and nova-compute,
which does not fork, would otherwise first wait for a conductor in
``Service.create``.  The check builds nothing (no connection or thread is
inherited across the fork): the service is still built in each worker.

What still fails in a worker (a state directory made unwritable since the
check) ends that worker with its code, and the parent's process manager,
told by a dead-worker hook, stops the other workers and exits with that
code instead of forking another.

Deployment (all)
----------------
nova.conf::

    [shared_host_manager]
    config_files = /etc/nova/shared-host-manager.conf
    default_cell_uuid = <cell1 uuid>          # scheduler
    cell_uuid = <cell1 uuid>                  # compute

/etc/nova/shared-host-manager.conf (the project's own options, see
``etc/shm.conf.sample``)::

    [data_plane]
    backend = rabbit
    stream_url = amqp://shm:secret@rabbit1:5672//
    [control_plane]
    backend = oslo
    transport_url = rabbit://shm:secret@rabbit1:5672/
    [cache]                                   # scheduler
    name = sched-1
    state_dir = /var/lib/nova/shm
    [reporter]                                # compute
    name = compute-1
    state_dir = /var/lib/nova/shm
    [signing]
    enabled = true
    master_key = ...                          # scheduler; a compute gets key_file
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

LOG = logging.getLogger(__name__)

_lock = threading.Lock()
_service: Any = None
_endpoint: Any = None  # the [metrics] endpoint of this process (transport.metrics)
_serve: list[Any] = []  # the scheduler service's ConfigOpts, for its endpoint


def _register_nova_opts() -> Any:
    import nova.conf

    from shared_host_manager.nova import conf as shm_conf

    conf = nova.conf.CONF
    try:
        conf.shared_host_manager  # noqa: B018 - already registered?
    except Exception:
        shm_conf.register_opts(conf)
    return conf


def _stream_conf(register: Any) -> Any:
    """Our own ConfigOpts, parsed from ``[shared_host_manager] config_files``."""
    import nova.conf
    from oslo_config import cfg

    files = []
    for f in nova.conf.CONF.shared_host_manager.config_files:
        if os.path.exists(f):
            files.append(f)
        else:
            LOG.warning("[shared_host_manager] config_files: %s does not exist; using defaults", f)
    from transport.startup import broker_start_timeout_opt

    conf = cfg.ConfigOpts()
    register(conf)
    conf.register_opt(broker_start_timeout_opt)  # [DEFAULT], as in the shm services' files
    args: list[str] = []
    for f in files:
        args += ["--config-file", f]
    conf(args, project="shm", default_config_files=[], default_config_dirs=[])
    from transport.startup import check_conf_values

    check_conf_values(conf)  # an inline comment in a value: refused, with the option named
    return conf


# -- errors at start (see the module docstring) --------------------------------------------

_fatal_exit: int | None = None  # a worker's exit code that ends the parent with it


def _check_before_start(register: Any, local: Any) -> None:
    """The checks of every service: our options in nova.conf and the stream configuration
    (values, required URLs, signing keys, update log), ``local(conf)`` (state on disk), then
    a login to the broker(s), for up to ``[DEFAULT] broker_start_timeout`` seconds."""
    from shared_host_manager.updatelog import recorder
    from transport import factory, signing_opts
    from transport.startup import check_brokers, check_conf_values

    check_conf_values(_register_nova_opts(), ["shared_host_manager"])
    conf = _stream_conf(register)
    factory.check_urls(conf)
    signing_opts.keyring_from_conf(conf)
    recorder.check_conf(conf)
    local(conf)
    check_brokers(conf, conf.broker_start_timeout)


def run_checked(prog: str, nova_main: Any, check: Any) -> int:
    """Run nova's ``main()`` with ``check()`` right after it parsed nova.conf, before it
    builds its service (nova-compute's first waits for a conductor) and forks workers;
    a mistake found there, or anywhere before nova serves, ends the process with one line
    (``<prog>: error: ...``) and its exit code (transport.startup). Returns the exit code."""
    from nova import config

    from transport.startup import report_error

    parse_args = config.parse_args

    def parse_args_then_check(argv: Any, *args: Any, **kwargs: Any) -> Any:
        result = parse_args(argv, *args, **kwargs)
        check()
        return result

    config.parse_args = parse_args_then_check
    try:
        nova_main()
    except SystemExit:
        if _fatal_exit is not None:  # the launcher's own exit after a worker's fatal one
            return _fatal_exit
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_error(prog, exc, "--debug" in sys.argv or "-d" in sys.argv)
    finally:
        config.parse_args = parse_args
    return _fatal_exit or 0


def _end_worker(prog: str, exc: Any) -> None:
    """A forked worker's operator error: one line, and the error's exit code, which the
    parent (``_on_dead_worker``) takes as its own instead of forking the worker again."""
    print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 -- exiting anyway
            pass
    os._exit(exc.exit_code)  # the worker's own service never started: nothing to stop


def _stop_on_a_fatal_worker() -> None:
    """Have oslo.service's process manager (cotyledon) call ``_on_dead_worker`` when a
    worker exits, in the parent."""
    import cotyledon

    cls = cotyledon.ServiceManager
    if getattr(cls, "_shm_installed", False):
        return
    original_run = cls.run

    def run(self: Any) -> None:
        self.register_hooks(on_dead_worker=_on_dead_worker)
        original_run(self)

    cls.run = run  # type: ignore[method-assign]  # wrapped in place: cotyledon has no hook for it
    cls._shm_installed = True  # type: ignore[attr-defined]  # our marker on cotyledon's class


def _on_dead_worker(service_id: Any, worker_id: Any, exit_code: int) -> None:
    global _fatal_exit
    from transport.startup import EX_CONFIG, EX_UNAVAILABLE

    if exit_code not in (EX_CONFIG, EX_UNAVAILABLE) or _fatal_exit is not None:
        return
    _fatal_exit = exit_code
    LOG.error("a worker exited with code %d (its one line is on stderr); stopping", exit_code)
    os.kill(os.getpid(), signal.SIGTERM)
    # cotyledon runs this hook in its supervisor thread, which forks the replacement right
    # after it unless the shutdown has begun: the signal wakes the main thread at once, and
    # its shutdown stops the supervisor before the replacement
    time.sleep(1.0)


# -- scheduler -----------------------------------------------------------------------------

SCHEDULER_PROG = "nova-scheduler-shared"


def _register_scheduler(conf: Any) -> None:
    """The stream configuration's options of a scheduler."""
    from shared_host_manager import service as scheduler_service
    from shared_host_manager.conf import updatelog as updatelog_conf
    from transport import metrics as transport_metrics

    updatelog_conf.register_opts(conf)
    scheduler_service.register_service_opts(conf)
    transport_metrics.register_opts(conf, transport_metrics.DEFAULT_PORTS["nova-scheduler"])


def _scheduler_workers() -> int | None:
    import nova.conf

    workers: int | None = nova.conf.CONF.scheduler.workers
    return workers


def check_scheduler() -> None:
    """What can stop a scheduler, checked before nova builds its service (see "Errors at
    start" in the module docstring); OperatorError."""
    def local(conf: Any) -> None:
        from transport.startup import check_state_dir

        if _scheduler_workers() == 1 and conf.cache.state_dir:  # else unused (scheduler_service)
            check_state_dir(conf.cache.state_dir, "[cache] state_dir")

    _check_before_start(_register_scheduler, local)


def scheduler_service() -> Any:
    """This process's host-state cache service, built on first call (in the worker)."""
    global _service
    with _lock:
        if _service is None:
            from shared_host_manager import service as scheduler_service
            from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf

            conf = _stream_conf(_register_scheduler)
            if _register_nova_opts().shared_host_manager.cell_streams:
                _read_cells(conf)
            if _scheduler_workers() != 1:
                conf.set_override("name", f"{conf.cache.name}-{os.getpid()}", group="cache")
                conf.set_override("state_dir", None, group="cache")
                conf.set_override("bind_port", 0, group="metrics")  # one endpoint per worker
            _service = scheduler_service.service_from_conf(conf, recorder=recorder_from_conf(conf))
            _serve.append(conf)
        return _service


def _read_cells(conf: Any) -> None:
    """A stream per cell: nova's cell mappings, read once as the service is built."""
    from nova import context, objects

    from shared_host_manager.nova import cells

    objects.register_all()
    read = cells.apply_cell_mappings(
        conf, objects.CellMappingList.get_all(context.get_admin_context()))
    LOG.info("reading the host-state streams of %d cells: %s", len(read), ", ".join(read))


def _start_scheduler_service(*_: Any) -> None:
    global _endpoint
    service = scheduler_service()
    if not service.running:
        from shared_host_manager.gc_threshold import tune_gc

        tune_gc(_register_nova_opts().shared_host_manager.gc_young_threshold)
        service.start()
        LOG.info("shared host-state cache %s started (gc thresholds %s)", service.name,
                 gc.get_threshold())
        from shared_host_manager import metrics

        _endpoint = _serve_metrics(lambda: metrics.serve(service, _serve[-1], role="nova-scheduler"))
        if _endpoint is not None:
            from shared_host_manager.nova import report_client, request_filters

            # the placement client's and the request filters' counters beside the cache's
            _endpoint.registry.register(report_client.ReportClientCollector())
            _endpoint.registry.register(request_filters.RequestFilterCollector())


def _serve_metrics(serve: Any) -> Any:
    """Start the [metrics] endpoint; a port in use is logged, not fatal to nova's service."""
    try:
        return serve()
    except OSError as exc:
        LOG.error("[metrics] bind_port: cannot listen (%s); no /metrics, /healthz, /status in this "
                  "process: choose another port (0: any free one)", exc)
        return None


def _stop_scheduler_service(*_: Any) -> None:
    service = _service
    if _endpoint is not None:
        _endpoint.stop()
    if service is not None and service.running:
        service.stop()


def _timed(select_destinations: Any) -> Any:
    """select_destinations, its latency and outcome told to the cache service (/metrics)."""
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from nova import exception

        start, outcome = time.monotonic(), "error"
        try:
            result = select_destinations(self, *args, **kwargs)
            outcome = "scheduled"
            return result
        except exception.NoValidHost:
            outcome = "no_valid_host"
            raise
        finally:
            if _service is not None:
                _service.record_decision(time.monotonic() - start, outcome)
    return wrapper


_no_view_logged = False


def _placement_view(_host_manager: Any) -> Any:
    """The placement view of this process's cache service (None before the service is built, or
    while the service has none: the report client then asks placement, reason ``no_view``)."""
    global _no_view_logged
    service = _service
    if service is None:
        return None
    view = getattr(service, "placement_view", None)
    if view is None and not _no_view_logged:
        _no_view_logged = True
        LOG.warning("the host-state cache service has no placement view: allocation candidates "
                    "come from placement (shm_allocation_candidates_total{reason=\"no_view\"})")
    return view


def install_scheduler() -> None:
    """Everything nova-scheduler-shared changes in nova (see the module docstring)."""
    _register_nova_opts()
    from nova.scheduler import manager as nova_manager

    from shared_host_manager.nova import host_manager, report_client

    host_manager.install()
    host_manager.set_cache_provider(lambda: scheduler_service().cache)
    report_client.install()
    report_client.set_view_provider(_placement_view)
    cls = nova_manager.SchedulerManager
    if not getattr(cls, "_shm_installed", False):
        original_pre_start = cls.pre_start_hook
        original_shutdown = cls.graceful_shutdown

        def pre_start_hook(self: Any, service_ref: Any) -> Any:
            from transport.startup import OperatorError

            try:
                _start_scheduler_service()
            except OperatorError as exc:  # checked before the fork; this is a later change
                _end_worker(SCHEDULER_PROG, exc)
            return original_pre_start(self, service_ref)

        def graceful_shutdown(self: Any, timeout: Any) -> Any:
            try:
                return original_shutdown(self, timeout)
            finally:
                _stop_scheduler_service()

        cls.pre_start_hook = pre_start_hook
        cls.graceful_shutdown = graceful_shutdown
        cls.select_destinations = _timed(cls.select_destinations)
        cls._shm_installed = True


def main() -> None:
    """Entry point ``nova-scheduler-shared`` (same command line as nova-scheduler)."""
    from nova import monkey_patch

    monkey_patch.patch(backend="threading")
    install_scheduler()
    from nova.cmd import scheduler as nova_scheduler

    _stop_on_a_fatal_worker()
    sys.exit(run_checked(SCHEDULER_PROG, nova_scheduler.main, check_scheduler))


# -- compute ----------------------------------------------------------------------------------

COMPUTE_PROG = "nova-compute-shared"

_reporter: Any = None
_hook: Any = None


def _register_compute(conf: Any) -> None:
    """The stream configuration's options of a compute node's reporter."""
    from compute_reporter import service as reporter_service
    from shared_host_manager.conf import updatelog as updatelog_conf
    from transport import metrics as transport_metrics

    updatelog_conf.register_opts(conf)
    reporter_service.register_service_opts(conf)
    transport_metrics.register_opts(conf, transport_metrics.DEFAULT_PORTS["nova-compute"])


def check_compute() -> None:
    """What can stop nova-compute-shared's reporter, checked before nova builds its service
    (which first waits for the conductor); OperatorError."""
    def local(conf: Any) -> None:
        from compute_reporter.epochs import EpochStore

        EpochStore(conf.reporter.state_dir)  # writable, and its epochs file readable
        group = _register_nova_opts().shared_host_manager
        if group.cell_streams:
            from shared_host_manager.nova import cells

            cells.compute_cell(conf, group.cell_uuid)

    _check_before_start(_register_compute, local)


def reporter_service() -> Any:
    """This nova-compute's ReporterService (None before pre_start_hook)."""
    return _reporter


def install_compute() -> Any:
    """Everything nova-compute-shared changes in nova; returns the ComputeHook (idempotent)."""
    global _hook
    if _hook is not None:
        return _hook
    conf = _register_nova_opts()
    from nova.compute import manager as compute_manager

    from shared_host_manager.nova import compute_hook
    from shared_host_manager.nova.core import document as ndoc

    hook = _hook = compute_hook.ComputeHook()
    compute_hook.install(hook)
    cls = compute_manager.ComputeManager
    original_pre_start = cls.pre_start_hook
    original_shutdown = cls.graceful_shutdown
    original_in_progress = cls.set_shutdown_in_progress

    def pre_start_hook(self: Any, service_ref: Any) -> Any:
        global _reporter, _endpoint
        group = conf.shared_host_manager
        hook.cell_uuid = group.cell_uuid
        hook.reserved = ndoc.Reserved.from_conf(conf)
        hook.aggregate_refresh_interval = group.aggregate_refresh_interval
        result = original_pre_start(self, service_ref)  # the first update_available_resource
        from compute_reporter import metrics
        from compute_reporter import service as reporter_service
        from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf

        ours = _stream_conf(_register_compute)
        if group.cell_streams:
            from shared_host_manager.nova import cells

            cells.compute_cell(ours, group.cell_uuid)
        _reporter = reporter_service.service_from_conf(ours, compute_hook.NovaTracker(hook),
                                                       recorder=recorder_from_conf(ours))
        _reporter.start()
        _endpoint = _serve_metrics(lambda: metrics.serve(_reporter, ours, role="nova-compute"))
        return result

    def set_shutdown_in_progress(self: Any) -> Any:
        # the goodbye here, the first step of nova's Service.stop, in its own thread and
        # before nova stops taking builds: graceful_shutdown runs later, in a thread nova
        # gives up on after manager_shutdown_timeout (0 s when graceful_shutdown_timeout is
        # 10 s or less) before the process exits, and until the goodbye every scheduler
        # still takes the host for up; what the shutdown changes after it, the next start's
        # snapshot says
        result = original_in_progress(self)
        if _reporter is not None:
            _reporter.stop()  # the last changes, then every host's goodbye
        return result

    def graceful_shutdown(self: Any, timeout: Any) -> Any:
        try:
            return original_shutdown(self, timeout)
        finally:
            if _endpoint is not None:
                _endpoint.stop()

    cls.pre_start_hook = pre_start_hook
    cls.set_shutdown_in_progress = set_shutdown_in_progress
    cls.graceful_shutdown = graceful_shutdown
    return hook


# -- API and conductor ------------------------------------------------------------------------

def install_api(role: str = "nova-api") -> Any:
    """Publish what this nova-api or nova-conductor process (and each worker it forks)
    changes and no compute owns: service state, service and compute-node deletions,
    aggregates (the API-side source, design §2; :mod:`.api_publisher`).  Returns the
    process's :class:`~.api_publisher.ApiPublisher` (idempotent); it starts in each
    worker on its first use there (the WSGI application's first request, the conductor
    service's start) and says goodbye when the worker stops."""
    conf = _register_nova_opts()
    from compute_reporter import service as reporter_service
    from shared_host_manager.nova import api_publisher

    group = conf.shared_host_manager
    return api_publisher.install(
        role, lambda: _stream_conf(reporter_service.register_service_opts),
        publish_timeout=group.api_publish_timeout, lock_dir=group.api_lock_dir)


def api_wsgi_application() -> Any:
    """nova's compute API WSGI application with the API-side source (the module
    ``shared_host_manager.nova.wsgi.osapi_compute`` operators point uWSGI at)."""
    from nova.wsgi import osapi_compute

    from shared_host_manager.nova import api_publisher

    return api_publisher.wsgi_application(osapi_compute.application, install_api("nova-api"))


def install_conductor() -> Any:
    """Everything nova-conductor-shared changes in nova: the API-side source, started in
    each conductor worker when its service starts and stopped (a goodbye) when it stops
    (oslo.service's workers leave with ``os._exit``, which runs no ``atexit``)."""
    publisher = install_api("nova-conductor")
    from nova import service as nova_service

    cls = nova_service.Service
    if not getattr(cls, "_shm_api_installed", False):
        original_start, original_stop = cls.start, cls.stop

        def start(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_start(self, *args, **kwargs)
            if self.binary == "nova-conductor":
                from transport.startup import OperatorError

                try:
                    publisher.ensure_started()
                except OperatorError as exc:  # changed since the parent's check
                    _end_worker(CONDUCTOR_PROG, exc)
                except Exception:  # the conductor itself still serves nova
                    LOG.exception("API-side source not started: the service and aggregate "
                                  "changes this conductor makes do not reach the schedulers")
            return result

        def stop(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original_stop(self, *args, **kwargs)
            finally:
                if self.binary == "nova-conductor":
                    publisher.stop()

        cls.start, cls.stop = start, stop
        cls._shm_api_installed = True
    return publisher


CONDUCTOR_PROG = "nova-conductor-shared"


def check_conductor() -> None:
    """What can stop nova-conductor-shared's API-side source, checked before nova builds its
    service and forks its workers (see "Errors at start"); OperatorError."""
    from compute_reporter import service as reporter_service
    from shared_host_manager.conf import updatelog as updatelog_conf

    def register(conf: Any) -> None:
        updatelog_conf.register_opts(conf)  # read by the common checks; the source keeps no log
        reporter_service.register_service_opts(conf)

    def local(conf: Any) -> None:
        from transport.startup import check_state_dir

        group = _register_nova_opts().shared_host_manager
        lock_dir = group.api_lock_dir or conf.reporter.state_dir
        if lock_dir:
            option = ("[shared_host_manager] api_lock_dir" if group.api_lock_dir
                      else "[reporter] state_dir")
            check_state_dir(lock_dir, option)

    _check_before_start(register, local)


def conductor_main() -> None:
    """Entry point ``nova-conductor-shared`` (same command line as nova-conductor)."""
    from nova import monkey_patch

    monkey_patch.patch(backend="threading")
    install_conductor()
    from nova.cmd import conductor as nova_conductor

    _stop_on_a_fatal_worker()
    sys.exit(run_checked(CONDUCTOR_PROG, nova_conductor.main, check_conductor))


def compute_main() -> None:
    """Entry point ``nova-compute-shared`` (same command line as nova-compute)."""
    from nova import monkey_patch

    monkey_patch.patch(backend="threading")
    install_compute()
    from nova.cmd import compute as nova_compute

    sys.exit(run_checked(COMPUTE_PROG, nova_compute.main, check_compute))


if __name__ == "__main__":
    main()  # exits with nova-scheduler's status
