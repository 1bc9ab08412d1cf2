"""Differential: the vectorised fast path decides exactly as the per-host slow path (nova's way).

The engine decides with nova 34's own filter and weigher classes (the ``nova``
decision core): on the fast path through their vector forms over the engine's
index, on the slow path as nova's classes per host.  So this is the core's own
definition of "exact": every filter and weigher below is nova's class except
ResourceFitFilter, AvailabilityZoneFilter and VolumeLocalityFilter, which nova
has no class for.

Random clouds (sizes, usage, ratios, aggregates with metadata and multiplier
overrides, capabilities, instances, server-group members, pending claims,
disabled/forced-down/silent hosts, duplicate host names, a volume backend)
and random requests (flavors, extra specs, image properties, projects,
groups, hints, AZs, ignore/force hosts, multi-instance).  Two receivers hold
the same state; two engines with the same seed decide on them, one per path.

* vector mode: same ordered host list with bit-identical weights, same
  selections (hosts, alternates, weights, claim ids), or the same NoValidHost
  reason (per-filter counts);
* per-host mode (no filter has a vector form, as plugins): same ordered host
  list and the same selections — when at most one weigher is active the fast
  path stops early, so only its weights (relative to the pre-filter set) may differ.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.messages import Claim
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.plugins import load_core
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from simulator.synthetic_hosts import host_doc, load_receiver

AGGREGATES = {
    "agg-ssd": {"name": "ssd", "metadata": {"ssd": "true", "cpu_mhz": "3000"}},
    "agg-hdd": {"name": "hdd", "metadata": {"ssd": "false", "cpu_mhz": "2000"}},
    "agg-az1": {"name": "az1", "metadata": {"availability_zone": "az1"}},
    "agg-az2": {"name": "az2", "metadata": {"availability_zone": "az2"}},
    "agg-tenant": {"name": "t", "metadata": {"filter_tenant_id": "p1,p2"}},
    "agg-ram2": {"name": "r", "metadata": {"ram_weight_multiplier": "2.0"}},
    "agg-mixed": {"name": "m", "metadata": {"cpu_weight_multiplier": "-0.5",
                                            "io_ops_weight_multiplier": "0"}},
}
SUPPORTED = ([["x86_64", "qemu", "hvm"]], [["x86_64", "kvm", "hvm"], ["i686", "kvm", "hvm"]],
             [["aarch64", "qemu", "hvm"]], [])
INSTANCE_POOL = [f"i{k}" for k in range(24)]
#: every filter nova 34 has a class for that this cloud exercises, and the engine's own three
FILTERS = ("ComputeFilter", "ResourceFitFilter", "AvailabilityZoneFilter",
           "AggregateInstanceExtraSpecsFilter", "AggregateMultiTenancyIsolation",
           "ImagePropertiesFilter", "ServerGroupAffinityFilter", "ServerGroupAntiAffinityFilter",
           "SameHostFilter", "DifferentHostFilter", "NumInstancesFilter", "IoOpsFilter",
           "VolumeLocalityFilter")


def mostly(default, other):
    """``default`` three times in four, else a value of ``other`` (restrictions stay occasional)."""
    return st.one_of(st.just(default), st.just(default), st.just(default), other)


host_st = st.fixed_dictionaries({
    "name": st.integers(0, 11),
    "vcpus": st.integers(1, 16),
    "cpu_ratio": st.sampled_from((1.0, 1.5, 4.0)),
    "vcpus_used": st.integers(0, 14),
    "memory_mb": st.integers(2, 32).map(lambda x: x * 512),
    "memory_mb_used": st.integers(0, 8).map(lambda x: x * 512),
    "ram_ratio": st.sampled_from((1.0, 1.5)),
    "disk_gb": mostly(200, st.integers(0, 200)),
    "disk_gb_used": st.integers(0, 30),
    "reserved": st.sampled_from(({}, {"memory_mb": 512}, {"vcpus": 1, "disk_gb": 10})),
    "num_io_ops": st.integers(0, 6),
    "extra_instances": st.integers(0, 4),
    "aggregates": st.sets(st.sampled_from(sorted(AGGREGATES)), max_size=2),
    "supported": st.integers(0, len(SUPPORTED) - 1),
    "hv_version": st.sampled_from((6000000, 6002000, 8002000)),
    "state": st.sampled_from(("ok",) * 12 + ("disabled", "forced_down", "silent")),
    "cell": st.sampled_from(("c1", "c1", "c2")),
})

NONE = frozenset()
request_st = st.fixed_dictionaries({
    "vcpus": st.integers(0, 4),
    "memory_mb": st.integers(0, 8).map(lambda x: x * 256),
    "root_gb": st.integers(0, 2).map(lambda x: x * 10),
    "extra_specs": mostly({}, st.sampled_from((
        {"ssd": "true"}, {"aggregate_instance_extra_specs:cpu_mhz": ">= 2500"},
        {"trust:trusted_host": "true"}))),
    "image": mostly({}, st.sampled_from((
        {"hw_architecture": "x86_64"}, {"img_hv_type": "kvm"},
        {"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.1"}))),
    "project": st.sampled_from(("p1", "p1", "p3")),
    "group": mostly(None, st.sampled_from(("affinity", "anti-affinity"))),
    "members": st.sets(st.sampled_from(INSTANCE_POOL), max_size=4),
    "max_per_host": st.sampled_from((None, 1, 2)),
    "same_host": mostly(NONE, st.sets(st.sampled_from(INSTANCE_POOL), min_size=1, max_size=3)),
    "different_host": mostly(NONE, st.sets(st.sampled_from(INSTANCE_POOL), min_size=1, max_size=2)),
    "near_volume": mostly(None, st.sampled_from(("vol-a", "vol-missing"))),
    "az": mostly(None, st.sampled_from(("az1", "nova"))),
    "ignore": mostly(NONE, st.sets(st.integers(0, 11), min_size=1, max_size=2)),
    "force": mostly((), st.sampled_from(((1,), (2, 3)))),
    "num_instances": st.integers(1, 3),
})

#: weigher set-ups: "single" and "none" let the per-host mode stop early (order set-independent)
WEIGHING = {
    "single": {"ram_weight_multiplier": 1.0, "cpu_weight_multiplier": 0.0,
               "disk_weight_multiplier": 0.0, "num_instances_weight_multiplier": 0.0,
               "io_ops_weight_multiplier": 0.0},
    "none": {"ram_weight_multiplier": 0.0, "cpu_weight_multiplier": 0.0,
             "disk_weight_multiplier": 0.0, "num_instances_weight_multiplier": 0.0,
             "io_ops_weight_multiplier": 0.0},
}

config_st = st.fixed_dictionaries({
    "weighing": st.sampled_from(("random", "random", "single", "none")),
    "ram_weight_multiplier": st.sampled_from((1.0, 0.0, -1.0, 2.5)),
    "cpu_weight_multiplier": st.sampled_from((1.0, 0.0, 0.3)),
    "disk_weight_multiplier": st.sampled_from((1.0, 0.0)),
    "num_instances_weight_multiplier": st.sampled_from((0.0, 1.0, -2.0)),
    "io_ops_weight_multiplier": st.sampled_from((-1.0, 0.0)),
    "max_instances_per_host": st.sampled_from((4, 50, 50)),
    "max_io_ops_per_host": st.sampled_from((5, 8, 8)),
    "host_subset_size_min": st.integers(1, 2),
    "host_subset_size_max": st.integers(2, 3),
    "max_attempts": st.integers(1, 4),
})

scenario_st = st.fixed_dictionaries({
    "hosts": st.lists(host_st, min_size=3, max_size=14),
    "pending": st.lists(st.tuples(st.integers(0, 11), st.integers(0, 4), st.integers(0, 4),
                                  st.booleans()), max_size=5),
    "volume_hosts": st.sets(st.integers(0, 11), max_size=4),
    "requests": st.lists(request_st, min_size=1, max_size=3),
    "config": config_st,
    "seed": st.integers(0, 2**16),
})


def build(scenario, path, vector=True):
    rnd = random.Random(scenario["seed"])
    pool = list(INSTANCE_POOL)
    rnd.shuffle(pool)
    docs, silent = {}, []
    for i, h in enumerate(scenario["hosts"]):
        insts = {pool.pop(): {"claim": "", "resources": {}} for _ in range(h["extra_instances"])
                 if pool}
        source = f"cn{i:02d}"
        docs[source] = host_doc(
            f"h{h['name']}", vcpus=h["vcpus"], vcpus_used=h["vcpus_used"], cpu_ratio=h["cpu_ratio"],
            memory_mb=h["memory_mb"], memory_mb_used=h["memory_mb_used"], ram_ratio=h["ram_ratio"],
            disk_gb=h["disk_gb"], disk_gb_used=h["disk_gb_used"], reserved=h["reserved"],
            num_io_ops=h["num_io_ops"], instances=insts,
            aggregates={a: AGGREGATES[a] for a in sorted(h["aggregates"])},
            supported_instances=SUPPORTED[h["supported"]], hypervisor_version=h["hv_version"],
            disabled=h["state"] == "disabled", forced_down=h["state"] == "forced_down",
            cell_uuid=h["cell"], nodename=f"node{i}")
        if h["state"] == "silent":
            silent.append(source)
    docs["volume-backend:a"] = {"locality": {"hosts": [f"h{k}" for k in sorted(scenario["volume_hosts"])]},
                                "volumes": {"vol-a": {"size_gb": 1}}}
    rec = load_receiver(docs, name="sched", down_interval=1e9)
    for source in silent:
        rec.sources[source].down = True
    for k, (h, vcpus, mem, named) in enumerate(scenario["pending"]):
        source = f"cn{h % len(scenario['hosts']):02d}"
        view = rec.sources[source]
        rec.add_claim(Claim(f"old-{k}", "sched", source, view.epoch, view.seq,
                            {"vcpus": vcpus, "memory_mb": mem * 256}, pool.pop() if named and pool else ""),
                      0.0)
    options = dict(scenario["config"])
    options.update(WEIGHING.get(options.pop("weighing"), {}))
    cfg = SchedulerConfig(enabled_filters=FILTERS, **options)
    filters, weighers = load_core(cfg)
    if not vector:
        filters = [PerHost(f) for f in filters]
    engine = DecisionEngine(rec, config=cfg, filters=filters, weighers=weighers, path=path,
                            rng=random.Random(scenario["seed"]))
    return engine, []


class PerHost(BaseHostFilter):
    """``filt`` without its vector form: run per host on the survivors, as a plugin is."""

    def __init__(self, filt: BaseHostFilter) -> None:
        super().__init__(filt.config)
        self.filt = filt
        self.placement = filt.placement

    @property
    def name(self) -> str:
        return self.filt.name

    def active(self, spec_obj):
        return self.filt.active(spec_obj)

    def host_passes(self, host_state, spec_obj):
        return self.filt.host_passes(host_state, spec_obj)


def make_spec(r, n):
    group = None
    if r["group"]:
        rules = {} if r["max_per_host"] is None else {"max_server_per_host": r["max_per_host"]}
        group = InstanceGroup(r["group"], members=sorted(r["members"]), rules=rules)
    hints = {}
    if r["same_host"]:
        hints["same_host"] = sorted(r["same_host"])
    if r["different_host"]:
        hints["different_host"] = sorted(r["different_host"])
    if r["near_volume"]:
        hints["near_volume"] = [r["near_volume"]]
    return RequestSpec(
        flavor=Flavor(vcpus=r["vcpus"], memory_mb=r["memory_mb"], root_gb=r["root_gb"],
                      extra_specs=r["extra_specs"]),
        image_properties=r["image"], project_id=r["project"], num_instances=r["num_instances"],
        instance_group=group, scheduler_hints=hints, availability_zone=r["az"],
        ignore_hosts=[f"H{k}" for k in sorted(r["ignore"])],
        force_hosts=[f"h{k}" for k in r["force"]], request_id=f"r{n}")


def decide(engine, spec, sent):
    """The decision's rows (its claims cast into ``sent``), or NoValidHost's reason."""
    try:
        decision = engine.select_destinations(spec, 0.0)
    except NoValidHost as exc:
        return ("NoValidHost", exc.reason)
    sent.extend(decision.claims)
    return decision.rows


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenario_st)
def test_fast_path_equals_slow_path(scenario):
    fast, fast_sent = build(scenario, "fast")
    slow, slow_sent = build(scenario, "slow")
    for n, r in enumerate(scenario["requests"]):
        spec = make_spec(r, n)
        assert fast.ordered_hosts(spec) == slow.ordered_hosts(spec)
        assert decide(fast, spec, fast_sent) == decide(slow, spec, slow_sent)
    assert [c.claim_id for c in fast_sent] == [c.claim_id for c in slow_sent]


@SETTINGS
@given(scenario_st)
def test_per_host_filters_on_survivors_equal_slow_path(scenario):
    fast, fast_sent = build(scenario, "fast", vector=False)
    slow, slow_sent = build(scenario, "slow")

    def hosts_only(result):
        if isinstance(result, tuple):
            return result
        return [[(s.source, s.instance_uuid, s.claim_id) for s in row] for row in result]

    for n, r in enumerate(scenario["requests"]):
        spec = make_spec(r, n)
        assert [s for s, _ in fast.ordered_hosts(spec)] == [s for s, _ in slow.ordered_hosts(spec)]
        assert hosts_only(decide(fast, spec, fast_sent)) == hosts_only(decide(slow, spec, slow_sent))
    assert [c.claim_id for c in fast_sent] == [c.claim_id for c in slow_sent]
