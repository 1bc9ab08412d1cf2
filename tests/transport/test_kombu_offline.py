"""Broker-free tests of the kombu stream classes: settings, bounded
publish retries, clean stop while unreachable, and the consumer's
offset/gap/duplicate bookkeeping driven with fake messages."""

from __future__ import annotations

import dataclasses
import socket
import time

import amqp.exceptions
import pytest
from kombu import Producer

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


class ScriptedBroker:
    """A broker behind fake channels: each publish attempt does the next step of ``script``.

    ``refused``: the connection is refused (nothing sent); ``nack``: the broker refuses the
    message; ``lost``: the broker stores it and the connection dies before its confirm;
    ``ok``: stored and confirmed."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.stored: list[bytes] = []

    def step(self) -> str:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def connect(self) -> Producer:
        if self.script[0] == "refused":
            self.step()
            raise ConnectionRefusedError(111, "Connection refused")
        return Producer(FakePublishChannel(self), routing_key="s", auto_declare=False)


class FakePublishChannel:
    """The part of a py-amqp channel kombu's Producer.publish uses, in confirm mode."""

    def __init__(self, broker: ScriptedBroker) -> None:
        self.broker = broker

    def prepare_message(self, body, priority=None, content_type=None, content_encoding=None,
                        headers=None, properties=None):
        return body

    def basic_publish(self, message, **kwargs):
        what = self.broker.step()
        if what == "nack":
            raise amqp.exceptions.MessageNacked()
        self.broker.stored.append(message)
        if what == "lost":
            raise ConnectionResetError(104, "Connection reset by peer")


def _scripted_publisher(script: list[str]) -> tuple[KombuStreamPublisher, ScriptedBroker]:
    pub = KombuStreamPublisher(StreamSettings(publish_timeout=0.3, reconnect_interval=0.01,
                                              reconnect_interval_max=0.02))
    broker = ScriptedBroker(script)

    def connect() -> Producer:
        producer = broker.connect()
        pub._producer = producer
        return producer

    pub._connect = connect  # type: ignore[method-assign]
    return pub, broker


@pytest.mark.parametrize("script, stored", [
    (["refused"], False),             # the broker is down the whole time
    (["nack", "refused"], False),     # it said no, then went down
    (["lost", "refused"], None),      # stored, the confirm lost with the connection
    (["nack", "lost", "refused"], None),
])
def test_a_given_up_publish_says_whether_the_message_is_known_not_stored(script, stored, caplog):
    pub, broker = _scripted_publisher(script)
    with pytest.raises(PublishError) as info:
        pub.publish(b"batch")
    assert info.value.stored is stored
    stats = pub.stats()
    if stored is None:
        assert broker.stored, "the scenario stores the message"
        assert (stats.failures, stats.unconfirmed) == (0, 1)
        assert "unconfirmed" in str(info.value) and "not stored" not in str(info.value)
    else:
        assert broker.stored == []
        assert (stats.failures, stats.unconfirmed) == (1, 0)
        assert "not stored" in str(info.value)


def test_a_publish_confirmed_after_a_lost_confirm_is_neither():
    pub, broker = _scripted_publisher(["lost", "refused", "ok"])
    pub.publish(b"batch")
    assert broker.stored == [b"batch", b"batch"]  # the consumer drops the duplicate
    stats = pub.stats()
    assert (stats.published, stats.failures, stats.unconfirmed) == (1, 0, 0)
