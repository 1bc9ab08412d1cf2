"""Checkpoints of the whole view (design §4.5): restored exactly, or not at all, never ahead.

A checkpoint carries the bytes of a local save (``HostStateCache.dump_state``); these tests
check the round trip, that a damaged, forged or unsigned one is a cold start, and what the
stream after the checkpoint does to restored views: a source restarted since brings its new
epoch, and a checkpoint whose offset retention dropped asks its sources to resync.  And a
newcomer's ask: answered at once by the publisher alone, asks close together sharing one
checkpoint, the answer restored rather than the older newest, and the newest when no
answer comes.
"""

from __future__ import annotations

import contextlib
import time
import zlib

import msgpack
import pytest
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from protocol.document import SET
from protocol.messages import Delta, ResyncRequest, Snapshot
from protocol.receiver import ReceiverMachine
from protocol.signing import Keyring, derive_key
from shared_host_manager import checkpoint, metrics
from shared_host_manager.cache import HostStateCache
from shared_host_manager.checkpoint import Checkpointer, CheckpointError
from transport.inprocess import InProcessBus

DOC = {"compute": {"vcpus": 8, "vcpus_used": 3}}
MASTER = b"m" * 32


def _cache(sent: list | None = None) -> HostStateCache:
    def send(endpoint, msg):
        if sent is not None:
            sent.append((endpoint, msg))
    # a fixed wall clock: two cuts of the same views are the same bytes
    return HostStateCache(ReceiverMachine("s0"), send, clock=lambda: 1.0,
                          wall_clock=lambda: 1_700_000_000.0)


def _held() -> HostStateCache:
    cache = _cache()
    cache.receiver.receive(Snapshot("cn-1", 5, 7, {**DOC, "service": {"endpoint": "rep-0"}}), 0.0)
    cache.receiver.receive(Snapshot("cn-2", 3, 0, DOC), 0.0)
    cache.receiver.receive(Snapshot("scheduler/old", 1, 4, {"scheduler": {"name": "old"}}), 0.0)
    cache.offset = 41
    cache.origins["cn-2"] = "rep-1"
    return cache


def _message(cache: HostStateCache, keyring: Keyring | None = None) -> bytes:
    return checkpoint.encode(cache.dump_state(), scheduler="s0", taken_ns=1, sources=3,
                             offset=cache.offset, keyring=keyring)


def _checkpointer(cache: HostStateCache, *bodies: bytes, keyring: Keyring | None = None
                  ) -> Checkpointer:
    bus = InProcessBus(threaded=False)
    plane = bus.sibling_stream(checkpoint.SUFFIX)
    publisher = plane.stream_publisher()
    for body in bodies:
        publisher.publish(body)
    return Checkpointer("s1", cache, plane, interval=30.0, peers=lambda: (), keyring=keyring)


def test_round_trip_restores_every_view_offset_and_origin_but_no_membership():
    held = _held()
    fresh = _cache()
    assert _checkpointer(fresh, _message(held)).restore() == 41
    views = fresh.receiver.sources
    assert views["cn-1"].version == (5, 7) and views["cn-1"].doc == held.receiver.sources["cn-1"].doc
    assert views["cn-2"].version == (3, 0) and views["cn-2"].status.value == "active"
    # a dead peer's entry in a checkpoint must not count as a live peer
    assert "scheduler/old" not in views
    assert fresh.offset == 41
    assert fresh.endpoint_of("cn-1") == "rep-0" and fresh.endpoint_of("cn-2") == "rep-1"


def test_the_checkpoint_carries_the_bytes_a_local_save_writes(tmp_path):
    held = _held()
    path = str(tmp_path / "cache.msgpack")
    held.save(path)
    decoded = checkpoint.decode(_message(held), None)
    assert decoded.state == open(path, "rb").read()
    assert (decoded.offset, decoded.sources, decoded.scheduler) == (41, 3, "s0")


def test_the_newest_checkpoint_wins():
    older = _held()
    newer = _held()
    newer.receiver.receive(Delta("cn-2", 3, 1, [[SET, "compute", "vcpus_used", 4]]), 0.0)
    newer.offset = 50
    fresh = _cache()
    assert _checkpointer(fresh, _message(older), _message(newer)).restore() == 50
    assert fresh.receiver.sources["cn-2"].version == (3, 1)


@pytest.mark.parametrize("damage", ["truncate", "flip_blob", "not_msgpack", "other_format"])
def test_a_damaged_checkpoint_means_a_cold_start(damage):
    good = _message(_held())
    if damage == "truncate":
        bad = good[:-5]
    elif damage == "flip_blob":
        envelope = msgpack.unpackb(good)
        blob = bytearray(envelope["state"])
        blob[len(blob) // 2] ^= 0x40
        bad = msgpack.packb({**envelope, "state": bytes(blob)})
    elif damage == "not_msgpack":
        bad = b"\xc1garbage"
    else:
        bad = msgpack.packb({**msgpack.unpackb(good), "format": 99})
    with pytest.raises(CheckpointError):
        checkpoint.decode(bad, None)
    fresh = _cache()
    assert _checkpointer(fresh, bad).restore() is None
    assert fresh.receiver.sources == {} and fresh.offset is None


def test_a_damaged_state_inside_a_sound_envelope_is_refused_by_its_checksum():
    state = bytearray(_held().dump_state())
    i = state.index(b"vcpus_used") + len(b"vcpus_used")
    state[i] ^= 0x01  # still msgpack, another number: only the checksum tells
    bad = checkpoint.encode(bytes(state), scheduler="s0", taken_ns=1, sources=3, offset=41,
                            keyring=None)
    fresh = _cache()
    assert _checkpointer(fresh, bad).restore() is None
    assert fresh.receiver.sources == {}


def test_a_damaged_newest_is_a_cold_start_not_an_older_checkpoint():
    # only the stream's last chunk is read (a newcomer must not read back through the
    # retention); an older checkpoint in that chunk would be tried, one before it is not
    good = _message(_held())
    fresh = _cache()
    assert _checkpointer(fresh, good, good[:-5]).restore() is None
    assert fresh.receiver.sources == {}


def test_no_checkpoint_on_the_stream_is_a_cold_start():
    fresh = _cache()
    assert _checkpointer(fresh).restore() is None
    assert fresh.receiver.sources == {}


def test_an_empty_in_process_checkpoint_stream_costs_no_wait(bus):
    cp = Checkpointer("s1", _cache(), bus.sibling_stream(checkpoint.SUFFIX), interval=30.0,
                      peers=lambda: ())
    started = time.monotonic()
    assert cp.restore() is None
    assert time.monotonic() - started < cp.wait / 2


def test_a_decompression_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_STATE_BYTES", 1024)
    big = checkpoint.encode(b"\0" * 4096, scheduler="s0", taken_ns=1, sources=0, offset=1,
                            keyring=None)
    with pytest.raises(CheckpointError, match="over 1024 bytes"):
        checkpoint.decode(big, None)


def test_signed_checkpoints_verify_with_the_master_and_forgeries_do_not():
    schedulers = Keyring(master=MASTER)
    signed = _message(_held(), schedulers)
    assert checkpoint.decode(signed, schedulers).offset == 41
    with pytest.raises(CheckpointError, match="unsigned"):
        checkpoint.decode(_message(_held()), schedulers)
    # a compute node holds its own key and the scheduler keys, not the checkpoint key
    compute = Keyring({"cn-1": derive_key(MASTER, "cn-1"), "s0": derive_key(MASTER, "s0")})
    with pytest.raises(KeyError):
        _message(_held(), compute)
    forged = msgpack.unpackb(signed)
    forged["mac"] = compute.sign("s0", b"anything")
    with pytest.raises(CheckpointError, match="bad signature"):
        checkpoint.decode(msgpack.packb(forged), schedulers)
    fresh = _cache()
    assert _checkpointer(fresh, msgpack.packb(forged), keyring=schedulers).restore() is None
    # without the master a scheduler neither publishes nor trusts checkpoints
    keyless = _checkpointer(_cache(), signed, keyring=compute)
    assert keyless.restore() is None and not keyless.publish()


def test_a_source_restarted_since_the_checkpoint_takes_its_new_epoch():
    sent: list = []
    fresh = _cache(sent)
    assert _checkpointer(fresh, _message(_held())).restore() == 41
    # the stream after the offset: a delta of the source's new epoch before its announcement
    fresh.ingest_stream(_encode(Delta("cn-1", 9, 1, [[SET, "compute", "vcpus_used", 1]])), 42)
    assert [type(m) for _, m in sent] == [ResyncRequest]
    assert fresh.receiver.sources["cn-1"].version == (5, 7)  # never applied out of its epoch
    fresh.ingest_stream(_encode(Snapshot("cn-1", 9, 1, DOC)), 43)
    assert fresh.receiver.sources["cn-1"].version == (9, 1)
    # and an older delta of the checkpointed epoch changes nothing
    fresh.ingest_stream(_encode(Delta("cn-2", 3, 0, [])), 44)
    assert fresh.receiver.sources["cn-2"].version == (3, 0)


def _encode(msg) -> bytes:
    from protocol.codec import encode
    return encode(msg)


def test_publish_only_the_coordinator_or_alone():
    cache = _held()
    bus = InProcessBus(threaded=False)
    plane = bus.sibling_stream(checkpoint.SUFFIX)
    peers: tuple[str, ...] = ()
    cp = Checkpointer("s1", cache, plane, interval=30.0, peers=lambda: peers)
    assert cp.publishes()
    peers = ("s0", "s1")
    assert not cp.publishes()
    peers = ("s1", "s2")
    assert cp.publishes()
    assert cp.publish() and bus.stream_bounds(plane.stream) == (0, 1)
    empty = Checkpointer("s1", _cache(), plane, interval=30.0, peers=lambda: ())
    assert not empty.publish()  # nothing applied from the stream: nothing to resume from


@contextlib.contextmanager
def _coordinator_and_peer(plane, interval: float):
    """Two running checkpointers of peers s0 and s1: s0, the coordinator, publishes."""
    pair = [Checkpointer(name, _held(), plane, interval=interval, peers=lambda: ("s0", "s1"))
            for name in ("s0", "s1")]
    for cp in pair:
        cp.start()
    try:
        yield pair
    finally:
        for cp in pair:
            cp.stop()


def test_the_thread_publishes_every_interval_and_only_as_coordinator(bus):
    plane = bus.sibling_stream(checkpoint.SUFFIX)
    with _coordinator_and_peer(plane, 0.02) as (ours, theirs):
        wait_for(lambda: ours.published >= 3, 5, "checkpoints")
    assert theirs.published == 0 and ours.publish_failures == 0
    assert not ours.publish()  # stopped


def _newest(plane) -> checkpoint.Checkpoint:
    reader = Checkpointer("reader", _cache(), plane, interval=0.0, peers=lambda: ())
    return checkpoint.decode(max(reader.read_newest(), key=lambda m: m[1])[0], None)


def test_an_ask_is_answered_at_once_by_the_publisher_alone_and_close_asks_share_one(bus):
    plane = bus.sibling_stream(checkpoint.SUFFIX)
    with _coordinator_and_peer(plane, 60.0) as (ours, theirs):
        for cp in (ours, theirs):
            cp.asked("first")
        wait_for(lambda: ours.published == 1, 5, "the answer")  # not the 60 s interval
        assert _newest(plane).answers == ("first",)
        asked = time.monotonic()
        for token in ("second", "third"):
            for cp in (ours, theirs):
                cp.asked(token)
        wait_for(lambda: ours.published == 2, 5, "the second answer")
        # within ANSWER_GAP of the first: one checkpoint for both, not one each
        assert time.monotonic() - asked >= checkpoint.ANSWER_GAP * 0.5
        assert _newest(plane).answers == ("second", "third")
        assert ours.answered == 2 and ours.asks == 3
    assert theirs.published == 0 and bus.stream_bounds(plane.stream) == (0, 2)


def test_without_an_answer_the_newest_serves_after_the_wait(monkeypatch):
    cache = _held()
    bus = InProcessBus(threaded=True)
    try:
        plane = bus.sibling_stream(checkpoint.SUFFIX)
        plane.stream_publisher().publish(_message(cache))
        monkeypatch.setattr(checkpoint, "ANSWER_WAIT", 0.3)
        asked: list[str] = []
        reader = Checkpointer("s1", _cache(), plane, interval=30.0, peers=lambda: ())
        started = time.monotonic()
        assert reader.restore(ask=asked.append) == 41
        assert time.monotonic() - started >= 0.3  # it waited for an answer, then took the newest
        assert asked == [reader.asked_token] and reader.restored is not None
        assert reader.restored.answers == ()

        def unreachable(token: str) -> None:
            raise OSError("peer topic unreachable")
        again = Checkpointer("s2", _cache(), plane, interval=30.0, peers=lambda: ())
        started = time.monotonic()
        assert again.restore(ask=unreachable) == 41 and again.asked_token is None
        assert time.monotonic() - started < 0.3  # no ask sent: nothing to wait for

        # a newest taken a moment ago: replaying since it is quicker than waiting for more
        monkeypatch.setattr(checkpoint, "ANSWER_WAIT", 30.0)
        plane.stream_publisher().publish(checkpoint.encode(
            cache.dump_state(), scheduler="s0", taken_ns=time.time_ns(), sources=3, offset=41,
            keyring=None))
        young = Checkpointer("s3", _cache(), plane, interval=30.0, peers=lambda: ())
        started = time.monotonic()
        assert young.restore(ask=asked.append) == 41 and young.asked_token is not None
        assert time.monotonic() - started < 5
    finally:
        bus.close()


def test_answers_outside_the_mac_are_read_but_a_malformed_list_is_refused():
    body = checkpoint.encode(_held().dump_state(), scheduler="s0", taken_ns=1, sources=3,
                             offset=41, keyring=None, answers=("tok",))
    assert checkpoint.head(body) == (1, ("tok",))
    assert checkpoint.decode(body, None).answers == ("tok",)
    envelope = msgpack.unpackb(body, raw=False)
    envelope["answers"] = ["x" * 10_000]
    bad = msgpack.packb(envelope, use_bin_type=True)
    assert checkpoint.head(bad) == (1, ())
    with pytest.raises(CheckpointError, match="malformed"):
        checkpoint.decode(bad, None)
    assert checkpoint.head(b"not msgpack \xc1") == (None, ())


def test_checkpoints_compress():
    cache = _cache()
    for i in range(200):
        cache.receiver.receive(Snapshot(f"cn-{i}", 1, 0, {**DOC, "n": {"i": i}}), 0.0)
    cache.offset = 7
    state = cache.dump_state()
    assert len(zlib.compress(state, 1)) < len(state) / 3


@pytest.fixture
def bus():
    b = InProcessBus(threaded=True)
    yield b
    b.close()


def test_a_newcomer_starts_from_the_checkpoint_and_catches_up_without_resyncs(bus):
    reporter = make_reporter(bus, bus, "r", hosts=30, seed=3)
    first = make_scheduler(bus, bus, "s0", checkpoint_interval=30.0)
    first.start()
    reporter.start()
    try:
        wait_for(lambda: len(first.receiver.sources) == 30, what="sources")
        assert first.checkpoints is not None and first.checkpoints.publish()
        published = reporter.stats["published"]
        wait_for(lambda: reporter.stats["published"] > published + 5, what="changes after it")
        older = first.checkpoints.last_published
        newcomer = make_scheduler(bus, bus, "s1", checkpoint_interval=30.0)
        newcomer.start()
        try:
            assert newcomer.checkpoints is not None and newcomer.checkpoints.restored is not None
            restored = newcomer.checkpoints.restored
            assert newcomer.resumed_from == restored.offset
            # not the newest periodic one: the one first took in answer to the newcomer's ask
            assert newcomer.checkpoints.asked_token in restored.answers
            assert older is not None and restored.offset > older[1]
            assert first.checkpoints.answered == 1
            # what an operator sees: the metrics of the one, the status of the other
            samples = {m.name: m.samples[0].value
                       for m in metrics.SchedulerCollector(first).collect() if m.samples}
            assert samples["shm_checkpoint_answers"] == 1
            assert samples["shm_checkpoints_published"] == 2
            started_from = metrics.status(newcomer)["checkpoints"]["restored_from"]
            assert started_from["scheduler"] == "s0" and started_from["answered_ask"]
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [first, newcomer]), what="convergence")
            assert newcomer.receiver.stats["resyncs_requested"] == 0
            assert newcomer.cache.messages < first.cache.messages
        finally:
            newcomer.stop()
    finally:
        reporter.stop()
        first.stop()


def test_a_checkpoint_older_than_the_stream_retention_asks_its_sources_to_resync(monkeypatch):
    bus = InProcessBus(threaded=True, max_messages=20)
    try:
        reporter = make_reporter(bus, bus, "r", hosts=10, seed=5, change_interval=0.05)
        first = make_scheduler(bus, bus, "s0", checkpoint_interval=30.0)
        first.start()
        reporter.start()
        try:
            wait_for(lambda: len(first.receiver.sources) == 10, what="sources")
            assert first.checkpoints is not None and first.checkpoints.publish()
            offset = first.checkpoints.last_published[1]
            wait_for(lambda: bus.stream_bounds()[0] > offset + 1, what="retention past it")
            # nobody answers the newcomer's ask: that old checkpoint is the newest it gets
            first.checkpoints.stop()
            monkeypatch.setattr(checkpoint, "ANSWER_WAIT", 0.2)
            newcomer = make_scheduler(bus, bus, "s1", checkpoint_interval=30.0)
            newcomer.start()
            try:
                wait_for(lambda: newcomer.retention_gaps == 1, what="the retention gap")
                assert newcomer.receiver.stats["resyncs_requested"] >= 10
                quiesce([reporter])
                wait_for(lambda: converged([reporter], [newcomer]), what="convergence")
            finally:
                newcomer.stop()
        finally:
            reporter.stop()
            first.stop()
    finally:
        bus.close()
