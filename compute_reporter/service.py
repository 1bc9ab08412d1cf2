"""The compute reporter as a running service: threads and transport around ReporterManager.

Life cycle::

    ReporterService(...) --start()--> running --stop()--> stopped
        start(): allocate and persist new epochs, build the manager, open the
                 stream publisher and the control client, start the control
                 server and the loop thread, then the tracker.
        running: tracker thread ---change/release---> manager ---+
                 control thread ---claims/resyncs---> manager ---+--> loop thread: poll(),
                                                                        publish batches, cast answers
        stop():  stop the tracker and the control server, flush every
                 pending change (one last publish), stop the loop, close.

One loop thread does all sending, so a transport object is never used from two
threads at once; the other threads only wake it.  A publish that fails is
logged and counted; the lost items are repaired by the protocol (the next
heartbeat shows the gap and schedulers resync).  A publish whose message may
be stored (sent, its confirm lost with the connection) is counted apart, as
unconfirmed: it is no known loss.

Observation: :meth:`ReporterService.figures`, :meth:`stream_stats` and
``manager.versions()`` are the read interface of the metrics endpoint
(``compute_reporter.metrics``); nothing else reads the service's insides.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from oslo_config import cfg

from compute_reporter import conf as reporter_conf
from compute_reporter.epochs import EpochStore
from compute_reporter.manager import ReporterManager, ReporterParams
from compute_reporter.tracker import ResourceTracker
from protocol.codec import Decoder, Encoder
from protocol.document import Op
from protocol.messages import Batch, ClaimResult, Fence, Message, ResyncAnswer, Send
from transport import cells, factory, signing_opts
from transport import opts as transport_opts
from transport.base import (
    ControlClient,
    ControlPlane,
    ControlServer,
    DataPlane,
    PublishError,
    StreamPublisher,
    StreamPublisherStats,
)
from transport.rpcapi import SchedulerAPI

LOG = logging.getLogger(__name__)


class ReporterObserver(Protocol):
    """What a :class:`ReporterService` tells its observer (the update log's
    :class:`~compute_reporter.recorder.ReporterRecorder`): the service's contract, here
    where it is called.

    Called from the service's threads; an observer must be thread-safe and must not raise.
    """

    def reporter_attached(self, service: ReporterService) -> None:
        """``start()`` built the manager (epochs allocated): nothing was published yet."""

    def control(self, body: bytes, now: float, sends: Sequence[Send] | None = None) -> None:
        """A claim or resync request was handled (``body`` as received; a reporter passes no
        ``sends``: the parameter is there so that one recorder can observe a scheduler's
        cache as well, whose ``control`` has it)."""

    def dropped(self, body: bytes, plane: str, offset: int | None, now: float) -> None:
        """An invalid control message was dropped."""

    def published(self, body: bytes, now: float) -> None:
        """A batch went out on the stream (``body`` as published)."""

    def sent(self, to: str | None, message: Message, now: float) -> None:
        """A claim result or resync answer was cast to a scheduler."""

    def close(self) -> None:
        """The reporter stopped."""


class _Sink:
    """Adapts the manager to the tracker's clock-less TrackerSink interface."""

    def __init__(self, service: ReporterService) -> None:
        self._service = service

    def change(self, source: str, ops: list[Op]) -> None:
        self._service.manager.change(source, ops, self._service.clock())
        self._service.wake()

    def release(self, source: str, instance: str) -> bool:
        done = self._service.manager.release(source, instance, self._service.clock())
        self._service.wake()
        return done

    def instances(self, source: str) -> list[str]:
        return self._service.manager.instances(source)

    def claims_included(self, source: str, claim_ids: list[str]) -> None:
        self._service.manager.claims_included(source, claim_ids, self._service.clock())
        self._service.wake()


class _Waiter:
    """One caller of :meth:`ReporterService.publish_now`."""

    __slots__ = ("done", "fence", "ok")

    def __init__(self, fence: bool = False) -> None:
        self.done = threading.Event()
        self.fence = fence
        self.ok = False


class ReporterService:
    # the transport objects, built by start() from the planes
    _publisher: StreamPublisher
    _client: ControlClient
    _server: ControlServer
    _scheduler_api: SchedulerAPI

    def __init__(
        self,
        name: str,
        tracker: ResourceTracker,
        data_plane: DataPlane,
        control_plane: ControlPlane,
        *,
        reporter_topic: str,
        scheduler_topic: str,
        encoder: Encoder | None = None,
        decoder: Decoder | None = None,
        state_dir: str | None = None,
        coalesce_window: float = 0.05,
        heartbeat_interval: float = 10.0,
        ring_size: int = 256,
        max_batch_items: int = 500,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        recorder: ReporterObserver | None = None,
    ) -> None:
        self.name = name
        self.tracker = tracker
        self._data_plane = data_plane
        self._control_plane = control_plane
        self._reporter_topic = reporter_topic
        self._scheduler_topic = scheduler_topic
        self._encoder = encoder or Encoder()
        self._decoder = decoder or Decoder()
        self._state_dir = state_dir
        #: the reporter's settings (recorded in its update log's header)
        self.params: ReporterParams = dict(
            coalesce_window=coalesce_window, heartbeat_interval=heartbeat_interval,
            ring_size=ring_size, max_batch_items=max_batch_items)
        self.clock = clock
        self._wall_ns = wall_ns
        self._wake = threading.Condition()
        self._woken = False
        #: callers of publish_now() waiting for the loop's next send (under _wake), each told
        #: whether every publish of that send succeeded
        self._flush_waiters: list[_Waiter] = []
        self._running = False
        self._thread: threading.Thread | None = None
        self.manager: ReporterManager
        #: optional update log (compute_reporter.recorder.ReporterRecorder): attached by
        #: start(), records what is handled, published and cast; closed by stop()
        self.recorder: ReporterObserver | None = recorder
        self.stats = {"published": 0, "publish_errors": 0, "publish_unconfirmed": 0, "casts": 0,
                      "cast_errors": 0, "invalid": 0, "fences": 0}
        #: invalid control messages dropped, by reason (protocol.errors reasons)
        self.invalid: Counter[str] = Counter()
        self.started_at: float | None = None
        self.running = False

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        hosts = self.tracker.hosts()
        epochs = EpochStore(self._state_dir).new_epochs(hosts, self._wall_ns())
        self.manager = ReporterManager(
            self.name, {h: self.tracker.document(h) for h in hosts}, epochs, **self.params)
        if self.recorder is not None:
            self.recorder.reporter_attached(self)
        self._publisher = self._data_plane.stream_publisher()
        self._client = self._control_plane.control_client()
        self._scheduler_api = SchedulerAPI(self._client, self._encoder, self._scheduler_topic)
        self._server = self._control_plane.control_server(
            self._reporter_topic, self.name, self._on_control)
        self._server.start()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=f"reporter-{self.name}",
                                        daemon=True)
        self._thread.start()
        self.tracker.start(_Sink(self))
        self.started_at = time.time()
        self.running = True
        LOG.info("reporter %s serving %d hosts", self.name, len(hosts))

    def stop(self, *, goodbye: bool = True) -> None:
        """Stop serving; the last changes are published, and with ``goodbye`` (a clean stop)
        every host's goodbye, which takes it out of every scheduler's eligible set at once
        (design §4.2).  A killed reporter says nothing: the schedulers' ``down_interval`` does."""
        if not self._running:
            return
        self.running = False
        self.tracker.stop()
        self._running = False
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        now = self.clock()
        batches, control = self.manager.goodbye(now) if goodbye else self.manager.flush_all(now)
        errors = self.stats["publish_errors"]
        self._send(batches, control)
        with self._wake:  # callers of publish_now() the loop left: their changes went now
            waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            waiter.ok = self.stats["publish_errors"] == errors
            waiter.done.set()
        # after the goodbye, not before: an oslo.messaging server takes seconds to stop, and
        # a process on its way out (nova's graceful shutdown) may not wait that long
        self._server.stop()
        self._publisher.close()
        self._client.close()
        if self.recorder is not None:
            self.recorder.close()
        LOG.info("reporter %s stopped", self.name)

    # -- observation ---------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """Counters of this reporter, read at once (the metrics endpoint's read interface)."""
        manager = getattr(self, "manager", None)
        return {
            "sources": len(manager.machines) if manager is not None else 0,
            "service": dict(self.stats),
            "invalid": dict(self.invalid),
            "manager": dict(manager.stats) if manager is not None else {},
            "machines": manager.machine_stats() if manager is not None else {},
            "ring_deltas": manager.ring_deltas() if manager is not None else 0,
        }

    def stream_stats(self) -> StreamPublisherStats | None:
        """The stream publisher's figures (None before start, or for a backend without them)."""
        publisher = getattr(self, "_publisher", None)
        stats = getattr(publisher, "stats", None)
        return stats() if callable(stats) else None

    def flush(self) -> None:
        """Publish every pending change now, in the calling thread (a caller that must know
        its changes are on the stream before it goes on: nova's functional tests)."""
        if self._running:
            self._send(*self.manager.flush_all(self.clock()))

    def publish_now(self, timeout: float, *, fence: bool = False) -> bool:
        """Publish every pending change at once, without waiting out the coalesce window,
        and wait until the loop thread has handed it to the stream publisher (which waits for
        the broker's confirm where the backend has one).  True if every batch was confirmed
        within ``timeout`` seconds; False if not (the change is still published as soon as it
        can be).  A caller that must know its change is on the stream before it goes on (an
        API call that forces a service down) uses it; the loop stays the only sender.

        ``fence``: then also fan a :class:`~protocol.messages.Fence` of each source's version
        out to every scheduler, so that none decides before it holds the change."""
        waiter = _Waiter(fence)
        with self._wake:
            if not self._running:
                return False
            self._flush_waiters.append(waiter)
            self._woken = True
            self._wake.notify()
        return waiter.done.wait(timeout) and waiter.ok

    def wake(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify()

    # -- threads -------------------------------------------------------------------

    def _on_control(self, body: bytes) -> None:
        now = self.clock()
        reason = self.manager.handle_bytes(body, self._decoder, now)
        if reason is not None:
            self.stats["invalid"] += 1
            self.invalid[reason] += 1
            LOG.warning("dropped invalid control message (%s): %s", reason, self.manager.last_error)
            if self.recorder is not None:
                self.recorder.dropped(body, "control", None, now)
            return
        if self.recorder is not None:
            self.recorder.control(body, now)
        if self._stream_out_of_reach():
            # the answer goes now, from this thread: the loop is retrying a publish for up to
            # publish_timeout, and a claim's arbiter is this reporter, not the stream (§5.3)
            self._cast(self.manager.take_control())
        self.wake()

    def _loop(self) -> None:
        while self._running:
            with self._wake:
                waiters, self._flush_waiters = self._flush_waiters, []
            published = self.stats["published"]
            ok = False
            try:
                now = self.clock()
                batches, control = (self.manager.flush_all(now) if waiters
                                    else self.manager.poll(now))
                self._send(batches, control)
                ok = self.stats["published"] - published == len(batches)
                if ok and any(waiter.fence for waiter in waiters):
                    self._fence()
            except Exception:  # the loop must outlive any single failure
                LOG.exception("reporter loop iteration failed")
            for waiter in waiters:
                waiter.ok = ok
                waiter.done.set()
            deadline = self.manager.next_deadline()
            timeout = 1.0 if deadline is None else max(0.0, min(1.0, deadline - self.clock()))
            with self._wake:
                if not self._woken and timeout > 0:
                    self._wake.wait(timeout)
                self._woken = False

    def _fence(self) -> None:
        """Every source's published version, fanned out to the schedulers (see publish_now)."""
        for source, (epoch, seq, _) in self.manager.versions().items():
            try:
                self._scheduler_api.fence(Fence(source, epoch, seq))
                self.stats["fences"] += 1
            except Exception as exc:
                self.stats["cast_errors"] += 1
                LOG.warning("fence of %s not sent: %s", source, exc)

    def _stream_out_of_reach(self) -> bool:
        """The stream's last publish failed (its broker out of reach): claim results then go
        out as they are judged, ahead of the deltas (design §5.3)."""
        stats = getattr(self._publisher, "stats", None)
        return callable(stats) and not stats().connected

    def _cast(self, control: list[Send]) -> None:
        """Cast claim results and resync answers to their schedulers (from the control
        thread as they are judged, or from the loop)."""
        recorder = self.recorder
        now = self.clock() if recorder is not None else 0.0
        for send in control:
            try:
                to, message = send.to, send.message
                if to is None or not isinstance(message, (ClaimResult, ResyncAnswer)):
                    raise TypeError(f"a reporter does not cast {type(message).__name__} to {to!r}")
                self._scheduler_api.send(to, message)
                if recorder is not None:
                    recorder.sent(send.to, send.message, now)
                self.stats["casts"] += 1
            except Exception as exc:
                self.stats["cast_errors"] += 1
                LOG.warning("cast to scheduler %s failed: %s", send.to, exc)

    def _send(self, batches: list[Batch], control: list[Send]) -> None:
        recorder = self.recorder
        now = self.clock() if recorder is not None else 0.0
        if self._stream_out_of_reach():
            self._cast(control)  # not behind publishes the stream may not take for long
            control = []
        for batch in batches:
            try:
                body = self._encoder.encode(batch)
                self._publisher.publish(body)
                if recorder is not None:
                    recorder.published(body, now)
                self.stats["published"] += 1
            except PublishError as exc:
                if exc.stored is None:
                    # the broker may hold it: no scheduler sees a gap if it does, and the
                    # next heartbeat repairs one if it does not
                    self.stats["publish_unconfirmed"] += 1
                    LOG.warning("publish of %d items unconfirmed (sent, its confirm lost; it may "
                                "be stored): %s", len(batch.items), exc)
                else:
                    self.stats["publish_errors"] += 1
                    LOG.warning("publish of %d items failed, not stored: %s", len(batch.items), exc)
            except Exception as exc:
                self.stats["publish_errors"] += 1
                LOG.warning("publish of %d items failed: %s", len(batch.items), exc)
        self._cast(control)  # after the deltas: a claim's delta first, then its result


# -- built from a configuration file -------------------------------------------------

def register_service_opts(conf: cfg.ConfigOpts) -> None:
    """Every option group a reporter reads: [reporter], [signing], [data_plane], [control_plane]."""
    reporter_conf.register_opts(conf)
    signing_opts.register_opts(conf)
    transport_opts.register_opts(conf)


def service_from_conf(conf: cfg.ConfigOpts, tracker: ResourceTracker, *,
                      recorder: ReporterObserver | None = None) -> ReporterService:
    """A ReporterService serving ``tracker``'s hosts, configured by ``conf``
    (registered with :func:`register_service_opts`); it publishes on its cell's stream with
    ``[data_plane] cell``."""
    group = conf.reporter
    keyring = signing_opts.keyring_from_conf(conf)
    data_plane, control_plane = factory.from_conf(conf, cell=cells.publish_cell(conf))
    topics = factory.topics(conf)
    return ReporterService(
        group.name, tracker, data_plane, control_plane,
        reporter_topic=topics.reporter, scheduler_topic=topics.scheduler,
        encoder=Encoder(keyring), decoder=Decoder(keyring), state_dir=group.state_dir,
        coalesce_window=group.coalesce_window, heartbeat_interval=group.heartbeat_interval,
        ring_size=group.ring_size, max_batch_items=group.max_batch_items, recorder=recorder)
