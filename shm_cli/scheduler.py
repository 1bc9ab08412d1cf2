"""``shm scheduler --config-file FILE``: run the scheduler-side cache until SIGTERM.

The cache is what a scheduler process embeds (``nova-scheduler-shared`` runs
it inside nova's scheduler); run standalone it keeps an up-to-date view of
every host, serves /metrics, /healthz and /status on ``[metrics]
bind_host:bind_port`` (default port 9466) and logs a summary every 10 s,
which is how an operator checks a deployment's stream and, with two of them
and ``shm status --verify``, that views converge.
"""

from __future__ import annotations

from oslo_config import cfg
from oslo_log import log as logging

from shared_host_manager import metrics as scheduler_metrics
from shared_host_manager import service as scheduler_service
from shared_host_manager.conf import updatelog as updatelog_conf
from shared_host_manager.service import SchedulerService
from shared_host_manager.updatelog.recorder import from_conf as recorder_from_conf
from shm_cli import common
from transport.startup import check_state_dir

LOG = logging.getLogger(__name__)

PROG = "shm scheduler"


def register(conf: cfg.ConfigOpts) -> None:
    updatelog_conf.register_opts(conf)
    scheduler_service.register_service_opts(conf)
    common.register_metrics(conf, "scheduler")


def build(conf: cfg.ConfigOpts) -> SchedulerService:
    return scheduler_service.service_from_conf(conf, recorder=recorder_from_conf(conf))


def summary(service: SchedulerService, max_lag_seconds: float) -> str:
    """The line logged every 10 s: the same figures as /status."""
    status = scheduler_metrics.status(service, max_lag_seconds=max_lag_seconds)
    src, stream = status["sources"], status["stream"]
    lag = "unknown" if stream["lag_seconds"] is None else \
        f"{stream['lag_offsets']} offsets / {stream['lag_seconds']:.2f} s"
    stale = (stream.get("staleness") or {}).get("p99_le")
    return (f"sources: {src['held']} held, {src['active']} active, {src['down']} down, "
            f"{src['syncing']} syncing; stream offset {stream['applied_offset']} of "
            f"{stream['tail_offset']} (lag {lag}); staleness p99 <= "
            f"{'-' if stale is None else f'{stale:g} s'}; {common.summary_tail(status)}")


def _main(argv: list[str]) -> int:
    conf = common.setup(argv, PROG, register)
    service = build(conf)
    if conf.cache.state_dir:  # a local mistake before the broker
        check_state_dir(conf.cache.state_dir, "[cache] state_dir")
    return common.serve_until_signalled(conf, service, lambda: scheduler_metrics.serve(service, conf),
                                        lambda: summary(service, conf.metrics.max_lag_seconds))


def main(argv: list[str]) -> int:
    return common.run(argv, PROG, _main)
