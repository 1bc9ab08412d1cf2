"""--decisions: recorded decisions re-run on the replayed view come out the same (or say why not)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from unittest import mock

import pytest

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from shared_host_manager.updatelog.format import DECISION, DECISION_END, ENGINE, spec_from_wire, spec_to_wire
from shared_host_manager.updatelog.reader import LogReader, resolve_log
from shared_host_manager.updatelog.replay import Replayer, replay


def _cast(run, decision):
    """Cast a decision's claims to the reporter, as the manager does; returns its rows."""
    for claim in decision.claims:
        run._to_reporter("r0", claim)
    return decision.rows


def _recorded_run(mini_run, *, unbounded_weighers=False, core="nova", recorded_core=None):
    run = mini_run(checkpoint_interval=0.2)
    run.run(5)
    cache = run.caches["s0"]
    engine = DecisionEngine(cache.receiver,
                            config=SchedulerConfig(host_subset_size_min=3, decision_core=core),
                            rng=random.Random(7))
    if unbounded_weighers:  # as engines weighed before the weighers took nova's minval
        for w in engine.weighers:
            w.minval = w.maxval = None
    if recorded_core is not None:  # as an engine of another core records itself
        engine.config = dataclasses.replace(engine.config, decision_core=recorded_core)
    engine.set_observer(run.recorders["s0"])
    placed, failed = [], 0
    for i in range(12):
        spec = RequestSpec(flavor=Flavor(vcpus=1 + i % 2, memory_mb=512 * (1 + i % 3)),
                           num_instances=1 + i % 2, request_id=f"req-{i}", project_id="p1")
        with cache.lock:
            try:
                placed.append(_cast(run, engine.select_destinations(spec, run.clock())))
            except NoValidHost:
                failed += 1
        run.run(2)
    with cache.lock, pytest.raises(NoValidHost):
        engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1000), request_id="too-big"),
                                   run.clock())
    run.settle(10)
    run.close()
    return run, placed


def test_recorded_decisions_come_out_the_same(mini_run):
    run, placed = _recorded_run(mini_run)
    kinds = [r.kind for r in LogReader(resolve_log(run.log("s0")))]
    assert kinds.count(ENGINE) == 1 and kinds.count(DECISION) == 13 and kinds.count(DECISION_END) == 13
    result = replay(resolve_log(run.log("s0")), decisions=True)
    assert result.ok, result.decision_diffs
    assert result.decisions == 13 and result.decisions_checked == 13 and not result.decisions_note
    assert len({s[0][0].source for s in placed}) > 1  # the seeded RNG did spread them


def test_decisions_are_re_run_with_the_weighers_bounds_the_log_recorded(mini_run):
    run, _ = _recorded_run(mini_run, unbounded_weighers=True)
    engine_records = [r for r in LogReader(resolve_log(run.log("s0"))) if r.kind == ENGINE]
    assert engine_records[0].fields[0]["weigher_bounds"] == [[None, None]] * 5
    result = replay(resolve_log(run.log("s0")), decisions=True)
    assert result.ok, result.decision_diffs
    assert result.decisions_checked == 13 and not result.decisions_note


def test_a_changed_option_changes_decisions_and_is_reported(mini_run):
    run, _ = _recorded_run(mini_run)
    result = replay(resolve_log(run.log("s0")), decisions=True,
                    decision_options={"ram_weight_multiplier": "-1.0", "host_subset_size_min": "1"})
    assert result.decisions_checked == 13
    assert result.decision_diffs
    diff = result.decision_diffs[0]
    assert diff["recorded"] != diff["replayed"] and "recorded" in diff["what"]
    # the replay is still faithful: only the re-run decisions differ
    assert not result.mismatches and not result.effect_mismatches


@pytest.mark.nova
def test_a_log_of_the_engines_former_ports_re_runs_with_novas_classes(mini_run):
    """A log recorded while the engine decided with its own ports of nova's filters and
    weighers (``decision_core = own``, held equal to nova's classes) re-runs with nova's
    classes, the one core there is, and its decisions come out the same."""
    run, _ = _recorded_run(mini_run, recorded_core="own")
    engine_records = [r for r in LogReader(resolve_log(run.log("s0"))) if r.kind == ENGINE]
    assert engine_records[0].fields[0]["config"]["decision_core"] == "own"
    result = replay(resolve_log(run.log("s0")), decisions=True)
    assert result.decisions_checked == 13 and not result.decisions_note
    assert result.decision_diffs == [] and result.ok


@pytest.mark.nova
def test_decisions_recorded_with_novas_classes_replay_with_them(mini_run):
    """An engine that decided with nova's classes records its core with its options: the
    replay re-runs its decisions with nova's classes too, and they come out the same."""
    pytest.importorskip("nova.scheduler")
    run, placed = _recorded_run(mini_run, core="nova")
    engine_records = [r for r in LogReader(resolve_log(run.log("s0"))) if r.kind == ENGINE]
    assert engine_records[0].fields[0]["config"]["decision_core"] == "nova"
    assert engine_records[0].fields[0]["filters"][0] == "ComputeFilter"
    from shared_host_manager.nova.core import plugins as core_plugins

    with mock.patch.object(core_plugins, "load_core", wraps=core_plugins.load_core) as loaded:
        result = replay(resolve_log(run.log("s0")), decisions=True)
    assert loaded.call_count == 1  # the replay's engine loaded nova's classes
    assert result.ok, result.decision_diffs
    assert result.decisions_checked == 13 and not result.decisions_note
    assert len({s[0][0].source for s in placed}) > 1


def test_replay_without_decisions_only_counts_them(mini_run):
    run, _ = _recorded_run(mini_run)
    result = replay(resolve_log(run.log("s0")))
    assert result.ok and result.decisions == 13 and result.decisions_checked == 0


def test_request_specs_survive_the_log():
    spec = RequestSpec(flavor=Flavor(vcpus=2, memory_mb=1024, extra_specs={"hw:cpu_policy": "dedicated"}),
                       image_properties={"hw_architecture": "x86_64"}, project_id="p", user_id="u",
                       instance_uuids=("a", "b"), instance_group=InstanceGroup("anti-affinity", ["x"]),
                       scheduler_hints={"same_host": ["a"]}, ignore_hosts=("h1",), availability_zone="az1",
                       extra_resources={"vgpu": 1}, request_id="r")
    back = spec_from_wire(spec_to_wire(spec))
    assert back == spec
    assert back.resources == spec.resources


def test_decisions_among_peers_replay_with_the_scarce_requests_remembered(mini_run):
    # With peers, a request two hosts fit is scarce: the engine remembers it, keeps those
    # hosts from the small requests that follow, and the log carries that memory.
    run = mini_run(checkpoint_interval=0.2)
    run.run(5)
    cache = run.caches["s0"]
    engine = DecisionEngine(cache.receiver, config=SchedulerConfig(), rng=random.Random(7))
    engine.set_peers(["s0", "s1"])
    engine.set_observer(run.recorders["s0"])
    for i in range(9):
        big = i % 3 == 0  # 13.5 GB: only the two largest hosts (14 and 15 GB) fit
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=13_500 if big else 512),
                           request_id=f"req-{i}", project_id="p1")
        with cache.lock:
            try:
                _cast(run, engine.select_destinations(spec, run.clock()))
            except NoValidHost:
                pass
        run.run(2)
    run.settle(10)
    run.close()
    assert engine.stats["scarce_choices"] >= 1
    records = [r for r in LogReader(resolve_log(run.log("s0"))) if r.kind == DECISION]
    assert any(r.fields[0]["scarce"] for r in records)
    result = replay(resolve_log(run.log("s0")), decisions=True)
    assert result.ok, result.decision_diffs
    assert result.decisions == 9 and result.decisions_checked == 9


def test_decisions_after_a_part_base_re_run_with_the_claims_held_there(mini_run, monkeypatch):
    """A log whose oldest parts were deleted: its first part's base repeats the engine's
    configuration and lists the claims held (s0's announced ones, s1's own pending), so the
    decisions after it -- within peer_claim_ttl of it too -- come out the same."""
    run = mini_run(max_file_bytes=16 * 1024, checkpoint_interval=0.1, max_total_bytes=96 * 1024)
    run.settle(5)
    cache = run.caches["s1"]
    engine = DecisionEngine(cache.receiver, config=SchedulerConfig(host_subset_size_min=3),
                            rng=random.Random(7))
    engine.set_observer(run.recorders["s1"])
    sources = sorted(run.sources)
    for i in range(40):
        run.change(3)
        # s0's claims reach s1 as announcements; every other one never reaches its host
        run.claim("s0", sources[i % len(sources)], {"memory_mb": 1024},
                  announce=True, lost=i % 2 == 1)
        spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512), request_id=f"req-{i}",
                           project_id="p1")
        with cache.lock, contextlib.suppress(NoValidHost):
            _cast(run, engine.select_destinations(spec, run.clock()))
        run.pump()
    run.close()
    parts = resolve_log(run.log("s1"))
    assert not parts[0].endswith(".0001"), "the oldest parts were not deleted"
    assert ENGINE in [r.kind for r in LogReader(parts[:1])]
    result = replay(parts, decisions=True)
    assert result.ok and not result.decisions_note, (result.mismatches, result.decision_diffs)
    assert result.decisions_checked >= 10
    # without the claims the base lists, the decisions after it see emptier hosts
    monkeypatch.setattr(Replayer, "_restore_claims", lambda self, rec: None)
    unrestored = replay(parts, decisions=True)
    assert unrestored.decision_diffs and unrestored.decisions_checked == result.decisions_checked
