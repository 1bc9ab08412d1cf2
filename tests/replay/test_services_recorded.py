"""Real services (threads) on the in-process bus, recorded with the simulator's hook, then replayed."""

from __future__ import annotations

import random
import threading

import pytest
from oslo_config import cfg
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from protocol import codec
from protocol.messages import Batch, Delta
from shared_host_manager.conf import updatelog as updatelog_conf
from shared_host_manager.decision.engine import DecisionEngine
from shared_host_manager.decision.request import Flavor, RequestSpec
from shared_host_manager.updatelog import recorder as updatelog
from shared_host_manager.updatelog.diff import diff_logs
from shared_host_manager.updatelog.format import ViewStates
from shared_host_manager.updatelog.reader import resolve_log
from shared_host_manager.updatelog.recorder import RunRecording
from shared_host_manager.updatelog.replay import replay
from transport.inprocess import InProcessBus
from transport.startup import OperatorError


@pytest.fixture
def bus():
    b = InProcessBus(threaded=True)
    yield b
    b.close()


def _drop_next_delta_batch(sched, armed: threading.Event, dropped: list):
    """Lose (before the cache sees it) the first stream message carrying deltas once ``armed``."""
    ingest = sched.cache.ingest_stream

    def lossy(body, offset=None):
        if armed.is_set() and not dropped:
            msg = codec.decode(body)
            deltas = [i for i in msg.items if type(i) is Delta] if type(msg) is Batch else []
            if deltas:
                dropped.extend(deltas)
                return
        ingest(body, offset)

    def lossy_batch(messages):
        for body, offset, _ in messages:
            lossy(body, offset)

    sched.cache.ingest_stream = lossy
    sched.cache.ingest_stream_batch = lossy_batch  # what the in-process consumer calls


def _states(receiver):
    vs = ViewStates()
    vs.scan(receiver.sources)
    return vs.states


def test_recorded_run_replays_and_the_lost_delta_shows_in_diff(bus, tmp_path):
    recording = RunRecording(str(tmp_path), checkpoint_interval=0.05)
    reporters = [make_reporter(bus, bus, f"r{i}", hosts=8, seed=i, change_interval=0.3,
                               recorder=recording.recorder()) for i in range(2)]
    schedulers = [make_scheduler(bus, bus, f"s{i}") for i in range(2)]
    for s in schedulers:
        recording.attach(s)
    armed, dropped = threading.Event(), []
    _drop_next_delta_batch(schedulers[1], armed, dropped)
    for s in schedulers:
        s.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: all(len(s.receiver.sources) == 16 for s in schedulers), what="all sources")
        s0 = schedulers[0]
        engine = DecisionEngine(s0.receiver, rng=random.Random(3))
        recording.attach(engine)
        with s0.cache.lock:
            decision = engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512),
                                                              request_id="req-1"), s0.clock())
        for claim in decision.claims:
            s0.send_claim(claim)
        armed.set()
        wait_for(lambda: bool(dropped), what="a lost delta")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, schedulers), what="convergence")
    finally:
        for r in reporters:
            r.stop()
        for s in schedulers:
            s.stop()
        recording.close()
    logs = recording.logs()
    assert set(logs) == {("scheduler", "s0"), ("scheduler", "s1"), ("reporter", "r0"), ("reporter", "r1")}
    for s in schedulers:
        result = replay(resolve_log(logs[("scheduler", s.name)]), decisions=True)
        assert result.ok, (result.mismatches, result.effect_mismatches, result.decision_diffs)
        assert result.damage is None and result.checkpoints >= 3
        assert _states(result.receiver) == _states(s.receiver)
    assert replay(resolve_log(logs[("scheduler", "s0")]), decisions=True).decisions_checked == 1
    for r in reporters:
        result = replay(resolve_log(logs[("reporter", r.name)]))
        assert result.ok and result.records > 0 and result.divergences == 0

    lost = {}
    for d in dropped:
        lost[d.source] = min(lost.get(d.source, (d.epoch, d.seq)), (d.epoch, d.seq))
    d = diff_logs(resolve_log(logs[("scheduler", "s0")]), resolve_log(logs[("scheduler", "s1")]))
    found = {x.source: x for x in d.diverged}
    assert set(found) == set(lost), [x.as_dict() for x in d.diverged]
    for source, version in lost.items():
        assert found[source].version == version and found[source].side == "b"
        assert found[source].kind in ("missed_delta", "late_resync")
    # and against the reporter that published it
    reporter = next(r for r in reporters if next(iter(lost)) in r.manager.machines)
    d = diff_logs(resolve_log(logs[("reporter", reporter.name)]), resolve_log(logs[("scheduler", "s1")]))
    mine = {s: v for s, v in lost.items() if s in reporter.manager.machines}
    assert {x.source: x.version for x in d.diverged if x.kind != "behind"} == mine


def test_update_log_options(tmp_path):
    conf = cfg.ConfigOpts()
    updatelog_conf.register_opts(conf)
    conf([], project="shm")
    assert updatelog.from_conf(conf) is None
    conf.set_override("enabled", True, group="update_log")
    with pytest.raises(OperatorError, match="directory"):
        updatelog.from_conf(conf)
    conf.set_override("directory", str(tmp_path), group="update_log")
    conf.set_override("checkpoint_interval", 0.5, group="update_log")
    rec = updatelog.from_conf(conf)
    assert rec.directory == str(tmp_path) and rec.checkpoint_interval == 0.5
    assert rec.max_file_bytes == 256 * 1024 * 1024
    [(group, opts)] = updatelog_conf.list_opts()
    assert group == "update_log" and {o.name for o in opts} == {
        "enabled", "directory", "max_file_bytes", "checkpoint_interval", "max_total_bytes", "max_age"}
    assert rec.max_total_bytes == 2 * 1024 ** 3 and rec.max_age == 7 * 24 * 3600


def test_scheduler_restart_with_restored_state_replays_as_two_sessions(bus, tmp_path):
    recording = RunRecording(str(tmp_path / "logs"), checkpoint_interval=0.05)
    reporter = make_reporter(bus, bus, "r", hosts=6, seed=5, change_interval=0.2)
    reporter.start()
    state_dir = str(tmp_path / "state")
    first = make_scheduler(bus, bus, "s", state_dir=state_dir)
    recording.attach(first)
    first.start()
    try:
        wait_for(lambda: len(first.receiver.sources) == 6, what="sources")
        first.stop()
        wait_for(lambda: reporter.stats["published"] > 3, what="publishing while down")
        again = make_scheduler(bus, bus, "s", state_dir=state_dir)
        recording.attach(again)
        again.start()
        try:
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [again]), what="convergence after restart")
        finally:
            again.stop()
    finally:
        reporter.stop()
        recording.close()
    result = replay(resolve_log(recording.logs()[("scheduler", "s")]))
    assert result.ok and result.sessions == 2 and result.damage is None
    assert _states(result.receiver) == _states(again.receiver)
