"""The operator's window into a running process: ``[metrics]`` options and the HTTP endpoint.

Every long-running process (``shm reporter``, ``shm scheduler``,
``nova-scheduler-shared``, ``nova-compute-shared``) serves, on
``[metrics] bind_host:bind_port``:

* ``GET /metrics`` -- Prometheus' text format (``prometheus_client``), every
  project metric named ``shm_...``, plus the client library's ``process_*``;
* ``GET /healthz`` -- ``200 ok`` while the process is connected to the broker
  and within its lag bound, else ``503`` and the reason, one line;
* ``GET /status`` -- the same figures as JSON; ``/status?sources=1`` adds every
  source's ``(epoch, seq, digest)`` (what ``shm status --verify`` compares).

Life cycle of a :class:`MetricsEndpoint`::

    MetricsEndpoint(collector, health, status, host, port)
      start()   bind (an OSError -- port taken -- goes to the caller) and serve
                from a daemon thread, each request in a thread of its own
      running   every scrape calls the collector, which reads the service's
                counters at that moment (nothing is pushed, nothing replaced)
      stop()    close the socket; idempotent

The figures come from each service through an explicit read interface: a
``prometheus_client`` custom collector (``compute_reporter.metrics``,
``shared_host_manager.metrics``) that reads the service's stats on scrape.
:class:`Histogram` is the plain accumulator those services fill (staleness,
decision latency): no prometheus types below the collectors.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from oslo_config import cfg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_PORTS",
    "GROUP",
    "Histogram",
    "LATENCY_BUCKETS",
    "MetricsEndpoint",
    "bucket_quantile",
    "histogram_family",
    "list_opts",
    "register_opts",
]

LOG = logging.getLogger(__name__)

GROUP = "metrics"

#: the default port of each process, so one host can run several side by side
DEFAULT_PORTS = {"reporter": 9465, "scheduler": 9466, "nova-compute": 9467, "nova-scheduler": 9468,
                 "placement-feed": 9469}

METRICS_GROUP = cfg.OptGroup("metrics", title="Metrics, health and status endpoint", help="""
An HTTP endpoint of every long-running process: GET /metrics (Prometheus),
GET /healthz (200 while connected to the broker and within the lag bound,
503 and the reason otherwise) and GET /status (JSON; what ``shm status``
reads).
""")

metrics_opts = [
    cfg.BoolOpt("enabled", default=True, help="""
Serve /metrics, /healthz and /status.

Possible values: true (default), false.

Related options: bind_host, bind_port.
"""),
    cfg.HostAddressOpt("bind_host", default="127.0.0.1", help="""
Address the endpoint listens on. The default answers only on this host; use
``0.0.0.0`` (or the host's address) for a Prometheus server elsewhere. The
endpoint has no authentication: it shows versions and counters, never
documents or keys.

Related options: bind_port.
"""),
    cfg.PortOpt("bind_port", default=9466, help="""
TCP port of the endpoint. Each process has its own default so that they can
share a host: shm reporter 9465, shm scheduler 9466, nova-compute-shared
9467, nova-scheduler-shared 9468. 0: any free port (logged at start and
shown in /status).

Related options: bind_host.
"""),
    cfg.FloatOpt("max_lag_seconds", default=30.0, min=0.0, help="""
A scheduler is unhealthy (/healthz answers 503) while its view is further
behind the stream than this: the publish time of the newest message at the
stream's tail minus that of the newest message it applied. A cold start
reading a long backlog is unhealthy until it has caught up.

Related options: [data_plane] tail_probe_interval.
"""),
]


def register_opts(conf: cfg.ConfigOpts, default_port: int | None = None) -> None:
    """Register ``[metrics]`` on ``conf``; ``default_port``: this process's default (DEFAULT_PORTS)."""
    conf.register_group(cfg.OptGroup(METRICS_GROUP.name, title=METRICS_GROUP.title,
                                     help=METRICS_GROUP.help))
    conf.register_opts(metrics_opts, group=GROUP)
    if default_port is not None:
        conf.set_default("bind_port", default_port, group=GROUP)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    """Entry point for oslo-config-generator (part of ``shm.transport``)."""
    return [(METRICS_GROUP, list(metrics_opts))]


# -- accumulators the services fill ---------------------------------------------------------

#: seconds: from a millisecond to five minutes (a cold start's backlog lands at the top)
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def bucket_quantile(buckets: Sequence[float], cumulative: Sequence[int], q: float
                    ) -> float | None:
    """The upper bound of the bucket holding the q-quantile of cumulative counts per bucket
    (+Inf last, as :meth:`Histogram.snapshot` gives them; a difference of two snapshots is
    one too): None for no observation, inf beyond the last bucket."""
    if not cumulative or cumulative[-1] == 0:
        return None
    rank = q * cumulative[-1]
    for bound, c in zip((*buckets, float("inf")), cumulative, strict=True):
        if c >= rank:
            return bound
    return float("inf")


class Histogram:
    """Counts of observations per bucket, their sum and count; thread-safe, no allocation per
    observation. Read with :meth:`snapshot` (what a collector exports) or :meth:`quantile`."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        buckets = self.buckets
        with self._lock:
            for value in values:
                self._counts[bisect.bisect_left(buckets, value)] += 1
                self._sum += value

    def snapshot(self) -> tuple[list[int], float]:
        """(cumulative counts per bucket, +Inf last; sum)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for c in counts:
            running += c
            cumulative.append(running)
        return cumulative, total

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile (None: no observation;
        inf: beyond the last bucket) -- what ``shm status`` shows."""
        return bucket_quantile(self.buckets, self.snapshot()[0], q)

    def as_dict(self) -> dict[str, Any]:
        cumulative, total = self.snapshot()
        p50, p99 = self.quantile(0.5), self.quantile(0.99)
        return {"count": cumulative[-1], "sum": round(total, 6),
                "p50_le": None if p50 is None or p50 == float("inf") else p50,
                "p99_le": None if p99 is None or p99 == float("inf") else p99}


def histogram_family(name: str, documentation: str, histograms: dict[tuple[str, ...], Histogram],
                     labels: Sequence[str] = ()) -> HistogramMetricFamily:
    """One Prometheus histogram family from accumulators keyed by label values."""
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    for values, hist in histograms.items():
        cumulative, total = hist.snapshot()
        bounds = [repr(float(b)) for b in hist.buckets] + ["+Inf"]
        family.add_metric(list(values), list(zip(bounds, cumulative, strict=True)), total)
    return family


# -- the endpoint ----------------------------------------------------------------------------

Health = Callable[[], tuple[bool, str]]
Status = Callable[[bool], dict[str, Any]]


def serve(conf: cfg.ConfigOpts, port: int | None,
          parts: Callable[[Any], tuple[Collector, Health, Status]]) -> MetricsEndpoint | None:
    """Start a process's endpoint on ``[metrics]`` (None when disabled); ``parts(group)`` builds
    its collector, health and status from the group's options.  An OSError (port in use) goes
    to the caller, which knows what the process is."""
    register_opts(conf)
    group = conf.metrics
    if not group.enabled:
        return None
    collector, health, status = parts(group)
    return MetricsEndpoint(collector, health, status, host=group.bind_host,
                           port=group.bind_port if port is None else port).start()


class MetricsEndpoint:
    """Serves /metrics, /healthz and /status for one process (see the module docstring)."""

    def __init__(self, collector: Collector, health: Health, status: Status, *,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(ProcessCollector(registry=None))
        self.health = health
        self.status = status
        self.host = host
        self.requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.started_at = time.time()

    @property
    def port(self) -> int:
        """The port actually bound (``bind_port = 0`` picks one)."""
        return self._server.server_address[1] if self._server is not None else self.requested_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MetricsEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                endpoint._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                LOG.debug("metrics endpoint: " + format, *args)

        server = ThreadingHTTPServer((self.host, self.requested_port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="shm-metrics", daemon=True)
        self._thread.start()
        LOG.info("metrics, health and status on %s (/metrics, /healthz, /status)", self.url)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        url = urlsplit(request.path)
        try:
            if url.path == "/metrics":
                self._reply(request, 200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            elif url.path == "/healthz":
                ok, reason = self.health()
                self._reply(request, 200 if ok else 503, "text/plain; charset=utf-8",
                            (reason + "\n").encode())
            elif url.path == "/status":
                query = parse_qs(url.query)
                sources = query.get("sources", ["0"])[0] not in ("0", "", "false")
                body = json.dumps(self.status(sources), sort_keys=True).encode()
                self._reply(request, 200, "application/json", body)
            else:
                self._reply(request, 404, "text/plain; charset=utf-8",
                            b"not found: try /metrics, /healthz or /status\n")
        except Exception as exc:  # a scrape must never take the process down
            LOG.exception("metrics endpoint: %s failed", url.path)
            self._reply(request, 500, "text/plain; charset=utf-8", f"error: {exc}\n".encode())

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, code: int, content_type: str, body: bytes) -> None:
        request.send_response(code)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
