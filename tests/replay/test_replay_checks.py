"""Replay rebuilds the cache exactly (invariant 5), and a log that does not is caught where it differs."""

from __future__ import annotations

import msgpack

from protocol import codec
from protocol.messages import Batch, Claim, Delta
from shared_host_manager.updatelog.format import (
    CANCEL,
    CHECKPOINT,
    FRAME,
    MAGIC,
    RX_STREAM,
    ViewStates,
    frame,
)
from shared_host_manager.updatelog.reader import LogReader, resolve_log
from shared_host_manager.updatelog.replay import replay


def _live(cache):
    vs = ViewStates()
    with cache.lock:
        vs.scan(cache.receiver.sources)
    return vs.states


def _replayed(result):
    vs = ViewStates()
    vs.scan(result.receiver.sources)
    return vs.states


def test_replay_reaches_every_checkpoint_and_the_final_state(mini_run):
    run = mini_run(checkpoint_interval=0.1)
    run.run(20)
    claims = [run.claim("s0", "cn02", {"vcpus": 1, "memory_mb": 512}),
              run.claim("s1", "cn03", {"vcpus": 100})]  # fits nowhere: rejected
    run.run(10)
    run.drop["s1"].add(len(run.stream))
    run.run(10)
    run.settle(20)
    assert run.converged()
    live = {name: _live(cache) for name, cache in run.caches.items()}
    run.close()
    for name in run.caches:
        result = replay(resolve_log(run.log(name)))
        assert result.ok, (result.mismatches, result.effect_mismatches)
        assert result.damage is None and result.role == "scheduler" and result.name == name
        assert result.checkpoints >= 10 and result.checkpoints_failed == 0
        assert _replayed(result) == live[name]
        assert result.effects_checked > 50
    s0 = replay(resolve_log(run.log("s0")))
    assert s0.sent == 0  # claims from MiniRun go straight to the reporter, not via the service
    assert run.caches["s1"].receiver.stats["claims_rejected"] == 1
    assert claims[0].claim_id not in s0.receiver.sources["cn02"].pending
    reporter = replay(resolve_log(run.log("r0")))
    assert reporter.role == "reporter" and reporter.ok and reporter.divergences == 0
    assert {s: (v.epoch, v.seq) for s, v in reporter.receiver.sources.items()} == \
        {s: sm.version for s, sm in run.sources.items()}


def test_a_cancelled_claim_is_recorded_and_replays(mini_run):
    run = mini_run(checkpoint_interval=0.1)
    run.run(5)
    cache = run.caches["s0"]
    with cache.lock:  # a claim never sent: only cancelling it ends it before its deadline
        view = cache.receiver.sources["cn01"]
        cache.receiver.add_claim(Claim("given-up", "s0", "cn01", view.epoch, view.seq, {"vcpus": 1},
                                       "vm-x"), run.clock())
    run.run(4)  # checkpoints see it pending
    with cache.lock:
        assert cache.receiver.cancel_claim("cn01", "given-up")
    run.run(4)
    live = _live(cache)
    run.close()
    path = resolve_log(run.log("s0"))
    cancels = [r for r in LogReader(path) if r.kind == CANCEL]
    assert [r.fields[:2] for r in cancels] == [["cn01", "given-up"]]
    assert cancels[0].fields[2]["o"] == [["given-up", "cn01", "cancelled"]]
    result = replay(path)
    assert result.ok and result.checkpoints_failed == 0, (result.mismatches, result.effect_mismatches)
    assert _replayed(result) == live
    assert "given-up" not in result.receiver.sources["cn01"].pending


def test_state_at_a_record_or_a_time_equals_the_live_state_then(mini_run):
    run = mini_run(checkpoint_interval=0.3)
    run.run(8)
    run.claim("s0", "cn01", {"vcpus": 2, "memory_mb": 1024})
    run.pump()
    mark_records = run.recorders["s0"].records
    mark_time = run.clock()
    mark_state = _live(run.caches["s0"])
    pending = dict(run.caches["s0"].receiver.sources["cn01"].pending)
    run.run(15)
    run.close()
    parts = resolve_log(run.log("s0"))
    at = replay(parts, at=mark_records - 1)
    assert at.stopped_early and at.last_record == mark_records - 1
    assert _replayed(at) == mark_state
    assert at.receiver.sources["cn01"].pending.keys() == pending.keys()
    until = replay(parts, until=mark_time)
    assert _replayed(until) == mark_state
    assert _replayed(replay(parts)) != mark_state


def _rewrite(path: str, out: str, change) -> None:
    """Copy a log file record by record; ``change(index, record)`` returns the record, or None to drop it."""
    with open(path, "rb") as f:
        data = f.read()
    pos = len(MAGIC)
    chunks = [MAGIC]
    index = -1
    while pos < len(data):
        length, _ = FRAME.unpack_from(data, pos)
        rec = msgpack.unpackb(data[pos + FRAME.size:pos + FRAME.size + length], raw=False)
        pos += FRAME.size + length
        if index >= 0:
            rec = change(index, rec)
        index += 1
        if rec is not None:
            chunks.append(frame(msgpack.packb(rec, use_bin_type=True)))
    with open(out, "wb") as f:
        f.write(b"".join(chunks))


def test_a_lost_record_is_caught_at_the_next_checkpoint(mini_run, tmp_path):
    run = mini_run(schedulers=("s0",), checkpoint_interval=0.2, record_reporter=False)
    run.run(20)
    run.close()
    [path] = resolve_log(run.log("s0"))
    records = [r for r in LogReader([path]) if r.index >= 0]
    # drop a stream message carrying a delta, well after the start
    victim = next(r for r in records[len(records) // 2:] if r.kind == RX_STREAM
                  and any(type(i) is Delta for i in codec.decode(r.fields[1]).items))
    sources = {i.source for i in codec.decode(victim.fields[1]).items if type(i) is Delta}
    next_cp = next(r for r in records if r.kind == CHECKPOINT and r.index > victim.index)
    prev_cp = max(r.index for r in records if r.kind == CHECKPOINT and r.index < victim.index)
    out = str(tmp_path / "tampered.ulog.0001")
    _rewrite(path, out, lambda i, rec: None if i == victim.index else rec)
    result = replay([out])
    assert not result.ok
    first = result.mismatches[0]
    assert first["what"] == "checkpoint"
    # numbering shifted by one after the dropped record
    assert first["record"] == next_cp.index - 1
    assert first["verified_until"] == prev_cp
    assert {s["source"] for s in first["sources"]} <= sources
    assert first["sources"]


def test_a_wrong_checkpoint_digest_is_reported_at_that_record(mini_run, tmp_path):
    run = mini_run(schedulers=("s0",), checkpoint_interval=0.2, record_reporter=False)
    run.run(10)
    run.close()
    [path] = resolve_log(run.log("s0"))
    cps = [r for r in LogReader([path]) if r.kind == CHECKPOINT and r.fields[2]]
    target = cps[len(cps) // 2]
    source = target.fields[2][0][0]

    def corrupt(i, rec):
        if i == target.index:
            rec[4][0][1][2] = b"\x00" * 16  # the first changed view's digest
        return rec

    out = str(tmp_path / "wrong.ulog.0001")
    _rewrite(path, out, corrupt)
    result = replay([out])
    first = result.mismatches[0]
    assert first["record"] == target.index and first["what"] == "checkpoint"
    assert [s["source"] for s in first["sources"]] == [source]


def test_different_effects_are_reported_per_step(mini_run, tmp_path):
    run = mini_run(schedulers=("s1",), checkpoint_interval=10.0, record_reporter=False)
    run.run(6)
    run.drop["s1"].add(len(run.stream))
    run.run(10)
    run.close()
    [path] = resolve_log(run.log("s1"))
    with_sends = [r for r in LogReader([path]) if r.index >= 0 and r.kind != CHECKPOINT and r.fields
                  and isinstance(r.fields[-1], dict) and r.fields[-1].get("s")]
    assert with_sends, "the dropped message should have caused a resync request"
    target = with_sends[0]

    def forget_send(i, rec):
        if i == target.index:
            rec[-1] = {}
        return rec

    out = str(tmp_path / "effects.ulog.0001")
    _rewrite(path, out, forget_send)
    result = replay([out])
    assert [m["record"] for m in result.effect_mismatches] == [target.index]
    assert "resync requests: recorded 0" in result.effect_mismatches[0]["detail"]


def test_batches_from_a_replayed_log_are_the_bytes_received(mini_run):
    run = mini_run(schedulers=("s0",), record_reporter=False)
    run.run(5)
    run.close()
    stream = [r for r in LogReader(resolve_log(run.log("s0"))) if r.kind == RX_STREAM]
    assert [r.fields[1] for r in stream] == run.stream[:len(stream)]
    assert all(type(codec.decode(r.fields[1])) is Batch for r in stream)
