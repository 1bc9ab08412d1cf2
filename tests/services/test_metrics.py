"""/metrics, /healthz and /status of reporters and schedulers, and `shm status [--verify]`, on the
in-process bus (the same over RabbitMQ with real processes: tests/integration/test_operating.py)."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
import uuid

import pytest
from oslo_config import cfg
from prometheus_client.parser import text_string_to_metric_families
from svc_harness import make_reporter, make_scheduler, quiesce, wait_for

from compute_reporter import metrics as reporter_metrics
from protocol.messages import Claim
from shared_host_manager import metrics as scheduler_metrics
from shm_cli import status as status_cli
from transport.base import StreamConsumerStats
from transport.inprocess import InProcessBus
from transport.metrics import Histogram


def _conf() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    conf([])
    return conf


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, text = _get(url + "/metrics")
    assert code == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def cloud():
    bus = InProcessBus(threaded=True)
    # heartbeats rarely: one would repair the view the verify test corrupts (digest check)
    reporter = make_reporter(bus, bus, "r0", hosts=10, seed=1, change_interval=0.2,
                             heartbeat_interval=30.0)
    schedulers = [make_scheduler(bus, bus, f"s{i}") for i in range(2)]
    for s in schedulers:
        s.start()
    reporter.start()
    endpoints = [reporter_metrics.serve(reporter, _conf(), port=0)]
    endpoints += [scheduler_metrics.serve(s, _conf(), port=0) for s in schedulers]
    wait_for(lambda: all(len(s.receiver.sources) == 10 for s in schedulers), what="all sources")
    yield reporter, schedulers, [e.url for e in endpoints]
    for e in endpoints:
        e.stop()
    reporter.stop()
    for s in schedulers:
        s.stop()
    bus.close()


def test_histogram_counts_sums_and_quantiles():
    h = Histogram((0.01, 0.1, 1.0))
    h.observe_many([0.005, 0.05, 0.05, 0.5, 5.0])
    cumulative, total = h.snapshot()
    assert cumulative == [1, 3, 4, 5] and total == pytest.approx(5.605)
    assert h.quantile(0.5) == 0.1 and h.quantile(1.0) == float("inf") and h.count == 5
    assert Histogram().quantile(0.5) is None


def test_metrics_health_and_status_of_a_reporter_and_a_scheduler(cloud):
    reporter, (s0, _), (r_url, s_url, _) = cloud
    s0.record_decision(0.004, "scheduled")
    r = _samples(r_url)
    s = _samples(s_url)
    assert r[("shm_reporter_sources", ())] == 10
    assert r[("shm_reporter_batches_published_total", ())] > 0
    assert r[("shm_process_info", (("name", "r0"), ("role", "reporter"), ("version", "0.1.0")))] == 1
    assert s[("shm_sources", (("state", "active"),))] == 10
    assert s[("shm_sources_held", ())] == 10
    assert s[("shm_decision_seconds_count", ())] == 1
    assert s[("shm_decisions_total", (("outcome", "scheduled"),))] == 1
    assert s[("shm_receiver_events_total", (("event", "snapshots"),))] >= 10
    assert all(name.startswith(("shm_", "process_")) for name, _ in {**r, **s})
    for url in (r_url, s_url):
        code, text = _get(url + "/healthz")
        assert code == 200 and text.startswith("ok"), text
    code, text = _get(s_url + "/status?sources=1")
    st = json.loads(text)
    assert st["role"] == "scheduler" and st["sources"]["active"] == 10 and len(st["views"]) == 10
    assert _get(s_url + "/nothing")[0] == 404


def test_the_periodic_summary_lines_say_what_status_says(cloud):
    from shm_cli import reporter as reporter_cli
    from shm_cli import scheduler as scheduler_cli

    reporter, (s0, _), _ = cloud
    line = reporter_cli.summary(reporter)
    assert line.startswith("10 hosts;") and "; broker connected; ok" in line, line
    line = scheduler_cli.summary(s0, 30.0)
    assert line.startswith("sources: 10 held, 10 active, 0 down, 0 syncing;"), line
    assert "; broker connected; ok" in line, line


def test_claim_outcomes_are_counted_on_both_sides(cloud):
    reporter, (s0, _), (r_url, s_url, _) = cloud
    with s0.cache.lock:
        source = sorted(s0.receiver.sources)[0]
        view = s0.receiver.sources[source]
        claim = Claim(uuid.uuid4().hex, s0.name, source, view.epoch, view.seq, {"memory_mb": 512},
                      uuid.uuid4().hex)
        s0.receiver.add_claim(claim, s0.clock())
    assert s0.send_claim(claim)
    wait_for(lambda: _samples(s_url).get(("shm_claims_total", (("outcome", "included"),)), 0) == 1,
             what="the claim included")
    s = _samples(s_url)
    assert s[("shm_claims_total", (("outcome", "accepted"),))] == 1
    assert s[("shm_claims_added_total", ())] == 1
    assert _samples(r_url)[("shm_reporter_claims_total", (("outcome", "accepted"),))] == 1


def test_status_table_and_verify(cloud, capsys):
    reporter, _, urls = cloud
    quiesce([reporter])
    assert status_cli.main([*urls, "--verify", "--timeout", "10", "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "r0" in out and "s1" in out and "all 10 agree" in out


def test_verify_names_a_source_whose_document_differs(cloud, capsys):
    reporter, (s0, _), urls = cloud
    quiesce([reporter])
    with s0.cache.lock:  # corrupt one view behind the receiver's back: same version, other document
        source = sorted(s0.receiver.sources)[0]
        view = s0.receiver.sources[source]
        view.doc["compute"]["memory_mb"] = 1
        view._digest = None
        view._canonical.clear()
    code = status_cli.main([*urls, "--verify", "--timeout", "0.5", "--interval", "0.2"])
    out = capsys.readouterr().out
    assert code == 1 and source in out and "different documents" in out


def test_health_names_the_reason(cloud):
    _, (s0, _), _ = cloud
    stats = StreamConsumerStats(
        connected=True, reconnects=2, delivered=0, duplicates=0, errors=0, retention_gaps=0,
        applied_offset=100, tail_offset=500, tail_checked_at=1.0, applied_published_at=1000.0,
        tail_published_at=1045.0, state_since=None)
    s0.stream_stats = lambda: stats  # type: ignore[method-assign]
    ok, reason = scheduler_metrics.health(s0, max_lag_seconds=30)
    assert not ok and reason.startswith("45.0 s (400 offsets) behind the stream's tail")
    stats = dataclasses.replace(stats, connected=False)
    ok, reason = scheduler_metrics.health(s0)
    assert not ok and reason.startswith("not connected to the broker") and "2 reconnects" in reason
    s0.stream_stats = lambda: dataclasses.replace(stats, connected=True, tail_offset=100)
    s0.last_save_error = "Permission denied (/x/cache-s0.msgpack)"
    ok, reason = scheduler_metrics.health(s0)
    assert not ok and "cannot save the cache state" in reason
    s0.last_save_error = None
    assert scheduler_metrics.health(s0) == (True, "ok: 10 sources active, lag 0 offsets, 0.00 s")


def test_health_without_a_placement_feed_is_ok_and_a_stale_placement_view_is_degraded(cloud):
    """No feed ever heard (no_feed): healthy, nothing said.  A feed heard, then its source down
    or silent past placement_max_staleness: still 200 (placement answers), "degraded: placement
    view stale"."""
    _, (s0, _), _ = cloud
    view = s0.placement_view
    assert view.status()["reason"] == "no_feed"
    assert scheduler_metrics.health(s0) == (True, "ok: 10 sources active (in-process stream)")
    assert scheduler_metrics.status(s0)["placement"]["reason"] == "no_feed"
    provider = {"uuid": "00000001-0000-4000-8000-000000000001", "name": "cn1", "generation": 1,
                "inventories": {"VCPU": {"total": 8}}, "usages": {}, "traits": [], "aggregates": []}
    view.apply_providers({provider["uuid"]: provider}, view.clock())
    assert scheduler_metrics.health(s0) == (
        True, "ok: 10 sources active (in-process stream); placement view 1 providers")
    view.source_down()
    ok, reason = scheduler_metrics.health(s0)
    assert ok and reason.startswith("ok: 10 sources active (in-process stream); degraded: "
                                    "placement view stale: 0 s (the feed's source is down)")
    st = scheduler_metrics.status(s0)
    assert st["placement"]["reason"] == "stale" and st["healthy"]
    assert "STALE" in status_cli._rows(st)["placement view"]
