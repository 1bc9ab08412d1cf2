"""``shm reporter --config-file FILE``: run a compute reporter until SIGTERM.

It serves ``[reporter] simulated_hosts`` simulated hosts (load tests, the
simulator's shape of a deployment) or a resource-tracker adapter plugged in
by code (:class:`compute_reporter.tracker.ResourceTracker`); on a nova compute
node the reporter runs inside ``nova-compute-shared`` instead.
"""

from __future__ import annotations

from oslo_config import cfg

from compute_reporter import service as reporter_service
from compute_reporter.service import ReporterService
from compute_reporter.tracker import SimulatedTracker
from shared_host_manager.conf import updatelog as updatelog_conf
from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf
from shm_cli import common


def register(conf: cfg.ConfigOpts) -> None:
    updatelog_conf.register_opts(conf)
    reporter_service.register_service_opts(conf)


def build(conf: cfg.ConfigOpts) -> ReporterService:
    group = conf.reporter
    tracker = SimulatedTracker(group.simulated_hosts, seed=group.simulated_seed,
                               prefix=group.name,
                               change_interval=group.simulated_change_interval)
    return reporter_service.service_from_conf(conf, tracker, recorder=recorder_from_conf(conf))


def main(argv: list[str]) -> int:
    conf = common.setup(argv, "shm reporter", register)
    service = build(conf)
    return common.run_until_signalled(service.start, service.stop)
