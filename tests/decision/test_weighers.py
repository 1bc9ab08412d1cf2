"""The engine's weighing around nova's weighers: nova's normalisation, multipliers, aggregate
overrides, clamping, ties ordered by source id, and fast weights bit-identical to slow ones.

The weighers are nova 34's own classes (the ``nova`` decision core); every ranking is taken
on both paths and must be the same."""

from __future__ import annotations

import random

import pytest

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.request import RequestSpec
from shared_host_manager.decision.weights import normalize
from simulator.synthetic_hosts import host_doc, load_receiver

pytestmark = pytest.mark.nova


def _ranked(weighers, docs, **options):
    """Hosts and weights (rounded) as the engine ranks ``docs`` with only ``weighers``; the
    fast and the slow path must agree to the bit."""
    config = SchedulerConfig(enabled_filters=(), weight_classes=tuple(weighers), **options)
    fast, slow = (DecisionEngine(load_receiver(docs), config=config, path=path).ordered_hosts(
        RequestSpec()) for path in ("fast", "slow"))
    assert fast == slow
    return [(source, round(weight, 6)) for source, weight in fast]


def _ram_docs():
    # nova's test_ram weigher fixture shape: free RAM 512, 1024, 3072, 8192 MB
    return {f"host{i}": host_doc(f"host{i}", memory_mb=free, memory_mb_used=0)
            for i, free in enumerate((512, 1024, 3072, 8192), start=1)}


def test_normalize_is_novas():
    assert normalize([1, 2, 3], 1, 3) == [0.0, 0.5, 1.0]
    assert normalize([5, 5], 5, 5) == [0.0, 0.0]
    assert normalize([], 0, 0) == []


def test_ram_weigher_spreads_by_default_and_stacks_with_negative_multiplier():
    # nova's minval = 0: free / most free, as nova's own test_ram asserts (512 / 8192)
    ranked = _ranked(["RAMWeigher"], _ram_docs())
    assert ranked[0] == ("host4", 1.0) and ranked[-1] == ("host1", 0.0625)
    stack = _ranked(["RAMWeigher"], _ram_docs(), ram_weight_multiplier=-1.0)
    assert stack[0] == ("host1", -0.0625) and stack[-1] == ("host4", -1.0)
    double = _ranked(["RAMWeigher"], _ram_docs(), ram_weight_multiplier=2.0)
    assert double[0] == ("host4", 2.0)


def test_free_ram_ignores_ratio_and_counts_reserved():
    docs = {"ratio": host_doc("ratio", memory_mb=1000, ram_ratio=10.0),
            "reserved": host_doc("reserved", memory_mb=2000, reserved={"memory_mb": 500}),
            "plain": host_doc("plain", memory_mb=1600)}
    free = {v.source: HostView(v).free_ram_mb for v in load_receiver(docs).sources.values()}
    assert free == {"ratio": 1000, "reserved": 1500, "plain": 1600}
    assert [s for s, _ in _ranked(["RAMWeigher"], docs)] == ["plain", "reserved", "ratio"]


def test_cpu_weigher_uses_ratio():
    docs = {"a": host_doc("a", vcpus=8, vcpus_used=4, cpu_ratio=16.0),  # 124 free
            "b": host_doc("b", vcpus=32, vcpus_used=0, cpu_ratio=1.0),  # 32 free
            "c": host_doc("c", vcpus=16, vcpus_used=16, cpu_ratio=4.0)}  # 48 free
    assert [s for s, _ in _ranked(["CPUWeigher"], docs)] == ["a", "c", "b"]


def test_disk_weigher_free_disk():
    docs = {"a": host_doc("a", disk_gb=100, disk_gb_used=50), "b": host_doc("b", disk_gb=100)}
    assert _ranked(["DiskWeigher"], docs) == [("b", 1.0), ("a", 0.5)]


def test_num_instances_weigher_default_zero_and_stacking():
    docs = {"busy": host_doc("busy", num_instances=10), "idle": host_doc("idle", num_instances=0)}
    assert {w for _, w in _ranked(["NumInstancesWeigher"], docs)} == {0.0}
    assert _ranked(["NumInstancesWeigher"], docs, num_instances_weight_multiplier=1.0)[0] == (
        "busy", 1.0)


def test_io_ops_weigher_prefers_idle_hosts():
    docs = {"busy": host_doc("busy", num_io_ops=6), "idle": host_doc("idle", num_io_ops=1),
            "mid": host_doc("mid", num_io_ops=3)}
    assert [s for s, _ in _ranked(["IoOpsWeigher"], docs)] == ["idle", "mid", "busy"]


def test_an_aggregate_override_takes_the_minimum_and_a_bad_one_is_ignored():
    same = {"memory_mb": 4096}
    docs = {"both": host_doc("both", aggregates={
        "x": {"name": "x", "metadata": {"ram_weight_multiplier": "3.0"}},
        "y": {"name": "y", "metadata": {"ram_weight_multiplier": "-2.5"}}}, **same),
        "bad": host_doc("bad", aggregates={"z": {"name": "z", "metadata": {
            "ram_weight_multiplier": "lots"}}}, **same),
        "none": host_doc("none", **same)}
    assert dict(_ranked(["RAMWeigher"], docs)) == {"both": -2.5, "bad": 1.0, "none": 1.0}


def test_single_host_weighs_zero():
    assert _ranked(["RAMWeigher"], {"only": host_doc("only")}) == [("only", 0.0)]


def test_ties_are_ordered_by_source_id():
    docs = {name: host_doc(name) for name in ("c", "a", "b")}
    assert [s for s, _ in _ranked(["RAMWeigher", "CPUWeigher"], docs)] == ["a", "b", "c"]


def test_an_overcommitted_host_weighs_zero_on_both_paths():
    # nova's RAM, CPU, disk and I/O-ops weighers clamp at minval = 0 before normalising
    docs = {"over": host_doc("over", memory_mb=1024, memory_mb_used=1536, ram_ratio=2.0),
            "half": host_doc("half", memory_mb=2048, memory_mb_used=1024),
            "full": host_doc("full", memory_mb=4096)}
    assert _ranked(["RAMWeigher"], docs) == [("full", 1.0), ("half", 0.25), ("over", 0.0)]


@pytest.mark.parametrize("seed", range(5))
def test_fast_weights_are_bit_identical_to_slow(seed):
    rng = random.Random(seed)
    docs = {}
    for i in range(40):
        aggs = {}
        if rng.random() < 0.3:
            aggs["m"] = {"name": "m", "metadata": {
                rng.choice(("ram_weight_multiplier", "cpu_weight_multiplier",
                            "io_ops_weight_multiplier")): rng.choice(("0.5", "2", "-1"))}}
        docs[f"cn{i}"] = host_doc(
            f"h{i}", vcpus=rng.choice((4, 8, 16)), vcpus_used=rng.randrange(8),
            cpu_ratio=rng.choice((1.0, 1.5, 16.0)), memory_mb=rng.randrange(1024, 65536, 512),
            memory_mb_used=rng.randrange(0, 1024, 256), disk_gb=rng.randrange(10, 500),
            # some overcommitted: the weighers' minval clamps them to 0
            disk_gb_used=rng.choice((0, 0, 5, 600)),
            num_io_ops=rng.randrange(5), num_instances=rng.randrange(9), aggregates=aggs)
    cfg = SchedulerConfig(num_instances_weight_multiplier=rng.choice((0.0, 1.0, -0.3)))
    spec = RequestSpec()
    fast = DecisionEngine(load_receiver(docs), config=cfg, path="fast")
    slow = DecisionEngine(load_receiver(docs), config=cfg, path="slow")
    assert fast.ordered_hosts(spec) == slow.ordered_hosts(spec)
