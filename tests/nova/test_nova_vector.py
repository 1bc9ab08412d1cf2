"""The drop-in's vector core decides exactly as nova's own handlers on nova's own HostStates.

Hypothesis draws compute nodes (aggregates with metadata, instances, service
states, NUMA topologies, PCI pools, metrics, io ops, hypervisor versions, builds
this scheduler sent that the compute has not reported: consumed on nova's
HostState, held as pending claims on ours), a
configuration (enabled_filters in any order, multipliers, limits, isolated
hosts) and a request (flavor extra specs, image properties, server group,
scheduler hints, forced/ignored hosts and nodes, requested destination, NUMA
and PCI requests, rebuild).  nova's side: ``HostState.update`` from the same
ComputeNodes, then nova's ``HostManager.get_filtered_hosts`` /
``get_weighed_hosts`` with nova's handlers.  Ours: the compute hook's documents
in a cache, ``SharedHostManager`` with the vector core.  Asserted equal: the
filtered hosts in order, the weights (bit for bit: no tolerance; the vector
core does nova's float operations in nova's order), the sorted order, the
limits and allocation candidates the filters left on the survivors; and the
same again for the second instance of a multi-create after the first host was
consumed (the touched host then goes through nova's classes, the rest through
the vector forms).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import filters as nova_filters  # noqa: E402
from nova.scheduler import host_manager as nova_hm  # noqa: E402
from nova.scheduler import manager as nova_manager  # noqa: E402
from nova.scheduler import weights as nova_weights  # noqa: E402

from shared_host_manager.decision.index import HostIndex  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.compute_hook import ComputeHook  # noqa: E402
from shared_host_manager.nova.core import vector  # noqa: E402
from shared_host_manager.nova.core.document import (  # noqa: E402
    canonical_primitive,
    document_from_compute_node,
)
from shared_host_manager.nova.core.index_table import IndexTable, Templates  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

CONF = fx.setup_nova()

FILTERS = ["ComputeFilter", "ComputeCapabilitiesFilter", "ImagePropertiesFilter",
           "ServerGroupAntiAffinityFilter", "ServerGroupAffinityFilter",
           "AggregateInstanceExtraSpecsFilter", "AggregateImagePropertiesIsolation",
           "AggregateMultiTenancyIsolation", "AggregateTypeAffinityFilter", "IsolatedHostsFilter",
           "SameHostFilter", "DifferentHostFilter", "NumInstancesFilter",
           "AggregateNumInstancesFilter", "IoOpsFilter", "AggregateIoOpsFilter",
           "SimpleCIDRAffinityFilter", "JsonFilter", "MetricsFilter", "NUMATopologyFilter",
           "PciPassthroughFilter", "AllHostsFilter"]

#: the filters that decide once per aggregate group (and spread the answer to the group)
AGGREGATE_FILTERS = ["AggregateInstanceExtraSpecsFilter", "AggregateImagePropertiesIsolation",
                     "AggregateMultiTenancyIsolation", "AggregateTypeAffinityFilter",
                     "AggregateNumInstancesFilter", "AggregateIoOpsFilter"]

INSTANCES = [fx.uuid_for("vinst", i) for i in range(6)]

AGG_META = [
    {"ssd": "true"},
    {"ssd": "false", "ram_weight_multiplier": "2.5"},
    {"cpu_weight_multiplier": "-1.0", "io_ops_weight_multiplier": "not-a-number"},
    {"filter_tenant_id": "p"},
    {"filter_tenant_id_2": "q,r"},
    {"max_instances_per_host": "4", "max_io_ops_per_host": "2"},
    {"instance_type": "f1, f9"},
    {"instance_type": "f2"},
    {"hw_vm_mode": "hvm", "build_failure_weight_multiplier": "0"},
    {"hw_architecture": "armv7l", "metrics_weight_multiplier": "3"},
    {"soft_affinity_weight_multiplier": "5", "num_instances_weight_multiplier": "-2"},
    {},
]
AGGREGATES = [objects.Aggregate(id=i + 1, uuid=fx.uuid_for("vagg", i), name=f"agg{i}",
                                metadata=dict(meta), hosts=[]) for i, meta in enumerate(AGG_META)]


@st.composite
def hosts(draw: Any, least: int = 1, least_aggregates: int = 0) -> list[dict[str, Any]]:
    n = draw(st.integers(least, 7))
    out = []
    for i in range(n):
        out.append({
            "i": i,
            "free_ram_mb": draw(st.sampled_from([1024, 8192, 30000, 30000, 64000])),
            "vcpus_used": draw(st.integers(0, 20)),
            "num_instances": draw(st.integers(0, 6)),
            "io_workload": draw(st.integers(0, 4)),
            "failed_builds": draw(st.sampled_from([0, 0, 1, 5])),
            "hypervisor_version": draw(st.sampled_from([6000000, 8002000, 8002000, 9000000])),
            "cpu_allocation_ratio": draw(st.sampled_from([1.0, 4.0, 16.0])),
            "numa": draw(st.sampled_from(["none", "free", "pinned"])),
            "pci": draw(st.sampled_from([0, 0, 1, 4])),
            "metrics": draw(st.sampled_from(["default", "none", "frequency"])),
            "stats": draw(st.sampled_from([{}, {"num_vm_active": "1"}, {"gpu": "yes"}])),
            "disabled": draw(st.booleans()) and draw(st.booleans()),
            "forced_down": draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans()),
            "aggregates": draw(st.lists(st.integers(0, len(AGGREGATES) - 1), min_size=least_aggregates,
                                        max_size=3, unique=True)),
            "instances": draw(st.lists(st.sampled_from(INSTANCES), max_size=3, unique=True)),
            # builds this scheduler sent that the compute has not reported yet
            "pending": draw(st.sampled_from([0, 0, 0, 1, 2])),
        })
    return out


def _pending_specs(p: dict[str, Any]) -> list[Any]:
    """The host's pending builds: small flavors, the first one also takes a PCI device."""
    out = []
    for k in range(p.get("pending", 0)):
        pci = fx.pci_request() if k == 0 and p["pci"] else None
        out.append(fx.request_spec(instance_uuid=fx.uuid_for(f"pending-{p['i']}", k),
                                   memory_mb=512 * (k + 1), vcpus=k + 1, root_gb=k, pci=pci))
    return out


@st.composite
def configs(draw: Any, pool: list[str] = FILTERS) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8, unique=True))
    mult = st.sampled_from([0.0, 1.0, -1.0, 2.5])
    positive = st.sampled_from([0.0, 1.0, 2.5])  # options with min=0
    return {
        "filter_scheduler.enabled_filters": names,
        "filter_scheduler.max_instances_per_host": draw(st.sampled_from([2, 5, 50])),
        "filter_scheduler.max_io_ops_per_host": draw(st.sampled_from([1, 3, 8])),
        "filter_scheduler.ram_weight_multiplier": draw(mult),
        "filter_scheduler.cpu_weight_multiplier": draw(mult),
        "filter_scheduler.disk_weight_multiplier": draw(mult),
        "filter_scheduler.io_ops_weight_multiplier": draw(mult),
        "filter_scheduler.num_instances_weight_multiplier": draw(mult),
        "filter_scheduler.pci_weight_multiplier": draw(positive),
        "filter_scheduler.hypervisor_version_weight_multiplier": draw(mult),
        "filter_scheduler.soft_affinity_weight_multiplier": draw(positive),
        "filter_scheduler.soft_anti_affinity_weight_multiplier": draw(positive),
        "filter_scheduler.build_failure_weight_multiplier": draw(st.sampled_from([1000000.0, 0.0, 3.0])),
        "filter_scheduler.cross_cell_move_weight_multiplier": draw(mult),
        "filter_scheduler.isolated_hosts": draw(st.sampled_from([[], ["host0"], ["host1", "host2"]])),
        "filter_scheduler.isolated_images": draw(st.sampled_from([[], [fx.uuid_for("img", 1)]])),
        "filter_scheduler.restrict_isolated_hosts_to_isolated_images": draw(st.booleans()),
        "metrics.weight_setting": draw(st.sampled_from(
            [[], ["cpu.frequency=1.0"], ["cpu.percent=-2.0", "cpu.frequency=0.001"]])),
        "metrics.weight_multiplier": draw(st.sampled_from([1.0, 0.0])),
        "metrics.required": draw(st.booleans()),
        "metrics.weight_of_unavailable": draw(st.sampled_from([-10000.0, 3.0])),
    }


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    extra = draw(st.dictionaries(st.sampled_from([
        "aggregate_instance_extra_specs:ssd", "ssd", "capabilities:cpu_info:arch",
        "capabilities:hypervisor_version", "num_vm_active", "gpu", "hw:cpu_policy",
        "hw:cpu_thread_policy", "capabilities:cpu_info:features", "trait:CUSTOM_X"]),
        st.sampled_from(["true", "x86_64", ">= 8000000", ">= 2", "yes", "dedicated", "require",
                         "<in> avx", "required"]), max_size=3))
    image = draw(st.dictionaries(st.sampled_from([
        "hw_architecture", "img_hv_type", "hw_vm_mode", "img_hv_requested_version"]),
        st.sampled_from(["x86_64", "armv7l", "qemu", "hvm", ">= 7.0", ">= 9.0"]), max_size=2))
    image = {k: v for k, v in image.items() if _valid_image_prop(k, v)}
    group = draw(st.sampled_from([None, "anti-affinity", "affinity", "soft-affinity",
                                  "soft-anti-affinity"]))
    return {
        "extra": extra, "image": image, "group": group,
        "members": draw(st.lists(st.sampled_from(INSTANCES), max_size=3, unique=True)),
        "group_hosts": draw(st.lists(st.sampled_from(["host0", "host1", "host3"]), max_size=2,
                                     unique=True)),
        "max_per_host": draw(st.sampled_from([None, 1, 2])),
        "me": draw(st.sampled_from([fx.uuid_for("req", 1), INSTANCES[0]])),
        "hints": draw(st.dictionaries(st.sampled_from(["same_host", "different_host",
                                                       "build_near_host_ip", "query"]),
                                      st.just(None), max_size=2)),
        "same": draw(st.lists(st.sampled_from(INSTANCES), min_size=1, max_size=2, unique=True)),
        "numa": draw(st.sampled_from([None, None, 2, 6])),
        "pci": draw(st.sampled_from([0, 0, 1, 2])),
        "force_hosts": draw(st.sampled_from([[], [], ["HOST1"], ["host0", "host2"]])),
        "ignore_hosts": draw(st.sampled_from([[], [], ["host1"], ["Host0", "host4"]])),
        "force_nodes": draw(st.sampled_from([[], [], ["node2"]])),
        "check_type": draw(st.sampled_from([None, None, ["rebuild"], ["resize"]])),
        "destination": draw(st.sampled_from([None, None, ("host1", None), ("host2", "node2")])),
        "project": draw(st.sampled_from(["p", "q", "z"])),
        "image_id": draw(st.sampled_from([None, fx.uuid_for("img", 1), fx.uuid_for("img", 2)])),
        "index": draw(st.sampled_from([0, 0, 1])),
    }


def _valid_image_prop(key: str, value: str) -> bool:
    return {"hw_architecture": value in ("x86_64", "armv7l"), "img_hv_type": value == "qemu",
            "hw_vm_mode": value == "hvm",
            "img_hv_requested_version": value.startswith(">=")}[key]


def _spec(r: dict[str, Any]) -> Any:
    group = None
    if r["group"]:
        rules = {"max_server_per_host": r["max_per_host"]} if r["max_per_host"] else {}
        group = objects.InstanceGroup(uuid=fx.uuid_for("group", 1), policy=r["group"],
                                      policies=[r["group"]], rules=rules,
                                      members=list(r["members"]), hosts=list(r["group_hosts"]))
    hints: dict[str, Any] = {}
    for key in r["hints"]:
        hints[key] = {"same_host": r["same"], "different_host": r["same"],
                      "build_near_host_ip": ["10.0.0.1"],
                      "query": ['["<", "$free_ram_mb", 20000]']}[key]
    if "build_near_host_ip" in hints:
        hints["cidr"] = ["/31"]
    if r["check_type"]:
        hints["_nova_check_type"] = r["check_type"]
    numa = fx.dedicated_cpus(r["numa"]) if r["numa"] else None
    pci = fx.pci_request(r["pci"]) if r["pci"] else None
    spec = fx.request_spec(instance_uuid=r["me"], extra_specs=r["extra"], image_props=r["image"],
                           group=group, hints=hints, numa=numa, pci=pci)
    spec.project_id = r["project"]
    spec.force_hosts = list(r["force_hosts"])
    spec.ignore_hosts = list(r["ignore_hosts"])
    spec.force_nodes = list(r["force_nodes"])
    if r["image_id"]:
        spec.image.id = r["image_id"]
    if r["destination"]:
        host, node = r["destination"]
        spec.requested_destination = objects.Destination(host=host, node=node)
    else:
        spec.requested_destination = None
    return spec


class _World:
    def __init__(self, params: list[dict[str, Any]]) -> None:
        self.nodes = []
        self.services = {}
        self.aggs: dict[str, list[Any]] = {}
        self.instances = {}
        self.pending = {}
        hook = ComputeHook()
        for p in params:
            i = p["i"]
            numa = {"none": None, "free": fx.numa_topology(),
                    "pinned": fx.numa_topology(pinned=set(range(4, 8)) | set(range(12, 15)))}[p["numa"]]
            metrics = {"default": None, "none": [], "frequency": [
                {"name": "cpu.frequency", "value": 1000 + 7 * i, "timestamp": fx.NOW.isoformat(),
                 "source": "libvirt.LibvirtDriver"}]}[p["metrics"]]
            cn = fx.compute_node(i, free_ram_mb=p["free_ram_mb"], vcpus_used=p["vcpus_used"],
                                 num_instances=p["num_instances"], io_workload=p["io_workload"],
                                 failed_builds=p["failed_builds"], numa=numa, pci=p["pci"],
                                 hypervisor_version=p["hypervisor_version"],
                                 cpu_allocation_ratio=p["cpu_allocation_ratio"], metrics=metrics,
                                 extra_stats=p["stats"])
            self.nodes.append(cn)
            self.services[cn.host] = fx.service_dict(cn.host, disabled=p["disabled"],
                                                     forced_down=p["forced_down"])
            aggs = []
            for a in p["aggregates"]:
                agg = AGGREGATES[a].obj_clone()
                agg.hosts = [cn.host]
                aggs.append(agg)
            self.aggs[cn.host] = aggs
            self.instances[cn.host] = list(p["instances"])
            self.pending[cn.host] = _pending_specs(p)
            hook.report(cn, instances=self.instances[cn.host], service=self.services[cn.host],
                        aggregates=aggs)
        self.cache = fx.cache_from_documents({cn.uuid: hook.document(cn.uuid) for cn in self.nodes})

    def nova_states(self) -> list[Any]:
        out = []
        for cn in self.nodes:
            hs = nova_hm.HostState(cn.host, cn.hypervisor_hostname, fx.CELL1)
            hs.update(cn, dict(self.services[cn.host]), list(self.aggs[cn.host]),
                      {u: objects.Instance(uuid=u) for u in self.instances[cn.host]})
            for spec in self.pending[cn.host]:  # nova's own HostState consumed them
                hs.consume_from_request(spec)
            out.append(hs)
        return out

    def hold_pending(self, manager: Any) -> None:
        """Our side of the same builds: each consumed on a view, held as a pending claim."""
        if not any(self.pending.values()):
            return
        states = manager.get_host_states_by_uuids(nova_context.get_admin_context(),
                                                  [cn.uuid for cn in self.nodes], None)
        for hs in list(states):
            for spec in self.pending[hs.host]:
                hs.consume_from_request(spec)


def _candidates(hosts: list[Any]) -> list[Any]:
    for h in hosts:
        # read without materialising our shells: reading an attribute of a shell builds its
        # full HostState, and the vector core then leaves that host to nova's classes (the
        # comparison would be nova against nova)
        u = vector.node_uuid(h)
        h.allocation_candidates = [{"allocations": {u: {}}, "mappings": {"": [u]}}]
    return hosts


def _limits(h: Any) -> dict[str, Any]:
    return {k: canonical_primitive(v.obj_to_primitive()) if hasattr(v, "obj_to_primitive") else v
            for k, v in h.limits.items()}


class _NovaSide:
    """nova's HostManager.get_filtered_hosts / get_weighed_hosts, with nova's handlers."""

    def __init__(self) -> None:
        by_name = {cls.__name__: cls for cls in nova_filters.all_filters()}
        self.filter_handler = nova_filters.HostFilterHandler()
        self.enabled_filters = [by_name[n]() for n in CONF.filter_scheduler.enabled_filters]
        self.weight_handler = nova_weights.HostWeightHandler()
        self.weighers = [cls() for cls in nova_weights.all_weighers()]

    def get_filtered_hosts(self, hosts: Any, spec: Any, index: int) -> Any:
        return nova_hm.HostManager.get_filtered_hosts(self, hosts, spec, index)  # type: ignore[arg-type]

    def get_weighed_hosts(self, hosts: Any, spec: Any) -> Any:
        return nova_hm.HostManager.get_weighed_hosts(self, hosts, spec)  # type: ignore[arg-type]


@contextlib.contextmanager
def _conf(overrides: dict[str, Any]) -> Any:
    for key, value in overrides.items():
        group, _, name = key.rpartition(".")
        CONF.set_override(name, value, group=group)
    try:
        yield
    finally:
        for key in overrides:
            group, _, name = key.rpartition(".")
            CONF.clear_override(name, group=group)


def _decide(side: Any, hosts: Any, spec: Any, index: int) -> tuple[list[Any], Any]:
    try:
        passed = side.get_filtered_hosts(hosts, spec, index)
    except Exception as exc:  # a filter raising (e.g. '>= 8000000' against 'x86_64'): on both sides
        return [], type(exc)
    passed = list(passed) if passed else []
    try:
        weighed = side.get_weighed_hosts(passed, spec) if passed else []
    except Exception as exc:  # e.g. MetricsWeigher with [metrics] required and a metric missing
        return passed, type(exc)
    return passed, weighed


@contextlib.contextmanager
def _filter_lines() -> Any:
    """The INFO lines nova's filter handler (or the vector core in its place) logs meanwhile:
    the filter that returned no host, and the filters' counts when none is left."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.INFO and record.getMessage().startswith("Filter"):
                lines.append(record.getMessage())
    loggers = [logging.getLogger(n) for n in ("nova.filters", vector.__name__)]
    keep, levels = Keep(), [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(keep)
        lg.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(keep)
            lg.setLevel(level)


def _same_decision(theirs: tuple[list[Any], Any], ours: tuple[list[Any], Any]) -> None:
    (t_passed, t_weighed), (o_passed, o_weighed) = theirs, ours
    if isinstance(t_weighed, type) or isinstance(o_weighed, type):
        assert o_weighed == t_weighed  # the same exception on both sides
        t_weighed = o_weighed = []
    assert [(h.host, h.nodename) for h in o_passed] == [(h.host, h.nodename) for h in t_passed]
    # bit-identical weights, in nova's (stable, descending) order
    assert [(w.obj.host, w.weight) for w in o_weighed] == [(w.obj.host, w.weight) for w in t_weighed]
    by_host = {h.host: h for h in t_passed}
    for h in o_passed:
        assert _limits(h) == _limits(by_host[h.host]), h.host
        assert h.allocation_candidates == by_host[h.host].allocation_candidates, h.host


@settings(max_examples=int(__import__("os").environ.get("SHM_VECTOR_EXAMPLES", "60")),
          deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=hosts(), config=configs(), req=requests())
def test_vector_core_decides_as_novas_handlers(params: Any, config: Any, req: Any) -> None:
    _decides_as_nova(params, config, req)


@settings(max_examples=int(__import__("os").environ.get("SHM_VECTOR_EXAMPLES", "60")),
          deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=hosts(4, 1), config=configs(AGGREGATE_FILTERS), req=requests())
def test_the_aggregate_filters_decide_as_novas_handlers(params: Any, config: Any, req: Any) -> None:
    """Only filters whose answer is spread per aggregate group, over 4-7 hosts each in an
    aggregate: a wrong spread (a group's answer given to another group's hosts) shows
    whenever two groups answer differently."""
    _decides_as_nova(params, config, req)


def _decides_as_nova(params: Any, config: Any, req: Any) -> None:
    world = _World(params)
    with _conf(config):
        nova_side = _NovaSide()
        ours = shm.SharedHostManager(world.cache, register_claims=True, default_cell_uuid=fx.CELL1)
        assert ours.vector_decisions
        world.hold_pending(ours)
        ctx = nova_context.get_admin_context()
        spec_n, spec_o = _spec(req), _spec(req)
        theirs_hosts = _candidates(world.nova_states())
        rows = ours.get_host_states_by_uuids(ctx, [cn.uuid for cn in world.nodes], spec_o)
        our_hosts = _candidates(list(rows))
        assert not rows.touched  # every host still a shell: the vector forms decide
        index = req["index"]
        with _filter_lines() as their_lines:
            theirs = _decide(nova_side, theirs_hosts, spec_n, index)
        with _filter_lines() as our_lines:
            mine = _decide(ours, our_hosts, spec_o, index)
        _same_decision(theirs, mine)
        assert our_lines == their_lines  # what an operator reads about a NoValidHost
        assert ours.counters["vector_filtered"] == 1  # the vector core decided, not nova's handler
        if not theirs[1] or isinstance(theirs[1], type):
            return
        # the manager consumes the chosen host, then decides the next instance over the sorted list
        chosen = {"nova": theirs[1][0].obj, "ours": mine[1][0].obj}
        for side, spec in (("nova", spec_n), ("ours", spec_o)):
            nova_manager.SchedulerManager._consume_selected_host(chosen[side], spec,
                                                                 instance_uuid=fx.uuid_for("next", 1))
            spec.instance_uuid = fx.uuid_for("next", 2)
        _same_decision(_decide(nova_side, [w.obj for w in theirs[1]], spec_n, index + 1),
                       _decide(ours, [w.obj for w in mine[1]], spec_o, index + 1))


@settings(max_examples=int(__import__("os").environ.get("SHM_VECTOR_EXAMPLES", "60")),
          deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=hosts(), config=configs(), req=requests())
def test_the_vector_core_over_the_engines_index_decides_as_novas_handlers(
        params: Any, config: Any, req: Any) -> None:
    """The same comparison with the engine's HostIndex in place of the drop-in's request rows
    (design §10, item 13, step 1): the same compute-hook documents and pending builds, held
    in the receiver the index reads; the filtered hosts in order and the weights, bit for
    bit.  Left out of the drawn worlds: a request for a NUMA topology or PCI devices (nova's
    NUMATopologyFilter and PciPassthroughFilter then keep the allocation candidates that
    fit, and the engine has no placement to give any: its requests carry neither)."""
    _decides_as_nova_over_the_index(params, config, dict(req, numa=None, pci=0))


def _decides_as_nova_over_the_index(params: Any, config: Any, req: Any) -> None:
    world = _World(params)
    with _conf(config):
        nova_side = _NovaSide()
        ours = shm.SharedHostManager(world.cache, register_claims=True, default_cell_uuid=fx.CELL1)
        world.hold_pending(ours)
        spec_n, spec_o = _spec(req), _spec(req)
        theirs = _decide(nova_side, _candidates(world.nova_states()), spec_n, req["index"])
        table = IndexTable(HostIndex(world.cache.receiver), Templates(fx.CELL1),
                           now=world.cache.clock())
        order = [cn.uuid for cn in world.nodes]  # nova's side iterates the hosts in this order
        rows = sorted(table.rows().tolist(), key=lambda r: order.index(table.index.sources[r]))
        mine: tuple[list[Any], Any]
        try:
            rows, skip = vector.pre_filter(table, rows, spec_o)
            if not skip:
                rows = vector.run_filters(ours.enabled_filters, table, rows, spec_o, req["index"]) \
                    or []
            passed = [table.host(r) for r in rows]
        except Exception as exc:
            mine = ([], type(exc))
        else:
            try:
                mine = (passed, vector.weigh(ours.weighers, table, rows, spec_o) if rows else [])
            except Exception as exc:
                mine = (passed, type(exc))
        (t_passed, t_weighed), (o_passed, o_weighed) = theirs, mine
        if isinstance(t_weighed, type) or isinstance(o_weighed, type):
            assert o_weighed == t_weighed
            t_weighed = o_weighed = []
        assert [h.host for h in o_passed] == [h.host for h in t_passed]
        assert [(w.obj.host, w.weight) for w in o_weighed] == \
            [(w.obj.host, w.weight) for w in t_weighed]


def test_held_pci_devices_weigh_as_in_novas_host_state() -> None:
    """A world the generator reaches only rarely, pinned: PCIWeigher over two PCI hosts, the
    one device of host0 held by a pending build (nova: taken from its HostState's pools)."""
    params = [{"i": i, "free_ram_mb": 30000, "vcpus_used": 2, "num_instances": 1, "io_workload": 0,
               "failed_builds": 0, "hypervisor_version": 8002000, "cpu_allocation_ratio": 4.0,
               "numa": "none", "pci": (1, 4, 0)[i], "metrics": "default", "stats": {},
               "disabled": False, "forced_down": False, "aggregates": [], "instances": [],
               "pending": 1 if i == 0 else 0} for i in range(3)]
    req = {**_BASE_REQUEST, "me": fx.uuid_for("req", 2)}
    config = {"filter_scheduler.enabled_filters": ["ComputeFilter"],
              "filter_scheduler.pci_weight_multiplier": 1.0}
    _decides_as_nova(params, config, req)
    _decides_as_nova_over_the_index(params, config, req)  # the index counts them too


_BASE_REQUEST = {"extra": {}, "image": {}, "group": None, "members": [], "group_hosts": [],
                 "max_per_host": None, "me": fx.uuid_for("req", 1), "hints": {}, "same": [],
                 "numa": None, "pci": 0, "force_hosts": [], "ignore_hosts": [], "force_nodes": [],
                 "check_type": None, "destination": None, "project": "p", "image_id": None,
                 "index": 0}


def test_the_generated_worlds_exercise_the_vector_forms() -> None:
    """Guard against a vacuous comparison: over a fixed world, each vector filter rejects a host."""
    params = [{"i": i, "free_ram_mb": 30000, "vcpus_used": i, "num_instances": i, "io_workload": i,
               "failed_builds": 0, "hypervisor_version": 6000000 if i == 1 else 8002000,
               "cpu_allocation_ratio": 4.0, "numa": "free", "pci": 0, "metrics": "default",
               "stats": {}, "disabled": i == 2, "forced_down": False,
               "aggregates": [0] if i == 0 else [3] if i == 3 else [],
               "instances": [INSTANCES[0]] if i == 4 else []} for i in range(6)]
    world = _World(params)
    others = {f"host{i}" for i in range(6)} - {"host4"}  # host4 holds INSTANCES[0]
    cases = {
        "ComputeFilter": ({}, {"host2"}),
        "ComputeCapabilitiesFilter": ({"extra": {"capabilities:hypervisor_version": ">= 8000000"}},
                                      {"host1"}),
        "ImagePropertiesFilter": ({"image": {"hw_architecture": "x86_64",
                                             "img_hv_requested_version": ">= 7.0"}}, {"host1"}),
        "AggregateInstanceExtraSpecsFilter": ({"extra": {"aggregate_instance_extra_specs:ssd":
                                                         "true"}},
                                              {"host1", "host2", "host3", "host4", "host5"}),
        "AggregateMultiTenancyIsolation": ({"project": "q"}, {"host3"}),
        "NumInstancesFilter": ({}, {"host5"}),
        "IoOpsFilter": ({}, {"host3", "host4", "host5"}),
        "ServerGroupAntiAffinityFilter": ({"group": "anti-affinity", "members": [INSTANCES[0]]},
                                          {"host4"}),
        "DifferentHostFilter": ({"hints": {"different_host": None}, "same": [INSTANCES[0]]},
                                {"host4"}),
        "SameHostFilter": ({"hints": {"same_host": None}, "same": [INSTANCES[0]]}, others),
        "ServerGroupAffinityFilter": ({"group": "affinity", "members": [INSTANCES[0]],
                                       "group_hosts": ["host4"]}, others),
    }
    base = _BASE_REQUEST
    everyone = {cn.host for cn in world.nodes}
    for name, (req, rejected) in cases.items():
        with _conf({"filter_scheduler.enabled_filters": [name],
                    "filter_scheduler.max_instances_per_host": 5,
                    "filter_scheduler.max_io_ops_per_host": 3}):
            ours = shm.SharedHostManager(world.cache, register_claims=False,
                                         default_cell_uuid=fx.CELL1)
            assert type(ours.enabled_filters[0]) in vector.VECTOR_FILTERS
            spec = _spec({**base, **req})
            rows = ours.get_host_states_by_uuids(nova_context.get_admin_context(), None, spec)
            passed = ours.get_filtered_hosts(rows, spec, 0)
            assert ours.counters["filter_fallback_runs"] == 0, name
            assert everyone - {h.host for h in passed} == rejected, name


def test_a_patched_nova_filter_runs_as_itself() -> None:
    """A vector form stands for nova's methods as shipped: with ``host_passes`` replaced (a
    test's mock.patch, a deployment's monkey patch) the class decides, per host, as nova's
    handler would call it (nova's functional tests patch the group filters this way)."""
    params = [{"i": i, "free_ram_mb": 30000, "vcpus_used": 0, "num_instances": 0, "io_workload": 0,
               "failed_builds": 0, "hypervisor_version": 8002000, "cpu_allocation_ratio": 4.0,
               "numa": "free", "pci": 0, "metrics": "default", "stats": {}, "disabled": False,
               "forced_down": False, "aggregates": [],
               "instances": [INSTANCES[0]] if i == 1 else []} for i in range(3)]
    world = _World(params)
    base = {"extra": {}, "image": {}, "group": "anti-affinity", "members": [INSTANCES[0]],
            "group_hosts": [], "max_per_host": None, "me": fx.uuid_for("req", 1), "hints": {},
            "same": [], "numa": None, "pci": 0, "force_hosts": [], "ignore_hosts": [],
            "force_nodes": [], "check_type": None, "destination": None, "project": "p",
            "image_id": None, "index": 0}
    everyone = {cn.host for cn in world.nodes}
    with _conf({"filter_scheduler.enabled_filters": ["ServerGroupAntiAffinityFilter"]}):
        spec = _spec(base)
        ours = shm.SharedHostManager(world.cache, register_claims=False, default_cell_uuid=fx.CELL1)
        rows = ours.get_host_states_by_uuids(nova_context.get_admin_context(), None, spec)
        assert everyone - {h.host for h in ours.get_filtered_hosts(rows, spec, 0)} == {"host1"}
        with mock.patch("nova.scheduler.filters.affinity_filter.ServerGroupAntiAffinityFilter."
                        "host_passes", return_value=True):
            ours = shm.SharedHostManager(world.cache, register_claims=False,
                                         default_cell_uuid=fx.CELL1)
            rows = ours.get_host_states_by_uuids(nova_context.get_admin_context(), None, spec)
            assert {h.host for h in ours.get_filtered_hosts(rows, spec, 0)} == everyone
            assert ours.counters["filter_fallback_runs"] == 1


def test_only_the_hosts_novas_manager_uses_become_host_states(nova_conf) -> None:
    """Through nova's real SchedulerManager: the candidates are not deep-copied for every host,
    and only the selected host and its alternates are built as HostState objects."""
    nova_conf.set(**{"scheduler.max_attempts": 3})
    nodes = [fx.compute_node(i, free_ram_mb=16384 + (i * 7919) % 40000) for i in range(40)]
    cache = fx.cache_from_documents({cn.uuid: document_from_compute_node(
        cn, service=fx.service_dict(cn.host), instances=[], cell_uuid=fx.CELL1) for cn in nodes})
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement, shared=True):
            manager = nova_manager.SchedulerManager()
            spec = fx.request_spec(instance_uuid=fx.uuid_for("req", 7))
            selections = manager.select_destinations(
                nova_context.get_admin_context(), spec_obj=spec,
                instance_uuids=[spec.instance_uuid], return_objects=True, return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    counters = manager.host_manager.counters
    assert len(selections[0]) == 3
    # the best-weighed host (RAM spreads: the most free RAM) is the one claimed
    best = max(nodes, key=lambda cn: cn.free_ram_mb)
    assert selections[0][0].compute_node_uuid == best.uuid
    assert placement.claims == [(spec.instance_uuid, best.uuid)]
    assert counters["candidates_taken_over"] == 1
    assert counters["vector_filtered"] == 1 and counters["vector_weighed"] == 1
    assert counters["hosts_materialized"] == 3


def test_bench_decision_only_agrees_with_novas_handlers(capsys, tmp_path) -> None:
    """``shm bench nova --decision-only`` runs both ways and checks they pick the same hosts."""
    import gc
    import json

    from simulator import bench_nova

    before = gc.get_threshold()
    assert bench_nova.main(["--decision-only", "--hosts", "30", "--rounds", "1", "--requests", "2",
                            "--warmup", "1", "--json", "--record", str(tmp_path)]) == 0
    assert gc.get_threshold() == before  # the benchmark's GC threshold ends with it
    result = json.loads(capsys.readouterr().out)
    assert result["hosts"] == 30 and result["vector"]["samples"] == 2
    assert result["per-host"]["samples"] == 1
    assert set(result["vector"]) >= {"host_states", "filter", "weigh", "total"}
    # --record: a recording drop-in beside, whose log re-runs the same
    assert result["recorded"]["samples"] == 2 and result["update_log_bytes"] > 0
    from shared_host_manager.nova.replay.steps import StepReplayer
    from shared_host_manager.updatelog.reader import find_logs
    from shared_host_manager.updatelog.replay import replay

    (parts,) = find_logs(str(tmp_path)).values()
    r = replay(parts, decisions=True, host_manager=StepReplayer)
    assert r.decisions == 3 and r.decisions_checked == 3 and r.ok, r.decision_diffs


def test_bench_decision_only_in_a_deployments_state_agrees_with_novas_handlers(capsys) -> None:
    """``--api-services --aggregates``: API-side service records for every host (some of them
    disabling the host) and aggregates with weight multipliers; both ways pick the same hosts
    with the same weights (the benchmark asserts it)."""
    import json

    from simulator import bench_nova

    assert bench_nova.main(["--decision-only", "--hosts", "30", "--rounds", "1", "--requests", "2",
                            "--warmup", "1", "--json", "--api-services", "--aggregates", "4",
                            "--gc-young-threshold", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["api_services"] is True and result["aggregates"] == 4
    assert result["hosts_passed"] == 29  # host 7's service is disabled on the API side
    assert result["vector"]["samples"] == 2


@pytest.mark.slow
def test_bench_nova_runs_each_side_with_its_process_gc(tmp_path) -> None:
    """``shm bench nova``: nova's database side with Python's GC, the drop-in with its own (in
    a process of its own: nova's database setup is once per process).  osprofiler is installed
    here, as in many nova deployments (the test extra): nova's database layer then reads
    [profiler], which only nova's own configuration parse registered."""
    import importlib.util
    import json
    import subprocess
    import sys

    assert importlib.util.find_spec("osprofiler") is not None

    out = subprocess.run([sys.executable, "-m", "shm_cli.main", "bench", "nova", "--hosts", "12",
                          "--rounds", "1", "--requests", "1", "--warmup", "1", "--dir",
                          str(tmp_path), "--json"], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    g1, g2 = result["gc_thresholds"]["nova"][1:]
    assert result["gc_thresholds"] == {"nova": [700, g1, g2], "shared": [100000, g1, g2]}
    assert result["nova"]["sql_per_request"] > 0 and result["shared"]["sql_per_request"] == 0
    assert result["shared"]["mean_ms"] > 0
