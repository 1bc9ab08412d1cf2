"""Idempotent declaration of the RabbitMQ stream queue.

Role: turn retention settings into stream queue arguments and declare the
stream on a kombu connection so that publishers and consumers can attach
in any order, each declaring it itself.

Life cycle: ``declare_stream`` is called by the stream publisher and the
stream consumer every time they (re)connect, before the first publish or
consume on that connection; it holds no state. ``delete_stream`` is for
tests and operators.

Why every party declares, and why callers must retry the whole connect
step rather than just this call: measured on RabbitMQ 3.10 here, when
several clients declare a *new* stream at the same moment, the declares
all succeed but the stream leader is not running yet for the losers of the
race, and their next operation fails: ``basic.consume`` with ``(406)
PRECONDITION_FAILED ... does not have a replica on the local node`` or the
whole connection with ``(541) INTERNAL_ERROR`` (also on ``basic.publish``,
whose message is then not stored). Both are transient, so the publisher
and consumer treat them like a lost connection: reconnect with backoff,
declare again, retry. A resumed consumer never falls back to ``"last"``
(a consumer that resumes at ``"last"`` skips every message published
while it was away; docs/design.md §7.1).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import amqp.exceptions
from kombu import Connection

from transport.base import TransportError

__all__ = [
    "StreamConfigError",
    "declare_stream",
    "delete_stream",
    "stream_arguments",
    "validate_max_age",
]

LOG = logging.getLogger(__name__)

_MAX_AGE_RE = re.compile(r"^[1-9][0-9]*[YMDhms]$")


class StreamConfigError(TransportError):
    """The stream cannot be used as configured (retrying will not help)."""


def validate_max_age(value: str) -> str:
    """Check an ``x-max-age`` value such as ``"1h"`` or ``"7D"``.

    RabbitMQ rejects anything else at declare time with a channel error,
    which is much harder to read than a config error at start-up.
    """
    if not _MAX_AGE_RE.match(value):
        raise ValueError(
            f"stream max age {value!r} must be a positive integer followed by "
            "one unit of Y, M, D, h, m or s (e.g. '1h', '7D')")
    return value


def stream_arguments(max_age: str | None = None,
                     max_length_bytes: int | None = None,
                     max_segment_size_bytes: int | None = None,
                     ) -> dict[str, Any]:
    """Queue arguments for a stream with the given retention.

    Retention is applied per segment file: nothing is dropped until a
    segment is full and a new one starts, so the effective retained size
    is up to one segment more than *max_length_bytes*.
    """
    args: dict[str, Any] = {"x-queue-type": "stream"}
    if max_age:
        args["x-max-age"] = validate_max_age(max_age)
    if max_length_bytes:
        args["x-max-length-bytes"] = int(max_length_bytes)
    if max_segment_size_bytes:
        args["x-stream-max-segment-size-bytes"] = int(max_segment_size_bytes)
    return args


def declare_stream(connection: Connection, channel: Any, name: str,
                   arguments: dict[str, Any]) -> None:
    """Declare stream *name* on *channel* (durable, not auto-deleted).

    If the stream already exists with *different retention* arguments the
    broker answers 406 and closes the channel. The existing stream is then
    used as it is (checked with a passive declare on a new channel) and a
    warning is logged: retention of a live stream is changed with a
    RabbitMQ policy, not by redeclaring, and refusing to start a scheduler
    over it would turn a tuning change into an outage. A name clash with a
    queue of another type is a real misconfiguration and raises
    ``StreamConfigError``.
    """
    try:
        channel.queue_declare(queue=name, durable=True, exclusive=False,
                              auto_delete=False, arguments=arguments)
        return
    except amqp.exceptions.PreconditionFailed as exc:
        text = str(exc)
        if "inequivalent arg" not in text:
            raise
        if "x-queue-type" in text:
            raise StreamConfigError(
                f"queue {name!r} exists but is not a stream: {text}") from exc
        LOG.warning("stream %s exists with other retention arguments than "
                    "configured (%s); using it as it is. Change retention "
                    "with a RabbitMQ policy.", name, text)
    passive = connection.channel()
    try:
        passive.queue_declare(queue=name, passive=True)
    finally:
        _close_quietly(passive)


def delete_stream(url: str, name: str, connect_timeout: float = 5.0) -> None:
    """Delete stream *name* and its data (tests, decommissioning)."""
    with Connection(url, connect_timeout=connect_timeout) as conn:
        channel = conn.channel()
        try:
            channel.queue_delete(queue=name)
        finally:
            _close_quietly(channel)


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # closing an already broken channel may fail
        LOG.debug("ignored error closing channel", exc_info=True)
