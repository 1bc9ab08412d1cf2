"""What every long-running ``shm`` service command does before it starts serving.

Life cycle of a service process::

    parse --config-file/--config-dir and the command line (oslo.config)
      -> set up logging (oslo.log)
      -> choose the concurrency backend: native threads by default; only
         ``[DEFAULT] concurrency_backend = eventlet`` imports and monkey-patches
         eventlet, before anything else starts a thread (nova 34 makes
         ``import eventlet`` fail in its threading mode, so nothing here
         imports it unless asked)
      -> build the transport from [data_plane] / [control_plane]
      -> run until SIGTERM or SIGINT, then stop cleanly (flush, close).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from oslo_config import cfg
from oslo_log import log as logging

LOG = logging.getLogger(__name__)

common_opts: list[cfg.Opt] = [
    cfg.StrOpt("concurrency_backend", default="threading", choices=["threading", "eventlet"],
               help="""
How this process runs concurrent work. 'threading' (default): native threads.
'eventlet': import eventlet and monkey-patch the standard library first, for
deployments that still run eventlet; deprecated upstream and never imported
unless chosen here.
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
    logging.setup(conf, "shm")
    if conf.concurrency_backend == "eventlet":
        import eventlet  # noqa: PLC0415 — only when the operator asked for it

        eventlet.monkey_patch()
        LOG.warning("running with the eventlet backend (deprecated upstream)")
    return conf


def run_until_signalled(start: Callable[[], None], stop: Callable[[], None]) -> int:
    """Start, block until SIGTERM/SIGINT, stop. Returns the exit code."""
    done = threading.Event()

    def _signalled(signum: int, frame: object) -> None:
        LOG.info("received signal %d, stopping", signum)
        done.set()

    signal.signal(signal.SIGTERM, _signalled)
    signal.signal(signal.SIGINT, _signalled)
    start()
    try:
        while not done.wait(1.0):
            pass
    finally:
        stop()
    return 0
