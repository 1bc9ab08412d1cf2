"""``shm status`` with the placement feed: the feed's column and each scheduler's placement view.

placement's own WSGI app on SQLite (:class:`simulator.placement_real.RealPlacement`), the
feed served by a ReporterService and one scheduler on the in-process bus, both endpoints
on free ports: ``shm status`` shows the feed's providers and last poll and the scheduler's
placement view, and ``--verify`` counts the feed's source among the reporters' (its role,
placement-feed, publishes sources); the feed's source is neither a host nor a peer.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("placement.deploy")

from oslo_config import cfg  # noqa: E402
from svc_harness import REPORTER_TOPIC, SCHEDULER_TOPIC, make_scheduler, wait_for  # noqa: E402

from compute_reporter import metrics as reporter_metrics  # noqa: E402
from compute_reporter.service import ReporterService  # noqa: E402
from protocol.hostdoc import is_host  # noqa: E402
from shared_host_manager import metrics as scheduler_metrics  # noqa: E402
from shared_host_manager.membership import live_peers  # noqa: E402
from shared_host_manager.placement.database import PlacementDatabase  # noqa: E402
from shared_host_manager.placement.feed_service import PlacementFeed  # noqa: E402
from shm_cli import placement_feed as feed_cli  # noqa: E402
from shm_cli import status as status_cli  # noqa: E402
from simulator.placement_real import RealPlacement  # noqa: E402
from transport.inprocess import InProcessBus  # noqa: E402

UUIDS = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(1, 4)]


def _conf() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    conf([])
    return conf


@pytest.fixture
def running() -> Iterator[tuple[Any, ...]]:
    p = RealPlacement()
    for u in UUIDS:
        p.ok("POST", "/resource_providers", {"uuid": u, "name": "cn-" + u[:8]})
        p.ok("PUT", f"/resource_providers/{u}/inventories",
             {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}})
    db = PlacementDatabase(p.db_url)
    bus = InProcessBus(threaded=True)
    feed = PlacementFeed(db, poll_interval=0.05)
    reporter = ReporterService("placement-feed", feed, bus, bus, reporter_topic=REPORTER_TOPIC,
                               scheduler_topic=SCHEDULER_TOPIC, heartbeat_interval=0.3)
    feed.confirm = lambda: reporter.publish_now(5.0)
    sched = make_scheduler(bus, bus, "s0")
    sched.start()
    reporter.start()
    endpoints = [reporter_metrics.serve(reporter, _conf(), role=feed_cli.ROLE, port=0,
                                        collector=feed_cli.FeedCollector(reporter, feed),
                                        extra=lambda: feed_cli.status_extra(feed)),
                 scheduler_metrics.serve(sched, _conf(), port=0)]
    try:
        wait_for(lambda: sched.placement_view.status()["providers"] == 3, what="the placement view")
        yield feed, sched, [e.url for e in endpoints if e is not None]
    finally:
        for e in endpoints:
            if e is not None:
                e.stop()
        reporter.stop()
        sched.stop()
        bus.close()
        db.close()
        p.close()


def test_status_shows_the_feed_and_the_view_and_verify_counts_the_feed(running, capsys) -> None:
    feed, sched, urls = running
    with sched.cache.lock:
        assert not is_host(sched.receiver.sources[feed.source].doc)
        assert live_peers(sched.receiver, sched.clock()) == []
    feed_st = status_cli.fetch(urls[0])
    assert feed_st["role"] == "placement-feed" and feed_st["placement_feed"]["providers"] == 3
    rows = status_cli._rows(feed_st)
    assert rows["placement feed"].startswith("3 providers, last poll ")
    with urllib.request.urlopen(urls[0] + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert "shm_placement_feed_providers 3.0" in metrics
    assert 'shm_placement_feed_events_total{event="published"}' in metrics
    rows = status_cli._rows(status_cli.fetch(urls[1]))
    assert rows["placement view"].startswith("3 providers, heard ")
    assert status_cli.main([*urls, "--verify", "--timeout", "10", "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "placement feed" in out and "placement view" in out
    assert "verify: 1 sources of 1 reporter(s), 1 scheduler(s)" in out and "all 1 agree" in out
