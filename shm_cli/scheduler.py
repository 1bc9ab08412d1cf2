"""``shm scheduler --config-file FILE``: run the scheduler-side cache until SIGTERM.

The cache is what a scheduler process embeds; run standalone it keeps an
up-to-date view of every host and logs its state, which is how an operator
checks a deployment's stream before pointing a scheduler at it.
"""

from __future__ import annotations

import threading

from oslo_config import cfg
from oslo_log import log as logging

from shared_host_manager import service as scheduler_service
from shared_host_manager.conf import updatelog as updatelog_conf
from shared_host_manager.service import SchedulerService
from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf
from shm_cli import common

LOG = logging.getLogger(__name__)


def register(conf: cfg.ConfigOpts) -> None:
    updatelog_conf.register_opts(conf)
    scheduler_service.register_service_opts(conf)


def build(conf: cfg.ConfigOpts) -> SchedulerService:
    return scheduler_service.service_from_conf(conf, recorder=recorder_from_conf(conf))


def main(argv: list[str]) -> int:
    conf = common.setup(argv, "shm scheduler", register)
    service = build(conf)
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(10.0):
            with service.cache.lock:
                views = list(service.receiver.sources.values())
                active = sum(1 for v in views if v.status.value == "active")
            LOG.info("sources: %d held, %d active; stream offset %s; invalid %s",
                     len(views), active, service.cache.offset, dict(service.cache.invalid))

    reporter = threading.Thread(target=report, daemon=True)

    def start() -> None:
        service.start()
        reporter.start()

    def halt() -> None:
        stop.set()
        service.stop()

    return common.run_until_signalled(start, halt)
