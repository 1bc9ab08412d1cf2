"""What a scheduler shows on its metrics endpoint: /metrics, /healthz, /status.

A ``prometheus_client`` custom collector reads the service's figures on every
scrape through :class:`~shared_host_manager.service.SchedulerService`'s read
interface (``figures()``, ``stream_stats()``, ``versions()``, the decision
histogram); it keeps nothing and replaces nothing.  Metric names and meanings
are listed in docs/operating.md ("Health, status and metrics").

Healthy (``/healthz`` 200) while: the service runs, its stream consumer is
connected to the broker, its view is within ``[metrics] max_lag_seconds`` of
the stream's tail, and its state directory (if any) can be written.
Otherwise 503 and the first reason that applies, in one line.  A stale
placement view (design §11: the placement feed's source silent past ``[cache]
placement_max_staleness``, or down) degrades without failing: the line says
``degraded: placement view stale ...`` -- the scheduler still decides
correctly, placement answering the candidates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from oslo_config import cfg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from protocol.receiver import OUTCOME_STATS, STAT_KEYS
from shared_host_manager.service import SchedulerService
from transport import metrics as transport_metrics
from transport.base import StreamConsumerStats
from transport.cells import DEFAULT_STREAM
from transport.metrics import Histogram, MetricsEndpoint, histogram_family

__all__ = ["SchedulerCollector", "health", "serve", "status"]

VERSION = "0.1.0"

#: receiver counters with a metric of their own (the rest: shm_receiver_events_total{event})
_CLAIM_OUTCOMES = {outcome.value: key for outcome, key in OUTCOME_STATS.items()}


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float("nan") if value is None else value)


class SchedulerCollector:
    """``shm_*`` metrics of one :class:`SchedulerService`, read on scrape."""

    def __init__(self, service: SchedulerService, role: str = "scheduler",
                 max_lag_seconds: float = 30.0) -> None:
        self.service = service
        self.role = role
        self.max_lag_seconds = max_lag_seconds

    def describe(self) -> list[Metric]:
        return []  # collected on scrape only (auto_describe is off)

    def collect(self) -> Iterator[Metric]:
        s = self.service
        f = s.figures()
        rx = f["receiver"]
        info = InfoMetricFamily("shm_process", "This process: role and name.")
        info.add_metric([], {"role": self.role, "name": s.name, "version": VERSION})
        yield info
        sources = GaugeMetricFamily("shm_sources", "Sources this scheduler knows, by state: active "
                                    "(held, heard within down_interval), down (held, silent), "
                                    "syncing (no document yet).", labels=["state"])
        for state in ("active", "down", "syncing"):
            sources.add_metric([state], f["sources"][state])
        yield sources
        yield _gauge("shm_sources_held", "Sources whose document this scheduler holds.",
                     f["sources"]["held"])
        yield _counter("shm_messages_applied", "Stream and control messages applied.", f["messages"])
        yield _counter("shm_deltas_applied", "Deltas applied in order.", rx["applied"])
        yield _counter("shm_gaps", "Deltas that arrived ahead of a missing one (a gap opened).",
                       rx["gaps"])
        yield _counter("shm_resync_requests", "Resync requests sent to sources.",
                       rx["resyncs_requested"])
        yield _counter("shm_resync_answers", "Resync answers received.",
                       f["control"].get("resync_answer", 0))
        yield _counter("shm_digest_mismatches", "Heartbeats whose digest differed from the held "
                       "document at the same version (a divergence; full resync).", rx["divergences"])
        events = CounterMetricFamily("shm_receiver_events", "Every receiver counter "
                                     "(protocol.receiver.STAT_KEYS).", labels=["event"])
        for key in STAT_KEYS:
            events.add_metric([key], rx.get(key, 0))
        yield events
        claims = CounterMetricFamily(
            "shm_claims", "Claims by outcome: accepted (the arbiter said yes), included (a delta "
            "carried it), rejected, expired (no word before the deadline), dropped (the host ended "
            "the build without counting it), cancelled (given up by this scheduler), "
            "epoch_changed (the host restarted).", labels=["outcome"])
        claims.add_metric(["accepted"], f["control"].get("claim_accepted", 0))
        for outcome, key in _CLAIM_OUTCOMES.items():
            claims.add_metric([outcome], rx.get(key, 0))
        yield claims
        yield _counter("shm_claims_added", "Claims this scheduler made.", rx["claims_added"])
        invalid = CounterMetricFamily("shm_invalid_messages", "Invalid messages dropped, by reason.",
                                      labels=["reason"])
        for reason, n in sorted(f["invalid"].items()):
            invalid.add_metric([reason], n)
        yield invalid
        yield _counter("shm_unroutable_sends", "Resync requests or claims with no known endpoint.",
                       f["unroutable"])
        decisions = CounterMetricFamily("shm_decisions", "Decisions made with this cache, by outcome.",
                                        labels=["outcome"])
        for outcome, n in sorted(f["decisions"].items()):
            decisions.add_metric([outcome], n)
        yield decisions
        yield histogram_family("shm_decision_seconds", "Time to decide one request (select_"
                               "destinations in nova-scheduler-shared).", {(): s.decision_seconds})
        yield _counter("shm_state_save_failures", "Failed writes of the local snapshot.",
                       f["save_failures"])
        checkpoints = f["checkpoints"] or {}
        yield _counter("shm_checkpoints_published", "Checkpoints of the whole view this "
                       "scheduler published (design §4.5).", checkpoints.get("published", 0))
        yield _counter("shm_checkpoint_answers", "Checkpoints published in answer to a starting "
                       "scheduler's ask.", checkpoints.get("answered", 0))
        yield _counter("shm_checkpoint_publish_failures", "Checkpoints that could not be "
                       "published.", checkpoints.get("publish_failures", 0))
        yield from _stream_families(_streams(s))
        placement = s.placement_view.status()
        yield _gauge("shm_placement_view_providers", "Resource providers in this scheduler's copy "
                     "of placement (the placement feed's source; 0 without a feed).",
                     placement["providers"])
        yield _gauge("shm_placement_view_fresh", "1 while allocation candidates are answered from "
                     "the placement view (the feed heard within placement_max_staleness), 0 when "
                     "stale or no feed was ever heard.", 1 if placement["fresh"] else 0)
        yield _gauge("shm_placement_view_silent_seconds", "Seconds since the placement feed's "
                     "source was last heard (NaN: never).", placement["last_heard"])
        yield _counter("shm_placement_view_fresh_waits", "Allocation candidate requests that "
                       "waited for a poll of the placement feed begun after they arrived at nova's "
                       "API (read-your-writes; those still without one after placement_fresh_wait "
                       "go to placement, reason behind).", placement["counters"].get("waits", 0))
        yield _counter("shm_placement_view_fresh_wait_seconds", "Seconds those requests waited, "
                       "in all.", placement["waited_seconds"])
        yield _gauge("shm_placement_view_peer_claims", "The peers' announced claims in placement "
                     "this scheduler's placement view deducts until the feed's copy can hold them "
                     "(design §11).", placement["peer_claims_held"])
        yield _gauge("shm_healthy", "1 when /healthz answers 200.",
                     1 if health(s, self.max_lag_seconds)[0] else 0)


def _streams(service: SchedulerService) -> dict[str, StreamConsumerStats]:
    """The deployment's stream (``default``) and each cell's (design §4.6) -> its consumer's
    figures, where the backend has them."""
    streams = {DEFAULT_STREAM: service.stream_stats(), **service.cell_stream_stats()}
    return {name: stats for name, stats in streams.items() if stats is not None}


def _stream_families(streams: dict[str, StreamConsumerStats]) -> Iterator[Metric]:
    """The stream consumers' metrics, one series per stream, labelled ``cell``."""
    if not streams:
        return
    def family(kind: type, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return kind(name, doc, labels=[*extra, "cell"])
    connected = family(GaugeMetricFamily, "shm_broker_connected", "1 while the stream "
                       "consumer is connected to the broker, else 0.", ("plane",))
    reconnects = family(CounterMetricFamily, "shm_broker_reconnects", "Connections to the "
                        "broker lost and made again.", ("plane",))
    gauges = {
        "applied_offset": family(GaugeMetricFamily, "shm_stream_applied_offset",
                                 "Stream offset of the last message applied."),
        "tail_offset": family(GaugeMetricFamily, "shm_stream_tail_offset", "Stream offset of "
                              "the newest message in the stream, when last looked at "
                              "([data_plane] tail_probe_interval)."),
        "lag_offsets": family(GaugeMetricFamily, "shm_stream_lag_offsets", "Tail offset minus "
                              "applied offset (about the messages not yet applied)."),
        "lag_seconds": family(GaugeMetricFamily, "shm_stream_lag_seconds", "Publish time of "
                              "the tail minus that of the newest message applied (0 when "
                              "caught up)."),
    }
    counters = {
        "retention_gaps": family(CounterMetricFamily, "shm_stream_retention_gaps", "Resumes "
                                 "that found their offset dropped by retention (every source "
                                 "asked to resync)."),
        "duplicates": family(CounterMetricFamily, "shm_stream_duplicates", "Stream messages "
                             "dropped as publish-retry duplicates."),
        "stamped_ahead": family(CounterMetricFamily, "shm_stream_stamped_ahead", "Stream "
                                "messages stamped over a second ahead of this host's clock when "
                                "applied: a publisher's clock is ahead (NTP)."),
    }
    staleness: dict[tuple[str, ...], Histogram] = {}
    for cell, stream in streams.items():
        connected.add_metric(["stream", cell], 1 if stream.connected else 0)
        reconnects.add_metric(["stream", cell], stream.reconnects)
        for key, metric in gauges.items():
            value = getattr(stream, key)
            metric.add_metric([cell], float("nan") if value is None else value)
        for key, metric in counters.items():
            metric.add_metric([cell], getattr(stream, key))
        if stream.staleness is not None:
            staleness[(cell,)] = stream.staleness
    yield connected
    yield reconnects
    yield from gauges.values()
    yield from counters.values()
    if staleness:
        yield histogram_family("shm_staleness_seconds", "Per stream message: from its publish() "
                               "on the reporter to applied here (includes catching up a "
                               "backlog; clocks must agree: NTP).", staleness, labels=["cell"])


def health(service: SchedulerService, max_lag_seconds: float = 30.0) -> tuple[bool, str]:
    """(healthy, one line); see the module docstring."""
    if not service.running:
        return False, "not running"
    stream = service.stream_stats()
    if stream is not None:
        if not stream.connected:
            return False, f"not connected to the broker{_disconnected(stream)}"
        lag = stream.lag_seconds
        if lag is not None and lag > max_lag_seconds:
            return False, (f"{lag:.1f} s ({stream.lag_offsets} offsets) behind the stream's tail "
                           f"(max_lag_seconds = {max_lag_seconds:g})")
    if service.last_save_error is not None:
        return False, f"cannot save the cache state: {service.last_save_error}"
    # a stale placement view degrades, it does not fail: the scheduler still decides correctly
    # (placement answers the candidates), and a failing probe would have every scheduler
    # restarted for an outage of the feed alone
    placement = service.placement_view.status()
    f = service.figures()["sources"]
    if placement["reason"] == "stale":
        feed = "; degraded: " + placement_stale_line(placement)
    elif placement["reason"] == "no_feed":
        feed = ""
    else:
        feed = f"; placement view {placement['providers']} providers"
    feed += "".join(f"; degraded: {line}" for line in _cell_lines(service, max_lag_seconds))
    if stream is None:
        return True, f"ok: {f['active']} sources active (in-process stream){feed}"
    lag_text = "lag unknown" if stream.lag_seconds is None else \
        f"lag {stream.lag_offsets} offsets, {stream.lag_seconds:.2f} s"
    return True, f"ok: {f['active']} sources active, {lag_text}{feed}"


def _disconnected(stream: StreamConsumerStats) -> str:
    """`` since HH:MM:SS (N reconnects)`` of a consumer out of reach."""
    since = f" since {time.strftime('%H:%M:%S', time.localtime(stream.state_since))}" \
        if stream.state_since else ""
    return f"{since} ({stream.reconnects} reconnects)"


def _cell_lines(service: SchedulerService, max_lag_seconds: float) -> list[str]:
    """A line for each cell whose stream is out of reach or behind (design §4.6): the
    scheduler still decides, with that cell's hosts going down after ``down_interval``, so
    it degrades and does not fail (a failing probe would restart every scheduler for one
    cell's broker)."""
    out = []
    for cell, stream in service.cell_stream_stats().items():
        if stream is None:
            continue
        if not stream.connected:
            out.append(f"cell {cell} not connected to its broker{_disconnected(stream)}")
        elif stream.lag_seconds is not None and stream.lag_seconds > max_lag_seconds:
            out.append(f"cell {cell} {stream.lag_seconds:.1f} s behind its stream's tail")
    return out


def placement_stale_line(placement: dict[str, Any]) -> str:
    """/healthz's line for a stale placement view (``PlacementView.status()``)."""
    heard = placement["last_heard"]
    age = "never heard" if heard is None else f"{heard:.0f} s"
    why = "the feed's source is down" if placement["down"] else \
        f"max_staleness {placement['max_staleness']:g} s"
    return f"placement view stale: {age} ({why}); allocation candidates go to placement"


def status(service: SchedulerService, sources: bool = False, role: str = "scheduler",
           max_lag_seconds: float = 30.0) -> dict[str, Any]:
    """The scheduler as JSON (``/status``); ``sources``: each source's version and digest."""
    f = service.figures()
    ok, reason = health(service, max_lag_seconds)
    stream = service.stream_stats()
    rx = f["receiver"]
    out: dict[str, Any] = {
        "role": role, "name": service.name, "pid": os.getpid(), "version": VERSION,
        "started_at": service.started_at, "now": time.time(),
        "healthy": ok, "health": reason,
        "sources": f["sources"],
        "broker": {"connected": stream.connected, "reconnects": stream.reconnects,
                   "since": stream.state_since} if stream is not None else None,
        "stream": _stream_status(stream, f["offset"], f["retention_gaps"]),
        "cells": {cell: _cell_status(stats, f["cell_offsets"].get(cell))
                  for cell, stats in service.cell_stream_stats().items()},
        "receiver": {"applied": rx["applied"], "gaps": rx["gaps"],
                     "resync_requests": rx["resyncs_requested"],
                     "resync_answers": f["control"].get("resync_answer", 0),
                     "digest_mismatches": rx["divergences"]},
        "claims": {"accepted": f["control"].get("claim_accepted", 0),
                   **{k: rx.get(v, 0) for k, v in _CLAIM_OUTCOMES.items()}},
        "decisions": {**f["decisions"], "seconds": service.decision_seconds.as_dict()},
        "invalid": f["invalid"],
        "state": {"save_failures": f["save_failures"], "last_error": f["last_save_error"],
                  "last_saved_at": f["last_saved_at"]},
        "checkpoints": f["checkpoints"],
        "placement": _placement_status(service),
    }
    if sources:
        out["views"] = {src: [e, q, d.hex() if d is not None else None, st]
                        for src, (e, q, d, st) in service.versions().items()}
    return out


def _stream_status(stream: StreamConsumerStats | None, applied: int | None,
                   retention_gaps: int | None) -> dict[str, Any]:
    """A stream's consumer in /status: offsets, lag and staleness (None: no figures)."""
    return {"applied_offset": applied,
            "tail_offset": stream.tail_offset if stream else None,
            "lag_offsets": stream.lag_offsets if stream else None,
            "lag_seconds": stream.lag_seconds if stream else None,
            "tail_checked_at": stream.tail_checked_at if stream else None,
            "staleness": stream.staleness.as_dict()
            if stream is not None and stream.staleness is not None else None,
            "retention_gaps": retention_gaps}


def _cell_status(stream: StreamConsumerStats | None, applied: int | None) -> dict[str, Any]:
    """One cell's stream in /status (design §4.6): its broker beside the stream's figures."""
    return {**_stream_status(stream, applied, stream.retention_gaps if stream else None),
            "connected": stream.connected if stream else None,
            "reconnects": stream.reconnects if stream else None,
            "since": stream.state_since if stream else None}


def _placement_status(service: SchedulerService) -> dict[str, Any]:
    """The placement view (design §11) in /status: providers, ages, fresh or why not."""
    p = service.placement_view.status()
    return {k: p[k] for k in ("providers", "last_applied", "last_heard", "fresh", "reason",
                              "max_staleness")}


def serve(service: SchedulerService, conf: cfg.ConfigOpts, role: str = "scheduler",
          port: int | None = None) -> MetricsEndpoint | None:
    """Start the endpoint of ``service`` on ``[metrics]`` (None when disabled); an OSError
    (port in use) goes to the caller."""
    def parts(group: Any) -> tuple[SchedulerCollector, Any, Any]:
        max_lag = group.max_lag_seconds
        return (SchedulerCollector(service, role, max_lag), lambda: health(service, max_lag),
                lambda sources: status(service, sources, role, max_lag))
    return transport_metrics.serve(conf, port, parts)
