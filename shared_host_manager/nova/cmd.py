"""``nova-scheduler-shared`` and ``nova-compute-shared``: nova's services with the shared host state.

nova 34 has no option or entry point for a custom host manager (removed in
Rocky, see the nova notes), so these wrappers do what the nova scheduler and
compute starters do, plus two things, and then call nova's own ``main()``:

nova-scheduler-shared::

    monkey_patch.patch(backend='threading')      # nova's first line, first
    register [shared_host_manager] in nova's CONF
    nova.scheduler.host_manager.HostManager = SharedHostManager
    SchedulerManager.select_destinations: timed (shm_decision_seconds)
    request_filter._should_filter_by_owner -> answered from the stream
    SchedulerManager.pre_start_hook  += start the host-state cache service and its
                                        [metrics] endpoint (port 9468)
    SchedulerManager.graceful_shutdown += stop it (last snapshot to state_dir)
    nova.cmd.scheduler.main()

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
    ComputeManager.graceful_shutdown += stop it (last changes flushed)
    nova.cmd.compute.main()

nova-api and nova-conductor (:func:`install_api`, called in each process)::

    Service.create/save/destroy, ComputeNode.create/destroy, Aggregate changes
        -> the API-side source (shared_host_manager.nova.api_source) on the stream

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
    conf = cfg.ConfigOpts()
    register(conf)
    args: list[str] = []
    for f in files:
        args += ["--config-file", f]
    conf(args, project="shm", default_config_files=[], default_config_dirs=[])
    from transport.startup import check_conf_values

    check_conf_values(conf)  # an inline comment in a value: refused, with the option named
    return conf


# -- scheduler -----------------------------------------------------------------------------

def scheduler_service() -> Any:
    """This process's host-state cache service, built on first call (in the worker)."""
    global _service
    with _lock:
        if _service is None:
            import nova.conf

            from shared_host_manager import service as scheduler_service
            from shared_host_manager.conf import updatelog as updatelog_conf
            from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf
            from transport import metrics as transport_metrics

            def register(conf: Any) -> None:
                updatelog_conf.register_opts(conf)
                scheduler_service.register_service_opts(conf)
                transport_metrics.register_opts(conf, transport_metrics.DEFAULT_PORTS["nova-scheduler"])

            conf = _stream_conf(register)
            workers = nova.conf.CONF.scheduler.workers
            if workers != 1:
                conf.set_override("name", f"{conf.cache.name}-{os.getpid()}", group="cache")
                conf.set_override("state_dir", None, group="cache")
                conf.set_override("bind_port", 0, group="metrics")  # one endpoint per worker
            _service = scheduler_service.service_from_conf(conf, recorder=recorder_from_conf(conf))
            _serve.append(conf)
        return _service


def _start_scheduler_service(*_: Any) -> None:
    global _endpoint
    service = scheduler_service()
    if not service.running:
        from shared_host_manager.nova import host_manager

        host_manager.tune_gc(_register_nova_opts().shared_host_manager.gc_young_threshold)
        service.start()
        LOG.info("shared host-state cache %s started (gc thresholds %s)", service.name,
                 gc.get_threshold())
        from shared_host_manager import metrics

        _endpoint = _serve_metrics(lambda: metrics.serve(service, _serve[-1], role="nova-scheduler"))


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


def install_scheduler() -> None:
    """Everything nova-scheduler-shared changes in nova (see the module docstring)."""
    _register_nova_opts()
    from nova.scheduler import manager as nova_manager

    from shared_host_manager.nova import host_manager

    host_manager.install()
    host_manager.set_cache_provider(lambda: scheduler_service().cache)
    cls = nova_manager.SchedulerManager
    if not getattr(cls, "_shm_installed", False):
        original_pre_start = cls.pre_start_hook
        original_shutdown = cls.graceful_shutdown

        def pre_start_hook(self: Any, service_ref: Any) -> Any:
            _start_scheduler_service()
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

    nova_scheduler.main()


# -- compute ----------------------------------------------------------------------------------

_reporter: Any = None
_hook: Any = None


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
    from shared_host_manager.nova import document as ndoc

    hook = _hook = compute_hook.ComputeHook()
    compute_hook.install(hook)
    cls = compute_manager.ComputeManager
    original_pre_start = cls.pre_start_hook
    original_shutdown = cls.graceful_shutdown

    def pre_start_hook(self: Any, service_ref: Any) -> Any:
        global _reporter, _endpoint
        group = conf.shared_host_manager
        hook.cell_uuid = group.cell_uuid
        hook.reserved = ndoc.Reserved.from_conf(conf)
        hook.aggregate_refresh_interval = group.aggregate_refresh_interval
        result = original_pre_start(self, service_ref)  # the first update_available_resource
        from compute_reporter import metrics
        from compute_reporter import service as reporter_service
        from shared_host_manager.conf import updatelog as updatelog_conf
        from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf
        from transport import metrics as transport_metrics

        def register(conf: Any) -> None:
            updatelog_conf.register_opts(conf)
            reporter_service.register_service_opts(conf)
            transport_metrics.register_opts(conf, transport_metrics.DEFAULT_PORTS["nova-compute"])

        ours = _stream_conf(register)
        _reporter = reporter_service.service_from_conf(ours, compute_hook.NovaTracker(hook),
                                                       recorder=recorder_from_conf(ours))
        _reporter.start()
        _endpoint = _serve_metrics(lambda: metrics.serve(_reporter, ours, role="nova-compute"))
        return result

    def graceful_shutdown(self: Any, timeout: Any) -> Any:
        try:
            return original_shutdown(self, timeout)
        finally:
            if _endpoint is not None:
                _endpoint.stop()
            if _reporter is not None:
                _reporter.stop()  # flushes the last changes

    cls.pre_start_hook = pre_start_hook
    cls.graceful_shutdown = graceful_shutdown
    return hook


# -- API and conductor ------------------------------------------------------------------------

_api_reporter: Any = None


def install_api() -> Any:
    """Publish what this nova-api or nova-conductor process changes and no compute owns:
    service state, service and compute-node deletions, aggregates (the API-side source,
    design §2).  Call once per process after nova's configuration is parsed (in nova-api's
    WSGI script, in a wrapper of nova-conductor); the reporter's ``[reporter] name`` gets
    ``-api-<pid>`` appended (one source per process: a source has a single writer) and no
    ``state_dir``.  Returns the running reporter (idempotent); it says goodbye at exit.
    """
    global _api_reporter
    if _api_reporter is not None:
        return _api_reporter
    _register_nova_opts()
    import atexit

    from compute_reporter import service as reporter_service
    from shared_host_manager.nova import api_source

    ours = _stream_conf(reporter_service.register_service_opts)
    name = f"{ours.reporter.name}-api-{os.getpid()}"
    ours.set_override("name", name, group="reporter")
    ours.set_override("state_dir", None, group="reporter")
    source = api_source.ApiStateSource(name)
    reporter = reporter_service.service_from_conf(ours, source)
    reporter.start()
    api_source.install(source)
    atexit.register(reporter.stop)
    _api_reporter = reporter
    return reporter


def compute_main() -> None:
    """Entry point ``nova-compute-shared`` (same command line as nova-compute)."""
    from nova import monkey_patch

    monkey_patch.patch(backend="threading")
    install_compute()
    from nova.cmd import compute as nova_compute

    nova_compute.main()


if __name__ == "__main__":
    sys.exit(main())
