"""The schedulers' peer topic over RabbitMQ with kombu alone: casts that are advice.

Role: a ``ControlPlane`` for one kind of traffic, the claims a scheduler announces to its
peers and the rejections it forwards (design §5.2): at most once, never waited for, lost
at no cost but a rejection.  Over oslo.messaging each cast cost the receiver far more than
its handler: oslo's RPC listener polls its connection after every message with a timeout
that starts at 1 ms and doubles, and its executor hands each message to a thread of its
own; a scheduler pays that once per peer's claim.  Here a server is one thread blocked in
``drain_events`` until a message arrives, and a cast is one publish without confirms.

Wire: one *direct* exchange per topic (``<topic>``, transient, deleted with its last
queue); each server's queue ``<topic>.<server>.kombu`` (exclusive, deleted with its
connection) is bound with its own name and with the broadcast key, so a cast is a publish
with the server's name as routing key and a fanout one with the broadcast key.  Bodies
travel as they are (``application/octet-stream``), signed by the codec like every cast.

Life cycle: a server receives between ``start()`` and ``stop()``; on a lost connection
it reconnects with a growing pause (what was sent meanwhile is lost, as advice may be).  A
client connects on its first cast and again after a failed one; a failed cast raises
``CastError`` (the caller logs and goes on).  Clients are safe to share between threads.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kombu import Connection, Exchange, Producer, Queue, binding

from transport.base import CastError, ControlHandler

LOG = logging.getLogger(__name__)

#: the routing key every server of a topic is bound with (a name no server has: it
#: contains a character oslo.messaging server names and ours never use here)
BROADCAST = "*all*"
#: seconds a receiving thread blocks before it looks at its stop flag
_DRAIN_TIMEOUT = 1.0
_RECONNECT_PAUSES = (0.1, 0.5, 1.0, 2.0)


def _exchange(topic: str) -> Exchange:
    return Exchange(topic, type="direct", durable=False, auto_delete=True)


class KombuPeerServer:
    """Receives the casts for ``(topic, server)`` and the topic's fanout ones."""

    def __init__(self, url: str, topic: str, server: str, handler: ControlHandler) -> None:
        self.topic = topic
        self.server = server
        self._url = url
        self._handler = handler
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.delivered = 0
        self.errors = 0

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("peer server already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"peers-{self.topic}.{self.server}")
        self._thread.start()
        # a cast sent after start() returns reaches us (the queue is bound by then)
        self._ready.wait(10)

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=2 * _DRAIN_TIMEOUT + 5)

    def _queue(self) -> Queue:
        exchange = _exchange(self.topic)
        return Queue(f"{self.topic}.{self.server}.kombu", exclusive=True, auto_delete=True,
                     durable=False, bindings=[binding(exchange, routing_key=self.server),
                                              binding(exchange, routing_key=BROADCAST)])

    def _on_message(self, message: Any) -> None:
        self.delivered += 1
        try:
            self._handler(message.body)
        except Exception:  # a handler's bug drops this message, not the server
            self.errors += 1
            LOG.exception("peer topic %s.%s: handler failed; cast dropped", self.topic,
                          self.server)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            conn = Connection(self._url, connect_timeout=5)
            try:
                conn.connect()
                channel = conn.channel()
                queue = self._queue()
                with conn.Consumer(queue, channel=channel, no_ack=True,
                                   on_message=self._on_message):
                    self._ready.set()
                    failures = 0
                    while not self._stop.is_set():
                        try:
                            conn.drain_events(timeout=_DRAIN_TIMEOUT)
                        except TimeoutError:
                            pass
            except Exception as exc:  # reconnect: peers' casts are lost meanwhile (advice)
                if self._stop.is_set():
                    break
                pause = _RECONNECT_PAUSES[min(failures, len(_RECONNECT_PAUSES) - 1)]
                failures += 1
                LOG.warning("peer topic %s.%s: %s; reconnecting in %.1f s", self.topic,
                            self.server, exc, pause)
                self._stop.wait(pause)
            finally:
                try:
                    conn.release()
                except Exception:
                    LOG.debug("ignored error closing a peer connection", exc_info=True)


class KombuPeerClient:
    """Casts to ``(topic, server)`` and fans out to a topic's servers; one connection,
    one publish at a time."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._declared: set[str] = set()
        self._closed = False
        self.casts = 0
        self.cast_bytes = 0

    def cast(self, topic: str, server: str, body: bytes) -> None:
        self._publish(topic, server, body)

    def fanout(self, topic: str, body: bytes) -> None:
        self._publish(topic, BROADCAST, body)

    def _publish(self, topic: str, key: str, body: bytes) -> None:
        with self._lock:
            if self._closed:
                raise CastError("peer client is closed")
            try:
                producer = self._connected()
                exchange = _exchange(topic)
                if topic not in self._declared:
                    exchange(producer.channel).declare()
                    self._declared.add(topic)
                producer.publish(bytes(body), exchange=exchange, routing_key=key,
                                 content_type="application/octet-stream",
                                 content_encoding="binary", delivery_mode=1)
            except Exception as exc:
                self._reset()
                raise CastError(f"peer cast to {topic} ({key}) failed: {exc}") from exc
            self.casts += 1
            self.cast_bytes += len(body)

    def _connected(self) -> Producer:
        if self._producer is None:
            conn = Connection(self._url, connect_timeout=5)
            conn.connect()
            self._conn = conn
            self._producer = Producer(conn.channel())
        return self._producer

    def _reset(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        self._declared.clear()
        if conn is not None:
            try:
                conn.collect()
            except Exception:
                LOG.debug("ignored error dropping a peer connection", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception:
                LOG.debug("ignored error closing a peer connection", exc_info=True)


class KombuPeerPlane:
    """``ControlPlane`` of the peer topic over one RabbitMQ broker (kombu URL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._servers: list[KombuPeerServer] = []
        self._clients: list[KombuPeerClient] = []

    def control_server(self, topic: str, server: str,
                       handler: ControlHandler) -> KombuPeerServer:
        srv = KombuPeerServer(self.url, topic, server, handler)
        self._servers.append(srv)
        return srv

    def control_client(self) -> KombuPeerClient:
        client = KombuPeerClient(self.url)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for srv in self._servers:
            srv.stop()
        for client in self._clients:
            client.close()


__all__ = ["BROADCAST", "KombuPeerClient", "KombuPeerPlane", "KombuPeerServer"]
