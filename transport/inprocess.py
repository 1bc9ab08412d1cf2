"""The embedded, broker-less bus: both planes inside one process.

Role: implement ``DataPlane`` and ``ControlPlane`` (see ``transport.base``)
with plain Python objects so every party (compute reporters, schedulers,
the simulator) can run in one process with no RabbitMQ: a stream log per
stream name with integer offsets and count/byte retention, consumers that
each read at their own offset, and one inbox per control ``(topic,
server)``. It also counts what a broker would carry (messages and bytes
per plane) for the simulator's reports.

Two delivery modes, chosen per bus:

* ``threaded=True``: each started consumer and control server gets a
  daemon thread that waits for work, like a real deployment.
* ``threaded=False`` (synchronous): nothing runs on its own. Messages are
  delivered only when the caller asks, in the calling thread, via
  ``consumer.poll()``, ``server.poll()`` or ``bus.pump()``. With no threads
  and a fixed pump order a discrete-event simulation is reproducible.

Life cycle: create the bus, build publishers/consumers/servers/clients
from it, ``start()`` consumers and servers, and ``close()`` the bus at the
end (it stops whatever is still running). Control inboxes are created by
the first ``start()`` of a server on that ``(topic, server)`` and then
outlive the server, like a non-auto-delete RabbitMQ queue: casts sent
while the server is restarting wait for it; casts to a target that never
had a server are dropped and counted.

The contract: docs/design.md §7.3.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from transport.base import (
    CastError,
    ControlHandler,
    OffsetSpec,
    OnBatch,
    OnMessage,
    OnRetentionGap,
    PublishError,
    validate_offset,
)
from transport.streamlog import Entry, StreamLog

__all__ = [
    "BusStats",
    "InProcessBus",
    "InProcessControlClient",
    "InProcessControlServer",
    "InProcessStreamConsumer",
    "InProcessStreamPlane",
    "InProcessStreamPublisher",
]

LOG = logging.getLogger(__name__)

DEFAULT_STREAM = "shm-hoststate"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# Messages taken per lock acquisition: big enough to amortise locking,
# small enough that stop() inside a handler is honoured promptly.
_BATCH = 512


@dataclasses.dataclass(frozen=True)
class BusStats:
    """Counters since the bus was created (what a broker would carry)."""

    stream_messages: int
    stream_bytes: int
    stream_deliveries: int
    stream_retention_dropped: int
    control_messages: int
    control_bytes: int
    control_deliveries: int
    control_dropped: int
    handler_errors: int


class _Stream:
    __slots__ = ("name", "log", "cond", "messages", "bytes", "deliveries")

    def __init__(self, name: str, max_messages: int | None,
                 max_bytes: int | None) -> None:
        self.name = name
        self.log = StreamLog(max_messages=max_messages, max_bytes=max_bytes)
        self.cond = threading.Condition(threading.Lock())
        self.messages = 0
        self.bytes = 0
        self.deliveries = 0


class _Inbox:
    __slots__ = ("key", "queue", "cond", "server", "messages", "bytes",
                 "deliveries")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.queue: collections.deque[bytes] = collections.deque()
        self.cond = threading.Condition(threading.Lock())
        self.server: InProcessControlServer | None = None
        self.messages = 0
        self.bytes = 0
        self.deliveries = 0


class InProcessBus:
    """Broker stand-in shared by every party of one process.

    :param threaded: deliver from background threads (True) or only when
        polled/pumped by the caller (False, deterministic).
    :param stream: default stream name for publishers/consumers.
    :param max_messages: retention: keep at most this many messages per
        stream (None: no count limit).
    :param max_bytes: retention: keep at most this many body bytes per
        stream (None: no byte limit). The newest message is always kept.
    :param wall_clock: the publish time stamped on every stream message.
    """

    def __init__(self, *, threaded: bool = True,
                 stream: str = DEFAULT_STREAM,
                 max_messages: int | None = None,
                 max_bytes: int | None = DEFAULT_MAX_BYTES,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.threaded = threaded
        #: stamps every stream message's publish time (the kombu stream's ``shm-ts``)
        self.wall_clock = wall_clock
        self.default_stream = stream
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._inboxes: dict[tuple[str, str], _Inbox] = {}
        # Started consumers/servers in start order: pump() walks these so
        # the delivery order depends only on the caller's actions.
        self._consumers: list[InProcessStreamConsumer] = []
        self._servers: list[InProcessControlServer] = []
        self._control_dropped = 0
        self._handler_errors = 0
        self._closed = False

    # -- factories (DataPlane / ControlPlane) ---------------------------

    def stream_publisher(self, stream: str | None = None,
                         ) -> InProcessStreamPublisher:
        return InProcessStreamPublisher(self, self._stream(stream))

    def stream_consumer(self, on_retention_gap: OnRetentionGap | None = None,
                        stream: str | None = None,
                        ) -> InProcessStreamConsumer:
        return InProcessStreamConsumer(self, self._stream(stream),
                                       on_retention_gap=on_retention_gap)

    def sibling_stream(self, suffix: str, *, max_age: str | None = None,
                       max_length_bytes: int | None = None,
                       max_segment_size_bytes: int | None = None) -> InProcessStreamPlane:
        """A ``DataPlane`` on the stream named like the default one plus ``suffix`` (the
        schedulers' checkpoints); the retention arguments are RabbitMQ's and ignored here:
        every stream of this bus keeps the bus's own retention."""
        return InProcessStreamPlane(self, self.default_stream + suffix)

    def control_server(self, topic: str, server: str,
                       handler: ControlHandler) -> InProcessControlServer:
        return InProcessControlServer(self, topic, server, handler)

    def control_client(self) -> InProcessControlClient:
        return InProcessControlClient(self)

    # -- synchronous mode ------------------------------------------------

    def pump(self, max_messages: int | None = None) -> int:
        """Deliver pending messages in the calling thread; return how many.

        Walks started consumers, then started control servers, each in
        start order, and repeats while handlers produce more work, until
        nothing is pending or *max_messages* were delivered.
        """
        if self.threaded:
            raise RuntimeError("pump() is only for a bus with threaded=False")
        delivered = 0
        while max_messages is None or delivered < max_messages:
            progress = 0
            for party in self._parties():
                budget = (None if max_messages is None
                          else max_messages - delivered - progress)
                if budget is not None and budget <= 0:
                    break
                progress += party.poll(budget)
            if not progress:
                break
            delivered += progress
        return delivered

    # -- introspection ---------------------------------------------------

    def stats(self) -> BusStats:
        with self._lock:
            streams = list(self._streams.values())
            inboxes = list(self._inboxes.values())
            dropped = self._control_dropped
            errors = self._handler_errors
        return BusStats(
            stream_messages=sum(s.messages for s in streams),
            stream_bytes=sum(s.bytes for s in streams),
            stream_deliveries=sum(s.deliveries for s in streams),
            stream_retention_dropped=sum(s.log.dropped_messages
                                         for s in streams),
            control_messages=sum(i.messages for i in inboxes),
            control_bytes=sum(i.bytes for i in inboxes),
            control_deliveries=sum(i.deliveries for i in inboxes),
            control_dropped=dropped,
            handler_errors=errors,
        )

    def stream_bounds(self, stream: str | None = None) -> tuple[int, int]:
        """``(first_offset, next_offset)`` of a stream (retained range)."""
        s = self._stream(stream)
        with s.cond:
            return s.log.first_offset, s.log.next_offset

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop every consumer and server still running; idempotent."""
        with self._lock:
            self._closed = True
            parties = self._parties()
        for party in parties:
            party.stop()

    # -- internals used by the parties ----------------------------------

    def _parties(self) -> list[InProcessStreamConsumer | InProcessControlServer]:
        return [*self._consumers, *self._servers]

    def _stream(self, name: str | None) -> _Stream:
        name = name or self.default_stream
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = self._streams[name] = _Stream(
                    name, self._max_messages, self._max_bytes)
            return stream

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the in-process bus is closed")

    def _register(self, consumer: InProcessStreamConsumer) -> None:
        with self._lock:
            self._check_open()
            self._consumers.append(consumer)

    def _unregister(self, consumer: InProcessStreamConsumer) -> None:
        with self._lock:
            if consumer in self._consumers:
                self._consumers.remove(consumer)

    def _count_handler_error(self) -> None:
        with self._lock:
            self._handler_errors += 1

    def _attach_inbox(self, server: InProcessControlServer) -> _Inbox:
        key = (server.topic, server.server)
        with self._lock:
            self._check_open()
            inbox = self._inboxes.get(key)
            if inbox is None:
                inbox = self._inboxes[key] = _Inbox(key)
            if inbox.server is not None and inbox.server is not server:
                # Two servers on one inbox would compete for casts (as on
                # RabbitMQ); in-process that is always a wiring bug.
                raise RuntimeError(f"a control server already listens on "
                                   f"{key!r}")
            inbox.server = server
            self._servers.append(server)
            return inbox

    def _detach_inbox(self, server: InProcessControlServer,
                      inbox: _Inbox) -> None:
        with self._lock:
            if inbox.server is server:
                inbox.server = None
            if server in self._servers:
                self._servers.remove(server)

    def _fanout(self, topic: str, body: bytes) -> None:
        # to the servers listening now (RabbitMQ's fanout queues leave with their consumer)
        with self._lock:
            servers = [s for (t, s), inbox in self._inboxes.items()
                       if t == topic and inbox.server is not None]
        for server in servers:
            self._cast(topic, server, body)

    def _cast(self, topic: str, server: str, body: bytes) -> None:
        inbox = self._inboxes.get((topic, server))
        if inbox is None:
            with self._lock:
                self._control_dropped += 1
            LOG.debug("cast to %s.%s dropped: nobody ever listened there",
                      topic, server)
            return
        with inbox.cond:
            inbox.queue.append(body)
            inbox.messages += 1
            inbox.bytes += len(body)
            if self.threaded:
                inbox.cond.notify()


def _as_bytes(body: object) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, (bytes, bytearray, memoryview)):
        # Copy so a caller reusing its buffer cannot rewrite history.
        return bytes(body)
    raise TypeError(f"message body must be bytes, got {type(body).__name__}")


class InProcessStreamPlane:
    """``DataPlane`` of one named stream of an :class:`InProcessBus` (closing it leaves the
    bus running)."""

    def __init__(self, bus: InProcessBus, stream: str) -> None:
        self.bus = bus
        self.stream = stream

    @property
    def threaded(self) -> bool:
        return self.bus.threaded

    def stream_publisher(self) -> InProcessStreamPublisher:
        return self.bus.stream_publisher(self.stream)

    def stream_consumer(self, on_retention_gap: OnRetentionGap | None = None,
                        ) -> InProcessStreamConsumer:
        return self.bus.stream_consumer(on_retention_gap, self.stream)

    def close(self) -> None:
        pass


class InProcessStreamPublisher:
    """Appends to one in-process stream (never blocks, never fails)."""

    def __init__(self, bus: InProcessBus, stream: _Stream) -> None:
        self._bus = bus
        self._stream = stream
        self._notify = bus.threaded
        self._closed = False

    def publish(self, body: bytes) -> None:
        if self._closed:
            raise PublishError("publisher is closed")
        body = _as_bytes(body)
        stream = self._stream
        with stream.cond:
            stream.log.append(body, self._bus.wall_clock())
            stream.messages += 1
            stream.bytes += len(body)
            if self._notify:
                stream.cond.notify_all()

    def close(self) -> None:
        self._closed = True


class InProcessStreamConsumer:
    """Reads one in-process stream at its own offset.

    In synchronous mode call ``poll()`` (or ``bus.pump()``); in threaded
    mode a daemon thread delivers. Either way ``on_message`` runs in one
    thread at a time, in offset order.
    """

    def __init__(self, bus: InProcessBus, stream: _Stream,
                 on_retention_gap: OnRetentionGap | None = None) -> None:
        self._bus = bus
        self._stream = stream
        self.on_retention_gap = on_retention_gap
        self._on_message: OnMessage | None = None
        self._on_batch: OnBatch | None = None
        #: the offset of the newest message when this consumer started: the end of its
        #: backlog, whose publish times on_batch gets (-1: none)
        self._backlog_end = -1
        self._next = 0
        self._last: int | None = None
        self._running = False
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.errors = 0
        self.gaps = 0

    @property
    def last_offset(self) -> int | None:
        return self._last

    @property
    def pending(self) -> int:
        """Messages retained beyond this consumer's position."""
        with self._stream.cond:
            return max(0, self._stream.log.next_offset - self._next)

    def start(self, on_message: OnMessage,
              offset: OffsetSpec = "first", *, on_batch: OnBatch | None = None) -> None:
        offset = validate_offset(offset)
        if self._running:
            raise RuntimeError("consumer already started")
        stream = self._stream
        self._bus._register(self)
        with stream.cond:
            log = stream.log
            if offset == "first":
                self._next = log.first_offset
            elif offset == "next":
                self._next = log.next_offset
            elif offset == "last":
                self._next = max(log.first_offset, log.next_offset - 1)
            else:
                assert isinstance(offset, int)
                self._next = offset
            self._on_message = on_message
            self._on_batch = on_batch
            self._backlog_end = log.next_offset - 1
            self._running = True
        if self._bus.threaded:
            self._thread = threading.Thread(
                target=self._run, daemon=True,
                name=f"shm-inproc-consumer-{stream.name}")
            self._thread.start()

    def poll(self, max_messages: int | None = None) -> int:
        """Synchronous mode: deliver up to *max_messages* pending messages
        in the calling thread; return how many were delivered."""
        if self._bus.threaded:
            raise RuntimeError("poll() is only for a bus with threaded=False")
        delivered = 0
        while self._running:
            limit = _BATCH if max_messages is None else min(
                _BATCH, max_messages - delivered)
            if limit <= 0:
                break
            with self._stream.cond:
                expected, start, entries = self._take(limit)
            if not entries:
                break
            delivered += self._dispatch(expected, start, entries)
        return delivered

    def stop(self) -> None:
        stream = self._stream
        with stream.cond:
            was_running = self._running
            self._running = False
            stream.cond.notify_all()
        if was_running:
            self._bus._unregister(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    # Caller holds the stream lock.
    def _take(self, limit: int) -> tuple[int, int, list[Entry]]:
        expected = self._next
        start, entries = self._stream.log.read(expected, limit)
        self._next = start + len(entries)
        self._stream.deliveries += len(entries)
        return expected, start, entries

    def _run(self) -> None:
        stream = self._stream
        cond = stream.cond
        while True:
            with cond:
                while self._running and self._next >= stream.log.next_offset:
                    cond.wait()
                if not self._running:
                    return
                expected, start, entries = self._take(_BATCH)
            self._dispatch(expected, start, entries)

    def _dispatch(self, expected: int, start: int,
                  entries: list[Entry]) -> int:
        if start > expected:
            self._report_gap(expected, start)
        if self._on_batch is not None and entries:
            return self._dispatch_batch(start, entries)
        on_message = self._on_message
        assert on_message is not None
        offset = start
        for body, _ in entries:
            if not self._running:
                # stop() from inside on_message: rewind so a restart does
                # not skip what was fetched but not delivered.
                with self._stream.cond:
                    self._next = offset
                    self._stream.deliveries -= start + len(entries) - offset
                break
            try:
                on_message(body, offset)
            except Exception:
                self.errors += 1
                self._bus._count_handler_error()
                LOG.exception("stream %s: on_message failed at offset %d; "
                              "message skipped", self._stream.name, offset)
            self._last = offset
            offset += 1
        delivered = offset - start
        self.delivered += delivered
        return delivered

    def _dispatch_batch(self, start: int, entries: list[Entry]) -> int:
        assert self._on_batch is not None
        try:
            end = self._backlog_end
            self._on_batch([(body, offset, published if offset <= end else None)
                            for offset, (body, published) in enumerate(entries, start)])
        except Exception:
            self.errors += 1
            self._bus._count_handler_error()
            LOG.exception("stream %s: on_batch failed at offsets %d..%d; messages skipped",
                          self._stream.name, start, start + len(entries) - 1)
        self._last = start + len(entries) - 1
        self.delivered += len(entries)
        return len(entries)

    def _report_gap(self, requested: int, first: int) -> None:
        self.gaps += 1
        LOG.warning("stream %s: offsets %d..%d were dropped by retention "
                    "before this consumer read them", self._stream.name,
                    requested, first - 1)
        hook = self.on_retention_gap
        if hook is None:
            return
        try:
            hook(requested, first)
        except Exception:
            self._bus._count_handler_error()
            LOG.exception("stream %s: on_retention_gap hook failed",
                          self._stream.name)


class InProcessControlServer:
    """Receives casts for one ``(topic, server)`` inbox."""

    def __init__(self, bus: InProcessBus, topic: str, server: str,
                 handler: ControlHandler) -> None:
        self._bus = bus
        self.topic = topic
        self.server = server
        self._handler = handler
        self._inbox: _Inbox | None = None
        self._running = False
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.errors = 0

    def start(self) -> None:
        if self._running:
            raise RuntimeError("control server already started")
        inbox = self._bus._attach_inbox(self)
        with inbox.cond:
            self._inbox = inbox
            self._running = True
        if self._bus.threaded:
            self._thread = threading.Thread(
                target=self._run, daemon=True,
                name=f"shm-inproc-control-{self.topic}.{self.server}")
            self._thread.start()

    def poll(self, max_messages: int | None = None) -> int:
        """Synchronous mode: handle up to *max_messages* queued casts."""
        if self._bus.threaded:
            raise RuntimeError("poll() is only for a bus with threaded=False")
        inbox = self._inbox
        delivered = 0
        while self._running and inbox is not None and (
                max_messages is None or delivered < max_messages):
            with inbox.cond:
                if not inbox.queue:
                    break
                body = inbox.queue.popleft()
                inbox.deliveries += 1
            self._handle(body)
            delivered += 1
        return delivered

    def stop(self) -> None:
        inbox = self._inbox
        if inbox is None:
            return
        with inbox.cond:
            was_running = self._running
            self._running = False
            inbox.cond.notify_all()
        if was_running:
            self._bus._detach_inbox(self, inbox)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    def _run(self) -> None:
        inbox = self._inbox
        assert inbox is not None
        cond = inbox.cond
        while True:
            with cond:
                while self._running and not inbox.queue:
                    cond.wait()
                if not self._running:
                    return
                body = inbox.queue.popleft()
                inbox.deliveries += 1
            self._handle(body)

    def _handle(self, body: bytes) -> None:
        self.delivered += 1
        try:
            self._handler(body)
        except Exception:
            self.errors += 1
            self._bus._count_handler_error()
            LOG.exception("control server %s.%s: handler failed; cast "
                          "dropped", self.topic, self.server)


class InProcessControlClient:
    """Casts into the bus's control inboxes."""

    def __init__(self, bus: InProcessBus) -> None:
        self._bus = bus
        self._closed = False

    def cast(self, topic: str, server: str, body: bytes) -> None:
        if self._closed:
            raise CastError("control client is closed")
        self._bus._cast(topic, server, _as_bytes(body))

    def fanout(self, topic: str, body: bytes) -> None:
        if self._closed:
            raise CastError("control client is closed")
        self._bus._fanout(topic, _as_bytes(body))

    def close(self) -> None:
        self._closed = True
