"""The contracts both ends of the host-state bus program against.

Role: define, independently of any broker, what a *data plane* (one
replayable, ordered stream of opaque message bodies that every scheduler
reads at its own offset) and a *control plane* (fire-and-forget casts to
one named ``(topic, server)`` inbox) must do, plus the errors they raise.
Backends (``inprocess``, ``kombu_stream``, ``oslo_rpc``) implement these;
``compute_reporter`` and ``shared_host_manager`` only ever see these types.

Life cycle managed here (as a contract, not as code):

* a ``StreamPublisher`` is usable from construction until ``close()``;
* a ``StreamConsumer`` is idle until ``start()``, delivers from one thread
  in stream order until ``stop()``, and may be started again afterwards
  (resuming where the caller asks, typically ``last_offset + 1``);
* a ``ControlServer`` receives casts between ``start()`` and ``stop()``;
* a ``ControlClient`` is usable until ``close()``;
* a ``DataPlane`` / ``ControlPlane`` factory owns whatever is shared by the
  objects it built (connections, the in-process bus) and releases it in
  ``close()``, after the objects themselves were stopped/closed.

Bodies are ``bytes`` and are never inspected: the codec lives in
``protocol`` and this package must not depend on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transport.metrics import Histogram

__all__ = [
    "OFFSET_SPECS",
    "CastError",
    "ControlClient",
    "ControlHandler",
    "ControlPlane",
    "ControlServer",
    "DataPlane",
    "OffsetSpec",
    "OnBatch",
    "OnMessage",
    "OnRetentionGap",
    "PublishError",
    "StreamConsumer",
    "StreamConsumerStats",
    "StreamPublisher",
    "StreamPublisherStats",
    "TransportError",
    "validate_offset",
]

#: Called with ``(body, stream_offset)`` for every message, in stream order.
OnMessage = Callable[[bytes, int], None]
#: Called with ``[(body, stream_offset, published_at), ...]``: messages read together, in
#: stream order; ``published_at``, for a message of the consumer's backlog (in the stream
#: before the consumer started, or resumed after a lost connection), is the publisher's
#: wall-clock time of the publish, in seconds; None for a message published since, or where
#: the transport cannot tell.
OnBatch = Callable[[list[tuple[bytes, int, float | None]]], None]
#: Called with ``(requested_offset, first_offset_actually_delivered)``.
OnRetentionGap = Callable[[int, int], None]
#: Called with the body of every cast that reaches a control server.
ControlHandler = Callable[[bytes], None]

OffsetSpec = int | Literal["first", "last", "next"]
OFFSET_SPECS: frozenset[str] = frozenset({"first", "last", "next"})


class TransportError(Exception):
    """Base class of every error this package raises to its callers."""


class PublishError(TransportError):
    """A stream message could not be stored within the allowed time.

    The caller still owns the body: nothing was acknowledged by the
    backend, so it may retry later or fall back (e.g. count and rely on
    the next heartbeat/snapshot).

    ``stored`` is what is known of the message: ``False``, it is known not
    stored (every attempt was refused before the message was sent, or the
    broker nacked it); ``None``, unknown: an attempt reached the broker and
    the connection was lost before its confirm, so the message may be on the
    stream (a reporter counts it apart from the failures).
    """

    def __init__(self, message: str, *, stored: bool | None = False) -> None:
        super().__init__(message)
        self.stored = stored


class CastError(TransportError):
    """A control cast could not be handed to the backend."""


def validate_offset(offset: object) -> OffsetSpec:
    """Return *offset* if it is a valid start position, else raise.

    ``bool`` is rejected although it is an ``int``: ``start(True)`` is far
    more likely a bug than "resume at offset 1".
    """
    if isinstance(offset, bool):
        raise ValueError(f"invalid stream offset {offset!r}")
    if isinstance(offset, int):
        if offset < 0:
            raise ValueError(f"stream offset must be >= 0, got {offset}")
        return offset
    if offset == "first" or offset == "last" or offset == "next":  # OFFSET_SPECS, as literals
        return offset
    raise ValueError(
        f"stream offset must be an int >= 0 or one of {sorted(OFFSET_SPECS)}, "
        f"got {offset!r}")


@dataclasses.dataclass(frozen=True)
class StreamConsumerStats:
    """What a stream consumer reports about itself (``consumer.stats()``, read on scrape).

    Offsets are the stream's (RabbitMQ counts a few non-message records in
    them, so offset differences are about, not exactly, messages); times are
    wall-clock seconds; None where the backend cannot know.
    """

    connected: bool
    #: connections lost (and retried) since start
    reconnects: int
    delivered: int
    duplicates: int
    errors: int
    retention_gaps: int
    #: offset of the last message handed to the handler (applied)
    applied_offset: int | None
    #: offset of the newest message in the stream when last looked at
    tail_offset: int | None
    #: when the tail was last looked at
    tail_checked_at: float | None
    #: publish time of the newest applied message, and of the tail's
    applied_published_at: float | None
    tail_published_at: float | None
    #: since when the consumer is (dis)connected
    state_since: float | None
    #: seconds from publish to applied, per message (None: no publish stamps)
    staleness: Histogram | None = None
    #: messages whose publish stamp was over a second ahead of the wall clock here when
    #: applied: a publisher's clock ahead of this one
    stamped_ahead: int = 0

    @property
    def lag_offsets(self) -> int | None:
        if self.tail_offset is None:
            # looked, and the stream was empty: nothing to be behind of
            return 0 if self.tail_checked_at is not None and self.applied_offset is None else None
        return max(0, self.tail_offset - (self.applied_offset if self.applied_offset is not None else -1))

    @property
    def lag_seconds(self) -> float | None:
        """Publish-time distance between the tail and the newest applied message (0: caught up)."""
        lag = self.lag_offsets
        if lag is None:
            return None
        if lag == 0:
            return 0.0
        if self.tail_published_at is None or self.applied_published_at is None:
            return None
        return max(0.0, self.tail_published_at - self.applied_published_at)


@dataclasses.dataclass(frozen=True)
class StreamPublisherStats:
    """What a stream publisher reports about itself (``publisher.stats()``)."""

    #: the last publish was stored (False while retrying or after a failure)
    connected: bool
    published: int
    published_bytes: int
    #: attempts retried after a connection or channel error
    retries: int
    #: publishes given up with the message known not stored (PublishError, stored False)
    failures: int
    connects: int
    state_since: float | None
    last_error: str | None = None
    #: publishes given up without knowing whether the broker stored the message (an
    #: attempt was sent, its confirm lost with the connection: PublishError, stored None)
    unconfirmed: int = 0


@runtime_checkable
class StreamPublisher(Protocol):
    """Appends opaque bodies to the shared stream."""

    def publish(self, body: bytes) -> None:
        """Store *body* durably (per backend) or raise ``PublishError``.

        Returning means the backend accepted the message; it will be read
        by every consumer whose offset has not passed it.
        """
        ...

    def close(self) -> None:
        """Release the publisher's resources; idempotent."""
        ...


@runtime_checkable
class StreamConsumer(Protocol):
    """Reads the shared stream from a chosen offset, in order.

    ``on_message`` is called from a single thread, strictly in stream
    order. An exception it raises is logged and counted and never stops
    the consumer: the message counts as delivered.

    ``on_retention_gap`` (settable attribute) is called with
    ``(requested_offset, first_offset_delivered)`` when a consumer asked to
    resume at an integer offset finds that retention already dropped it,
    so the caller can request resyncs instead of trusting its cache.
    """

    on_retention_gap: OnRetentionGap | None

    def start(self, on_message: OnMessage,
              offset: OffsetSpec = "first", *, on_batch: OnBatch | None = None) -> None:
        """Begin delivery at *offset*.

        An ``int`` resumes at that stream offset (pass ``last_offset + 1``
        to continue after the last message handled); ``"first"`` is the
        oldest retained message, ``"last"`` the most recent one(s) and
        ``"next"`` only messages published from now on.

        ``on_batch``, if given, receives the messages a consumer has read
        together (a backlog) in one call, as ``(body, offset, published_at)``,
        instead of one ``on_message`` call each. Offsets increase but need
        not be contiguous (RabbitMQ puts chunk records into the offset
        space). Same thread and order rules; an exception it raises counts
        every message of the call as delivered.
        """
        ...

    def stop(self) -> None:
        """Stop delivery; returns once ``on_message`` is no longer running
        (unless called from inside ``on_message``). Idempotent."""
        ...

    @property
    def last_offset(self) -> int | None:
        """Offset of the last message handed to ``on_message``."""
        ...


@runtime_checkable
class ControlServer(Protocol):
    """Receives casts addressed to one ``(topic, server)`` pair."""

    topic: str
    server: str

    def start(self) -> None:
        """Start handing received bodies to the handler."""
        ...

    def stop(self) -> None:
        """Stop receiving and wait for the handler to finish. Idempotent."""
        ...


@runtime_checkable
class ControlClient(Protocol):
    """Sends point-to-point casts (fire and forget, at most once)."""

    def cast(self, topic: str, server: str, body: bytes) -> None:
        """Send *body* to the one server listening as ``(topic, server)``.

        No reply and no delivery guarantee: a cast to a target nobody ever
        listened on is dropped. Raises ``CastError`` only if the backend
        refused the message.
        """
        ...

    def fanout(self, topic: str, body: bytes) -> None:
        """Send *body* once to every server listening on *topic*, the sender's own
        included (one publish, whatever their number); at most once, like a cast."""
        ...

    def close(self) -> None:
        """Release the client's resources; idempotent."""
        ...


@runtime_checkable
class DataPlane(Protocol):
    """Factory of stream publishers/consumers for one backend."""

    def stream_publisher(self) -> StreamPublisher:
        ...

    def stream_consumer(
            self, on_retention_gap: OnRetentionGap | None = None,
    ) -> StreamConsumer:
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class ControlPlane(Protocol):
    """Factory of control servers/clients for one backend."""

    def control_server(self, topic: str, server: str,
                       handler: ControlHandler) -> ControlServer:
        ...

    def control_client(self) -> ControlClient:
        ...

    def close(self) -> None:
        ...
