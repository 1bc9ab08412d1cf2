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
        yield feed, sched, [e.url for e in endpoints if e is not None], p
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
    feed, sched, urls, _ = running
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


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} at {url}")


def _inventory(p: RealPlacement, rp: str, total: int) -> None:
    generation = p.ok("GET", f"/resource_providers/{rp}")["generation"]
    p.ok("PUT", f"/resource_providers/{rp}/inventories",
         {"resource_provider_generation": generation, "inventories": {"VCPU": {"total": total}}})


def test_a_provider_over_capacity_is_warned_counted_and_shown_until_it_fits_again(
        running, caplog) -> None:
    """placement keeps an inventory lowered under its allocations (it only logs it); the
    feed, the one process that reads usages beside inventories, says so: a warning naming
    the provider and the class, the gauge, /status and ``shm status``; and once the
    inventory holds its usage again, that it does."""
    feed, _, urls, p = running
    rp, name = UUIDS[0], "cn-" + UUIDS[0][:8]
    p.ok("PUT", f"/allocations/{UUIDS[2]}",
         {"allocations": {rp: {"resources": {"VCPU": 6}}}, "project_id": "p", "user_id": "u",
          "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert _metric(urls[0], "shm_placement_feed_over_capacity_providers") == 0.0
    caplog.set_level("INFO", logger="shared_host_manager.placement.feed_service")
    _inventory(p, rp, 4)
    wait_for(lambda: feed.figures()["over_capacity"] == 1, what="the feed to see the excess")
    assert f"resource provider {name} ({rp}) holds more than its capacity: VCPU 6 of 4" \
        in caplog.text
    assert _metric(urls[0], "shm_placement_feed_over_capacity_providers") == 1.0
    feed_st = status_cli.fetch(urls[0])
    assert feed_st["placement_feed"]["over_capacity_providers"] == {name: {"VCPU": [6, 4.0]}}
    assert f"over capacity: {name}" in status_cli._rows(feed_st)["placement feed"]
    _inventory(p, rp, 8)
    wait_for(lambda: feed.figures()["over_capacity"] == 0, what="the feed to see it fit")
    assert f"resource provider {name} ({rp}) is within its capacity again" in caplog.text
    assert "over capacity" not in status_cli._rows(status_cli.fetch(urls[0]))["placement feed"]
