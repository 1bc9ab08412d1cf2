"""What a reporter shows on its metrics endpoint: /metrics, /healthz, /status.

A ``prometheus_client`` custom collector reads the service's figures on every
scrape through the service's read interface (:meth:`ReporterService.figures`,
:meth:`ReporterService.stream_stats`, :meth:`ReporterManager.versions`); it
keeps nothing and replaces nothing.  Metric names and meanings are listed in
docs/operating.md ("Health, status and metrics").

Healthy: the reporter is running and its last publish on the stream was
stored.  While the broker is unreachable the publisher retries, and
``/healthz`` answers 503 with the last error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from oslo_config import cfg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from compute_reporter.service import ReporterService
from transport import metrics as transport_metrics
from transport.metrics import MetricsEndpoint

__all__ = ["ReporterCollector", "health", "serve", "status"]

VERSION = "0.1.0"


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None
             ) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class ReporterCollector:
    """``shm_*`` metrics of one :class:`ReporterService`, read on scrape."""

    def __init__(self, service: ReporterService, role: str = "reporter") -> None:
        self.service = service
        self.role = role

    def describe(self) -> list[Metric]:
        return []  # collected on scrape only (auto_describe is off)

    def collect(self) -> Iterator[Metric]:
        s = self.service
        f = s.figures()
        service, manager, machines = f["service"], f["manager"], f["machines"]
        info = InfoMetricFamily("shm_process", "This process: role and name.")
        info.add_metric([], {"role": self.role, "name": s.name, "version": VERSION})
        yield info
        yield _gauge("shm_reporter_sources", "Sources (hosts) this reporter serves.", f["sources"])
        yield _gauge("shm_reporter_ring_deltas", "Deltas kept to answer resyncs, all hosts (at "
                     "most hosts x min(ring_size, 256)).", f["ring_deltas"])
        yield _counter("shm_reporter_changes", "Changes the tracker reported (before coalescing).",
                       manager.get("changes", 0))
        yield _counter("shm_reporter_deltas_published", "Deltas published (after coalescing).",
                       machines.get("deltas", 0))
        yield _counter("shm_reporter_heartbeats_published", "Heartbeats published.",
                       machines.get("heartbeats", 0))
        yield _counter("shm_reporter_snapshots_published",
                       "Snapshots made (announcements and resync answers).", machines.get("snapshots", 0))
        yield _counter("shm_reporter_batches_published", "Stream messages (batches) published.",
                       service.get("published", 0))
        yield _counter("shm_reporter_publish_failures",
                       "Batches given up after publish_timeout and known not stored (refused or "
                       "nacked; the protocol repairs them).", service.get("publish_errors", 0))
        yield _counter("shm_reporter_publish_unconfirmed",
                       "Batches given up after publish_timeout that may be stored (sent, the "
                       "connection lost before the broker's confirm).",
                       service.get("publish_unconfirmed", 0))
        claims = CounterMetricFamily("shm_reporter_claims", "Claims arbitrated, by outcome.",
                                     labels=["outcome"])
        for outcome in ("accepted", "rejected", "duplicate"):
            claims.add_metric([outcome], machines.get(f"claims_{outcome}", 0))
        yield claims
        yield _counter("shm_reporter_resync_requests", "Resync requests received.",
                       manager.get("resync_requests", 0))
        yield _counter("shm_reporter_resyncs_answered", "Resync requests answered.",
                       machines.get("resyncs_answered", 0))
        yield _counter("shm_reporter_casts", "Control messages cast to schedulers (claim results, "
                       "resync answers).", service.get("casts", 0))
        yield _counter("shm_reporter_cast_failures", "Casts that failed.", service.get("cast_errors", 0))
        yield _counter("shm_reporter_fences", "Fences fanned out to the schedulers (an API-side "
                       "change an API call waited for).", service.get("fences", 0))
        invalid = CounterMetricFamily("shm_invalid_messages", "Invalid messages dropped, by reason.",
                                      labels=["reason"])
        for reason, n in sorted(f["invalid"].items()):
            invalid.add_metric([reason], n)
        yield invalid
        stream = s.stream_stats()
        if stream is not None:
            yield _gauge_labelled("shm_broker_connected",
                                  "1 while the connection to the broker works (the last publish was "
                                  "stored), else 0.", "stream", 1 if stream.connected else 0)
            yield _counter("shm_broker_reconnects", "Connections to the broker made again after a "
                           "failure.", max(0, stream.connects - 1), {"plane": "stream"})
            yield _counter("shm_stream_publish_retries", "Publish attempts retried after a "
                           "connection or channel error.", stream.retries)
            yield _counter("shm_stream_published_bytes", "Bytes published on the stream.",
                           stream.published_bytes)
        yield _gauge("shm_healthy", "1 when /healthz answers 200.", 1 if health(s)[0] else 0)


def _gauge_labelled(name: str, doc: str, plane: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["plane"])
    family.add_metric([plane], value)
    return family


def health(service: ReporterService) -> tuple[bool, str]:
    """(healthy, one line): running, and the stream's last publish was stored."""
    if not service.running:
        return False, "not running"
    stream = service.stream_stats()
    if stream is None:
        return True, "ok (in-process stream)"
    if stream.connected:
        return True, f"ok: publishing, {stream.published} batches stored"
    if stream.published == 0 and stream.last_error is None:
        return False, "connecting to the broker"
    since = f" since {time.strftime('%H:%M:%S', time.localtime(stream.state_since))}" \
        if stream.state_since else ""
    return False, f"cannot publish on the stream{since}: {stream.last_error}"


def status(service: ReporterService, sources: bool = False, role: str = "reporter",
           extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The reporter as JSON (``/status``); ``sources``: each source's published version;
    ``extra``: more keys of this kind of reporter (the placement feed's ``placement_feed``)."""
    f = service.figures()
    ok, reason = health(service)
    stream = service.stream_stats()
    out: dict[str, Any] = {
        "role": role, "name": service.name, "pid": os.getpid(), "version": VERSION,
        "started_at": service.started_at, "now": time.time(),
        "healthy": ok, "health": reason,
        "sources": {"served": f["sources"]},
        "broker": {"connected": stream.connected, "reconnects": max(0, stream.connects - 1),
                   "since": stream.state_since, "last_error": stream.last_error}
        if stream is not None else None,
        "published": {"batches": f["service"].get("published", 0),
                      "deltas": f["machines"].get("deltas", 0),
                      "heartbeats": f["machines"].get("heartbeats", 0),
                      "failures": f["service"].get("publish_errors", 0),
                      "unconfirmed": f["service"].get("publish_unconfirmed", 0),
                      "retries": stream.retries if stream is not None else 0},
        "changes": f["manager"].get("changes", 0),
        "claims": {k: f["machines"].get(f"claims_{k}", 0) for k in ("accepted", "rejected", "duplicate")},
        "resyncs": {"requested": f["manager"].get("resync_requests", 0),
                    "answered": f["machines"].get("resyncs_answered", 0)},
        "invalid": f["invalid"],
    }
    if sources:
        manager = getattr(service, "manager", None)
        versions = manager.versions() if manager is not None else {}
        out["views"] = {src: [e, q, d.hex() if d is not None else None]
                        for src, (e, q, d) in versions.items()}
    if extra is not None:
        out.update(extra())
    return out


def serve(service: ReporterService, conf: cfg.ConfigOpts, role: str = "reporter",
          port: int | None = None, *, collector: ReporterCollector | None = None,
          extra: Callable[[], dict[str, Any]] | None = None) -> MetricsEndpoint | None:
    """Start the endpoint of ``service`` on ``[metrics]`` (None when disabled); an OSError
    (port in use) goes to the caller.  ``collector``: a ReporterCollector of a kind of
    reporter with metrics of its own; ``extra``: its keys in /status."""
    return transport_metrics.serve(conf, port, lambda group: (
        collector or ReporterCollector(service, role), lambda: health(service),
        lambda sources: status(service, sources, role, extra)))
