"""The scheduler-side cache as a running service: stream consumer, control server, timers.

Life cycle::

    SchedulerService(...) --start()--> running --stop()--> stopped
      start(): restore the local snapshot (if state_dir has one), start the
               control server (resync answers and claim results come back here),
               start reading the stream after the restored offset — or from its
               retained start on a cold start — and start the timer thread.
      running: stream thread  --> cache.ingest_stream  (deltas, snapshots, heartbeats)
               control thread --> cache.ingest_control (resync answers, claim results)
               timer thread   --> cache.tick every tick_interval (gaps, resync
                                  retries, claim deadlines, down detection) and
                                  cache.save every snapshot_interval
               decisions      --> under cache.lock, from any thread
      stop():  stop the stream consumer, the control server and the timers,
               write a last snapshot, close the client.

Cold start has two modes: read the stream from its retained start (the
default: every announcement snapshot and delta still retained), or, given
``known_sources`` (source -> reporter endpoint), read only new messages and ask
every known source for a snapshot.

If the stream no longer holds the offset we resume from (retention dropped it),
the consumer reports a retention gap and every held source is asked to resync.

The contract: docs/design.md §4.4 (starting and restarting).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Unpack

from oslo_config import cfg

from protocol.codec import Decoder, Encoder
from protocol.messages import Claim, Message, ResyncRequest
from protocol.receiver import ReceiverMachine, ReceiverParams
from shared_host_manager.cache import CacheObserver, HostStateCache
from shared_host_manager.conf import cache as cache_conf
from transport import factory, signing_opts
from transport import opts as transport_opts
from transport.base import ControlClient, ControlPlane, ControlServer, DataPlane, StreamConsumer
from transport.rpcapi import ReporterAPI

LOG = logging.getLogger(__name__)


class SchedulerService:
    # the transport objects, built by start() from the planes
    _client: ControlClient
    _server: ControlServer
    _consumer: StreamConsumer
    reporter_api: ReporterAPI

    def __init__(
        self,
        name: str,
        data_plane: DataPlane,
        control_plane: ControlPlane,
        *,
        reporter_topic: str,
        scheduler_topic: str,
        encoder: Encoder | None = None,
        decoder: Decoder | None = None,
        state_dir: str | None = None,
        snapshot_interval: float = 30.0,
        tick_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        known_sources: Mapping[str, str] | None = None,
        recorder: CacheObserver | None = None,
        **receiver_params: Unpack[ReceiverParams],
    ) -> None:
        self.name = name
        self._data_plane = data_plane
        self._control_plane = control_plane
        self._reporter_topic = reporter_topic
        self._scheduler_topic = scheduler_topic
        self._encoder = encoder or Encoder()
        self.receiver = ReceiverMachine(name, **receiver_params)
        self.cache = HostStateCache(self.receiver, self._send, decoder=decoder, clock=clock,
                                    recorder=recorder)
        #: optional update log (shared_host_manager.updatelog.recorder.Recorder), closed by stop()
        self.recorder = recorder
        self._state_path = os.path.join(state_dir, f"cache-{name}.msgpack") if state_dir else None
        self.snapshot_interval = snapshot_interval
        self.tick_interval = tick_interval
        self.clock = clock
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.retention_gaps = 0
        self.resumed_from: int | None = None
        self.running = False
        self._known_sources = dict(known_sources or {})

    def set_recorder(self, recorder: CacheObserver) -> None:
        """Observe this scheduler's cache (before :meth:`start`); see :class:`CacheObserver`."""
        self.cache.set_recorder(recorder)
        self.recorder = recorder

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        self._client = self._control_plane.control_client()
        self.reporter_api = ReporterAPI(self._client, self._encoder, self._reporter_topic)
        offset = self.cache.load(self._state_path) if self._state_path else None
        self.resumed_from = offset
        self._server = self._control_plane.control_server(
            self._scheduler_topic, self.name, self.cache.ingest_control)
        self._server.start()
        self._consumer = self._data_plane.stream_consumer(on_retention_gap=self._on_retention_gap)
        if offset is None and self._known_sources:
            self._consumer.start(self.cache.ingest_stream, "next", on_batch=self.cache.ingest_stream_batch)
            self.cache.ask_sources(self._known_sources)
        else:
            self._consumer.start(self.cache.ingest_stream, "first" if offset is None else offset + 1,
                                 on_batch=self.cache.ingest_stream_batch)
        self._stop.clear()
        self._timer = threading.Thread(target=self._timers, name=f"scheduler-{self.name}-timers",
                                       daemon=True)
        self._timer.start()
        self.running = True
        LOG.info("scheduler cache %s started (%s)", self.name,
                 "cold start" if offset is None else f"resuming after stream offset {offset}")

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        self._consumer.stop()
        self._server.stop()
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=10)
        if self._state_path:
            self.cache.save(self._state_path)
        if self.recorder is not None:
            self.recorder.close()
        self._client.close()
        LOG.info("scheduler cache %s stopped", self.name)

    # -- edges -------------------------------------------------------------------

    def _send(self, endpoint: str, message: Message) -> None:
        if isinstance(message, ResyncRequest):
            self.reporter_api.resync(endpoint, message)
        elif isinstance(message, Claim):
            self.reporter_api.claim(endpoint, message)
        else:
            raise TypeError(f"a scheduler does not send {type(message).__name__}")

    def send_claim(self, claim: Claim) -> bool:
        """Cast a claim (with its build request) to the reporter of its source."""
        endpoint = self.cache.endpoint_of(claim.source)
        if endpoint is None:
            return False
        self.reporter_api.claim(endpoint, claim)
        if self.recorder is not None:
            self.recorder.sent(endpoint, claim, self.clock())
        return True

    def _on_retention_gap(self, requested: int, first: int) -> None:
        self.retention_gaps += 1
        n = self.cache.resync_all()
        LOG.warning("stream offset %d is gone (oldest retained %d): asked %d sources to resync",
                    requested, first, n)

    def _timers(self) -> None:
        next_save = self.clock() + self.snapshot_interval
        while not self._stop.wait(self.tick_interval):
            try:
                self.cache.tick()
                if self._state_path and self.clock() >= next_save:
                    next_save = self.clock() + self.snapshot_interval
                    self.cache.save(self._state_path)
            except Exception:  # timers must outlive any single failure
                LOG.exception("scheduler timer iteration failed")


# -- built from a configuration file -------------------------------------------------

def register_service_opts(conf: cfg.ConfigOpts) -> None:
    """Every option group a scheduler's cache reads: [cache], [signing], [data_plane], [control_plane]."""
    cache_conf.register_opts(conf)
    signing_opts.register_opts(conf)
    transport_opts.register_opts(conf)


def service_from_conf(conf: cfg.ConfigOpts, *, recorder: CacheObserver | None = None
                      ) -> SchedulerService:
    """A SchedulerService configured by ``conf`` (registered with :func:`register_service_opts`)."""
    group = conf.cache
    keyring = signing_opts.keyring_from_conf(conf)
    data_plane, control_plane = factory.from_conf(conf)
    topics = factory.topics(conf)
    return SchedulerService(
        group.name, data_plane, control_plane,
        reporter_topic=topics.reporter, scheduler_topic=topics.scheduler,
        encoder=Encoder(keyring),
        decoder=Decoder(keyring, max_message_bytes=group.max_message_bytes),
        state_dir=group.state_dir, snapshot_interval=group.snapshot_interval,
        tick_interval=group.tick_interval, reorder_window=group.reorder_window,
        reorder_timeout=group.reorder_timeout, resync_timeout=group.resync_timeout,
        resync_backoff_max=group.resync_backoff_max, down_interval=group.down_interval,
        claim_deadline=group.claim_deadline, recorder=recorder)
