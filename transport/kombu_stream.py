"""The RabbitMQ data plane: one stream queue, written and read with kombu.

Role: carry opaque msgpack bodies (deltas, snapshots, heartbeats, already
encoded by ``protocol``) through a RabbitMQ stream (``x-queue-type:
stream``). The broker stores one copy; every scheduler reads it at its own
offset and can resume where it stopped. Plain kombu/py-amqp is used, not
oslo.messaging, which cannot carry raw bytes and double-wraps JSON
(docs/design.md §7.1).

Life cycles managed here:

* ``KombuStreamPublisher`` connects lazily on the first ``publish()``,
  keeps one connection, and on any connection/channel error reconnects
  with backoff and publishes the same message again, until it is stored
  or ``publish_timeout`` passes (then ``PublishError``, whose ``stored``
  tells a message known not stored -- every attempt refused before it was
  sent, or nacked -- from one whose fate is unknown: an attempt was sent
  and the connection lost before its confirm). ``close()`` ends
  it. With publisher confirms (default) a message is stored at least once;
  a retry after a lost confirm can store it twice, which consumers drop
  (see below). Without confirms a message in flight when the connection
  dies can be lost.
* ``KombuStreamConsumer`` runs one daemon thread from ``start()`` to
  ``stop()``. It (re)connects with backoff, declares the stream, attaches
  at the wanted offset with ``basic.qos`` prefetch > 0 and manual acks
  (both required for streams) and hands bodies to ``on_message`` in stream
  order. After a lost connection it resumes right after the last message
  it delivered, so nothing is skipped or delivered twice. Given an
  ``on_batch`` handler, it hands over what the broker has already sent
  (a backlog: a catch-up after a restart, a burst) in one call of up to
  ``_BATCH_MAX`` messages, reading on while more is buffered, so a busy
  scheduler's cache takes its lock once per backlog, not once per message.
  Before it attaches at "first" or an offset (a start, or a resume after a
  lost connection) such a consumer looks at the stream's tail: the messages up
  to it are its backlog, handed over with their publish times (``shm-ts``),
  the later ones without.

Offsets are *not* contiguous message counters: RabbitMQ 3.10 puts
non-message chunks into the offset space (measured here: 100 messages in
11 segments ended at offset 111). So "first delivered > requested" alone
would flag false retention gaps whenever ``last_offset + 1`` is such a
chunk. The consumer therefore attaches one offset *earlier* than wanted
(at the last message it already has): seeing that offset again proves the
retained data reaches back far enough; if the broker starts later, the
data was dropped by retention and ``on_retention_gap`` fires. The
re-delivered message is skipped.

Duplicates from publish retries are dropped by the consumer: each
publisher stamps ``shm-pub`` (its random id) and ``shm-seq`` (1, 2, ...)
headers, and a consumer skips a body whose seq it already saw from that
publisher.

Observation (docs/design.md §8; read by the metrics endpoint through
``stats()``): the publisher also stamps ``shm-ts``, the wall-clock time of
the ``publish()`` call in nanoseconds -- a transport header, the body is
untouched -- so a consumer can measure staleness (publish to applied) per
message and tell how far behind the stream's tail it is; ``on_batch`` gets it
with each message of its backlog (a restarted scheduler counts that as heard
then, design §4.4).  The tail itself is
looked at every ``tail_probe_interval`` by a short-lived consumer at
``"last"`` on a connection of its own (RabbitMQ 3.10 gives no message count
for a stream over AMQP 0.9.1: ``queue.declare-ok`` says 0).

The contract: docs/design.md §7.1.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any

import amqp.exceptions
import kombu.exceptions
from kombu import Connection, Consumer, Producer, Queue

from transport.backoff import Backoff
from transport.base import (
    OffsetSpec,
    OnBatch,
    OnMessage,
    OnRetentionGap,
    PublishError,
    StreamConsumerStats,
    StreamPublisherStats,
    validate_offset,
)
from transport.kombu_peers import KombuPeerPlane
from transport.metrics import Histogram
from transport.stream_declare import (
    StreamConfigError,
    declare_stream,
    stream_arguments,
    validate_max_age,
)

__all__ = [
    "CONTENT_TYPE",
    "KombuStreamConsumer",
    "KombuStreamDataPlane",
    "KombuStreamPublisher",
    "StreamSettings",
]

LOG = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-msgpack"
HEADER_PUBLISHER = "shm-pub"
HEADER_SEQ = "shm-seq"
HEADER_OFFSET = "x-stream-offset"
#: wall-clock time of publish(), in nanoseconds (staleness and lag)
HEADER_PUBLISHED_AT = "shm-ts"

# Errors after which the connection is discarded and the operation
# retried on a new one. 541 INTERNAL_ERROR and 406 "no replica on the
# local node" from the declare race (stream_declare) are among them.
_RETRYABLE: tuple[type[BaseException], ...] = (
    amqp.exceptions.AMQPError,
    amqp.exceptions.MessageNacked,
    kombu.exceptions.OperationalError,
    OSError,  # includes socket.timeout / TimeoutError
)

# A consumer started at "next"/"last" that loses its connection before
# the first message re-attaches by timestamp; chunk timestamps come from
# the broker's clock, so step back a little to not miss anything.
_TIMESTAMP_MARGIN = datetime.timedelta(seconds=2)

# Publishers remembered for de-duplication; one per compute reporter
# process lifetime, so this bounds memory, not correctness (a forgotten
# publisher only loses dedup of its retry duplicates).
_DEDUP_CAPACITY = 65536
#: A look at a stream's tail (_look_at_tail): the deliveries asked for, the seconds it may
#: take, and how long after the last delivery it ends.
_LOOK_PREFETCH = 256
_LOOK_WINDOW = 0.5
_LOOK_QUIET = 0.05
#: A publish stamp this far ahead of the consumer's wall clock counts as a clock ahead.
_STAMPED_AHEAD = 1.0
#: Most messages handed to ``on_batch`` in one call.
_BATCH_MAX = 512
#: Reading a backlog takes only what has already arrived (a zero timeout:
#: py-amqp raises socket.timeout when no frame is buffered). Waiting even
#: 1 ms for more added that much to the staleness of every live message
#: (measured: p99 14.1 -> 17.3 ms at 1 000 sources changing once a second).
_BACKLOG_WAIT = 0.0


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    """Everything needed to reach and shape the stream (see transport.opts
    for the meaning of each field)."""

    url: str = "amqp://guest:guest@127.0.0.1:5672//"
    name: str = "shm-hoststate"
    max_age: str | None = "1h"
    max_length_bytes: int | None = 1024 ** 3
    max_segment_size_bytes: int | None = None
    prefetch_count: int = 1000
    publisher_confirms: bool = True
    publish_timeout: float = 30.0
    confirm_timeout: float = 10.0
    connect_timeout: float = 5.0
    heartbeat: int = 30
    reconnect_interval: float = 0.1
    reconnect_interval_max: float = 5.0
    poll_interval: float = 0.25
    #: seconds between looks at the stream's tail (lag); 0: never
    tail_probe_interval: float = 5.0

    def __post_init__(self) -> None:
        if self.prefetch_count < 1:
            raise ValueError("prefetch_count must be > 0 (streams require "
                             "basic.qos with a prefetch)")
        if self.max_age:
            validate_max_age(self.max_age)
        if self.publish_timeout <= 0 or self.confirm_timeout <= 0:
            raise ValueError("publish and confirm timeouts must be > 0")
        if not 0 < self.reconnect_interval <= self.reconnect_interval_max:
            raise ValueError("need 0 < reconnect_interval <= "
                             "reconnect_interval_max")

    def queue_arguments(self) -> dict[str, Any]:
        return stream_arguments(self.max_age, self.max_length_bytes,
                                self.max_segment_size_bytes)

    def backoff(self) -> Backoff:
        return Backoff(initial=self.reconnect_interval,
                       maximum=self.reconnect_interval_max)


def _connection_name(role: str) -> str:
    # Shown by `rabbitmqctl list_connections client_properties` and the
    # management UI: lets an operator tell which process owns a connection.
    return f"shm-{role}:{socket.gethostname()}:{os.getpid()}"


def _discard(conn: Connection | None) -> None:
    """Drop a connection that may be dead without touching the network."""
    if conn is None:
        return
    try:
        conn.collect()
    except Exception:
        LOG.debug("ignored error discarding a connection", exc_info=True)


def _release(conn: Connection | None) -> None:
    """Close a connection politely, falling back to discarding it."""
    if conn is None:
        return
    try:
        conn.release()
    except Exception:
        LOG.debug("ignored error closing a connection", exc_info=True)
        _discard(conn)


def _as_bytes(body: object) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"message body must be bytes, got {type(body).__name__}")


class KombuStreamPublisher:
    """Publishes raw bodies to the stream; thread-safe (serialised)."""

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self.publisher_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._seq = 0
        self.published = 0
        self.published_bytes = 0
        self.retries = 0
        self.failures = 0
        self.unconfirmed = 0
        self.connects = 0
        self._ok = False
        self._since: float | None = None
        self._last_error: str | None = None

    def publish(self, body: bytes) -> None:
        body = _as_bytes(body)
        s = self.settings
        with self._lock:
            if self._closed.is_set():
                raise PublishError("publisher is closed")
            self._seq += 1
            headers = {HEADER_PUBLISHER: self.publisher_id,
                       HEADER_SEQ: self._seq,
                       HEADER_PUBLISHED_AT: time.time_ns()}
            deadline = time.monotonic() + s.publish_timeout
            backoff: Backoff | None = None  # built on first failure only
            attempt = 0
            #: the attempt that was sent and neither confirmed nor nacked (0: none): the
            #: broker may have stored the message, so giving up is not a known loss
            unconfirmed = 0
            while True:
                attempt += 1
                sent = False
                try:
                    producer = self._producer or self._connect()
                    remaining = max(0.1, deadline - time.monotonic())
                    sent = True
                    producer.publish(
                        body, exchange="", routing_key=s.name,
                        content_type=CONTENT_TYPE,
                        content_encoding="binary", headers=headers,
                        delivery_mode=2, retry=False,
                        timeout=min(remaining, s.confirm_timeout),
                        confirm_timeout=min(remaining, s.confirm_timeout))
                except StreamConfigError as exc:
                    self._reset()
                    self._set_state(False, str(exc))
                    raise self._given_up(str(exc), unconfirmed) from exc
                except _RETRYABLE as exc:
                    if sent and not isinstance(exc, amqp.exceptions.MessageNacked):
                        # Sent, then no answer: lost on the way in, or stored and
                        # its confirm lost on the way out -- only a nack says no.
                        unconfirmed = attempt
                    # The connection may be half-dead (e.g. a confirm
                    # timed out mid-frame): never reuse it.
                    self._reset()
                    self._set_state(False, repr(exc))
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._given_up(
                            f"stream {s.name}: message {self._fate(unconfirmed)} after "
                            f"{attempt} attempts in {s.publish_timeout}s: {exc!r}",
                            unconfirmed) from exc
                    self.retries += 1
                    backoff = backoff or s.backoff()
                    delay = min(backoff.next_delay(), remaining)
                    LOG.warning("stream %s: publish attempt %d failed (%r); "
                                "retrying in %.2fs", s.name, attempt, exc,
                                delay)
                    if self._closed.wait(delay):
                        raise self._given_up(
                            f"publisher closed while retrying: message "
                            f"{self._fate(unconfirmed)}", unconfirmed) from exc
                    continue
                self.published += 1
                self.published_bytes += len(body)
                if not self._ok:
                    self._set_state(True, None)
                return

    @staticmethod
    def _fate(unconfirmed: int) -> str:
        return "not stored" if not unconfirmed else \
            f"unconfirmed (attempt {unconfirmed} was sent and its confirm lost: it may be stored)"

    def _given_up(self, text: str, unconfirmed: int) -> PublishError:
        """The error ending a publish, counted as a failure only when the message is known
        not stored: every attempt was refused before it was sent, or nacked."""
        if unconfirmed:
            self.unconfirmed += 1
            return PublishError(text, stored=None)
        self.failures += 1
        return PublishError(text, stored=False)

    def _set_state(self, ok: bool, error: str | None) -> None:
        if ok != self._ok or self._since is None:
            self._since = time.time()
        self._ok = ok
        self._last_error = error

    def stats(self) -> StreamPublisherStats:
        return StreamPublisherStats(
            connected=self._ok and self._producer is not None, published=self.published,
            published_bytes=self.published_bytes, retries=self.retries,
            failures=self.failures, connects=self.connects, state_since=self._since,
            last_error=self._last_error, unconfirmed=self.unconfirmed)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            conn, self._conn, self._producer = self._conn, None, None
        _release(conn)

    def _connect(self) -> Producer:
        s = self.settings
        conn = Connection(
            s.url, heartbeat=0, connect_timeout=s.connect_timeout,
            transport_options={
                "confirm_publish": s.publisher_confirms,
                "client_properties": {
                    "connection_name": _connection_name("stream-publisher")},
            })
        try:
            # Not connect(): kombu would retry once after a fixed 2 s sleep,
            # bypassing our backoff and the publish deadline.
            conn.ensure_connection(max_retries=0)
            channel = conn.channel()
            declare_stream(conn, channel, s.name, s.queue_arguments())
            producer = Producer(channel, routing_key=s.name,
                                auto_declare=False)
        except BaseException:
            _discard(conn)
            raise
        self._conn, self._producer = conn, producer
        self.connects += 1
        return producer

    def _reset(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        _discard(conn)


class KombuStreamConsumer:
    """Reads the stream in a daemon thread and calls ``on_message``.

    ``on_message`` runs in the consumer thread, which also answers broker
    heartbeats: a handler blocking for more than two heartbeat intervals
    gets the connection closed by the broker. Nothing is lost then (the
    consumer resumes after the last delivered offset), but keep handlers
    short or hand work to another thread.
    """

    def __init__(self, settings: StreamSettings,
                 on_retention_gap: OnRetentionGap | None = None) -> None:
        self.settings = settings
        self.on_retention_gap = on_retention_gap
        self._on_message: OnMessage | None = None
        self._on_batch: OnBatch | None = None
        # Messages read but not yet handed to on_batch (consumer thread only), as the
        # handler gets them, and their publish times (seconds; None for an unstamped
        # message): the staleness counts them all, the handler gets the backlog's only.
        self._pending: list[tuple[bytes, int, float | None]] = []
        self._pending_published: list[float | None] = []
        #: the offset of the newest message in the stream when this consumer last
        #: attached: the end of its backlog (-1: none; None: not known, or attached at
        #: "next" or "last")
        self._backlog_end: int | None = None
        self._spec: OffsetSpec = "first"
        self._last: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._attached = threading.Event()
        # Resume state, owned by the consumer thread.
        self._resume_from = 0
        self._gap_check = False
        self._first_attach_at: datetime.datetime | None = None
        self._dedup: collections.OrderedDict[str, int] = (
            collections.OrderedDict())
        self._channel: Any = None
        self._unacked_tag: int | None = None
        self._unacked = 0
        self._ack_every = max(1, settings.prefetch_count // 2)
        self._got_message = False
        self.delivered = 0
        self.errors = 0
        self.duplicates = 0
        self.stamped_ahead = 0
        self.gaps = 0
        self.reconnects = 0
        self.staleness = Histogram()
        self._connected = False
        self._since: float | None = None
        #: publish time (wall clock, seconds) of the newest message handed over
        self._last_published: float | None = None
        self._probe: _TailProbe | None = None

    @property
    def last_offset(self) -> int | None:
        return self._last

    def stats(self) -> StreamConsumerStats:
        """Figures for the metrics endpoint (any thread; a consistent-enough read)."""
        last = self._last
        probe = self._probe
        tail, tail_ns, checked = (probe.tail if probe is not None else (None, None, None))
        if checked is not None and probe is not None and \
                time.time() - checked > 3 * self.settings.tail_probe_interval + 5:
            tail = tail_ns = checked = None  # the probe is failing: the lag is unknown
        applied_at = self._last_published
        tail_at = tail_ns / 1e9 if tail_ns is not None else None
        if last is not None and (tail is None or last >= tail) and checked is not None:
            tail, tail_at = last, applied_at  # we are at (or past) what the probe saw
        return StreamConsumerStats(
            connected=self._connected, reconnects=self.reconnects,
            delivered=self.delivered, duplicates=self.duplicates, errors=self.errors,
            retention_gaps=self.gaps, applied_offset=last, tail_offset=tail,
            tail_checked_at=checked, applied_published_at=applied_at, tail_published_at=tail_at,
            state_since=self._since, staleness=self.staleness,
            stamped_ahead=self.stamped_ahead)

    def _set_connected(self, connected: bool) -> None:
        if connected != self._connected or self._since is None:
            self._since = time.time()
        self._connected = connected

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_attached(self, timeout: float) -> bool:
        """Block until the consumer is attached to the stream (tests and
        start-up ordering: a "next" consumer sees what is published after
        this returns True)."""
        return self._attached.wait(timeout)

    def start(self, on_message: OnMessage,
              offset: OffsetSpec = "first", *, on_batch: OnBatch | None = None) -> None:
        offset = validate_offset(offset)
        if self.running:
            raise RuntimeError("consumer already started")
        self._on_message = on_message
        self._on_batch = on_batch
        self._pending = []
        self._pending_published = []
        self._backlog_end = None
        self._spec = offset
        self._stop.clear()
        self._attached.clear()
        self._first_attach_at = None
        if isinstance(offset, int):
            self._resume_from = offset
            self._gap_check = True
        else:
            self._resume_from = 0
            self._gap_check = False
        self._thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"shm-stream-consumer-{self.settings.name}")
        self._thread.start()
        if self.settings.tail_probe_interval > 0 and self._probe is None:
            self._probe = _TailProbe(self.settings)
            self._probe.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.stop()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            LOG.error("stream %s: consumer thread did not stop within %ss",
                      self.settings.name, timeout)
        else:
            self._thread = None

    # -- consumer thread ---------------------------------------------------

    def _run(self) -> None:
        s = self.settings
        backoff = s.backoff()
        while not self._stop.is_set():
            conn: Connection | None = None
            try:
                conn = self._attach()
                self._drain(conn, backoff)
            except StreamConfigError:
                LOG.exception("stream %s: unusable; retrying slowly", s.name)
                backoff = Backoff(s.reconnect_interval_max,
                                  s.reconnect_interval_max)
            except Exception as exc:
                if self._stop.is_set():
                    break
                level = (logging.WARNING if isinstance(exc, _RETRYABLE)
                         else logging.ERROR)
                LOG.log(level, "stream %s: consumer connection lost (%r); "
                        "will resume after offset %s", s.name, exc,
                        self._last, exc_info=level == logging.ERROR)
            finally:
                self._attached.clear()
                self._set_connected(False)
                self._channel = None
                if self._stop.is_set():
                    _release(conn)
                else:
                    _discard(conn)
            if self._stop.is_set():
                break
            self.reconnects += 1
            self._stop.wait(backoff.next_delay())

    def _attach_argument(self) -> Any:
        if self._last is not None:
            # Re-read the last delivered message as proof of no gap.
            return self._last
        if isinstance(self._spec, int):
            return max(0, self._spec - 1)
        if self._spec == "first" or self._first_attach_at is None:
            return self._spec
        # "next"/"last" and the connection died before the first message:
        # re-attaching with the same word would skip what was published
        # meanwhile. A timestamp offset replays from (about) then.
        return self._first_attach_at - _TIMESTAMP_MARGIN

    def _attach(self) -> Connection:
        s = self.settings
        conn = Connection(
            s.url, heartbeat=s.heartbeat, connect_timeout=s.connect_timeout,
            transport_options={"client_properties": {
                "connection_name": _connection_name("stream-consumer")}})
        try:
            # Not connect(): kombu would retry once after a fixed 2 s sleep,
            # bypassing our backoff and the publish deadline.
            conn.ensure_connection(max_retries=0)
            channel = conn.channel()
            declare_stream(conn, channel, s.name, s.queue_arguments())
            attach_at = self._attach_argument()
            if self._on_batch is not None and (attach_at == "first" or isinstance(attach_at, int)):
                # what is in the stream now is read as a backlog: a (re)start's catch-up,
                # or what was published while the connection was down
                self._backlog_end = self._look_at_backlog(conn)
            queue = Queue(s.name, no_declare=True,
                          consumer_arguments={HEADER_OFFSET: attach_at})
            if self._first_attach_at is None:
                self._first_attach_at = datetime.datetime.now(
                    datetime.UTC)
            consumer = Consumer(channel, queues=[queue], no_ack=False,
                                auto_declare=False,
                                on_message=self._on_raw_message,
                                prefetch_count=s.prefetch_count)
            consumer.consume()
        except BaseException:
            _discard(conn)
            raise
        self._channel = channel
        # Every (re)attach by offset must prove again that the offset
        # it resumes from is still retained.
        self._gap_check = isinstance(attach_at, int)
        self._unacked = 0
        self._unacked_tag = None
        self._got_message = False
        LOG.info("stream %s: consumer attached at %r (resume from %d)",
                 s.name, attach_at, self._resume_from)
        self._set_connected(True)
        self._attached.set()
        return conn

    def _look_at_backlog(self, conn: Connection) -> int | None:
        """The offset of the newest message in the stream before an attach: the end of
        this consumer's backlog (-1: none; None: not known)."""
        try:
            tail, _ = _look_at_tail(conn, self.settings.name, self._stop)
        except Exception as exc:  # noqa: BLE001 -- without it the backlog is read as live
            LOG.warning("stream %s: could not look at the tail before attaching (%r): its "
                        "backlog counts as heard when read", self.settings.name, exc)
            return None
        return -1 if tail is None else tail

    def _drain(self, conn: Connection, backoff: Backoff) -> None:
        s = self.settings
        next_heartbeat = time.monotonic() + 1.0
        while not self._stop.is_set():
            try:
                conn.drain_events(timeout=s.poll_interval)
                if self._pending:
                    self._read_backlog(conn)
            except TimeoutError:
                self._flush_ack()
            finally:
                # Also when the connection dies mid-backlog: what was read
                # intact is delivered, so the resume point stays right.
                self._flush_batch()
            now = time.monotonic()
            if now >= next_heartbeat:
                # Also under load: drain_events then never times out.
                conn.heartbeat_check()
                next_heartbeat = now + 1.0
                if self._got_message:
                    backoff.reset()
        self._flush_ack()

    def _read_backlog(self, conn: Connection) -> None:
        """Read on while more has already arrived, up to a full batch."""
        while 0 < len(self._pending) < _BATCH_MAX and not self._stop.is_set():
            try:
                conn.drain_events(timeout=_BACKLOG_WAIT)
            except TimeoutError:
                return

    def _flush_batch(self) -> None:
        pending, published = self._pending, self._pending_published
        self._pending, self._pending_published = [], []
        if not pending or self._stop.is_set():
            return
        assert self._on_batch is not None
        try:
            self._on_batch(pending)
        except Exception:
            self.errors += 1
            LOG.exception("stream %s: on_batch failed at offsets %d..%d; "
                          "messages skipped", self.settings.name,
                          pending[0][1], pending[-1][1])
        self._applied(published)
        self._last = pending[-1][1]
        self.delivered += len(pending)

    def _applied(self, published: list[float | None]) -> None:
        """Staleness of messages just handed over (publish time to now, in seconds), and
        those stamped ahead of now (a publisher's clock ahead of ours)."""
        now = time.time()
        ages = [now - at for at in published if at is not None]
        if ages:
            self.staleness.observe_many(max(0.0, age) for age in ages)
            self.stamped_ahead += sum(age < -_STAMPED_AHEAD for age in ages)
        if published and published[-1] is not None:
            self._last_published = published[-1]

    def _flush_ack(self) -> None:
        if self._unacked_tag is not None and self._channel is not None:
            self._channel.basic_ack(self._unacked_tag, multiple=True)
            self._unacked_tag = None
            self._unacked = 0

    def _on_raw_message(self, message: Any) -> None:
        # Acks on a stream only return flow-control credit (position is
        # the offset), so ack in batches to save a frame per message.
        self._unacked_tag = message.delivery_tag
        self._unacked += 1
        if self._unacked >= self._ack_every:
            self._flush_ack()
        if self._stop.is_set():
            return
        headers = message.headers or {}
        offset = headers.get(HEADER_OFFSET)
        if not isinstance(offset, int):
            self.errors += 1
            LOG.error("stream %s: message without %s header skipped",
                      self.settings.name, HEADER_OFFSET)
            return
        self._got_message = True
        if offset < self._resume_from:
            # Chunk start before the wanted offset, or the re-read last
            # message: proof that nothing between was lost.
            self._gap_check = False
            return
        if self._gap_check:
            self._gap_check = False
            if offset > self._resume_from:
                self._report_gap(self._resume_from, offset)
        self._resume_from = offset + 1
        if self._is_duplicate(headers):
            self.duplicates += 1
            return
        stamp = headers.get(HEADER_PUBLISHED_AT)
        published = stamp / 1e9 if isinstance(stamp, int) else None
        if self._on_batch is not None:
            backlog = self._backlog_end is not None and offset <= self._backlog_end
            self._pending.append((message.body, offset, published if backlog else None))
            self._pending_published.append(published)
            if len(self._pending) >= _BATCH_MAX:
                self._flush_batch()
            return
        assert self._on_message is not None
        try:
            self._on_message(message.body, offset)
        except Exception:
            self.errors += 1
            LOG.exception("stream %s: on_message failed at offset %d; "
                          "message skipped", self.settings.name, offset)
        self._applied([published])
        self._last = offset
        self.delivered += 1

    def _is_duplicate(self, headers: dict[str, Any]) -> bool:
        publisher = headers.get(HEADER_PUBLISHER)
        seq = headers.get(HEADER_SEQ)
        if not isinstance(publisher, str) or not isinstance(seq, int):
            return False
        dedup = self._dedup
        seen = dedup.get(publisher)
        if seen is not None:
            if seq <= seen:
                return True
            dedup.move_to_end(publisher)
        elif len(dedup) >= _DEDUP_CAPACITY:
            dedup.popitem(last=False)
        dedup[publisher] = seq
        return False

    def _report_gap(self, requested: int, first: int) -> None:
        self.gaps += 1
        LOG.warning("stream %s: resume offset %d no longer retained; first "
                    "delivered offset is %d", self.settings.name, requested,
                    first)
        hook = self.on_retention_gap
        if hook is None:
            return
        try:
            hook(requested, first)
        except Exception:
            self.errors += 1
            LOG.exception("stream %s: on_retention_gap hook failed",
                          self.settings.name)


class _TailProbe:
    """Looks at the stream's tail every ``tail_probe_interval`` seconds from a thread of its own.

    Each look opens a channel on the probe's connection, consumes at ``"last"``
    (the broker sends the last chunk, then whatever arrives), takes the highest
    offset seen within a fraction of a second, and closes the channel.  Any
    error drops the connection; the next look reconnects.  ``tail`` is
    ``(offset, publish stamp in ns, checked at)``; all None until the first look.
    """


    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self.tail: tuple[int | None, int | None, float | None] = (None, None, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"shm-stream-tail-{settings.name}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_LOOK_WINDOW + self.settings.connect_timeout + 1)

    def _run(self) -> None:
        s = self.settings
        conn: Connection | None = None
        delay = 0.0
        while not self._stop.wait(delay):
            delay = s.tail_probe_interval
            try:
                if conn is None:
                    conn = Connection(s.url, heartbeat=0, connect_timeout=s.connect_timeout,
                                      transport_options={"client_properties": {
                                          "connection_name": _connection_name("stream-tail")}})
                    conn.ensure_connection(max_retries=0)
                self._look(conn)
            except Exception as exc:  # noqa: BLE001 -- a probe never takes anything down
                LOG.debug("stream %s: tail probe failed: %r", s.name, exc)
                _discard(conn)
                conn = None
        _release(conn)

    def _look(self, conn: Connection) -> None:
        offset, stamp = _look_at_tail(conn, self.settings.name, self._stop)
        self.tail = (offset, stamp, time.time())


def _look_at_tail(conn: Connection, name: str, stop: threading.Event,
                  ) -> tuple[int | None, int | None]:
    """The offset and publish stamp (ns) of the newest message in stream ``name`` (None,
    None: the stream is empty, or nothing came within ``_LOOK_WINDOW``), read on a channel
    of its own on ``conn``: consumes at ``"last"`` (the broker sends the last chunk, then
    whatever arrives) and takes the highest offset seen until deliveries pause."""
    seen: list[tuple[int, int | None]] = []

    def on_message(message: Any) -> None:
        headers = message.headers or {}
        offset, stamp = headers.get(HEADER_OFFSET), headers.get(HEADER_PUBLISHED_AT)
        if isinstance(offset, int):
            seen.append((offset, stamp if isinstance(stamp, int) else None))

    channel = conn.channel()
    try:
        queue = Queue(name, no_declare=True, consumer_arguments={HEADER_OFFSET: "last"})
        consumer = Consumer(channel, queues=[queue], no_ack=False, auto_declare=False,
                            on_message=on_message, prefetch_count=_LOOK_PREFETCH)
        consumer.consume()
        deadline = time.monotonic() + _LOOK_WINDOW
        while time.monotonic() < deadline and not stop.is_set():
            count = len(seen)
            try:
                conn.drain_events(timeout=_LOOK_QUIET if seen else 0.1)
            except TimeoutError:
                if seen and len(seen) == count:
                    break
        consumer.cancel()
        # read what the broker sent before it saw the cancel, so that closing the channel
        # does not make py-amqp warn about deliveries during the close
        try:
            while True:
                conn.drain_events(timeout=0.01)
        except TimeoutError:
            pass
    finally:
        channel.close()
    return max(seen) if seen else (None, None)


class KombuStreamDataPlane:
    """``DataPlane`` factory for one RabbitMQ stream.

    Publishers and consumers share nothing (each owns one connection);
    the factory only remembers them so ``close()`` can stop leftovers.
    """

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()

    def stream_publisher(self) -> KombuStreamPublisher:
        publisher = KombuStreamPublisher(self.settings)
        self._made.add(publisher)
        return publisher

    def stream_consumer(self, on_retention_gap: OnRetentionGap | None = None,
                        ) -> KombuStreamConsumer:
        consumer = KombuStreamConsumer(self.settings,
                                       on_retention_gap=on_retention_gap)
        self._made.add(consumer)
        return consumer

    def peer_plane(self) -> KombuPeerPlane:
        """The schedulers' peer topic on this broker, with kombu alone (see
        :mod:`transport.kombu_peers`): the claims they announce to each other are advice,
        and oslo.messaging's listener cost each of them far more than its handling."""
        plane = KombuPeerPlane(self.settings.url)
        self._made.add(plane)
        return plane

    def sibling_stream(self, suffix: str, *, max_age: str | None,
                       max_length_bytes: int | None,
                       max_segment_size_bytes: int | None) -> KombuStreamDataPlane:
        """A data plane on the stream named like this one plus ``suffix``, with retention of
        its own (the schedulers' checkpoints: a few large messages, so a small segment size:
        RabbitMQ drops whole segments only, 500 MB by default).  No tail probe: nothing
        measures a lag there."""
        return KombuStreamDataPlane(dataclasses.replace(
            self.settings, name=self.settings.name + suffix, max_age=max_age,
            max_length_bytes=max_length_bytes, max_segment_size_bytes=max_segment_size_bytes,
            tail_probe_interval=0.0))

    def close(self) -> None:
        for obj in list(self._made):
            if isinstance(obj, KombuStreamConsumer):
                obj.stop()
            else:
                obj.close()
