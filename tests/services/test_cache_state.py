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
