"""Broker-free tests of the kombu stream classes: settings, bounded
publish retries, clean stop while unreachable, and the consumer's
offset/gap/duplicate bookkeeping driven with fake messages."""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest

from transport.base import PublishError
from transport.kombu_stream import (
    HEADER_OFFSET,
    HEADER_PUBLISHER,
    HEADER_SEQ,
    KombuStreamConsumer,
    KombuStreamDataPlane,
    KombuStreamPublisher,
    StreamSettings,
)
from transport.stream_declare import stream_arguments


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}//"


@dataclasses.dataclass
class FakeMessage:
    body: bytes
    headers: dict
    delivery_tag: int


class FakeChannel:
    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acks.append((tag, multiple))


def _consumer(offset, settings: StreamSettings | None = None):
    """A consumer whose thread is never started; messages are injected."""
    gaps, got = [], []
    c = KombuStreamConsumer(settings or StreamSettings(prefetch_count=4),
                            on_retention_gap=lambda r, f: gaps.append((r, f)))
    c.start = None  # type: ignore[assignment]  # never used here
    c._on_message = lambda body, off: got.append((body, off))
    c._spec = offset
    if isinstance(offset, int):
        c._resume_from, c._gap_check = offset, True
    c._channel = FakeChannel()
    return c, got, gaps


def _feed(c: KombuStreamConsumer, offsets, pub="p1", seqs=None):
    seqs = seqs or list(range(1, len(offsets) + 1))
    for tag, (off, seq) in enumerate(zip(offsets, seqs, strict=True), 1):
        c._on_raw_message(FakeMessage(
            b"m%d" % off, {HEADER_OFFSET: off, HEADER_PUBLISHER: pub, HEADER_SEQ: seq}, tag))


def test_stream_arguments():
    assert stream_arguments("7D", 1000, 500) == {
        "x-queue-type": "stream", "x-max-age": "7D",
        "x-max-length-bytes": 1000, "x-stream-max-segment-size-bytes": 500}
    assert stream_arguments(None, None, None) == {"x-queue-type": "stream"}


@pytest.mark.parametrize("kwargs", [
    {"prefetch_count": 0}, {"max_age": "1 hour"}, {"max_age": "0h"},
    {"publish_timeout": 0}, {"reconnect_interval": 2.0, "reconnect_interval_max": 1.0},
])
def test_settings_validation(kwargs):
    with pytest.raises(ValueError):
        StreamSettings(**kwargs)


def test_publish_to_unreachable_broker_fails_within_bound():
    pub = KombuStreamPublisher(StreamSettings(
        url=_dead_url(), publish_timeout=0.6, reconnect_interval=0.05,
        reconnect_interval_max=0.2, connect_timeout=0.5))
    t0 = time.monotonic()
    with pytest.raises(PublishError):
        pub.publish(b"x")
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 3.0
    assert pub.retries >= 2
    pub.close()
    with pytest.raises(PublishError):
        pub.publish(b"x")


def test_consumer_on_unreachable_broker_stops_cleanly():
    plane = KombuStreamDataPlane(StreamSettings(
        url=_dead_url(), reconnect_interval=0.05, reconnect_interval_max=0.1,
        poll_interval=0.05))
    c = plane.stream_consumer()
    c.start(lambda b, o: None, "first")
    deadline = time.monotonic() + 5
    while c.reconnects < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.reconnects >= 2
    assert not c.wait_attached(0)
    t0 = time.monotonic()
    plane.close()
    assert time.monotonic() - t0 < 2
    assert not c.running


def test_delivers_in_order_and_acks_in_batches():
    c, got, gaps = _consumer("first")
    _feed(c, [0, 1, 2, 4, 5, 6])  # 3 is a non-message chunk
    assert got == [(b"m%d" % o, o) for o in (0, 1, 2, 4, 5, 6)]
    assert c.last_offset == 6 and gaps == []
    assert c._channel.acks == [(2, True), (4, True), (6, True)]  # every prefetch/2


def test_resume_probe_skips_redelivered_message_and_chunk_prefix():
    c, got, gaps = _consumer(5)
    # The broker starts at the chunk holding the probe (offset 4).
    _feed(c, [2, 3, 4, 5, 6])
    assert [o for _, o in got] == [5, 6]
    assert gaps == []


def test_resume_where_next_offset_is_a_segment_header_is_not_a_gap():
    # Offsets 0..2 are messages, 3 starts a new segment, 4 is a message.
    # A consumer that stopped after 2 resumes at 3 and probes at 2.
    c, got, gaps = _consumer(3)
    _feed(c, [0, 1, 2, 4])
    assert [o for _, o in got] == [4]
    assert gaps == []


def test_gap_when_probe_is_gone():
    c, got, gaps = _consumer(10)
    _feed(c, [40, 41])
    assert gaps == [(10, 40)]
    assert [o for _, o in got] == [40, 41]
    assert c.gaps == 1


def test_gap_check_rearmed_on_reattach_after_last_delivered():
    c, got, gaps = _consumer("first")
    _feed(c, [0, 1, 2])
    assert c._attach_argument() == 2  # probe = last delivered
    c._gap_check = True  # what _attach() does for integer attach points
    _feed(c, [30, 31], seqs=[4, 5])
    assert gaps == [(3, 30)]


def test_duplicates_from_publish_retries_are_dropped():
    c, got, gaps = _consumer("first")
    _feed(c, [0, 1, 2, 3], seqs=[1, 2, 2, 3])
    assert [o for _, o in got] == [0, 1, 3]
    assert c.duplicates == 1
    # other publishers are independent
    _feed(c, [4], pub="p2", seqs=[1])
    assert [o for _, o in got] == [0, 1, 3, 4]


def test_on_message_exception_is_contained(caplog):
    c, got, gaps = _consumer("first")

    def boom(body, offset):
        raise RuntimeError("handler bug")

    c._on_message = boom
    _feed(c, [0, 1])
    assert c.errors == 2 and c.last_offset == 1
    assert "handler bug" in caplog.text


def test_attach_argument_for_each_spec():
    c, _, _ = _consumer("first")
    assert c._attach_argument() == "first"
    c, _, _ = _consumer(0)
    assert c._attach_argument() == 0
    c, _, _ = _consumer(7)
    assert c._attach_argument() == 6
    c, _, _ = _consumer("next")
    assert c._attach_argument() == "next"
    import datetime
    t = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    c._first_attach_at = t
    assert c._attach_argument() < t  # reconnect before the first message
