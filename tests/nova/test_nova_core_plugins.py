"""The engine deciding with nova's own classes through the vector core (nova/core/plugins.py).

What the differential tests (test_own_core_vs_nova.py, test_nova_vector.py) do not
pin down: what changes between decisions reaches nova's classes over the index
(a delta, a host going down), where the engine's receiver stands in for nova's
servicegroup, that the engine's options reach nova's classes, and the benchmark
that measures the two cores side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from protocol.document import SET  # noqa: E402
from protocol.messages import Delta  # noqa: E402
from shared_host_manager.conf.decision import SchedulerConfig  # noqa: E402
from shared_host_manager.decision.engine import DecisionEngine  # noqa: E402
from shared_host_manager.decision.request import (  # noqa: E402
    Flavor,
    InstanceGroup,
    RequestSpec,
)
from shared_host_manager.nova.core import plugins as core_plugins  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from simulator import bench_decisions  # noqa: E402
from simulator.synthetic_hosts import host_doc, load_receiver  # noqa: E402

pytestmark = pytest.mark.nova

CONF = fx.setup_nova()

FILTERS = ("ComputeFilter", "ResourceFitFilter", "ImagePropertiesFilter")
WEIGHERS = ("RAMWeigher",)


def _engine(docs: dict, path: str = "fast", config: SchedulerConfig | None = None,
            **receiver: object) -> DecisionEngine:
    """An engine over ``docs`` deciding with nova's classes for ``config``'s names (default:
    FILTERS and WEIGHERS)."""
    config = config or SchedulerConfig(enabled_filters=FILTERS, weight_classes=WEIGHERS)
    shared = core_plugins.Shared()
    rec = load_receiver(docs, **receiver)  # type: ignore[arg-type]
    return DecisionEngine(
        rec, config=config, path=path,
        filters=core_plugins.load_filters(config.enabled_filters, config, shared),
        weighers=core_plugins.load_weighers(config.weight_classes, config, shared))


def _hosts(engine: DecisionEngine, spec: RequestSpec) -> list[str]:
    return [source for source, _ in engine.ordered_hosts(spec)]


def test_names_nova_has_become_novas_classes_the_rest_stay_ours() -> None:
    engine = _engine({"a": host_doc("a")})
    kinds = {f.name: type(f).__name__ for f in engine.filters}
    assert kinds == {"ComputeFilter": "NovaFilter", "ResourceFitFilter": "ResourceFitFilter",
                     "ImagePropertiesFilter": "NovaFilter"}
    assert [type(w).__name__ for w in engine.weighers] == ["NovaWeigher"]


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_delta_reaches_novas_classes_at_the_next_decision(path: str) -> None:
    """The per-row values nova's classes group by (here the supported instances) are kept
    between decisions: a delta must renew them."""
    engine = _engine({"a": host_doc("a"), "b": host_doc("b", supported_instances=[
        ["aarch64", "qemu", "hvm"]])}, path)
    arm = RequestSpec(flavor=Flavor(1, 512, 1), image_properties={"hw_architecture": "aarch64"},
                      instance_uuids=("i1",))
    assert _hosts(engine, arm) == ["b"]
    engine.receiver.receive(Delta("a", 1, 1, [[SET, "compute", "supported_instances",
                                               [["aarch64", "qemu", "hvm"]]]]), 1.0)
    assert sorted(_hosts(engine, arm)) == ["a", "b"]
    engine.receiver.receive(Delta("b", 1, 1, [[SET, "compute", "supported_instances",
                                               [["x86_64", "qemu", "hvm"]]]]), 2.0)
    assert _hosts(engine, arm) == ["a"]


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_the_receiver_is_novas_servicegroup(path: str) -> None:
    """A host the receiver no longer hears from (DOWN) fails nova's ComputeFilter; so does a
    disabled one."""
    engine = _engine({"a": host_doc("a"), "b": host_doc("b"), "c": host_doc("c", disabled=True)},
                     path, down_interval=10.0)
    spec = RequestSpec(flavor=Flavor(1, 512, 1), instance_uuids=("i1",))
    assert sorted(_hosts(engine, spec)) == ["a", "b"]
    for t in (4.0, 8.0, 12.0):  # a keeps reporting, b is silent past the down interval
        engine.receiver.receive(Delta("a", 1, int(t), [[SET, "compute", "num_io_ops", 0]]), t)
        engine.receiver.tick(t)
    assert _hosts(engine, spec) == ["a"]


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_claim_reaches_novas_classes_at_the_next_decision(path: str) -> None:
    """The numbers nova's classes read are kept between decisions too: a claim the engine
    registered counts an instance on its host at the next decision (max_instances_per_host
    1: one decision per host)."""
    docs = {name: host_doc(name, num_instances=0) for name in ("a", "b", "c")}
    config = SchedulerConfig(enabled_filters=("ComputeFilter", "NumInstancesFilter"),
                             weight_classes=WEIGHERS, max_instances_per_host=1)
    try:
        engine = _engine(docs, path, config)
        took = [engine.select_destinations(RequestSpec(flavor=Flavor(1, 512, 1),
                                                       instance_uuids=(f"i{k}",)), 0.0).rows[0][0].source
                for k in range(3)]
        assert sorted(took) == ["a", "b", "c"]
    finally:
        for name in core_plugins.SHARED_OPTIONS:
            CONF.clear_override(name, group="filter_scheduler")


def test_per_group_answers_kept_across_decisions_follow_the_request_and_the_aggregates() -> None:
    """nova's aggregate filters are asked once per aggregate group and the answers kept
    between decisions, under what the request asks (here its project): another project,
    or new aggregate metadata, is asked again."""
    private = {"agg-p": {"name": "p", "metadata": {"filter_tenant_id": "p1"}}}
    docs = {"a": host_doc("a", aggregates=private), "b": host_doc("b")}
    names = ("ComputeFilter", "AggregateMultiTenancyIsolation")
    engine = _engine(docs, config=SchedulerConfig(enabled_filters=names, weight_classes=WEIGHERS))

    def hosts(project: str) -> list[str]:
        return sorted(_hosts(engine, RequestSpec(flavor=Flavor(1, 512, 1), project_id=project,
                                                 instance_uuids=("i1",))))

    assert hosts("p1") == ["a", "b"]
    assert hosts("p2") == ["b"]
    assert hosts("p1") == ["a", "b"]
    engine.receiver.receive(Delta("a", 1, 1, [[SET, "aggregates", "agg-p", {
        "name": "p", "metadata": {"filter_tenant_id": "p2"}}]]), 1.0)
    assert hosts("p1") == ["b"]
    assert hosts("p2") == ["a", "b"]


def test_the_engines_options_reach_novas_classes() -> None:
    """nova's weighers read the engine's multiplier: -1 prefers the fullest host."""
    docs = {"a": host_doc("a", memory_mb_used=1024), "b": host_doc("b", memory_mb_used=65536)}
    spec = RequestSpec(flavor=Flavor(1, 512, 1), instance_uuids=("i1",))
    try:
        for multiplier, best in ((1.0, "a"), (-1.0, "b")):
            config = SchedulerConfig(enabled_filters=FILTERS, weight_classes=WEIGHERS,
                                     ram_weight_multiplier=multiplier)
            engine = _engine(docs, config=config)
            assert CONF.filter_scheduler.ram_weight_multiplier == multiplier
            assert _hosts(engine, spec)[0] == best
    finally:
        for name in core_plugins.SHARED_OPTIONS:
            CONF.clear_override(name, group="filter_scheduler")


def test_a_multi_create_consumes_on_novas_host_objects() -> None:
    """The second instance sees what the first took (the request's scratch on nova's host
    object): one host with room for one instance only, the other for two."""
    docs = {"a": host_doc("a", memory_mb=4096), "b": host_doc("b", memory_mb=8192)}
    config = SchedulerConfig(enabled_filters=("ComputeFilter", "ResourceFitFilter"),
                             weight_classes=("RAMWeigher",), host_subset_size_max=1)
    engine = _engine(docs, config=config)
    spec = RequestSpec(flavor=Flavor(1, 3072, 1), instance_uuids=("i1", "i2", "i3"))
    took = [row[0].source for row in engine.select_destinations(spec, 0.0, dry_run=True).rows]
    # RAMWeigher: b (8 GB free) first; then a (4 GB) against b's 5 GB left: b; then a
    assert took == ["b", "b", "a"]


def test_kept_image_answers_follow_the_request_and_novas_default_architecture() -> None:
    """ImagePropertiesFilter's answers are kept per supported-instances group across
    decisions, under what nova's class reads of the request: the image's architecture, or
    nova's default architecture when the image names none."""
    docs = {"a": host_doc("a"), "b": host_doc("b", supported_instances=[
        ["aarch64", "qemu", "hvm"]])}
    engine = _engine(docs)

    def hosts(**props: str) -> list[str]:
        return sorted(_hosts(engine, RequestSpec(flavor=Flavor(1, 512, 1),
                                                 image_properties=props,
                                                 instance_uuids=("i1",))))

    try:
        assert hosts() == ["a", "b"]
        assert hosts(hw_architecture="aarch64") == ["b"]
        CONF.set_override("image_properties_default_architecture", "aarch64",
                          group="filter_scheduler")
        assert hosts() == ["b"]
        assert hosts(hw_architecture="x86_64") == ["a"]
        CONF.set_override("image_properties_default_architecture", "x86_64",
                          group="filter_scheduler")
        assert hosts() == ["a"]
        assert hosts(hw_architecture="aarch64") == ["b"]
    finally:
        CONF.clear_override("image_properties_default_architecture", group="filter_scheduler")


def test_alike_requests_share_one_request_spec_each_placing_its_own_instances() -> None:
    """nova's RequestSpec is made once for requests alike but for their instances; each
    request's instance (and its group's members and hosts) is set on it again whenever
    another request used it in between."""
    engine = _engine({"a": host_doc("a")})
    shared = core_plugins.Shared()

    def view(uuid: str, member: str) -> object:
        group = InstanceGroup("anti-affinity", members=[member])
        return engine.request_view(RequestSpec(flavor=Flavor(1, 512, 1), instance_group=group,
                                               instance_uuids=(uuid,)))

    first, second = view("i1", "m1"), view("i2", "m2")
    one, two = shared.request(None, first), shared.request(None, second)  # type: ignore[arg-type]
    assert one.spec() is two.spec()
    for request, uuid, member in ((one, "i1", "m1"), (two, "i2", "m2"), (one, "i1", "m1")):
        spec = request.spec()
        assert spec.instance_uuid == uuid
        assert member in spec.instance_group.members
        assert (member == "m1") != ("m2" in spec.instance_group.members)
    other = shared.request(None, view("i3", "m3"))  # type: ignore[arg-type]
    assert other.spec() is one.spec()
    project = engine.request_view(RequestSpec(flavor=Flavor(1, 512, 1), project_id="p2",
                                              instance_uuids=("i4",)))
    assert shared.request(None, project).spec() is not one.spec()


def test_the_request_specs_asked_lately_are_kept_when_new_shapes_come() -> None:
    """At most ``size`` RequestSpecs are kept: a new shape makes the least recently asked
    one go, and only that one (making a RequestSpec costs more than a decision)."""
    engine = _engine({"a": host_doc("a")})
    shared = core_plugins.Shared()
    shared.objects = core_plugins._Objects(size=3)

    def spec(project: str) -> object:
        view = engine.request_view(RequestSpec(flavor=Flavor(1, 512, 1), project_id=project,
                                               instance_uuids=(f"i-{project}",)))
        return core_plugins._NovaRequest(shared, view).spec(instance=False)  # type: ignore[arg-type]

    a, b, c = spec("a"), spec("b"), spec("c")
    assert spec("a") is a  # asked again: now the most recent
    spec("d")  # a fourth shape: b, the least recently asked, goes
    assert spec("a") is a and spec("c") is c
    assert spec("b") is not b
    assert len(shared.objects._specs) == 3


def test_requests_alike_each_keep_their_own_group_members_away() -> None:
    """Two anti-affinity requests alike but for their members share one RequestSpec; each
    avoids its own members' hosts whichever decided last (a vector form reading what is set
    per instance gets it set: vector.PER_INSTANCE)."""
    m1, m2 = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
    docs = {"a": host_doc("a", instances={m1: {}}), "b": host_doc("b", instances={m2: {}}),
            "c": host_doc("c")}
    names = ("ComputeFilter", "ServerGroupAntiAffinityFilter")
    engine = _engine(docs, config=SchedulerConfig(enabled_filters=names, weight_classes=WEIGHERS))

    def hosts(member: str) -> set[str]:
        group = InstanceGroup("anti-affinity", members=[member], uuid="g1")
        return set(_hosts(engine, RequestSpec(flavor=Flavor(1, 512, 1), instance_group=group,
                                              instance_uuids=(f"i-{member}",))))

    for _ in range(2):
        assert hosts(m1) == {"b", "c"}
        assert hosts(m2) == {"a", "c"}


def test_the_multipliers_key_follows_novas_option_and_patched_classes_are_asked() -> None:
    """The multiplier a weigher's per-group answers are kept under is nova's, asked again
    when its option changes; a replaced ``weight_multiplier`` is asked every time."""
    from unittest import mock

    from nova.scheduler.weights import ram

    weigher = core_plugins.NovaWeigher(ram.RAMWeigher(), core_plugins.Shared())
    try:
        assert weigher.default_multiplier == 1.0
        CONF.set_override("ram_weight_multiplier", 2.5, group="filter_scheduler")
        assert weigher.default_multiplier == 2.5
        with mock.patch.object(ram.RAMWeigher, "weight_multiplier",
                               side_effect=[7.0, 8.0]):
            assert weigher.default_multiplier == 7.0
            assert weigher.default_multiplier == 8.0
        assert weigher.default_multiplier == 2.5
    finally:
        CONF.clear_override("ram_weight_multiplier", group="filter_scheduler")
    assert weigher.default_multiplier == 1.0


def test_a_class_replaced_since_nova_shipped_it_is_told_on_the_next_decision() -> None:
    """The vector forms stand for nova's classes as shipped (vector.is_base_filter_all and
    is_base_weigher, asked on every decision): a method replaced on the class, on a base
    class it inherits from, or shadowed in the class makes it run as itself, and restored,
    the form stands for it again.  The default multiplier only looks at
    ``weight_multiplier``, all it runs: another method replaced leaves it nova's."""
    from unittest import mock

    from nova.scheduler import filters as nova_filters
    from nova.scheduler.filters import compute_filter
    from nova.scheduler.weights import ram

    from shared_host_manager.nova.core import vector

    f = compute_filter.ComputeFilter.__new__(compute_filter.ComputeFilter)
    w = ram.RAMWeigher()
    assert vector.is_base_filter_all(f) and vector.is_base_weigher(w)
    for target, name in ((compute_filter.ComputeFilter, "host_passes"),
                         (nova_filters.BaseHostFilter, "_filter_one"),
                         (nova_filters.BaseHostFilter, "filter_all"),
                         (compute_filter.ComputeFilter, "filter_all")):  # shadows the base's
        with mock.patch.object(target, name, return_value=[]):
            assert not vector.is_base_filter_all(f), (target, name)
        assert vector.is_base_filter_all(f), (target, name)
    with mock.patch.object(ram.RAMWeigher, "_weigh_object", return_value=3.0):
        assert not vector.is_base_weigher(w)
        assert vector.default_multiplier(w) == 1.0
    assert vector.is_base_weigher(w)

    class Own(nova_filters.BaseHostFilter):
        """A method whose look-up is a new object each time: told in the class dicts."""

        @classmethod
        def limit(cls) -> int:
            return 1

        def host_passes(self, host_state: object, spec_obj: object) -> bool:
            return True

    shipped = vector._Shipped(Own, "filter_all", nova_filters.BaseHostFilter.filter_all)
    assert shipped.unchanged()
    with mock.patch.object(Own, "limit", classmethod(lambda cls: 2)):
        assert not shipped.unchanged()
    assert shipped.unchanged()


def test_bench_decisions_decides_with_novas_classes(tmp_path) -> None:
    out = tmp_path / "bench.json"
    rc = bench_decisions.main(["--hosts", "40", "--runs", "2", "--decisions", "10",
                               "--slow-decisions", "2", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert "ComputeFilter" in result["fast"]["filters"] and len(result["fast"]["runs"]) == 2
    assert result["fast"]["filters"] == result["slow"]["filters"]
    assert result["gc_young_threshold"] == 100000


def test_the_bench_with_novas_classes_warns_of_nothing() -> None:
    """nova's imports bring eventlet's deprecation warning in (nothing here runs eventlet),
    and nova's objects warn about any instance id that is no UUID: a user of ``shm bench
    decisions`` (or ``shm sim``) sees neither."""
    code = ("from shm_cli.main import main\n"
            "raise SystemExit(main(['bench', 'decisions', '--hosts', '30', '--runs', '1',"
            " '--decisions', '5', '--slow-decisions', '1']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__)))))
    assert result.returncode == 0, result.stderr
    assert "fast path" in result.stdout
    assert "Warning" not in result.stderr, result.stderr[:2000]
