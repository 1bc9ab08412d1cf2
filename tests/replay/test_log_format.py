"""The update-log file format: framing, rotation, sessions, and damage (truncation, flipped bytes)."""

from __future__ import annotations

import functools
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ulog_harness import RECEIVER_PARAMS, MiniRun

from protocol.codec import Encoder
from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine
from shared_host_manager.cache import HostStateCache
from shared_host_manager.updatelog import recorder as recorder_module
from shared_host_manager.updatelog.format import (
    CHECKPOINT,
    FRAME,
    MAGIC,
    RESTORE,
    RX_CELL_STREAM,
    RX_STREAM,
    ViewStates,
    part_paths,
)
from shared_host_manager.updatelog.reader import LogReader, resolve_log
from shared_host_manager.updatelog.recorder import Recorder
from shared_host_manager.updatelog.replay import Replayer, gap_text, replay


def _states(result):
    vs = ViewStates()
    vs.scan(result.receiver.sources)
    return vs.states


def _live_states(cache):
    vs = ViewStates()
    with cache.lock:
        vs.scan(cache.receiver.sources)
    return vs.states


def test_parts_rotate_each_with_a_header_and_numbering_continues(mini_run):
    run = mini_run(max_file_bytes=4096, checkpoint_interval=0.1)
    run.run(30)
    run.settle(5)
    live = _live_states(run.caches["s0"])
    run.close()
    parts = resolve_log(run.log("s0"))
    assert len(parts) > 3
    reader = LogReader(parts)
    indices = [rec.index for rec in reader if rec.index >= 0]
    assert indices == list(range(len(indices)))
    assert len(reader.headers) == len(parts)
    assert [h["part"] for h in reader.headers] == list(range(1, len(parts) + 1))
    assert {h["session"] for h in reader.headers} == {run.recorders["s0"].session}
    for path in parts:
        with open(path, "rb") as f:
            assert f.read(len(MAGIC)) == MAGIC
    # a later part read alone keeps the global numbering
    later = LogReader(parts[2:3])
    first = next(rec.index for rec in later if rec.index >= 0)
    assert first == later.headers[0]["first_record"] > 0
    result = replay(parts)
    assert result.ok and result.damage is None and result.checkpoints > 5
    assert _states(result) == live


def test_retention_deletes_the_oldest_parts_and_the_rest_replays(mini_run):
    """max_total_bytes deletes whole parts, oldest first, never the one being written; each
    part starts with a base (the views held), so what is left replays to the live state."""
    run = mini_run(max_file_bytes=4096, checkpoint_interval=0.1, max_total_bytes=24 * 1024)
    run.run(40)
    run.settle(5)
    live = _live_states(run.caches["s0"])
    run.close()
    parts = resolve_log(run.log("s0"))
    assert not parts[0].endswith(".0001"), "the oldest parts were not deleted"
    assert run.recorders["s0"]._writer.deleted
    assert sum(os.path.getsize(p) for p in parts[:-1]) <= 24 * 1024
    result = replay(parts)
    assert result.ok and result.damage is None and result.checkpoints > 3, result.mismatches[:3]
    assert _states(result) == live
    assert any("retention" in text for _, _, text in result.notes)


def test_part_bases_are_skipped_when_the_session_is_replayed_whole(mini_run):
    run = mini_run(max_file_bytes=4096, checkpoint_interval=0.1)
    run.run(20)
    run.settle(5)
    live = dict(run.caches["s0"].receiver.stats)
    run.close()
    parts = resolve_log(run.log("s0"))
    restores = [rec for rec in LogReader(parts) if rec.kind == RESTORE]
    assert len(parts) > 2 and restores, "no part base was written"
    result = replay(parts)
    assert result.ok and result.receiver.stats == live  # the bases changed nothing


def test_a_cell_streams_messages_are_recorded_with_their_cell_and_offsets(mini_run):
    """A scheduler reading a cell's stream records each message with the cell and the
    offset on that stream; replay reports the offsets it never received, by cell."""
    run = mini_run(checkpoint_interval=0.1)
    run.cell["s1"] = "cell1"
    run.drop["s1"] = {4}
    run.run(10)
    run.settle(10)
    live = _live_states(run.caches["s1"])
    run.close()
    kinds = [(rec.kind, rec.fields[:2]) for rec in LogReader(resolve_log(run.log("s1")))
             if rec.kind in (RX_STREAM, RX_CELL_STREAM)]
    assert kinds and all(kind == RX_CELL_STREAM and f[0] == "cell1" for kind, f in kinds)
    assert [f[1] for _, f in kinds][:5] == [0, 1, 2, 3, 5]
    result = replay(resolve_log(run.log("s1")))
    assert result.ok and _states(result) == live
    assert [gap[1:] for gap in result.stream_gaps] == [(4, 4, "cell1")]
    assert gap_text(result.stream_gaps[0]) == "cell cell1 4"
    # the deployment's stream: offsets of its own, no cell
    other = replay(resolve_log(run.log("s0")))
    assert other.ok and other.stream_gaps == []


def test_restarted_scheduler_appends_a_new_session(mini_run):
    run = mini_run(checkpoint_interval=0.1)
    run.run(10)
    run.recorders["s0"].close()
    records_before = run.recorders["s0"].records
    # "restart" s0: a fresh cache and receiver, recording into the same directory
    rec = Recorder(run.directory, checkpoint_interval=0.1)
    cache = HostStateCache(ReceiverMachine("s0", **RECEIVER_PARAMS), run._to_reporter,
                           clock=run.clock, recorder=rec)
    run.caches["s0"], run.recorders["s0"], run.read["s0"] = cache, rec, 0
    run.run(10)
    run.settle(5)
    live = _live_states(cache)
    run.close()
    parts = resolve_log(run.log("s0"))
    assert len(parts) == 2
    reader = LogReader(parts)
    list(reader)
    assert [h["first_record"] for h in reader.headers] == [0, records_before]
    result = replay(parts)
    assert result.sessions == 2 and result.ok
    assert result.records == rec.records
    assert _states(result) == live


def test_torn_tail_of_a_crashed_session_ends_only_that_session(mini_run):
    run = mini_run(checkpoint_interval=0.1)
    run.run(10)
    run.recorders["s0"].close()
    first = resolve_log(run.log("s0"))[0]
    size = os.path.getsize(first)
    with open(first, "r+b") as f:  # the crash cut the last record short
        f.truncate(size - 3)
    rec = Recorder(run.directory, checkpoint_interval=0.1)
    cache = HostStateCache(ReceiverMachine("s0", **RECEIVER_PARAMS), run._to_reporter,
                           clock=run.clock, recorder=rec)
    run.caches["s0"], run.recorders["s0"], run.read["s0"] = cache, rec, 0
    run.run(5)
    run.settle(5)
    live = _live_states(cache)
    run.close()
    result = replay(resolve_log(run.log("s0")))
    assert result.damage is None and len(result.damages) == 1 and result.damages[0].resumed
    assert result.damages[0].path == first and 0 < result.damages[0].offset < size
    assert result.sessions == 2 and result.ok
    assert _states(result) == live


# -- random damage -----------------------------------------------------------------------


@functools.cache
def _sample_log() -> tuple[bytes, list[tuple[int, int]]]:
    """One small recorded log: its bytes and every record's (start, end) byte range."""
    directory = tempfile.mkdtemp(prefix="ulog-sample-")
    run = MiniRun(directory, sources=4, schedulers=("s0",), checkpoint_interval=0.1,
                        record_reporter=False)
    run.run(12)
    run.claim("s0", "cn01", {"vcpus": 1, "memory_mb": 256})
    run.run(4)
    run.close()
    [path] = part_paths(run.log("s0"))
    with open(path, "rb") as f:
        data = f.read()
    spans = []
    pos = len(MAGIC)
    while pos < len(data):
        length, _ = FRAME.unpack_from(data, pos)
        spans.append((pos, pos + FRAME.size + length))
        pos += FRAME.size + length
    return data, spans[1:]  # the first frame is the header


@functools.cache
def _reference_states(last: int) -> dict:
    data, _ = _sample_log()
    path = _write(data)
    return _states(replay([path], at=last))


def _write(data: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="ulog-damaged-", suffix=".ulog.0001")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _check_prefix(path: str, replayed_expected: int) -> None:
    result = replay([path])
    assert result.records == replayed_expected
    assert not result.mismatches and not result.effect_mismatches
    if replayed_expected and result.receiver is not None:
        assert _states(result) == _reference_states(replayed_expected - 1)


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.data())
def test_truncated_log_replays_its_prefix_and_says_where(data):
    log, spans = _sample_log()
    cut = data.draw(st.integers(0, len(log) - 1), label="cut")
    path = _write(log[:cut])
    try:
        complete = [i for i, (_, end) in enumerate(spans) if end <= cut]
        result = replay([path])
        if cut < spans[0][0]:  # magic or header cut
            assert result.damage is not None and result.damage.offset == 0 and result.records == 0
            return
        on_boundary = cut == (spans[len(complete) - 1][1] if complete else spans[0][0])
        if on_boundary:
            assert result.damage is None
        else:
            assert result.damage is not None
            assert result.damage.offset == spans[len(complete)][0]
            assert result.damage.record == len(complete)
            assert "truncated" in result.damage.reason
        _check_prefix(path, len(complete))
    finally:
        os.unlink(path)


@_SETTINGS
@given(st.data())
def test_flipped_bytes_stop_the_replay_at_the_damaged_record(data):
    log, spans = _sample_log()
    pos = data.draw(st.integers(0, len(log) - 1), label="pos")
    mask = data.draw(st.integers(1, 255), label="mask")
    damaged = bytearray(log)
    damaged[pos] ^= mask
    path = _write(bytes(damaged))
    try:
        result = replay([path])
        if pos < spans[0][0]:
            assert result.damage is not None and result.damage.offset == 0 and result.records == 0
            return
        k = next(i for i, (start, end) in enumerate(spans) if start <= pos < end)
        assert result.damage is not None
        assert result.damage.offset == spans[k][0] and result.damage.record == k
        _check_prefix(path, k)
    finally:
        os.unlink(path)


def test_garbage_and_empty_files_are_damage_not_crashes(tmp_path):
    for name, content in (("empty", b""), ("garbage", os.urandom(300)), ("magic-only", MAGIC),
                          ("bad-frame", MAGIC + FRAME.pack(1 << 31, 0) + b"x" * 20)):
        path = tmp_path / f"{name}.ulog.0001"
        path.write_bytes(content)
        result = replay([str(path)])
        assert result.damage is not None and result.damage.offset == 0 and result.records == 0
    missing = replay([str(tmp_path / "nope.ulog.0001")])
    assert missing.damage is not None and "unreadable" in missing.damage.reason


# -- peer claims in checkpoints ------------------------------------------------------------


def _peer_ledgers(receiver):
    return {source: {cid: (held.deadline, dict(held.claim.resources), held.claim.instance)
                     for cid, held in view.peer.items()}
            for source, view in receiver.sources.items() if view.peer}


def _peer_run(mini_run, **kw):
    """s0 claims on a host at every step and announces it to s1; every other claim is lost on
    its way to the host, so s1 holds it until its peer_claim_ttl (1 s, 20 steps) runs out;
    every seventh is too big, and s0 forwards its rejection to s1."""
    run = mini_run(max_file_bytes=4096, checkpoint_interval=0.1, **kw)
    run.settle(5)
    sources = sorted(run.sources)
    for step in range(60):
        run.change(3)
        run.claim("s0", sources[step % len(sources)],
                  {"vcpus": 64 if step % 7 == 0 else 1, "memory_mb": 64},
                  announce=True, lost=step % 2 == 1 and step % 7 != 0)
        run.pump()
    return run


def _checkpoints_with_peer_claims(parts):
    return [rec for rec in LogReader(parts) if rec.kind == CHECKPOINT
            and any(state is not None and len(state) > 5 for _, state in rec.fields[2])]


def test_a_replay_starting_at_a_part_base_holds_the_peer_claims_held_there(mini_run, monkeypatch):
    """A part's base checkpoint lists the peer claims held (format 2): a replay of a log whose
    older parts were deleted holds them from its first record on, as the scheduler did, and
    every checkpoint (peer claims included) and the final ledger agree with the live ones."""
    run = _peer_run(mini_run, max_total_bytes=24 * 1024)
    cache = run.caches["s1"]
    with cache.lock:
        live, live_states = _peer_ledgers(cache.receiver), _live_states(cache)
        live_usage = {s: dict(v.peer_usage) for s, v in cache.receiver.sources.items() if v.peer}
        live_rejected = cache.receiver.peer_rejections()
    assert live, "s1 holds no peer claim at the end"
    run.close()
    parts = resolve_log(run.log("s1"))
    assert not parts[0].endswith(".0001"), "the oldest parts were not deleted"
    reader = LogReader(parts)
    base = next(rec for rec in reader if rec.kind == CHECKPOINT)
    assert reader.headers[0]["base"] and any(
        state is not None and len(state) > 5 for _, state in base.fields[2]), \
        "the base the replay starts at holds no peer claim"
    assert base.fields[3]["peer_rejected"], "the base remembers no rejection of a peer claim"
    result = replay(parts)
    assert result.ok and result.checkpoints > 3, result.mismatches[:3]
    assert _states(result) == live_states
    assert _peer_ledgers(result.receiver) == live
    assert {s: dict(v.peer_usage) for s, v in result.receiver.sources.items() if v.peer} == live_usage
    assert result.receiver.peer_rejections() == live_rejected
    assert result.receiver.stats["peer_claims_rejected"] > 0
    # without them the base checkpoint and the next ones differ (what format 1 could not avoid)
    monkeypatch.setattr(Replayer, "_restore_claims", lambda self, rec: None)
    unrestored = replay(parts)
    assert not unrestored.ok and unrestored.mismatches[0]["what"] == "checkpoint"


def test_a_replay_starting_at_a_part_base_holds_our_pending_claims_held_there(mini_run):
    """The checkpoint of a part's base lists this scheduler's pending claims whole: a replay
    starting there retires them as the scheduler did (the same outcomes, as effects)."""
    run = _peer_run(mini_run, max_total_bytes=24 * 1024)
    cache = run.caches["s0"]
    with cache.lock:
        live_states = _live_states(cache)
        live = {s: {cid: (p.deadline, p.accepted, dict(p.claim.resources)) for cid, p in v.pending.items()}
                for s, v in cache.receiver.sources.items() if v.pending}
    assert live, "s0 has no pending claim at the end"
    run.close()
    parts = resolve_log(run.log("s0"))
    assert not parts[0].endswith(".0001"), "the oldest parts were not deleted"
    base = next(rec for rec in LogReader(parts) if rec.kind == CHECKPOINT)
    assert base.fields[3]["pending"], "the base the replay starts at holds no pending claim"
    result = replay(parts)
    assert result.ok and result.checkpoints > 3, (result.mismatches + result.effect_mismatches)[:3]
    assert _states(result) == live_states
    assert {s: {cid: (p.deadline, p.accepted, dict(p.claim.resources)) for cid, p in v.pending.items()}
            for s, v in result.receiver.sources.items() if v.pending} == live


def test_peer_claims_in_checkpoints_of_a_whole_session_and_of_a_format_1_log(mini_run, monkeypatch):
    """A session replayed whole holds the same peer claims at every checkpoint; a log of
    format 1 (checkpoints without peer claims) still reads, compared without them."""
    run = _peer_run(mini_run)
    parts = resolve_log(run.log("s1"))
    run.close()
    assert _checkpoints_with_peer_claims(parts)
    result = replay(parts)
    assert result.ok and result.checkpoints > 20, result.mismatches[:3]
    assert _peer_ledgers(result.receiver) == _peer_ledgers(run.caches["s1"].receiver)

    monkeypatch.setattr(recorder_module, "FORMAT", 1)
    monkeypatch.setattr(recorder_module, "ViewStates", functools.partial(ViewStates, peers=False))
    old = _peer_run(mini_run)
    old.close()
    parts = resolve_log(old.log("s1"))
    reader = LogReader(parts)
    list(reader)
    assert not _checkpoints_with_peer_claims(parts) and reader.headers[0]["format"] == 1
    result = replay(parts)
    assert result.ok and result.checkpoints > 20, result.mismatches[:3]
    assert _peer_ledgers(result.receiver) == _peer_ledgers(old.caches["s1"].receiver)


def _replays_with_dead_and_quiet_down(cache: HostStateCache, recorder: Recorder) -> None:
    """``cache`` holds cn-dead and cn-quiet DOWN, cn-live up, and its log replays so."""
    live = _live_states(cache)
    recorder.close()
    down = {s for s, v in cache.receiver.sources.items() if v.down}
    assert down == {"cn-dead", "cn-quiet"}
    result = replay(resolve_log(recorder.path))
    assert result.ok and result.damage is None, result.mismatches[:3]
    assert _states(result) == live
    assert {s for s, v in result.receiver.sources.items() if v.down} == down


def test_a_restored_views_silence_is_recorded_and_replayed(tmp_path):
    """A restore record carries when its source was last heard: replayed, the host that died
    before the state was saved is DOWN again, and the silent one goes DOWN when it did."""
    wall = [1_700_000_000.0]
    running = HostStateCache(ReceiverMachine("s0", down_interval=30.0), lambda e, m: None,
                             clock=lambda: 500.0, wall_clock=lambda: wall[0])
    for source, at in (("cn-dead", 0.0), ("cn-quiet", 480.0), ("cn-live", 500.0)):
        running.receiver.receive(Snapshot(source, 1, 1, {"compute": {"vcpus": 4}}), at)
    running.receiver.tick(500.0)
    data = running.dump_state()
    now = [7.0]
    wall[0] += 5.0
    fresh = HostStateCache(ReceiverMachine("s0", down_interval=30.0), lambda e, m: None,
                           clock=lambda: now[0], wall_clock=lambda: wall[0])
    recorder = Recorder(str(tmp_path), checkpoint_interval=0.1)
    fresh.set_recorder(recorder)
    fresh.restore_state(data, "test")
    for now[0] in (8.0, 9.5, 11.0, 13.0):
        fresh.tick()
    _replays_with_dead_and_quiet_down(fresh, recorder)


def test_a_backlogs_publish_times_are_recorded_and_replayed(tmp_path):
    """A stream message of a restart's backlog is recorded with when it counted as heard:
    replayed, the host whose last word is in the backlog but long ago is DOWN again at once,
    and the one that spoke recently goes DOWN when it did."""
    wall, now = [1_700_000_000.0], [7.0]
    fresh = HostStateCache(ReceiverMachine("s0", down_interval=30.0), lambda e, m: None,
                           clock=lambda: now[0], wall_clock=lambda: wall[0])
    recorder = Recorder(str(tmp_path), checkpoint_interval=0.1)
    fresh.set_recorder(recorder)
    now[0], wall[0] = 9.0, wall[0] + 2.0
    doc = {"compute": {"vcpus": 4}}
    fresh.ingest_stream_batch([
        (Encoder().encode(Snapshot("cn-dead", 1, 1, doc)), 0, wall[0] - 60.0),
        (Encoder().encode(Snapshot("cn-quiet", 1, 1, doc)), 1, wall[0] - 20.0),
        (Encoder().encode(Snapshot("cn-live", 1, 1, doc)), 2, wall[0])])
    for now[0] in (9.5, 11.0, 19.5):
        fresh.tick()
    _replays_with_dead_and_quiet_down(fresh, recorder)


def test_a_later_part_replays_a_source_that_went_silent_before_it_as_down(mini_run):
    """A part's base restores each view last heard when it was: a host that went silent (and
    DOWN) before the part began is DOWN in a replay of that part alone, as it was live."""
    run = mini_run(max_file_bytes=4096, checkpoint_interval=0.1)
    run.run(10)
    run.sources.pop("cn03")  # dies without a goodbye: silent from now on
    run.run(120)
    live = _live_states(run.caches["s0"])
    assert run.caches["s0"].receiver.sources["cn03"].down
    run.close()
    parts = resolve_log(run.log("s0"))
    assert len(parts) > 3
    result = replay(parts[-2:])
    assert result.ok and result.damage is None, result.mismatches[:3]
    assert result.receiver.sources["cn03"].down
    assert _states(result) == live
