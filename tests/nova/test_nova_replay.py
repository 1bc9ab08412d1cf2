"""nova's decisions in a nova-scheduler-shared update log are re-run by ``shm replay --decisions``.

The drop-in decides with nova's real SchedulerManager on a recorded cache; the
replay rebuilds the receiver from the log and re-runs every step with the same
host manager.  Same options: no difference.  A what-if option that changes the
weights: the weigh steps differ, and say how.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import manager as nova_manager  # noqa: E402
from nova.scheduler.weights import ram  # noqa: E402

from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.replay.steps import StepReplayer  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from shared_host_manager.updatelog.recorder import Recorder  # noqa: E402
from shared_host_manager.updatelog.replay import replay  # noqa: E402
from shm_cli import main as cli  # noqa: E402

pytestmark = pytest.mark.nova

N = 10


def _record(tmp_path, nova_conf, patched=None) -> list[str]:
    """A recorded scheduler: a multi-create in an anti-affinity group, a plain request, an
    aggregate update and an instance-info cast between them."""
    fx.setup_nova()
    nodes = [fx.compute_node(i, free_ram_mb=20000 + 1000 * (i % 4)) for i in range(N)]
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                       cell_uuid=fx.CELL1) for cn in nodes}
    cache = fx.cache_from_documents(docs)
    recorder = Recorder(str(tmp_path / "log"))
    cache.set_recorder(recorder)
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    ctx = nova_context.get_admin_context()
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement), patched or contextlib.nullcontext():
            mgr = nova_manager.SchedulerManager()
            uuids = [fx.uuid_for("rp", 1), fx.uuid_for("rp", 2), fx.uuid_for("rp", 3)]
            group = objects.InstanceGroup(policy="anti-affinity", policies=["anti-affinity"],
                                          rules={}, members=list(uuids), hosts=[])
            spec = fx.request_spec(instance_uuid=uuids[0], group=group, num_instances=3)
            mgr.select_destinations(ctx, spec_obj=spec, instance_uuids=uuids, return_objects=True,
                                    return_alternates=True)
            mgr.host_manager.update_aggregates([objects.Aggregate(
                id=7, uuid=fx.uuid_for("agg", 7), name="heavy", hosts=["host1", "host2"],
                metadata={"ram_weight_multiplier": "-2.0"})])
            mgr.host_manager.update_instance_info(
                ctx, "host3", objects.InstanceList(objects=[objects.Instance(uuid=fx.uuid_for("rp", 9))]))
            plain = fx.request_spec(instance_uuid=fx.uuid_for("rp", 4), memory_mb=4096)
            mgr.select_destinations(ctx, spec_obj=plain, instance_uuids=[plain.instance_uuid],
                                    return_objects=True, return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    recorder.close()
    return recorder.files


def test_recorded_nova_decisions_are_re_run_the_same(tmp_path, nova_conf):
    files = _record(tmp_path, nova_conf)
    r = replay(files, decisions=True, host_manager=StepReplayer)
    assert r.decisions == 2 and r.decisions_checked == 2 and r.decisions_skipped == 0
    assert r.decision_diffs == [] and r.ok, r.decision_diffs
    assert r.decisions_note is None
    # without a re-runner, the decisions are counted and the replay says why they were not re-run
    r = replay(files, decisions=True)
    assert r.decisions == 2 and r.decisions_checked == 0 and "cannot re-run" in r.decisions_note


def test_a_what_if_weight_multiplier_shows_in_the_weigh_steps(tmp_path, nova_conf):
    files = _record(tmp_path, nova_conf)
    r = replay(files, decisions=True,
               host_manager=lambda: StepReplayer({"filter_scheduler.ram_weight_multiplier": "-1.0"}))
    assert r.decisions_checked == 2
    assert r.decision_diffs and {d["step"] for d in r.decision_diffs} <= {"weigh", "filter"}
    assert any(d["step"] == "weigh" and " | replayed " in d["what"] for d in r.decision_diffs)
    # the replayer's overrides were undone
    assert nova_conf.conf.filter_scheduler.ram_weight_multiplier == 1.0


def test_decisions_made_by_other_code_are_not_re_run(tmp_path, nova_conf):
    """A weigher patched while the scheduler decided (as nova's own tests do): the replay's
    weigher is not that code, so it says so instead of reporting every weight as different."""
    files = _record(tmp_path, nova_conf, patched=mock.patch.object(
        ram.RAMWeigher, "_weigh_object", lambda self, host_state, spec: 0.0))
    r = replay(files, decisions=True, host_manager=StepReplayer)
    assert r.decisions == 2 and r.decisions_checked == 0 and r.decisions_skipped == 2
    assert r.decision_diffs == [] and r.ok
    assert "RAMWeigher" in r.decisions_note and "other code" in r.decisions_note


def test_shm_replay_decisions_on_a_nova_log(tmp_path, nova_conf, capsys):
    files = _record(tmp_path, nova_conf)
    base = files[0].rsplit(".", 1)[0]
    assert cli.main(["replay", base, "--decisions"]) == 0
    out = capsys.readouterr().out
    assert "decisions: 2 recorded, 2 re-run" in out
    assert cli.main(["replay", base, "--decisions",
                     "--decision-option", "filter_scheduler.ram_weight_multiplier=-1"]) == 1
    with pytest.raises(SystemExit) as exited:
        cli.main(["replay", base, "--decisions", "--decision-option", "filter_scheduler.no_such=1"])
    assert exited.value.code == 2
    assert "nova.conf has no option 'no_such' in [filter_scheduler]" in capsys.readouterr().err


class _CandidatesOfSome(fx.FakePlacement):
    """Placement with no candidate on ``missing`` (in its summaries all the same, as a provider
    whose resources do not fit) and two on ``nested`` (its own and a second mapping)."""

    def __init__(self, providers, missing, nested) -> None:
        super().__init__(providers)
        self.missing, self.nested = missing, nested

    def get_allocation_candidates(self, context, resources):
        reqs, summaries, version = super().get_allocation_candidates(context, resources)
        reqs = [r for r in reqs if self.missing not in r["allocations"]]
        extra = {"allocations": {self.nested: {"resources": {}}},
                 "mappings": {"": [self.nested], "numa": [self.nested]}}
        return [*reqs, extra], summaries, version


def test_numa_requests_re_run_on_placements_candidates(tmp_path, nova_conf):
    """NUMATopologyFilter fits a requested NUMA topology to each of placement's allocation
    candidates: a host without one fails.  The log keeps the candidates of such requests (those
    of the hosts that do not have just their own one), so the re-run decides the same."""
    fx.setup_nova()
    nova_conf.set(**{"filter_scheduler.enabled_filters": ["ComputeFilter", "NUMATopologyFilter"]})
    nodes = [fx.compute_node(i, free_ram_mb=20000 + 1000 * i) for i in range(4)]
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                       cell_uuid=fx.CELL1) for cn in nodes}
    cache = fx.cache_from_documents(docs)
    recorder = Recorder(str(tmp_path / "log"))
    cache.set_recorder(recorder)
    placement = _CandidatesOfSome([cn.uuid for cn in nodes], nodes[3].uuid, nodes[1].uuid)
    ctx = nova_context.get_admin_context()
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement):
            mgr = nova_manager.SchedulerManager()
            spec = fx.request_spec(instance_uuid=fx.uuid_for("pin", 1), vcpus=4,
                                   numa=fx.dedicated_cpus(4))
            chosen = mgr.select_destinations(ctx, spec_obj=spec, instance_uuids=[spec.instance_uuid],
                                             return_objects=True, return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    recorder.close()
    # the best host by RAM had no candidate: nova's filter took it out
    assert chosen[0][0].compute_node_uuid == nodes[2].uuid
    assert {s.compute_node_uuid for s in chosen[0]} == {n.uuid for n in nodes[:3]}
    r = replay(recorder.files, decisions=True, host_manager=StepReplayer)
    assert r.decisions == 1 and r.decisions_checked == 1, r.decisions_note
    assert r.decision_diffs == [] and r.ok, r.decision_diffs


def test_a_request_recorded_against_one_not_in_the_log_is_skipped_not_different(tmp_path, nova_conf):
    """A log whose older parts were deleted starts with requests recorded as changes from
    requests it no longer holds: they are counted as not reproducible, the next whole one
    (every KEYFRAME-th) is re-run again."""
    from shared_host_manager.nova.decision_log import code_digests, nova_options

    fx.setup_nova()
    cache = fx.cache_from_documents({})
    code = code_digests(shm.SharedHostManager(cache, register_claims=False))
    replayer = StepReplayer()
    try:
        assert replayer.step(cache.receiver, 1.0, {"step": "config", "nova": nova_options(),
                                                   "code": code}) is None
        out = replayer.step(cache.receiver, 2.0, {
            "step": "hosts", "id": 70, "base": 69, "added": [], "removed": [], "n": 0,
            "spec": fx.request_spec(instance_uuid=fx.uuid_for("gone", 1)).obj_to_primitive(),
            "wall": 2.0, "peers": []})
        assert "not in the replayed log" in out["skipped"]
        assert replayer.step(cache.receiver, 3.0, {"step": "filter", "id": 70, "n": 0,
                                                   "digest": b""})["skipped"]
    finally:
        replayer.close()
