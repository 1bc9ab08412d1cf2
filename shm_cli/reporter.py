"""``shm reporter --config-file FILE``: run a compute reporter until SIGTERM.

Where it runs: on a nova compute node the reporter runs inside
``nova-compute-shared`` (the compute hook feeds it nova's resource tracker);
``shm reporter`` is the standalone process for everything else:

* ``[reporter] tracker = simulated`` (default) serves ``simulated_hosts``
  simulated hosts (load tests, a rehearsal of a deployment's stream);
* ``[reporter] tracker = package.module:factory`` serves the hosts of a
  resource-tracker adapter you write: ``factory(conf)`` returns an object with
  the :class:`compute_reporter.tracker.ResourceTracker` methods (``hosts()``,
  ``document(host)``, ``start(sink)``, ``stop()``).

It serves /metrics, /healthz and /status on ``[metrics] bind_host:bind_port``
(default port 9465) and logs a summary every 10 s.  With ``[update_log] enabled``
it records what it handled, published and cast (:mod:`compute_reporter.recorder`).
The process imports nothing of the scheduler package (``shared_host_manager``):
tests/test_layout.py holds it to that.
"""

from __future__ import annotations

import importlib
from typing import Any

from oslo_config import cfg
from oslo_log import log as logging

from compute_reporter import metrics as reporter_metrics
from compute_reporter import service as reporter_service
from compute_reporter.epochs import EpochStore
from compute_reporter.recorder import from_conf as recorder_from_conf
from compute_reporter.service import ReporterService
from compute_reporter.tracker import ResourceTracker, SimulatedTracker
from shm_cli import common
from transport.startup import OperatorError
from transport.updatelog import opts as updatelog_opts

LOG = logging.getLogger(__name__)

PROG = "shm reporter"


def register(conf: cfg.ConfigOpts) -> None:
    updatelog_opts.register_opts(conf)
    reporter_service.register_service_opts(conf)
    common.register_metrics(conf, "reporter")


def tracker_from_conf(conf: cfg.ConfigOpts) -> ResourceTracker:
    """The tracker ``[reporter] tracker`` names: ``simulated`` or ``module:factory``."""
    group = conf.reporter
    if group.tracker == "simulated":
        return SimulatedTracker(group.simulated_hosts, seed=group.simulated_seed, prefix=group.name,
                                change_interval=group.simulated_change_interval)
    module_name, _, attr = group.tracker.partition(":")
    try:
        factory: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OperatorError(f"[reporter] tracker = {group.tracker}: cannot import it ({exc}); give "
                            "'simulated' or 'package.module:factory' importable by this Python") from exc
    tracker: ResourceTracker = factory(conf)
    return tracker


def build(conf: cfg.ConfigOpts) -> ReporterService:
    return reporter_service.service_from_conf(conf, tracker_from_conf(conf),
                                              recorder=recorder_from_conf(conf))


def summary(service: ReporterService) -> str:
    """The line logged every 10 s: the same figures as /status."""
    st = reporter_metrics.status(service)
    pub = st["published"]
    return (f"{st['sources']['served']} hosts; {st['changes']} changes; published {pub['batches']} "
            f"batches ({pub['deltas']} deltas, {pub['heartbeats']} heartbeats), {pub['failures']} "
            f"not stored, {pub['unconfirmed']} unconfirmed, {pub['retries']} retries; resyncs "
            f"answered {st['resyncs']['answered']}; claims "
            f"{', '.join(f'{k} {v}' for k, v in st['claims'].items())}; {common.summary_tail(st)}")


def _main(argv: list[str]) -> int:
    conf = common.setup(argv, PROG, register)
    service = build(conf)
    if conf.reporter.state_dir:  # local mistakes before the broker: the directory, the epochs file
        EpochStore(conf.reporter.state_dir)
    return common.serve_until_signalled(conf, service, lambda: reporter_metrics.serve(service, conf),
                                        lambda: summary(service))


def main(argv: list[str]) -> int:
    return common.run(argv, PROG, _main)
