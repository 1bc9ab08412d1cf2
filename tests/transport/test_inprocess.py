"""Unit tests of the in-process bus (both planes, both delivery modes)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from transport import base
from transport.inprocess import InProcessBus


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


@pytest.fixture
def sync_bus():
    bus = InProcessBus(threaded=False)
    yield bus
    bus.close()


@pytest.fixture
def threaded_bus():
    bus = InProcessBus(threaded=True)
    yield bus
    bus.close()


def _publish(bus: InProcessBus, n: int, start: int = 0) -> None:
    pub = bus.stream_publisher()
    for i in range(start, start + n):
        pub.publish(b"m%d" % i)


# -- interfaces -----------------------------------------------------------

def test_objects_satisfy_the_protocols(sync_bus):
    assert isinstance(sync_bus, base.DataPlane)
    assert isinstance(sync_bus, base.ControlPlane)
    assert isinstance(sync_bus.stream_publisher(), base.StreamPublisher)
    assert isinstance(sync_bus.stream_consumer(), base.StreamConsumer)
    assert isinstance(sync_bus.control_server("t", "s", lambda b: None),
                      base.ControlServer)
    assert isinstance(sync_bus.control_client(), base.ControlClient)


@pytest.mark.parametrize("bad", [-1, True, "start", 1.5, None])
def test_invalid_offsets_are_rejected(sync_bus, bad):
    with pytest.raises(ValueError):
        sync_bus.stream_consumer().start(lambda b, o: None, bad)


def test_bodies_must_be_bytes(sync_bus):
    with pytest.raises(TypeError):
        sync_bus.stream_publisher().publish("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sync_bus.control_client().cast("t", "s", 42)  # type: ignore[arg-type]


def test_bytearray_body_is_copied(sync_bus):
    got = []
    sync_bus.stream_consumer().start(lambda b, o: got.append(b))
    buf = bytearray(b"abc")
    sync_bus.stream_publisher().publish(buf)
    buf[0] = ord("z")
    sync_bus.pump()
    assert got == [b"abc"]


# -- data plane -----------------------------------------------------------

def test_order_and_offsets_from_first(sync_bus):
    _publish(sync_bus, 100)
    got: list[tuple[bytes, int]] = []
    consumer = sync_bus.stream_consumer()
    consumer.start(lambda b, o: got.append((b, o)), "first")
    assert consumer.last_offset is None
    assert consumer.poll() == 100
    assert got == [(b"m%d" % i, i) for i in range(100)]
    assert consumer.last_offset == 99


def test_on_batch_gets_offsets_and_the_backlogs_publish_times(sync_bus):
    clock = iter(range(1000, 2000))
    sync_bus.wall_clock = lambda: float(next(clock))
    _publish(sync_bus, 700)
    calls: list[list[tuple[bytes, int, float | None]]] = []
    consumer = sync_bus.stream_consumer()
    consumer.start(lambda b, o: pytest.fail("on_message called despite on_batch"), 3,
                   on_batch=calls.append)
    _publish(sync_bus, 2)  # after the start: not the consumer's backlog
    assert consumer.poll() == 699
    assert [m for call in calls for m in call] == [
        (b"m%d" % i, i, 1000.0 + i) for i in range(3, 700)] + [(b"m0", 700, None),
                                                               (b"m1", 701, None)]
    assert 1 < len(calls) < 697  # a backlog, read in a few slices
    assert consumer.last_offset == 701 and consumer.delivered == 699


def test_each_consumer_reads_at_its_own_offset(sync_bus):
    _publish(sync_bus, 10)
    a, b = [], []
    ca, cb = sync_bus.stream_consumer(), sync_bus.stream_consumer()
    ca.start(lambda body, o: a.append(o), "first")
    cb.start(lambda body, o: b.append(o), 5)
    ca.poll(3)
    assert a == [0, 1, 2] and b == []
    cb.poll()
    assert b == [5, 6, 7, 8, 9]
    ca.poll()
    assert a == list(range(10))


def test_next_and_last(sync_bus):
    _publish(sync_bus, 5)
    nxt, last = [], []
    sync_bus.stream_consumer().start(lambda b, o: nxt.append(o), "next")
    sync_bus.stream_consumer().start(lambda b, o: last.append(o), "last")
    _publish(sync_bus, 2, start=5)
    sync_bus.pump()
    assert nxt == [5, 6]
    assert last == [4, 5, 6]


def test_last_on_empty_stream_waits_for_first_message(sync_bus):
    got = []
    sync_bus.stream_consumer().start(lambda b, o: got.append(o), "last")
    assert sync_bus.pump() == 0
    _publish(sync_bus, 1)
    sync_bus.pump()
    assert got == [0]


def test_resume_from_saved_offset_has_no_gap_and_no_duplicate(sync_bus):
    _publish(sync_bus, 50)
    first = []
    c1 = sync_bus.stream_consumer()
    c1.start(lambda b, o: first.append(o))
    c1.poll(20)
    c1.stop()
    saved = c1.last_offset
    assert saved == 19
    _publish(sync_bus, 10, start=50)
    gaps = []
    second = []
    c2 = sync_bus.stream_consumer(on_retention_gap=lambda r, f: gaps.append((r, f)))
    c2.start(lambda b, o: second.append(o), saved + 1)
    c2.poll()
    assert first + second == list(range(60))
    assert gaps == []


def test_consumer_restart_resumes(sync_bus):
    _publish(sync_bus, 10)
    got = []
    c = sync_bus.stream_consumer()
    c.start(lambda b, o: got.append(o))
    c.poll(4)
    c.stop()
    c.start(lambda b, o: got.append(o), c.last_offset + 1)
    c.poll()
    assert got == list(range(10))


def test_retention_by_count_reports_gap_on_resume():
    bus = InProcessBus(threaded=False, max_messages=10)
    _publish(bus, 25)
    assert bus.stream_bounds() == (15, 25)
    gaps, got = [], []
    c = bus.stream_consumer(on_retention_gap=lambda r, f: gaps.append((r, f)))
    c.start(lambda b, o: got.append((b, o)), 3)
    c.poll()
    assert gaps == [(3, 15)]
    assert got == [(b"m%d" % i, i) for i in range(15, 25)]
    assert c.gaps == 1
    assert bus.stats().stream_retention_dropped == 15


def test_retention_by_bytes_keeps_the_newest_message():
    bus = InProcessBus(threaded=False, max_bytes=100)
    pub = bus.stream_publisher()
    for _ in range(10):
        pub.publish(b"x" * 30)
    first, nxt = bus.stream_bounds()
    assert (first, nxt) == (7, 10)  # 3 x 30 <= 100 < 4 x 30
    pub.publish(b"y" * 500)  # larger than the limit on its own
    assert bus.stream_bounds() == (10, 11)


def test_start_first_after_retention_is_not_a_gap():
    bus = InProcessBus(threaded=False, max_messages=5)
    _publish(bus, 20)
    gaps, got = [], []
    bus.stream_consumer(on_retention_gap=lambda r, f: gaps.append((r, f))).start(
        lambda b, o: got.append(o), "first")
    bus.pump()
    assert gaps == [] and got == list(range(15, 20))


def test_lagging_consumer_overrun_by_retention_gets_gap_hook():
    bus = InProcessBus(threaded=False, max_messages=10)
    gaps, got = [], []
    c = bus.stream_consumer(on_retention_gap=lambda r, f: gaps.append((r, f)))
    c.start(lambda b, o: got.append(o), "first")
    _publish(bus, 5)
    c.poll()
    _publish(bus, 30, start=5)  # consumer at 5, retention keeps 25..34
    c.poll()
    assert gaps == [(5, 25)]
    assert got == list(range(5)) + list(range(25, 35))


def test_handler_and_hook_exceptions_do_not_kill_the_consumer(caplog):
    bus = InProcessBus(threaded=False, max_messages=3)
    _publish(bus, 6)
    got = []

    def on_message(body, offset):
        got.append(offset)
        if offset % 2:
            raise RuntimeError("boom")

    def hook(requested, first):
        raise RuntimeError("hook boom")

    c = bus.stream_consumer(on_retention_gap=hook)
    c.start(on_message, 0)
    assert c.poll() == 3
    _publish(bus, 2, start=6)
    assert c.poll() == 2
    assert got == [3, 4, 5, 6, 7]
    assert c.errors == 3  # offsets 3, 5, 7
    assert bus.stats().handler_errors == 4  # and the gap hook
    assert "boom" in caplog.text


def test_stop_inside_on_message_rewinds_undelivered(sync_bus):
    _publish(sync_bus, 10)
    got = []
    c = sync_bus.stream_consumer()

    def on_message(body, offset):
        got.append(offset)
        if offset == 3:
            c.stop()

    c.start(on_message)
    assert c.poll() == 4
    assert c.last_offset == 3
    c.start(lambda b, o: got.append(o), c.last_offset + 1)
    c.poll()
    assert got == list(range(10))


def test_poll_and_pump_respect_budgets(sync_bus):
    _publish(sync_bus, 10)
    a, b = [], []
    ca = sync_bus.stream_consumer()
    ca.start(lambda body, o: a.append(o))
    sync_bus.stream_consumer().start(lambda body, o: b.append(o))
    assert ca.pending == 10
    assert ca.poll(0) == 0
    assert sync_bus.pump(12) == 12
    assert (len(a), len(b)) == (10, 2)
    assert sync_bus.pump() == 8


def test_sync_mode_refuses_threaded_calls_and_vice_versa(sync_bus, threaded_bus):
    with pytest.raises(RuntimeError):
        threaded_bus.pump()
    c = threaded_bus.stream_consumer()
    with pytest.raises(RuntimeError):
        c.poll()
    c.start(lambda b, o: None)
    with pytest.raises(RuntimeError):
        c.start(lambda b, o: None)


def test_closed_bus_refuses_new_parties(sync_bus):
    sync_bus.close()
    with pytest.raises(RuntimeError):
        sync_bus.stream_consumer().start(lambda b, o: None)
    with pytest.raises(RuntimeError):
        sync_bus.control_server("t", "s", lambda b: None).start()


def test_closed_publisher_raises(sync_bus):
    pub = sync_bus.stream_publisher()
    pub.close()
    with pytest.raises(base.PublishError):
        pub.publish(b"x")


# -- determinism of the synchronous mode ----------------------------------

def _scenario(seed: int) -> tuple[list[tuple], object]:
    """A little simulated system: two 'schedulers' read the stream and
    claim over the control plane; 'computes' answer by publishing."""
    rng = random.Random(seed)
    bus = InProcessBus(threaded=False, max_messages=200)
    trace: list[tuple] = []
    pub = bus.stream_publisher()
    client = bus.control_client()
    for sched in ("s1", "s2"):
        def on_stream(body, offset, sched=sched):
            trace.append(("stream", sched, offset, body))
            if rng.random() < 0.3:
                client.cast("compute", f"c{rng.randrange(3)}", b"claim:" + sched.encode() + body)

        def on_control(body, sched=sched):
            trace.append(("ctl", sched, body))

        bus.stream_consumer().start(on_stream, "first")
        bus.control_server("sched", sched, on_control).start()
    for host in range(3):
        def on_claim(body, host=host):
            trace.append(("claim", host, body))
            pub.publish(b"delta:%d:%d" % (host, len(trace)))
            client.cast("sched", body[6:8].decode(), b"ok")
        bus.control_server("compute", f"c{host}", on_claim).start()
    for step in range(300):
        pub.publish(b"hb:%d" % step)
        if rng.random() < 0.5:
            bus.pump(rng.randrange(1, 20))
    bus.pump()
    stats = bus.stats()
    bus.close()
    return trace, stats


def test_sync_mode_is_reproducible():
    trace1, stats1 = _scenario(7)
    trace2, stats2 = _scenario(7)
    assert len(trace1) > 600
    assert trace1 == trace2
    assert stats1 == stats2
    trace3, _ = _scenario(8)
    assert trace3 != trace1


def test_sync_mode_delivers_only_in_the_calling_thread(sync_bus):
    threads = set()
    sync_bus.stream_consumer().start(lambda b, o: threads.add(threading.get_ident()))
    sync_bus.control_server("t", "s", lambda b: threads.add(threading.get_ident())).start()
    _publish(sync_bus, 5)
    sync_bus.control_client().cast("t", "s", b"x")
    assert threading.active_count() >= 1
    sync_bus.pump()
    assert threads == {threading.get_ident()}


# -- threaded mode --------------------------------------------------------

def test_threaded_consumer_delivers_in_order_from_one_thread(threaded_bus):
    got, threads = [], set()
    done = threading.Event()
    n_threads, per_thread = 4, 2000

    def on_message(body, offset):
        threads.add(threading.get_ident())
        got.append((offset, body))
        if len(got) == n_threads * per_thread:
            done.set()

    c = threaded_bus.stream_consumer()
    c.start(on_message, "first")

    def produce(k):
        pub = threaded_bus.stream_publisher()
        for i in range(per_thread):
            pub.publish(b"%d:%d" % (k, i))

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(n_threads)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    assert done.wait(10)
    c.stop()
    assert [o for o, _ in got] == list(range(n_threads * per_thread))
    assert len(threads) == 1 and threading.get_ident() not in threads
    for k in range(n_threads):  # each producer's own order is kept
        mine = [b for _, b in got if b.startswith(b"%d:" % k)]
        assert mine == [b"%d:%d" % (k, i) for i in range(per_thread)]


def test_threaded_handler_exception_keeps_consumer_alive(threaded_bus):
    got = []

    def on_message(body, offset):
        got.append(offset)
        raise ValueError("bad message")

    c = threaded_bus.stream_consumer()
    c.start(on_message)
    _publish(threaded_bus, 20)
    assert _wait_for(lambda: len(got) == 20)
    assert c.errors == 20
    c.stop()


def test_threaded_stop_is_clean_and_restartable(threaded_bus):
    got = []
    c = threaded_bus.stream_consumer()
    c.start(lambda b, o: got.append(o))
    _publish(threaded_bus, 10)
    assert _wait_for(lambda: len(got) == 10)
    c.stop()
    _publish(threaded_bus, 5, start=10)
    time.sleep(0.05)
    assert len(got) == 10  # stopped consumers receive nothing
    c.start(lambda b, o: got.append(o), c.last_offset + 1)
    assert _wait_for(lambda: len(got) == 15)
    assert got == list(range(15))


def test_threaded_control_round_trip(threaded_bus):
    got, threads = [], set()

    def handler(body):
        threads.add(threading.get_ident())
        got.append(body)

    srv = threaded_bus.control_server("compute", "node1", handler)
    srv.start()
    client = threaded_bus.control_client()
    for i in range(100):
        client.cast("compute", "node1", b"\x8f\xff%d" % i)
    assert _wait_for(lambda: len(got) == 100)
    srv.stop()
    assert got == [b"\x8f\xff%d" % i for i in range(100)]
    assert len(threads) == 1


# -- control plane --------------------------------------------------------

def test_cast_reaches_only_the_addressed_server(sync_bus):
    a, b = [], []
    sync_bus.control_server("compute", "a", a.append).start()
    sync_bus.control_server("compute", "b", b.append).start()
    client = sync_bus.control_client()
    client.cast("compute", "a", b"1")
    client.cast("compute", "b", b"2")
    client.cast("compute", "a", b"3")
    sync_bus.pump()
    assert a == [b"1", b"3"] and b == [b"2"]


def test_cast_to_unknown_target_is_dropped_and_counted(sync_bus):
    sync_bus.control_client().cast("compute", "nobody", b"x")
    assert sync_bus.pump() == 0
    assert sync_bus.stats().control_dropped == 1


def test_inbox_survives_server_restart(sync_bus):
    got = []
    srv = sync_bus.control_server("sched", "s1", got.append)
    srv.start()
    srv.stop()
    sync_bus.control_client().cast("sched", "s1", b"while down")
    assert sync_bus.pump() == 0
    srv.start()
    sync_bus.pump()
    assert got == [b"while down"]


def test_second_server_on_same_inbox_is_refused(sync_bus):
    sync_bus.control_server("t", "s", lambda b: None).start()
    with pytest.raises(RuntimeError):
        sync_bus.control_server("t", "s", lambda b: None).start()


def test_control_handler_exception_is_contained(sync_bus):
    got = []

    def handler(body):
        got.append(body)
        raise RuntimeError("bad claim")

    srv = sync_bus.control_server("t", "s", handler)
    srv.start()
    client = sync_bus.control_client()
    client.cast("t", "s", b"1")
    client.cast("t", "s", b"2")
    sync_bus.pump()
    assert got == [b"1", b"2"] and srv.errors == 2


def test_closed_client_raises(sync_bus):
    client = sync_bus.control_client()
    client.close()
    with pytest.raises(base.CastError):
        client.cast("t", "s", b"x")


def test_stats_count_messages_bytes_and_deliveries(sync_bus):
    sync_bus.stream_consumer().start(lambda b, o: None)
    sync_bus.stream_consumer().start(lambda b, o: None)
    sync_bus.control_server("t", "s", lambda b: None).start()
    pub = sync_bus.stream_publisher()
    pub.publish(b"abc")
    pub.publish(b"de")
    sync_bus.control_client().cast("t", "s", b"12345")
    sync_bus.pump()
    s = sync_bus.stats()
    assert (s.stream_messages, s.stream_bytes, s.stream_deliveries) == (2, 5, 4)
    assert (s.control_messages, s.control_bytes, s.control_deliveries) == (1, 5, 1)


def test_sync_delivers_a_large_interleaved_backlog_in_order():
    """100 000 messages published and pumped in slices all arrive, once and in offset
    order. (Throughput is measured in tests/integration/bench_transport.py, not asserted
    here: timing thresholds belong in benchmarks.)"""
    bus = InProcessBus(threaded=False)
    pub = bus.stream_publisher()
    offsets: list[int] = []

    def on_message(body, offset):
        offsets.append(offset)

    bus.stream_consumer().start(on_message)
    n = 100_000
    body = b"x" * 300
    for i in range(n):
        pub.publish(body)
        if i % 64 == 63:
            bus.pump()
    bus.pump()
    assert len(offsets) == n
    assert offsets == sorted(set(offsets))


def test_fanout_reaches_every_server_listening_on_the_topic_once(sync_bus):
    got: dict[str, list[bytes]] = {"a": [], "b": [], "other": []}
    servers = [sync_bus.control_server("peers", name, got[name].append) for name in ("a", "b")]
    servers.append(sync_bus.control_server("elsewhere", "other", got["other"].append))
    for s in servers:
        s.start()
    client = sync_bus.control_client()
    client.fanout("peers", b"one")
    servers[1].stop()  # a server that left gets nothing more (a fanout queue leaves with it)
    client.fanout("peers", b"two")
    for s in servers:
        if s is not servers[1]:
            s.poll()
    assert got == {"a": [b"one", b"two"], "b": [], "other": []}
