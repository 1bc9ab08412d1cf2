"""``shm placement-feed --config-file FILE``: publish placement's resource providers until SIGTERM.

Where it runs: once per placement database, anywhere that reaches both that
database and the broker (a controller node beside placement).  It reads
placement's tables every ``[placement_feed] poll_interval`` and publishes
every provider as one source (default name ``placement``), from which every
scheduler answers placement's ``GET /allocation_candidates`` in memory
(docs/design.md §11, docs/deploy-nova.md "Placement feed").

It serves /metrics, /healthz and /status on ``[metrics] bind_host:bind_port``
(default port 9469) and logs a summary every 10 s.  Errors: a missing or
wrong option ends it with one line and exit code 78; placement's database or
the broker unreachable at start, with exit code 69 (systemd restarts it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from oslo_config import cfg
from oslo_log import log as logging
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from compute_reporter import metrics as reporter_metrics
from compute_reporter.service import ReporterService
from shm_cli import common
from transport.startup import EX_UNAVAILABLE, OperatorError

if TYPE_CHECKING:  # imported when the command runs: sqlalchemy is not needed before
    from shared_host_manager.placement.feed_service import PlacementFeed

LOG = logging.getLogger(__name__)

PROG = "shm placement-feed"
ROLE = "placement-feed"


def register(conf: cfg.ConfigOpts) -> None:
    from shared_host_manager.placement import feed_service

    feed_service.register_opts(conf)
    common.register_metrics(conf, ROLE)


class FeedCollector(reporter_metrics.ReporterCollector):
    """The reporter's ``shm_*`` metrics and the feed's own ``shm_placement_feed_*``, read on scrape."""

    def __init__(self, service: ReporterService, feed: PlacementFeed) -> None:
        super().__init__(service, ROLE)
        self.feed = feed

    def collect(self) -> Iterator[Metric]:
        yield from super().collect()
        f = self.feed.figures()
        yield GaugeMetricFamily("shm_placement_feed_providers", "Resource providers the placement "
                                "feed publishes (its source's placement namespace).",
                                value=f["providers"])
        yield GaugeMetricFamily("shm_placement_feed_dirty", "Providers waiting to be read and "
                                "published again (an unconfirmed publish, a deferred read).",
                                value=f["dirty"])
        yield GaugeMetricFamily("shm_placement_feed_over_capacity_providers", "Providers whose "
                                "usage in placement exceeds what placement's claims allow "
                                "((total - reserved) * allocation_ratio), in any class.",
                                value=f["over_capacity"])
        age = f["last_poll_age"]
        yield GaugeMetricFamily("shm_placement_feed_last_poll_age_seconds", "Seconds since the "
                                "feed's last poll that reached placement's database (NaN: none "
                                "yet).", value=float("nan") if age is None else age)
        events = CounterMetricFamily("shm_placement_feed_events", "The feed's counters: polls, "
                                     "listings, reads, published, deleted, unconfirmed, deferred, "
                                     "errors (failed polls), confirm_errors.", labels=["event"])
        for key in ("polls", "listings", "reads", "published", "deleted", "unconfirmed",
                    "deferred", "errors", "confirm_errors"):
            events.add_metric([key], f[key])
        yield events


def status_extra(feed: PlacementFeed) -> dict[str, Any]:
    """The feed's keys in /status (what ``shm status`` shows as "placement feed")."""
    over = {name: {rc: [used, cap] for rc, (used, cap) in classes.items()}
            for name, classes in feed.over_capacity.values()}
    return {"placement_feed": {**feed.figures(), "over_capacity_providers": over}}


def summary(service: ReporterService, feed: PlacementFeed) -> str:
    st = reporter_metrics.status(service, role=ROLE)
    f = feed.figures()
    return (f"{f['providers']} providers, {f['dirty']} dirty; {f['polls']} polls, {f['listings']} "
            f"listings, {f['reads']} read, {f['published']} published, {f['deleted']} deleted, "
            f"{f['unconfirmed']} unconfirmed, {f['errors']} failed polls; published "
            f"{st['published']['batches']} batches; {common.summary_tail(st)}")


def _main(argv: list[str]) -> int:
    from shared_host_manager.placement import feed_service
    from shared_host_manager.placement.database import PlacementDatabase

    conf = common.setup(argv, PROG, register)
    group = conf.placement_feed
    if not group.connection:
        raise OperatorError("[placement_feed] connection is required: set it to placement.conf's "
                            "[placement_database] connection")
    try:
        database = PlacementDatabase(group.connection)
    except Exception as exc:  # a malformed URL, a driver not installed
        raise OperatorError(f"[placement_feed] connection: {' '.join(str(exc).split())}") from exc
    try:
        database.fingerprint()
    except Exception as exc:
        raise OperatorError(f"placement's database ([placement_feed] connection) is not readable: "
                            f"{' '.join(str(exc).split())[:300]}", EX_UNAVAILABLE) from exc
    service, feed = feed_service.feed_from_conf(conf, database)
    return common.serve_until_signalled(
        conf, service, lambda: reporter_metrics.serve(
            service, conf, role=ROLE, collector=FeedCollector(service, feed),
            extra=lambda: status_extra(feed)),
        lambda: summary(service, feed))


def main(argv: list[str]) -> int:
    return common.run(argv, PROG, _main)
