"""The cache's state file (design §4.4): restored exactly, or not at all.

``shm faults`` found that a damaged state file (torn by a crash on a filesystem
that reorders writes, or a bad disk) could restore a view that its source never
had, or one ahead of it, which nothing repairs.  The file is checksummed now: any
damage means a cold start.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from protocol.codec import Decoder, Encoder
from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine
from protocol.source_state import SourceState
from shared_host_manager.cache import HostStateCache


def _cache(clock: float = 1.0, wall: float = 1_700_000_000.0, down_interval: float = 30.0
           ) -> HostStateCache:
    return HostStateCache(ReceiverMachine("s0", down_interval=down_interval),
                          lambda endpoint, msg: None, clock=lambda: clock, wall_clock=lambda: wall)


def _saved(tmp_path) -> tuple[HostStateCache, str]:
    cache = _cache()
    cache.receiver.receive(Snapshot("cn-1", 5, 7, {"compute": {"vcpus": 8, "vcpus_used": 3}}), 0.0)
    cache.offset = 41
    cache.origins["cn-1"] = "rep-0"
    path = str(tmp_path / "cache-s0.msgpack")
    cache.save(path)
    return cache, path


def test_an_intact_file_restores_every_view(tmp_path):
    _, path = _saved(tmp_path)
    fresh = _cache()
    assert fresh.load(path) == 41
    view = fresh.receiver.sources["cn-1"]
    assert view.version == (5, 7) and view.doc == {"compute": {"vcpus": 8, "vcpus_used": 3}}
    assert fresh.endpoint_of("cn-1") == "rep-0"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_any_damage_means_a_cold_start(tmp_path, damage):
    _, path = _saved(tmp_path)
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[: len(data) - 3]
    else:
        # a flip inside the saved document: still valid msgpack, a different vcpus_used
        i = data.index(b"vcpus_used") + len(b"vcpus_used")
        data[i] ^= 0x01
    with open(path, "wb") as f:
        f.write(bytes(data))
    fresh = _cache()
    assert fresh.load(path) is None
    assert fresh.receiver.sources == {}


def test_a_file_of_the_previous_format_still_loads(tmp_path):
    path = tmp_path / "old.msgpack"
    path.write_bytes(msgpack.packb({"format": 1, "offset": 3, "origins": {},
                                    "sources": [["cn-2", 1, 2, {"compute": {"vcpus": 4}}]]}))
    fresh = _cache(clock=4.0)
    assert fresh.load(str(path)) == 3
    view = fresh.receiver.sources["cn-2"]
    assert view.version == (1, 2)
    # saved without when its source was heard: heard at the restore, as before
    assert view.last_heard == 4.0 and view.state is SourceState.ACTIVE


def test_a_state_packed_a_view_at_a_time_is_the_bytes_of_one_pack():
    """StateCut.pack packs view by view (other threads run between views); the state's bytes
    are those one msgpack.packb of the whole map makes, so every reader keeps reading them."""
    cache = _cache()
    for i in range(3):
        cache.receiver.receive(Snapshot(f"cn-{i}", 2, i, {"compute": {"vcpus": i}}), 0.0)
    cache.offset, cache.cell_offsets = 9, {"cell1": 4}
    cache.origins["cn-1"], cache.source_cells["cn-2"] = "rep-0", "cell1"
    whole = msgpack.packb({
        "offset": 9, "cells": {"cell1": 4},
        "sources": [[f"cn-{i}", 2, i, {"compute": {"vcpus": i}}] for i in range(3)],
        "origins": {"cn-1": "rep-0"}, "source_cells": {"cn-2": "cell1"},
        "heard": [1_700_000_000.0, [1.0, 1.0, 1.0]]}, use_bin_type=True)
    assert msgpack.unpackb(cache.dump_state())["state"] == whole


def _running(wall: float) -> HostStateCache:
    """A scheduler at its clock's 500.0: cn-dead silent since 0.0 (DOWN), cn-quiet since 480.0,
    cn-live heard now."""
    cache = _cache(clock=500.0, wall=wall)
    receiver = cache.receiver
    for source, at in (("cn-dead", 0.0), ("cn-quiet", 480.0), ("cn-live", 500.0)):
        receiver.receive(Snapshot(source, 1, 1, {"compute": {"vcpus": 4}}), at)
    receiver.tick(500.0)
    assert receiver.sources["cn-dead"].state is SourceState.DOWN
    return cache


def test_a_restored_view_is_silent_as_long_as_its_source_was_plus_the_time_since():
    """A host that died before the state was saved is not up again after a restart (or at a
    newcomer restoring a peer's checkpoint): each view comes back last heard when it was,
    counted on the restoring scheduler's own clock, plus the wall-clock time since the cut."""
    data = _running(wall=1_700_000_000.0).dump_state()
    # another process: its clock reads 7.0, and 5 s of wall-clock time passed since the cut
    fresh = _cache(clock=7.0, wall=1_700_000_005.0)
    fresh.restore_state(data, "test")
    views = fresh.receiver.sources
    assert views["cn-dead"].state is SourceState.DOWN
    assert views["cn-dead"].last_heard == 7.0 - 505.0
    assert fresh.receiver.stats["went_down"] == 1
    assert views["cn-quiet"].state is SourceState.ACTIVE
    assert views["cn-quiet"].last_heard == 7.0 - 25.0
    assert views["cn-live"].last_heard == 7.0 - 5.0
    # cn-quiet's 30 s of silence end 5 s later, as they would have without the restart (the
    # receiver looks for silent views at most once a second)
    fresh.receiver.tick(11.9)
    assert views["cn-quiet"].state is SourceState.ACTIVE
    fresh.receiver.tick(12.95)
    assert views["cn-quiet"].state is SourceState.DOWN
    assert views["cn-live"].state is SourceState.ACTIVE


def test_a_wall_clock_behind_the_cuts_adds_no_time():
    """Another scheduler's clock, or one set back: the silences are the cut's, never less."""
    data = _running(wall=1_700_000_000.0).dump_state()
    fresh = _cache(clock=7.0, wall=1_699_999_000.0)
    fresh.restore_state(data, "test")
    views = fresh.receiver.sources
    assert views["cn-quiet"].last_heard == 7.0 - 20.0
    assert views["cn-live"].last_heard == 7.0
    assert views["cn-dead"].state is SourceState.DOWN


def test_the_silences_follow_their_sources_when_some_are_not_restored():
    data = _running(wall=1_700_000_000.0).dump_state()
    fresh = _cache(clock=7.0, wall=1_700_000_000.0)
    fresh.restore_state(data, "test", keep=lambda source: source != "cn-dead")
    assert set(fresh.receiver.sources) == {"cn-quiet", "cn-live"}
    assert fresh.receiver.sources["cn-quiet"].last_heard == 7.0 - 20.0
    assert fresh.receiver.sources["cn-live"].last_heard == 7.0


@pytest.mark.parametrize("heard", [[1.0, [2.0]], [1.0], "soon", [1.0, [-1.0, 0.0]], [1.0, ["x", 0.0]]])
def test_a_state_with_unreadable_silences_means_a_cold_start(tmp_path, heard):
    path = tmp_path / "old.msgpack"
    path.write_bytes(msgpack.packb({"format": 1, "offset": 3, "origins": {}, "heard": heard,
                                    "sources": [["cn-1", 1, 2, {"compute": {"vcpus": 4}}],
                                                ["cn-2", 1, 2, {"compute": {"vcpus": 4}}]]}))
    fresh = _cache()
    assert fresh.load(str(path)) is None
    assert fresh.receiver.sources == {}


@settings(max_examples=200, deadline=None)
@given(silences=st.lists(st.floats(0.0, 120.0), min_size=1, max_size=8),
       gap=st.floats(0.0, 120.0), origin=st.floats(0.0, 1e4), down_interval=st.floats(1.0, 60.0))
def test_a_restarted_scheduler_sees_each_source_as_one_that_never_stopped(
        silences, gap, origin, down_interval):
    """Differential: a scheduler restored from a state saved ``gap`` wall-clock seconds ago,
    on a clock of its own, holds the same sources DOWN, each silent as long, as the scheduler
    that saved it and kept running (silences kept clear of down_interval by more than the
    receiver's once-a-second look for silent views)."""
    assume(all(abs(q - down_interval) > 1.5 and abs(q + gap + 2.0 - down_interval) > 1.5
               for q in silences))
    wall = 1_700_000_000.0
    running = _cache(clock=1000.0, wall=wall, down_interval=down_interval)
    for i, quiet in enumerate(silences):
        running.receiver.receive(Snapshot(f"cn-{i}", 1, 1, {"compute": {"vcpus": 4}}),
                                 1000.0 - quiet)
    running.receiver.tick(1000.0)
    data = running.dump_state()
    running.receiver.tick(1000.0 + gap + 2.0)
    restored = _cache(clock=origin, wall=wall + gap, down_interval=down_interval)
    restored.restore_state(data, "test")
    restored.receiver.tick(origin + 2.0)

    def down(cache: HostStateCache) -> set[str]:
        return {s for s, v in cache.receiver.sources.items() if v.down}

    def silent(cache: HostStateCache, now: float) -> dict[str, float]:
        return {s: now - v.last_heard for s, v in cache.receiver.sources.items()}

    assert down(restored) == down(running)
    assert silent(restored, origin + 2.0) == pytest.approx(silent(running, 1000.0 + gap + 2.0),
                                                           abs=1e-6)


# -- the backlog a restarted scheduler catches up on (design §4.4) ---------------------------

class _Clocks:
    """A scheduler's two clocks, set by the test: its own (``now``) and the wall clock."""

    def __init__(self, now: float, wall: float) -> None:
        self.now, self.wall = now, wall

    def cache(self, down_interval: float = 30.0) -> HostStateCache:
        return HostStateCache(ReceiverMachine("s0", down_interval=down_interval),
                              lambda endpoint, msg: None, decoder=Decoder(),
                              clock=lambda: self.now, wall_clock=lambda: self.wall)


def _beat(source: str, seq: int) -> bytes:
    """A source's next version on the stream (any message is proof of life)."""
    return Encoder().encode(Snapshot(source, 1, seq, {"compute": {"vcpus": 4}}))


def test_a_backlog_counts_as_heard_when_published_and_live_messages_when_applied():
    """A scheduler made at wall-clock W reads, 10 s later, the last word of a host that died
    at W - 35 and of one that spoke at W - 5 (published before W: the backlog of its
    restart), and the messages of a live host whose publisher's clock is 50 s behind."""
    wall = 1_700_000_000.0
    clocks = _Clocks(now=3.0, wall=wall)
    cache = clocks.cache()
    clocks.now, clocks.wall = 13.0, wall + 10.0
    cache.ingest_stream_batch([(_beat("cn-dead", 1), 0, wall - 35.0),
                               (_beat("cn-recent", 1), 1, wall - 5.0),
                               (_beat("cn-skewed", 1), 2, wall - 50.0 + 9.0),
                               (_beat("cn-ahead", 1), 3, wall + 100.0)])
    views = cache.receiver.sources
    # 45 s ago: DOWN the moment it is read, without waiting for a look for silent views
    assert views["cn-dead"].state is SourceState.DOWN
    assert views["cn-dead"].last_heard == pytest.approx(13.0 - 45.0)
    assert views["cn-recent"].state is SourceState.ACTIVE
    assert views["cn-recent"].last_heard == pytest.approx(13.0 - 15.0)
    # published before W by the scheduler's clock: read as 51 s ago, so DOWN until its next
    # word; the next one, published after W by that clock, counts as heard when applied
    assert views["cn-skewed"].state is SourceState.DOWN
    assert cache.receiver.stats["went_down"] == 2
    cache.ingest_stream_batch([(_beat("cn-skewed", 2), 4, wall - 50.0 + 61.0)])
    assert views["cn-skewed"].state is SourceState.ACTIVE
    assert views["cn-skewed"].last_heard == 13.0
    # a publisher's clock ahead of ours counts no later than now
    assert views["cn-ahead"].state is SourceState.ACTIVE
    assert views["cn-ahead"].last_heard == 13.0
    # cn-recent's 30 s of silence end at 28, as if it had been heard live
    clocks.now = 27.5
    cache.tick()
    assert views["cn-recent"].state is SourceState.ACTIVE
    clocks.now = 28.6
    cache.tick()
    assert views["cn-recent"].state is SourceState.DOWN


def test_a_message_without_a_publish_time_counts_as_heard_when_applied():
    clocks = _Clocks(now=3.0, wall=1_700_000_000.0)
    cache = clocks.cache()
    clocks.now = 100.0
    cache.ingest_stream(_beat("cn-1", 1), 0)
    cache.ingest_stream_batch([(_beat("cn-2", 1), 1, None)])
    assert {v.last_heard for v in cache.receiver.sources.values()} == {100.0}


@settings(max_examples=300, deadline=None)
@given(sources=st.lists(st.tuples(st.floats(0.0, 120.0),
                                  st.lists(st.floats(0.001, 0.999), max_size=4)),
                        min_size=1, max_size=6),
       gap=st.floats(1.0, 120.0), origin=st.floats(0.0, 1e4), down_interval=st.floats(1.0, 60.0))
def test_a_restarted_scheduler_that_caught_up_sees_each_source_as_one_that_never_stopped(
        sources, gap, origin, down_interval):
    """Differential: a scheduler stops at a cut of its view and starts again ``gap``
    wall-clock seconds later, on a clock of its own, restores the cut and reads the stream
    from it: every message published meanwhile, in order, some sources still speaking and
    some dead.  Two seconds later it holds the same sources DOWN, each silent as long, as
    the scheduler that never stopped and read each message as it was published (silences
    kept clear of down_interval by more than the receiver's once-a-second look).  Each
    source: silent ``quiet`` seconds at the cut, then versions at the given fractions of
    the gap."""
    wall = 1_700_000_000.0
    end = 1000.0 + gap + 2.0
    last = {f"cn-{i}": 1000.0 + gap * max(at) if at else 1000.0 - quiet
            for i, (quiet, at) in enumerate(sources)}
    assume(all(abs(end - heard - down_interval) > 1.5 for heard in last.values()))
    assume(all(abs(quiet - down_interval) > 1.5 for quiet, _ in sources))
    published = sorted((1000.0 + gap * f, f"cn-{i}", seq)
                       for i, (_, at) in enumerate(sources)
                       for seq, f in enumerate(sorted(at), start=2))
    running_clocks = _Clocks(now=0.0, wall=wall - 1000.0)
    running = running_clocks.cache(down_interval)
    for i, (quiet, _) in enumerate(sources):
        running_clocks.now = 1000.0 - quiet
        running_clocks.wall = wall - quiet
        running.ingest_stream_batch([(_beat(f"cn-{i}", 1), i, None)])
    running_clocks.now, running_clocks.wall = 1000.0, wall
    running.tick()
    data = running.dump_state()
    backlog = []
    for offset, (at, source, seq) in enumerate(published, start=len(sources)):
        body = _beat(source, seq)
        running_clocks.now, running_clocks.wall = at, wall + at - 1000.0
        running.ingest_stream_batch([(body, offset, running_clocks.wall)])
        backlog.append((body, offset, running_clocks.wall))
    running_clocks.now, running_clocks.wall = end, wall + gap + 2.0
    running.tick()

    restarted_clocks = _Clocks(now=origin, wall=wall + gap)
    restarted = restarted_clocks.cache(down_interval)
    restarted.restore_state(data, "test")
    restarted.ingest_stream_batch(backlog)
    restarted_clocks.now, restarted_clocks.wall = origin + 2.0, wall + gap + 2.0
    restarted.tick()

    def down(cache: HostStateCache) -> set[str]:
        return {s for s, v in cache.receiver.sources.items() if v.down}

    def silent(cache: HostStateCache, now: float) -> dict[str, float]:
        return {s: now - v.last_heard for s, v in cache.receiver.sources.items()}

    assert down(restarted) == down(running)
    assert silent(restarted, origin + 2.0) == pytest.approx(silent(running, end), abs=1e-6)
