"""The simulator's own filters and weighers decide as nova 34's own classes do (differential).

``shm sim``'s shared, legacy and caching modes, ``shm bench decisions`` and
``shm replay --decisions`` decide with the project's own engine
(:mod:`shared_host_manager.decision`), whose filters and weighers carry nova's
names and claim nova 34's semantics.  This test is what makes that claim
checkable: hypothesis draws a cloud and a request; the same hosts become our
documents (through :func:`simulator.synthetic_hosts.host_doc`, as the simulator
builds them) and nova's HostStates (``HostState.update(compute, service,
aggregates, instances)`` with the ComputeNode nova's resource tracker would
write); the same request becomes our RequestSpec and nova's.  Then, for every
filter both sides have, the set of hosts that pass must be equal, and for every
weigher both have, each host's weight (normalised, times its multiplier with
aggregate overrides) must be equal within 1e-9.  The option values (limits,
multipliers, default architecture) are drawn too and set on both sides.

Not compared, by design (docs/design.md §5.7): ties between equal weights (nova
keeps its host iteration order, we order by source id); the filters nova no
longer has or never had (AvailabilityZoneFilter, ResourceFitFilter,
VolumeLocalityFilter); and a numeric extra-spec operator on a value that is
no number, where nova's filter raises (failing the request) and ours fails
that host.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import host_manager as nova_hm  # noqa: E402
from nova.scheduler.filters import (  # noqa: E402
    affinity_filter,
    aggregate_instance_extra_specs,
    aggregate_multitenancy_isolation,
    compute_filter,
    image_props_filter,
    io_ops_filter,
    num_instances_filter,
)
from nova.scheduler.weights import HostWeightHandler  # noqa: E402
from nova.scheduler.weights import cpu as w_cpu  # noqa: E402
from nova.scheduler.weights import disk as w_disk  # noqa: E402
from nova.scheduler.weights import io_ops as w_io_ops  # noqa: E402
from nova.scheduler.weights import num_instances as w_num_instances  # noqa: E402
from nova.scheduler.weights import ram as w_ram  # noqa: E402

from protocol.hostdoc import is_host  # noqa: E402
from shared_host_manager.conf.decision import SchedulerConfig  # noqa: E402
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost  # noqa: E402
from shared_host_manager.decision.hostview import HostView  # noqa: E402
from shared_host_manager.decision.plugins import load_filters, load_weighers  # noqa: E402
from shared_host_manager.decision.request import (  # noqa: E402
    Flavor,
    InstanceGroup,
    RequestSpec,
    RequestView,
)
from shared_host_manager.decision.weights import weigh_hosts  # noqa: E402
from shared_host_manager.decision.world import ReceiverWorld  # noqa: E402
from shared_host_manager.nova.core import plugins as core_plugins  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from simulator.synthetic_hosts import host_doc, load_receiver  # noqa: E402

pytestmark = pytest.mark.nova

CONF = fx.setup_nova()

#: our filter name -> nova 34's class of that name
FILTERS = {
    "ComputeFilter": compute_filter.ComputeFilter,
    "ImagePropertiesFilter": image_props_filter.ImagePropertiesFilter,
    "ServerGroupAffinityFilter": affinity_filter.ServerGroupAffinityFilter,
    "ServerGroupAntiAffinityFilter": affinity_filter.ServerGroupAntiAffinityFilter,
    "SameHostFilter": affinity_filter.SameHostFilter,
    "DifferentHostFilter": affinity_filter.DifferentHostFilter,
    "AggregateInstanceExtraSpecsFilter": aggregate_instance_extra_specs.AggregateInstanceExtraSpecsFilter,
    "AggregateMultiTenancyIsolation": aggregate_multitenancy_isolation.AggregateMultiTenancyIsolation,
    "NumInstancesFilter": num_instances_filter.NumInstancesFilter,
    "IoOpsFilter": io_ops_filter.IoOpsFilter,
}
WEIGHERS = {
    "RAMWeigher": w_ram.RAMWeigher,
    "CPUWeigher": w_cpu.CPUWeigher,
    "DiskWeigher": w_disk.DiskWeigher,
    "NumInstancesWeigher": w_num_instances.NumInstancesWeigher,
    "IoOpsWeigher": w_io_ops.IoOpsWeigher,
}
#: the options both sides read, with the values drawn for them
OPTIONS = {
    "max_instances_per_host": st.sampled_from([1, 5, 50]),
    "max_io_ops_per_host": st.sampled_from([1, 4, 8]),
    "ram_weight_multiplier": st.sampled_from([1.0, -1.0, 2.5, 0.0]),
    "cpu_weight_multiplier": st.sampled_from([1.0, -1.0, 0.5]),
    "disk_weight_multiplier": st.sampled_from([1.0, 0.0, -2.0]),
    "num_instances_weight_multiplier": st.sampled_from([0.0, 1.0, -1.0]),
    "io_ops_weight_multiplier": st.sampled_from([-1.0, 0.0, 3.0]),
    "image_properties_default_architecture": st.sampled_from([None, "x86_64", "aarch64"]),
}

#: aggregates a host may belong to: metadata each filter and weigher reads, well and badly formed
AGGREGATES = {
    "agg-ssd": {"ssd": "true", "ram_weight_multiplier": "2.0"},
    "agg-hdd": {"ssd": "false", "cpu_weight_multiplier": "-0.5"},
    "agg-scoped": {"ssd": "true, maybe", "gpus": "4", "io_ops_weight_multiplier": "nonsense"},
    "agg-tenant": {"filter_tenant_id": "p1,p2", "disk_weight_multiplier": "0.25"},
    "agg-tenant2": {"filter_tenant_id_2": "p3", "num_instances_weight_multiplier": "-3"},
    "agg-plain": {"availability_zone": "az1", "ram_weight_multiplier": "-1.5"},
}
SUPPORTED = [
    [["x86_64", "qemu", "hvm"]],
    [["x86_64", "kvm", "hvm"], ["i686", "kvm", "hvm"]],
    [["aarch64", "qemu", "hvm"]],
    [["x86_64", "xen", "xen"], ["x86_64", "xen", "hvm"]],
    [],
]
INSTANCES = [fx.uuid_for("inst", i) for i in range(8)]
NEW = fx.uuid_for("new", 0)


#: a host is mostly up and enabled, so that more than one survives ComputeFilter
RARELY = st.sampled_from([False, False, False, False, True])


@st.composite
def host_params(draw: st.DrawFn, i: int) -> dict:
    vcpus = draw(st.sampled_from([4, 16, 64]))
    memory_mb = draw(st.sampled_from([8192, 65536]))
    disk_gb = draw(st.sampled_from([100, 2000]))
    reserved_mb = draw(st.sampled_from([0, 512]))
    reserved_gb = draw(st.sampled_from([0, 10]))
    return {
        "name": f"host{i}",
        "vcpus": vcpus, "vcpus_used": draw(st.integers(0, vcpus * 2)),
        "memory_mb": memory_mb, "memory_mb_used": draw(st.integers(0, memory_mb - reserved_mb)),
        "disk_gb": disk_gb, "disk_gb_used": draw(st.integers(0, disk_gb - reserved_gb)),
        "reserved": {"memory_mb": reserved_mb, "disk_gb": reserved_gb},
        "cpu_ratio": draw(st.sampled_from([1.0, 4.0, 16.0])),
        "ram_ratio": draw(st.sampled_from([1.0, 1.5])),
        # near the limits drawn in OPTIONS more often than not
        "num_instances": draw(st.sampled_from([0, 0, 1, 4, 5, 49, 50, 60])),
        "num_io_ops": draw(st.sampled_from([0, 0, 1, 3, 4, 8, 12])),
        "disabled": draw(RARELY),
        "forced_down": draw(RARELY),
        "aggregates": draw(st.lists(st.sampled_from(sorted(AGGREGATES)), max_size=3, unique=True)),
        "supported_instances": draw(st.sampled_from(SUPPORTED)),
        "hypervisor_version": draw(st.sampled_from([6000000, 7001000, 8002000])),
        "instances": draw(st.lists(st.sampled_from(INSTANCES), max_size=3, unique=True)),
    }


@st.composite
def clouds(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 8))
    hosts = [draw(host_params(i)) for i in range(n)]
    # an instance lives on one host only
    seen: set[str] = set()
    for h in hosts:
        h["instances"] = [u for u in h["instances"] if u not in seen]
        seen.update(h["instances"])
    return hosts


EXTRA_SPECS = st.dictionaries(
    st.sampled_from(["aggregate_instance_extra_specs:ssd", "ssd", "gpus",
                     "capabilities:hypervisor_type", "hw:cpu_policy", "trust:trusted_host"]),
    st.sampled_from(["true", "false", "<in> tr", "<or> true <or> maybe", ">= 2", "s== 4",
                     "dedicated"]),
    max_size=3)
IMAGE_PROPS = st.fixed_dictionaries({}, optional={
    "hw_architecture": st.sampled_from(["x86_64", "aarch64", "amd64", "i686"]),
    "img_hv_type": st.sampled_from(["qemu", "kvm", "xen", "xapi"]),
    "hw_vm_mode": st.sampled_from(["hvm", "xen", "hv"]),
    "img_hv_requested_version": st.sampled_from([">= 7.0", "< 7.0", ">=6.0,<8.2", "== 8.2"]),
})


@st.composite
def requests(draw: st.DrawFn) -> dict:
    group = None
    policy = draw(st.sampled_from([None, "affinity", "anti-affinity"]))
    if policy:
        rules = {}
        if policy == "anti-affinity" and draw(st.booleans()):
            rules = {"max_server_per_host": draw(st.integers(1, 3))}
        group = {"policy": policy, "rules": rules,
                 "members": draw(st.lists(st.sampled_from(INSTANCES), max_size=4, unique=True))}
    hints = {}
    for hint in ("same_host", "different_host"):
        if draw(st.booleans()):
            hints[hint] = draw(st.lists(st.sampled_from(INSTANCES), min_size=1, max_size=3,
                                        unique=True))
    return {
        "extra_specs": draw(EXTRA_SPECS),
        "image_props": draw(IMAGE_PROPS),
        "project_id": draw(st.sampled_from(["p1", "p2", "p3", "p9"])),
        # a move of an instance already placed (nova's affinity filters let it stay where it is)
        "instance_uuid": draw(st.sampled_from([NEW, *INSTANCES[:2]])),
        "group": group,
        "hints": hints,
    }


# -- our side ------------------------------------------------------------------------------

def our_docs(hosts: list[dict]) -> dict[str, dict]:
    docs = {}
    for h in hosts:
        kw = {k: v for k, v in h.items() if k not in ("name", "aggregates", "instances")}
        kw["aggregates"] = {a: {"name": a, "metadata": AGGREGATES[a]} for a in h["aggregates"]}
        kw["instances"] = {u: {"claim": "", "resources": {}} for u in h["instances"]}
        docs[h["name"]] = host_doc(h["name"], **kw)
    return docs


def our_spec(req: dict) -> RequestSpec:
    group = req["group"]
    return RequestSpec(
        flavor=Flavor(vcpus=2, memory_mb=2048, root_gb=20, extra_specs=dict(req["extra_specs"])),
        image_properties=dict(req["image_props"]), project_id=req["project_id"],
        instance_uuids=(req["instance_uuid"],),
        instance_group=InstanceGroup(group["policy"], list(group["members"]),
                                     rules=dict(group["rules"])) if group else None,
        scheduler_hints={k: list(v) for k, v in req["hints"].items()})


# -- nova's side -----------------------------------------------------------------------------

def nova_states(hosts: list[dict]) -> list:
    from oslo_serialization import jsonutils

    aggs = {name: objects.Aggregate(id=i + 1, uuid=fx.uuid_for("agg", i), name=name,
                                    metadata=dict(md), hosts=[])
            for i, (name, md) in enumerate(sorted(AGGREGATES.items()))}
    states = []
    for i, h in enumerate(hosts):
        r = h["reserved"]
        # nova's resource tracker counts the reserved amounts as used
        mem_used = h["memory_mb_used"] + r["memory_mb"]
        disk_used = h["disk_gb_used"] + r["disk_gb"]
        cn = objects.ComputeNode(
            id=i, uuid=fx.uuid_for("cn", i), host=h["name"], hypervisor_hostname=h["name"],
            memory_mb=h["memory_mb"], memory_mb_used=mem_used, free_ram_mb=h["memory_mb"] - mem_used,
            local_gb=h["disk_gb"], local_gb_used=disk_used, free_disk_gb=h["disk_gb"] - disk_used,
            disk_available_least=None, vcpus=h["vcpus"], vcpus_used=h["vcpus_used"],
            hypervisor_type="QEMU", hypervisor_version=h["hypervisor_version"],
            cpu_info=jsonutils.dumps({"arch": "x86_64"}), host_ip="10.0.0.1",
            supported_hv_specs=[objects.HVSpec(arch=a, hv_type=t, vm_mode=m)
                                for a, t, m in h["supported_instances"]],
            numa_topology=None, pci_device_pools=fx.pci_pools(0),
            stats={"num_instances": str(h["num_instances"]), "io_workload": str(h["num_io_ops"])},
            metrics="[]", cpu_allocation_ratio=h["cpu_ratio"], ram_allocation_ratio=h["ram_ratio"],
            disk_allocation_ratio=1.0, running_vms=h["num_instances"],
            current_workload=h["num_io_ops"], service_id=i, mapped=1, updated_at=fx.NOW)
        hs = nova_hm.HostState(h["name"], h["name"], fx.CELL1)
        hs.update(cn, fx.service_dict(h["name"], disabled=h["disabled"], forced_down=h["forced_down"]),
                  [aggs[a] for a in h["aggregates"]],
                  {u: objects.Instance(uuid=u) for u in h["instances"]})
        states.append(hs)
    return states


def nova_spec(req: dict, hosts: list[dict]) -> objects.RequestSpec:
    group = None
    if req["group"]:
        g = req["group"]
        # nova's API adds the new instance to its group; the conductor fills the group's hosts
        # from where its members run
        members = list(dict.fromkeys([*g["members"], req["instance_uuid"]]))
        on = [h["name"] for h in hosts if set(members) & set(h["instances"])]
        group = objects.InstanceGroup(policy=g["policy"], policies=[g["policy"]],
                                      rules=dict(g["rules"]), members=members, hosts=on)
    spec = fx.request_spec(instance_uuid=req["instance_uuid"], extra_specs=req["extra_specs"],
                           image_props=req["image_props"], group=group,
                           hints={k: list(v) for k, v in req["hints"].items()})
    spec.project_id = req["project_id"]
    return spec


def _with_options(options: dict) -> SchedulerConfig:
    for name, value in options.items():
        if name in OPTIONS:
            CONF.set_override(name, value, group="filter_scheduler")
    return SchedulerConfig(**options)


def _clear(options: dict) -> None:
    for name in OPTIONS:
        CONF.clear_override(name, group="filter_scheduler")


# -- the comparison ----------------------------------------------------------------------------

def _plugins(core: str, config: SchedulerConfig) -> tuple[list, list]:
    """The engine's filters and weighers: its own ("own"), or nova's classes through the
    vector core ("nova", design §10 item 13)."""
    if core == "own":
        return load_filters(list(FILTERS), config), load_weighers(list(WEIGHERS), config)
    shared = core_plugins.Shared(fx.CELL1)
    return (core_plugins.load_filters(list(FILTERS), config, shared),
            core_plugins.load_weighers(list(WEIGHERS), config, shared))


def _handler_raises(states: list, spec: object) -> bool:
    """Whether nova's filter handler raises for this request (a numeric extra-spec operator
    on a value that is no number, on a host the filters before it left)."""
    from nova.scheduler import filters as nova_filters

    try:
        nova_filters.HostFilterHandler().get_filtered_objects(
            [cls() for cls in FILTERS.values()], states, spec, 0)
    except ValueError:
        return True
    return False


def _nova_passes(f: object, hs: object, spec: object) -> bool:
    try:
        return bool(f.host_passes(hs, spec))  # type: ignore[attr-defined]
    except ValueError:
        # a numeric extra-spec operator on a value that is no number: nova's filter raises and
        # the request fails; ours lets that host fail (extra_specs_ops.py, design §5.7)
        return False


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=clouds(), req=requests(), options=st.fixed_dictionaries(OPTIONS))
def test_our_filters_and_weighers_decide_as_novas(hosts: list[dict], req: dict, options: dict) -> None:
    config = _with_options(options)
    try:
        rec = load_receiver(our_docs(hosts), down_interval=1e9)
        view = RequestView(our_spec(req), ReceiverWorld(rec), (req["instance_uuid"],))
        ours = {v.doc["compute"]["host"]: HostView(v) for v in rec.sources.values() if is_host(v.doc)}
        theirs = {hs.host: hs for hs in nova_states(hosts)}
        spec = nova_spec(req, hosts)

        for ours_f in load_filters(list(FILTERS), config):
            nova_f = FILTERS[ours_f.name]()
            passed_ours = {n for n, h in ours.items() if ours_f.host_passes(h, view)}
            passed_nova = {n for n, hs in theirs.items() if _nova_passes(nova_f, hs, spec)}
            assert passed_ours == passed_nova, (ours_f.name, sorted(passed_ours), sorted(passed_nova))

        names = sorted(ours)
        for ours_w in load_weighers(list(WEIGHERS), config):
            mine = {w.obj.doc["compute"]["host"]: w.weight
                    for w in weigh_hosts([ours_w], [ours[n] for n in names], view)}
            nova_w = WEIGHERS[ours_w.name]()
            nova = {w.obj.host: w.weight for w in HostWeightHandler().get_weighed_objects(
                [nova_w], [theirs[n] for n in names], spec)}
            assert mine == pytest.approx(nova, abs=1e-9), ours_w.name

        # the whole decision, on both of the engine's paths: nova's filter handler, then its
        # weight handler, over every filter and weigher at once
        survivors = list(theirs.values())
        for cls in FILTERS.values():
            survivors = [hs for hs in survivors if _nova_passes(cls(), hs, spec)]
        nova_ranked = {w.obj.host: w.weight for w in HostWeightHandler().get_weighed_objects(
            [cls() for cls in WEIGHERS.values()], survivors, spec)}
        nova_raises = _handler_raises(list(theirs.values()), spec)
        for path, core in (("fast", "own"), ("slow", "own"), ("fast", "nova"), ("slow", "nova")):
            filters, weighers = _plugins(core, config)
            engine = DecisionEngine(rec, lambda claim: None, config=config, path=path,
                                    filters=filters, weighers=weighers)
            if core == "nova" and nova_raises:  # nova's classes raise as in nova
                with pytest.raises(ValueError):
                    engine.ordered_hosts(our_spec(req))
                continue
            ranked = dict(engine.ordered_hosts(our_spec(req)))
            assert ranked == pytest.approx(nova_ranked, abs=1e-9), (path, core)
    finally:
        _clear(options)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=clouds(), req=requests(), count=st.integers(2, 3),
       options=st.fixed_dictionaries(OPTIONS))
def test_a_multi_create_request_takes_the_hosts_novas_loop_takes(
        hosts: list[dict], req: dict, count: int, options: dict) -> None:
    """nova's _schedule for several instances: filter, weigh, take the best, consume it
    (``_consume_selected_host``: resources, instance and I/O counts, the group's hosts and
    the host's instances), next instance.  Our engine with a subset of 1 takes the best too,
    consuming on the request's scratch (RequestView.consume); equal weights are ordered by
    name on both sides (nova's sort is stable and its hosts come in name order here)."""
    from nova.scheduler.manager import SchedulerManager

    uuids = [fx.uuid_for("multi", i) for i in range(count)]
    req = dict(req, instance_uuid=uuids[0])
    config = _with_options(dict(options, host_subset_size_min=1, host_subset_size_max=1))
    try:
        def novas_loop(first: str | None, strict: bool = False) -> list[str]:
            spec = nova_spec(req, hosts)
            if spec.instance_group is not None:  # nova's API makes every instance a member
                spec.instance_group.members = list(dict.fromkeys(
                    [*spec.instance_group.members, *uuids]))
            states = sorted(nova_states(hosts), key=lambda hs: hs.host)
            took: list[str] = []
            for uuid in uuids:
                spec.instance_uuid = uuid
                survivors = states
                if strict and _handler_raises(survivors, spec):
                    raise ValueError("nova's filters raise")
                for cls in FILTERS.values():
                    survivors = [hs for hs in survivors if _nova_passes(cls(), hs, spec)]
                if first is not None and not took:
                    # our choice for an affinity group's first member, if nova would allow it
                    survivors = [hs for hs in survivors if hs.host == first]
                if not survivors:
                    break
                best = HostWeightHandler().get_weighed_objects(
                    [cls() for cls in WEIGHERS.values()], survivors, spec)[0].obj
                SchedulerManager._consume_selected_host(best, spec, instance_uuid=uuid)
                took.append(best.host)
            return took

        # an affinity group none of whose members is placed: its first member goes to one
        # of the best hosts chosen by rendezvous over the group, so that racing schedulers
        # agree on it (design §5.4), where nova takes the best; the rest must follow nova
        anchored = bool(req["group"] and req["group"]["policy"] == "affinity" and not any(
            set(req["group"]["members"]) & set(h["instances"]) for h in hosts))
        rec = load_receiver(our_docs(hosts), down_interval=1e9)
        ours = dataclasses.replace(our_spec(req), instance_uuids=tuple(uuids))
        for path, core in (("fast", "own"), ("slow", "own"), ("fast", "nova"), ("slow", "nova")):
            filters, weighers = _plugins(core, config)
            engine = DecisionEngine(rec, lambda claim: None, config=config, path=path,
                                    filters=filters, weighers=weighers)
            strict = core == "nova"  # nova's classes raise where nova's handler does
            try:
                took = [row[0].host for row in engine.select_destinations(ours, 0.0, dry_run=True)]
            except NoValidHost:
                assert len(novas_loop(None, strict)) < count, (path, core)
                continue
            except ValueError:
                assert strict, (path, core)
                with pytest.raises(ValueError):
                    novas_loop(None, strict)
                continue
            assert took == novas_loop(took[0] if anchored else None, strict), (path, core)
    finally:
        _clear(options)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=clouds(), req=requests(), options=st.fixed_dictionaries(OPTIONS),
       pending=st.lists(st.sampled_from([0, 0, 1, 2]), min_size=8, max_size=8))
def test_novas_classes_over_the_engines_index_decide_as_novas_handlers(
        hosts: list[dict], req: dict, options: dict, pending: list[int]) -> None:
    """The vector core, fed the engine's HostIndex (IndexTable) instead of the drop-in's
    request rows, filters and weighs exactly as nova's handlers on nova's HostStates: the
    same hosts in the same order and bit-identical weights (design §10, item 13, step 1).
    Builds this scheduler sent that the hosts have not reported are pending claims on our
    side and consumed by nova's own HostState on nova's."""
    from collections import Counter

    from nova.scheduler import filters as nova_filters

    from protocol.messages import Claim
    from shared_host_manager.decision.index import HostIndex
    from shared_host_manager.nova.core import vector
    from shared_host_manager.nova.core.index_table import IndexTable, Templates

    _with_options(options)
    try:
        rec = load_receiver(our_docs(hosts), now=100.0, down_interval=1e9)
        theirs = nova_states(hosts)  # in host order, as the index's source order
        for i, (h, hs) in enumerate(zip(hosts, theirs, strict=False)):
            for k in range(pending[i]):
                uuid = fx.uuid_for(f"pending-{i}", k)
                rec.add_claim(Claim(f"c{i}-{k}", "scheduler-0", h["name"], 1, 0,
                                    {"vcpus": k + 1, "memory_mb": 512 * (k + 1), "disk_gb": k},
                                    instance=uuid), 100.0)
                hs.consume_from_request(fx.request_spec(instance_uuid=uuid, memory_mb=512 * (k + 1),
                                                        vcpus=k + 1, root_gb=k))
        table = IndexTable(HostIndex(rec), Templates(fx.CELL1), now=110.0)
        spec = nova_spec(req, hosts)
        filters = [cls() for cls in FILTERS.values()]
        counters: Counter[str] = Counter()
        try:
            nova_passed = nova_filters.HostFilterHandler().get_filtered_objects(
                filters, theirs, spec, 0)
        except ValueError:  # a numeric extra-spec operator on a value that is no number
            with pytest.raises(ValueError):
                vector.run_filters(filters, table, table.rows().tolist(), spec, 0, counters)
            return
        rows = vector.run_filters(filters, table, table.rows().tolist(), spec, 0, counters)
        assert rows is not None and nova_passed is not None
        assert [table.name(r) for r in rows] == [hs.host for hs in nova_passed]
        assert counters["filter_fallback_runs"] == 0  # every filter decided as a vector form

        weighers = [cls() for cls in WEIGHERS.values()]
        ours = vector.weigh(weighers, table, rows, spec, counters)
        nova = HostWeightHandler().get_weighed_objects(weighers, nova_passed, spec)
        assert [(w.obj.host, w.weight) for w in ours] == [(w.obj.host, w.weight) for w in nova]
        assert counters["weigher_fallback_runs"] == 0
    finally:
        _clear(options)
