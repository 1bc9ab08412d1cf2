"""What every long-running ``shm`` service command does before it starts serving.

Life cycle of a service process::

    parse --config-file/--config-dir and the command line (oslo.config)
      -> check every option's value once (an inline comment, a value that does
         not convert: one line naming the option and the file)
      -> set up logging (oslo.log)
      -> choose the concurrency backend: native threads by default; only
         ``[DEFAULT] concurrency_backend = eventlet`` imports and monkey-patches
         eventlet, before anything else starts a thread (nova 34 makes
         ``import eventlet`` fail in its threading mode, so nothing here
         imports it unless asked)
      -> build the service from [data_plane] / [control_plane] and its group
      -> start, in a thread of its own: the metrics endpoint ([metrics]), a
         login to the broker (a refused password fails at once, an unreachable
         broker after ``broker_start_timeout``), then the service
      -> run until SIGTERM or SIGINT -- also while still starting -- then stop
         cleanly (flush, close) within ``stop_timeout``.

Errors (:func:`run`): an operator's mistake ends the process within seconds
with one line on stderr, ``<prog>: error: <what, and what to do>``, and a
non-zero exit code (``transport.startup``: 78 configuration or state, 69
broker unreachable, 1 anything unexpected); a traceback only with
``--debug``.
"""

from __future__ import annotations

import logging as py_logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from oslo_config import cfg
from oslo_log import log as logging

from transport import metrics as transport_metrics
from transport.startup import (
    OperatorError,
    broker_start_timeout_opt,
    check_conf_values,
    report_error,
)
from transport.startup import check_brokers as _check_brokers

LOG = logging.getLogger(__name__)

common_opts: list[cfg.Opt] = [
    cfg.StrOpt("concurrency_backend", default="threading", choices=["threading", "eventlet"],
               help="""
How this process runs concurrent work. 'threading' (default): native threads.
'eventlet': import eventlet and monkey-patch the standard library first, for
deployments that still run eventlet; deprecated upstream and never imported
unless chosen here.
"""),
    broker_start_timeout_opt,
    cfg.FloatOpt("stop_timeout", default=10.0, min=1.0, help="""
Seconds a process may take to stop cleanly after SIGTERM (last publish,
last snapshot); past them it exits anyway with code 1. A second SIGTERM or
SIGINT exits at once.
"""),
]


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """Entry point for oslo-config-generator (``shm.common``): [DEFAULT] of every service."""
    return [("DEFAULT", common_opts)]


def setup(argv: list[str], prog: str, register: Callable[[cfg.ConfigOpts], None],
          conf: cfg.ConfigOpts | None = None) -> cfg.ConfigOpts:
    conf = conf or cfg.CONF
    conf.register_opts(common_opts)
    register(conf)
    logging.register_options(conf)
    conf(argv, project="shm", prog=prog)
    check_conf_values(conf)
    logging.setup(conf, "shm")
    if conf.concurrency_backend == "eventlet":
        import eventlet  # noqa: PLC0415 — only when the operator asked for it

        eventlet.monkey_patch()
        LOG.warning("running with the eventlet backend (deprecated upstream)")
    return conf


# -- errors ---------------------------------------------------------------------------------


def _wants_debug(argv: list[str]) -> bool:
    return "--debug" in argv or "-d" in argv


# -- running a service ------------------------------------------------------------------------

T = TypeVar("T")


def check_brokers(conf: cfg.ConfigOpts, cancel: threading.Event) -> bool:
    """Log in to the broker(s) this configuration names; False if cancelled meanwhile."""
    return _check_brokers(conf, conf.broker_start_timeout, cancel)


def start_metrics(serve: Callable[[], T]) -> T:
    """Start a metrics endpoint; a port in use is an OperatorError naming the option."""
    try:
        return serve()
    except OSError as exc:
        raise OperatorError(f"[metrics] bind_host/bind_port: cannot listen ({exc.strerror or exc}); "
                            "choose another bind_port (0: any free port) or set [metrics] enabled = "
                            "false") from exc


def run(argv: list[str], prog: str, main: Callable[[list[str]], int]) -> int:
    """Run ``main(argv)``, turning an operator's mistake into one line and an exit code."""
    debug = _wants_debug(argv)
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_error(prog, exc, debug)


class Service(Protocol):
    """What ``serve_until_signalled`` runs: a reporter or scheduler service."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Endpoint(Protocol):
    def stop(self) -> None: ...


def summary_tail(status: dict[str, Any]) -> str:
    """The end of every service's periodic summary line: broker state, then health."""
    broker = status["broker"]
    return (f"broker {'connected' if broker is None or broker['connected'] else 'DISCONNECTED'}; "
            f"{status['health']}")


def serve_until_signalled(conf: cfg.ConfigOpts, service: Service,
                          serve_metrics: Callable[[], Endpoint | None],
                          summary: Callable[[], str]) -> int:
    """The life of a standalone service process: metrics endpoint, broker check, start,
    a summary line every 10 s, and stop on SIGTERM/SIGINT in any of those states."""
    halt = threading.Event()
    endpoints: list[Endpoint | None] = []

    def report() -> None:
        while not halt.wait(10.0):
            LOG.info("%s", summary())

    def start(cancel: threading.Event) -> None:
        endpoints.append(start_metrics(serve_metrics))
        if check_brokers(conf, cancel) and not cancel.is_set():
            service.start()
            threading.Thread(target=report, name="shm-summary", daemon=True).start()

    def stop() -> None:
        halt.set()
        service.stop()
        for endpoint in endpoints:
            if endpoint is not None:
                endpoint.stop()

    return run_until_signalled(start, stop, stop_timeout=conf.stop_timeout)


def run_until_signalled(start: Callable[[threading.Event], None], stop: Callable[[], None], *,
                        stop_timeout: float = 10.0) -> int:
    """Start (in a thread, so that a signal can end a start that hangs), block until
    SIGTERM/SIGINT, stop. Returns the exit code; an exception of ``start`` is re-raised
    after a best-effort ``stop``.

    ``start`` gets a ``threading.Event`` that is set when a signal arrives while it still
    runs (the broker checks give up then, and it should return early)."""
    done = threading.Event()
    cancel = threading.Event()

    def _signalled(signum: int, frame: object) -> None:
        if done.is_set():
            print("second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(1)
        LOG.info("received signal %d, stopping", signum)
        cancel.set()
        done.set()

    signal.signal(signal.SIGTERM, _signalled)
    signal.signal(signal.SIGINT, _signalled)
    failure: list[BaseException] = []

    def _start() -> None:
        try:
            start(cancel)
        except BaseException as exc:  # noqa: BLE001 -- handed to the main thread
            failure.append(exc)

    starter = threading.Thread(target=_start, name="shm-start", daemon=True)
    starter.start()
    while starter.is_alive() and not done.wait(0.1):
        pass
    if starter.is_alive():  # a signal while starting
        starter.join(5.0)
        if starter.is_alive():
            LOG.warning("still starting 5 s after the signal (connecting?); exiting without a "
                        "clean stop")
            _flush_logs()
            os._exit(0)
    try:
        if failure:
            raise failure[0]
        while not done.wait(1.0):
            pass
    finally:
        _stop_within(stop, stop_timeout)
    return 0


def _stop_within(stop: Callable[[], None], timeout: float) -> None:
    def _overdue() -> None:
        LOG.error("did not stop within %.0f s ([DEFAULT] stop_timeout); exiting anyway", timeout)
        _flush_logs()
        os._exit(1)

    watchdog = threading.Timer(timeout, _overdue)
    watchdog.daemon = True
    watchdog.start()
    try:
        stop()
    finally:
        watchdog.cancel()


def _flush_logs() -> None:
    for handler in py_logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001
            pass
    sys.stderr.flush()


def register_metrics(conf: cfg.ConfigOpts, role: str) -> None:
    transport_metrics.register_opts(conf, transport_metrics.DEFAULT_PORTS[role])
