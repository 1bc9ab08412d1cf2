"""The drop-in's placement client (shared_host_manager/nova/report_client.py) against placement itself.

placement's own WSGI app runs in this process (:class:`simulator.placement_real.RealPlacement`,
SQLite), reached by nova's report client through a keystoneauth adapter (wsgi-intercept, no
socket).  The view is a stand-in with PlacementView's interface, backed by ``ProviderState``
and ``answer`` and fed from placement's tables (``export_state``): what the placement feed
gives the scheduler's view.

* the same tuple from memory as nova's own ``get_allocation_candidates`` for requests made by
  nova from request specs: standard resource classes, required and forbidden traits,
  ``member_of``, ``root_required=!COMPUTE_STATUS_DISABLED``, ``limit``;
* a request memory does not answer (a class asked twice), no feed, a stale view, the option
  off: nova's own query, counted by reason;
* a claim placement refuses because the view was behind: nova's manager goes on to the next
  host, the provider is read back into the view, and the next answer does not offer it;
* the hook: nova's ``Service.create`` builds the SharedSchedulerManager, whose client reaches
  its view through the view provider; the counters on the metrics endpoint's collector.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

pytest.importorskip("nova.scheduler")
pytest.importorskip("placement.deploy")
pytest.importorskip("wsgi_intercept")

from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import utils as nova_utils  # noqa: E402
from nova.scheduler.client import report  # noqa: E402

from shared_host_manager.nova import report_client as rc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from shared_host_manager.placement import PlacementConfig, ProviderState, Unanswered, answer  # noqa: E402
from simulator.placement_real import RealPlacement  # noqa: E402

pytestmark = pytest.mark.nova

AGG_A = "aaaaaaaa-0000-4000-8000-000000000001"
AGG_B = "bbbbbbbb-0000-4000-8000-000000000002"


def rp_uuid(i: int) -> str:
    """Compute node ``i``'s uuid (its provider's in placement)."""
    return fx.uuid_for("cn", i)


#: (traits, aggregates) of the providers; every one has 16 VCPU, 32 GB RAM, 400 GB disk
PROVIDERS = [
    ([], [AGG_A]),
    (["HW_CPU_X86_AVX2"], [AGG_A]),
    (["HW_CPU_X86_AVX2", "CUSTOM_SLOW"], [AGG_B]),
    (["COMPUTE_STATUS_DISABLED"], [AGG_A]),
    (["HW_CPU_X86_AVX2"], []),
    ([], [AGG_B]),
]


class MemoryView:
    """A stand-in with PlacementView's interface: ``ProviderState`` and ``answer`` under a lock."""

    def __init__(self, doc: Mapping[str, Any] | None = None, config: PlacementConfig | None = None) -> None:
        self.lock = threading.Lock()
        self.state = ProviderState.from_dict(doc) if doc is not None else ProviderState()
        self.fed = doc is not None
        self.stale = False
        self.config = config or PlacementConfig()
        self.claims: list[dict[str, dict[str, int]]] = []
        self.corrections: list[dict[str, Any]] = []

    def apply_providers(self, changed: Mapping[str, Mapping[str, Any] | None], now: float) -> None:
        with self.lock:
            for u, doc in changed.items():
                if doc is None:
                    self.state.delete(u)
                else:
                    self.state.apply(doc)
            self.fed = True

    def answer(self, querystring: str, microversion: str, rng: Any = None,
               asked_at: float | None = None, wait: float = 0.0) -> Any:
        with self.lock:
            if not self.fed:
                return Unanswered("no_feed")
            if self.stale:
                return Unanswered("stale")
            return answer(self.state, querystring, microversion, self.config, rng)

    def _replace(self, doc: Mapping[str, Any]) -> None:
        self.state.delete(doc["uuid"])
        self.state.apply(doc)

    def note_claim(self, allocations: Mapping[str, Mapping[str, int]]) -> None:
        with self.lock:
            self.claims.append({rp: dict(r) for rp, r in allocations.items()})
            for rp, resources in allocations.items():
                p = self.state.get(rp)
                if p is not None:
                    d = p.to_dict()
                    for r, n in resources.items():
                        d["usages"][r] = d["usages"].get(r, 0) + n
                    self._replace(d)

    def provider(self, uuid: str) -> dict[str, Any] | None:
        with self.lock:
            p = self.state.get(uuid)
            return None if p is None else p.to_dict()

    def correct(self, provider: Mapping[str, Any]) -> None:
        with self.lock:
            self.corrections.append(dict(provider))
            self._replace(provider)

    def status(self) -> dict[str, Any]:
        return {"providers": len(self.state), "fed": self.fed}

    def over_capacity(self, allocations: Mapping[str, Mapping[str, int]]) -> str | None:
        return None  # the stand-in never knows: every claim goes to placement


class Placement:
    """RealPlacement with a keystoneauth adapter onto its WSGI app (wsgi-intercept)."""

    def __init__(self) -> None:
        import requests
        from keystoneauth1 import session
        from wsgi_intercept import interceptor

        self.real = RealPlacement()
        self.url = f"http://placement-{uuid.uuid4().hex}/placement"
        app = self.real.app
        self._intercept = interceptor.RequestsInterceptor(lambda: app, url=self.url)
        self._intercept.__enter__()
        self._session = session.Session(auth=None, session=requests.Session(),
                                        additional_headers={"x-auth-token": "admin"})

    def adapter(self) -> Any:
        from keystoneauth1 import adapter

        return adapter.Adapter(self._session, service_type="placement", endpoint_override=self.url,
                               raise_exc=False)

    def close(self) -> None:
        self._intercept.__exit__(None, None, None)
        self.real.close()


def placement_view(doc: Mapping[str, Any]) -> Any:
    """The scheduler's own PlacementView, fed ``doc`` as the placement feed would, on a clock
    that does not move (always fresh)."""
    from shared_host_manager.placement.view import PlacementView

    view = PlacementView(clock=lambda: 0.0)
    view.set_known_names(traits=doc["traits"], resource_classes=doc["resource_classes"],
                         allocation_ratio_storage=doc["allocation_ratio_storage"])
    view.apply_providers({p["uuid"]: p for p in doc["providers"]}, 0.0)
    return view


VIEWS = {"stand-in": MemoryView, "PlacementView": placement_view}


@pytest.fixture(scope="module")
def placement():
    fx.setup_nova()
    p = Placement()
    yield p
    p.close()


@pytest.fixture
def world(placement):
    """Six compute providers, one of them with 2 VCPU used; the state's dict form back."""
    real = placement.real
    real.reset()
    real.ok("PUT", "/traits/CUSTOM_SLOW")
    for i, (traits, aggs) in enumerate(PROVIDERS):
        u = rp_uuid(i)
        real.ok("POST", "/resource_providers", {"uuid": u, "name": f"cn{i}"})
        gen = real.ok("PUT", f"/resource_providers/{u}/inventories", {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 16, "allocation_ratio": 1.0},
                            "MEMORY_MB": {"total": 32768}, "DISK_GB": {"total": 400}}},
        )["resource_provider_generation"]
        if traits:
            gen = real.ok("PUT", f"/resource_providers/{u}/traits", {
                "resource_provider_generation": gen, "traits": traits})["resource_provider_generation"]
        if aggs:
            real.ok("PUT", f"/resource_providers/{u}/aggregates",
                    {"resource_provider_generation": gen, "aggregates": aggs})
    claim(placement, rp_uuid(5), {"VCPU": 2, "MEMORY_MB": 1024})
    return real.export_state()


def claim(placement: Placement, rp: str, resources: Mapping[str, int], consumer: str | None = None) -> None:
    placement.real.ok("PUT", f"/allocations/{consumer or uuid.uuid4()}", {
        "allocations": {rp: {"resources": dict(resources)}}, "project_id": "p", "user_id": "u",
        "consumer_generation": None, "consumer_type": "INSTANCE"}, version="1.38")


def resources_of(spec: Any) -> Any:
    return nova_utils.resources_from_request_spec(nova_context.get_admin_context(), spec, None)


def spec(*, vcpus: int = 2, memory_mb: int = 2048, extra_specs: Mapping[str, str] | None = None,
         aggregates: list[str] | None = None, disabled_forbidden: bool = True) -> Any:
    s = fx.request_spec(vcpus=vcpus, memory_mb=memory_mb, extra_specs=extra_specs)
    if aggregates is not None:
        s.requested_destination = objects.Destination(aggregates=aggregates)
    if disabled_forbidden:  # nova's compute_status_filter request filter
        s.root_forbidden.add("COMPUTE_STATUS_DISABLED")
    return s


def canonical(areq: Mapping[str, Any]) -> str:
    return json.dumps(areq, sort_keys=True)


def normal(result: Any) -> tuple[list[str], dict[str, Any], str]:
    areqs, sums, version = result
    return (sorted(map(canonical, areqs)),
            {u: {**s, "traits": sorted(s["traits"])} for u, s in sums.items()}, version)


REQUESTS = {
    "standard classes": lambda: spec(disabled_forbidden=False),
    "root_required !COMPUTE_STATUS_DISABLED": lambda: spec(),
    "required trait": lambda: spec(extra_specs={"trait:HW_CPU_X86_AVX2": "required"}),
    "required and forbidden traits": lambda: spec(extra_specs={"trait:HW_CPU_X86_AVX2": "required",
                                                                "trait:CUSTOM_SLOW": "forbidden"}),
    "member_of any of": lambda: spec(aggregates=[f"{AGG_A},{AGG_B}"]),
    "member_of all of": lambda: spec(aggregates=[AGG_A]),
    "too big for one": lambda: spec(vcpus=15),
    "too big for all": lambda: spec(vcpus=17),
}


@pytest.mark.parametrize("kind", sorted(VIEWS))
@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_same_tuple_from_memory_as_from_nova(placement, world, name, kind):
    view = VIEWS[kind](world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    novas = report.SchedulerReportClient(placement.adapter())
    ctx = nova_context.get_admin_context()
    resources = resources_of(REQUESTS[name]())
    mine = ours.get_allocation_candidates(ctx, resources)
    theirs = novas.get_allocation_candidates(ctx, resources)
    assert type(mine) is tuple and len(mine) == 3
    assert normal(mine) == normal(theirs)
    assert ours.from_memory == 1 and ours.from_placement == 0 and ours.placement_queries == 0


def test_a_limit_cuts_to_the_same_number_of_candidates(placement, world, nova_conf):
    nova_conf.set(**{"scheduler.max_placement_results": 2})
    view = MemoryView(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    novas = report.SchedulerReportClient(placement.adapter())
    ctx = nova_context.get_admin_context()
    resources = resources_of(spec())
    assert "limit=2" in resources.to_querystring()
    mine = ours.get_allocation_candidates(ctx, resources)
    theirs = novas.get_allocation_candidates(ctx, resources)
    full = normal(novas.get_allocation_candidates(ctx, resources_of(spec())))  # limit 2 again
    assert len(mine[0]) == len(theirs[0]) == 2 and mine[2] == theirs[2] == "1.36"
    nova_conf.set(**{"scheduler.max_placement_results": 1000})
    every = {canonical(a) for a in novas.get_allocation_candidates(ctx, resources_of(spec()))[0]}
    assert set(map(canonical, mine[0])) <= every and set(full[0]) <= every
    assert set(mine[1]) == {u for a in mine[0] for u in a["allocations"]}


def test_placements_options_reach_the_view(placement, world):
    """max_allocation_candidates as nova.conf repeats it becomes the view's PlacementConfig."""
    view = MemoryView(world)
    config = PlacementConfig(max_allocation_candidates=1)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True, placement_config=config)
    result = ours.get_allocation_candidates(nova_context.get_admin_context(), resources_of(spec()))
    assert view.config == config and len(result[0]) == 1


def test_what_memory_does_not_answer_goes_to_placement_counted_by_reason(placement, world):
    view = MemoryView(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    novas = report.SchedulerReportClient(placement.adapter())
    ctx = nova_context.get_admin_context()
    # VCPU asked in two groups under isolate: placement's answer depends on the order it builds
    # candidates in (query.py, repeated_class)
    repeated = resources_of(spec(extra_specs={"resources1:VCPU": "1", "resources2:VCPU": "1",
                                              "group_policy": "isolate"}))
    assert "resources2=VCPU" in repeated.to_querystring()
    assert normal(ours.get_allocation_candidates(ctx, repeated)) == \
        normal(novas.get_allocation_candidates(ctx, repeated))
    view.stale = True
    ours.get_allocation_candidates(ctx, resources_of(spec()))
    view.stale, view.fed = False, False
    ours.get_allocation_candidates(ctx, resources_of(spec()))
    off = rc.SharedReportClient(placement.adapter(), view=view, from_memory=False)
    off.get_allocation_candidates(ctx, resources_of(spec()))
    none = rc.SharedReportClient(placement.adapter(), view_provider=lambda: None, from_memory=True)
    none.get_allocation_candidates(ctx, resources_of(spec()))
    assert ours.from_memory == 0 and ours.from_placement == 3
    assert ours.by_reason == {"repeated_class": 1, "stale": 1, "no_feed": 1}
    assert ours.requests["allocation_candidates"] == ours.placement_queries == 3
    assert dict(off.by_reason) == {"disabled": 1} and dict(none.by_reason) == {"no_view": 1}


def test_a_suffixed_group_is_answered_from_memory_as_placement_answers_it(placement, world):
    view = MemoryView(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    novas = report.SchedulerReportClient(placement.adapter())
    ctx = nova_context.get_admin_context()
    granular = resources_of(spec(extra_specs={"resources1:VCPU": "1", "trait1:HW_CPU_X86_AVX2": "required"}))
    assert "resources1=VCPU" in granular.to_querystring()
    mine = ours.get_allocation_candidates(ctx, granular)
    assert ours.from_memory == 1 and ours.from_placement == 0
    assert mine[0] and normal(mine) == normal(novas.get_allocation_candidates(ctx, granular))
    assert all(set(a["mappings"]) == {"", "1"} for a in mine[0])


def test_placement_views_no_feed_and_stale_go_to_placement(placement, world):
    from shared_host_manager.placement.view import PlacementView

    ctx = nova_context.get_admin_context()
    empty = rc.SharedReportClient(placement.adapter(), view=PlacementView(clock=lambda: 0.0),
                                  from_memory=True)
    empty.get_allocation_candidates(ctx, resources_of(spec()))
    view = placement_view(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    ours.get_allocation_candidates(ctx, resources_of(spec()))
    view.source_down()
    assert len(ours.get_allocation_candidates(ctx, resources_of(spec()))[0]) == 5  # placement's
    assert dict(empty.by_reason) == {"no_feed": 1}
    assert ours.from_memory == 1 and dict(ours.by_reason) == {"stale": 1}


def test_a_view_answers_a_request_once_it_holds_a_poll_begun_after_the_request_came(placement,
                                                                                  world):
    """The request context's timestamp (nova-api made the context when the request came; it
    travels with the context over RPC) bars answers from a view whose newest poll of the
    feed began before it: after ``fresh_wait`` placement answers, counted ``behind``."""
    view = placement_view(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True, fresh_wait=0.0)
    ctx = nova_context.get_admin_context()
    came = rc.asked_at(ctx)
    assert came is not None and abs(came - time.time()) < 60
    assert rc.asked_at(nova_context.RequestContext.from_dict(ctx.to_dict())) == came
    assert rc.asked_at(object()) is None
    view.polled(came - 0.5)
    theirs = ours.get_allocation_candidates(ctx, resources_of(spec()))
    assert ours.from_memory == 0 and dict(ours.by_reason) == {"behind": 1}
    view.polled(came + 0.001)
    assert normal(ours.get_allocation_candidates(ctx, resources_of(spec()))) == normal(theirs)
    assert ours.from_memory == 1 and view.counters["waits"] == 1


def test_an_accepted_claim_is_noted_in_the_view(placement, world):
    view = MemoryView(world)
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    ctx = nova_context.get_admin_context()
    areqs, _, version = ours.get_allocation_candidates(ctx, resources_of(spec()))
    areq = next(a for a in areqs if rp_uuid(0) in a["allocations"])
    assert ours.claim_resources(ctx, str(uuid.uuid4()), areq, "p", "u", version) is True
    assert view.claims == [{rp_uuid(0): {"DISK_GB": 20, "MEMORY_MB": 2048, "VCPU": 2}}]
    assert view.state.get(rp_uuid(0)).usages["VCPU"] == 2
    assert ours.requests["claim"] == 1 and ours.requests["claim_refused"] == 0


def test_a_provider_read_back_is_placements_own(placement, world):
    ours = rc.SharedReportClient(placement.adapter(), view=MemoryView(world), from_memory=True)
    got = ours.read_provider(nova_context.get_admin_context(), rp_uuid(2))
    want = next(p for p in world["providers"] if p["uuid"] == rp_uuid(2))
    assert {**got, "traits": sorted(got["traits"])} == {**want, "traits": sorted(want["traits"])}
    assert ours.requests["correction_read"] == 5
    assert ours.read_provider(nova_context.get_admin_context(), rp_uuid(99)) is None


def test_a_held_provider_is_read_back_in_part_what_a_claim_is_refused_over(placement, world):
    """A provider the view holds: its inventories and usages from placement (two reads, one
    generation), the rest as held; placement's own reading otherwise."""
    ctx = nova_context.get_admin_context()
    ours = rc.SharedReportClient(placement.adapter(), view=MemoryView(world), from_memory=True)
    want = next(p for p in world["providers"] if p["uuid"] == rp_uuid(2))
    claim(placement, rp_uuid(2), {"VCPU": 3})
    # the held copy is behind placement, and its traits say something placement does not
    held = {**want, "usages": {}, "traits": ["CUSTOM_HELD_ONLY"]}
    got = ours.read_provider(ctx, rp_uuid(2), held)
    assert ours.requests["correction_read"] == 2
    whole = ours.read_provider(ctx, rp_uuid(2))
    assert whole is not None and whole["usages"]["VCPU"] == 3
    assert got == {**held, "generation": whole["generation"],
                   "inventories": whole["inventories"], "usages": whole["usages"]}
    assert ours.read_provider(ctx, rp_uuid(99), held) is None


@pytest.mark.parametrize("kind", sorted(VIEWS))
def test_a_refused_claim_goes_to_the_next_host_and_corrects_the_view(placement, world, nova_conf, kind):
    """The view is behind (placement holds 14 of cn0's 16 VCPU, the view none); the weigher
    puts cn0 first, placement refuses it, nova claims the next host; cn0 is read back from
    placement and the next answer does not offer it."""
    from nova.scheduler import manager as nova_manager

    from shared_host_manager.nova import host_manager as shm
    from shared_host_manager.nova.core import document as ndoc

    view = VIEWS[kind](world)  # before the claim below: the view is behind
    claim(placement, rp_uuid(0), {"VCPU": 14})
    client = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    nova_conf.set(**{"filter_scheduler.enabled_filters": ["ComputeFilter"],
                     "filter_scheduler.weight_classes": ["nova.scheduler.weights.ram.RAMWeigher"],
                     "filter_scheduler.host_subset_size": 1})
    # the hosts' documents, cn0 the most free RAM (the weigher's first), cn5 (2 VCPU used) next
    nodes = [fx.compute_node(i, free_ram_mb=30000 - 1000 * i) for i in range(len(PROVIDERS))]
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                       cell_uuid=fx.CELL1) for cn in nodes}
    cache = fx.cache_from_documents(docs)
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(client, stub_request_filters=True):
            mgr = nova_manager.SchedulerManager()
            s = spec(vcpus=4, disabled_forbidden=False)
            selections = mgr.select_destinations(
                nova_context.get_admin_context(), spec_obj=s, instance_uuids=[s.instance_uuid],
                return_objects=True, return_alternates=True)
    finally:
        shm.set_cache_provider(None)
    chosen = selections[0][0].compute_node_uuid
    assert chosen == rp_uuid(1)  # cn0 refused, cn1 next by RAM
    assert client.requests["claim"] == 2 and client.requests["claim_refused"] == 1
    assert client.from_memory == 1
    assert view.state.get(rp_uuid(0)).usages["VCPU"] == 14
    assert view.state.get(rp_uuid(1)).usages["VCPU"] == 4  # the accepted claim, noted
    if kind == "stand-in":
        assert [c["uuid"] for c in view.corrections] == [rp_uuid(0)]
        assert view.claims == [{rp_uuid(1): {"DISK_GB": 20, "MEMORY_MB": 2048, "VCPU": 4}}]
    else:
        assert view.status()["counters"]["corrections"] == 1
    areqs, _, _ = client.get_allocation_candidates(nova_context.get_admin_context(),
                                                   resources_of(spec(vcpus=4)))
    assert rp_uuid(0) not in {u for a in areqs for u in a["allocations"]}
    assert client.from_memory == 2


def test_a_claim_the_view_knows_placement_refuses_is_not_sent(placement, world):
    """A host filled while nova worked down its sorted list: the feed's copy (placement's own
    reading here) and this scheduler's own claims leave no room, so the claim returns False
    as placement's refusal would, without a request; one that fits, or any while the view is
    stale, goes to placement."""
    from shared_host_manager.placement.view import PlacementView

    clock = [0.0]
    view = PlacementView(clock=lambda: clock[0])
    view.set_known_names(traits=world["traits"], resource_classes=world["resource_classes"],
                         allocation_ratio_storage=world["allocation_ratio_storage"])
    view.apply_providers({p["uuid"]: p for p in world["providers"]}, 0.0)
    ctx = nova_context.get_admin_context()
    ours = rc.SharedReportClient(placement.adapter(), view=view, from_memory=True)
    claim(placement, rp_uuid(0), {"VCPU": 13})
    view.apply_providers({rp_uuid(0): ours.read_provider(ctx, rp_uuid(0))}, 0.0)

    def areq(vcpus: int) -> dict[str, Any]:
        return {"allocations": {rp_uuid(0): {"resources": {"VCPU": vcpus, "MEMORY_MB": 512}}}}

    consumer = str(uuid.uuid4())
    assert ours.claim_resources(ctx, consumer, areq(4), "p", "u", "1.36") is False
    assert ours.claims_skipped == 1 and ours.requests["claim"] == 0
    assert ours.figures()["claims_skipped"] == 1
    assert placement.real.ok("GET", f"/allocations/{consumer}")["allocations"] == {}
    assert ours.claim_resources(ctx, str(uuid.uuid4()), areq(2), "p", "u", "1.36") is True
    assert ours.requests["claim"] == 1
    # 13 + 2 of 16 VCPU: this scheduler's own claim counts before the feed shows it
    assert ours.claim_resources(ctx, str(uuid.uuid4()), areq(2), "p", "u", "1.36") is False
    assert ours.claims_skipped == 2
    # a stale view knows nothing for certain: placement refuses it, as ever
    clock[0] = view.max_staleness + 1
    assert ours.claim_resources(ctx, str(uuid.uuid4()), areq(2), "p", "u", "1.36") is False
    assert (ours.claims_skipped, ours.requests["claim"], ours.requests["claim_refused"]) == (2, 2, 1)
    metrics = {m.name: [x.value for x in m.samples]
               for m in rc.ReportClientCollector(lambda: [ours]).collect()}
    assert metrics["shm_placement_claims_skipped"] == [2]


def test_nova_builds_the_shared_manager_whose_client_reaches_its_view(placement, world, monkeypatch):
    from nova import service

    view = MemoryView(world)
    seen: list[Any] = []

    def provider(host_manager: Any) -> Any:
        seen.append(host_manager)
        return view

    from shared_host_manager.nova import host_manager as shm

    rc.install()
    rc.set_view_provider(provider)
    shm.install()
    shm.set_cache_provider(lambda: fx.cache_from_documents({}))
    try:
        assert service.SERVICE_MANAGERS["nova-scheduler"] == rc.MANAGER_PATH
        monkeypatch.setattr(report.SchedulerReportClient, "_create_client", lambda self: placement.adapter())
        from oslo_utils import importutils

        mgr = importutils.import_class(service.SERVICE_MANAGERS["nova-scheduler"])()
        client = mgr.placement_client
        assert isinstance(client, rc.SharedReportClient) and mgr.placement_client is client
        assert report.PLACEMENTCLIENT is not client
        client.get_allocation_candidates(nova_context.get_admin_context(), resources_of(spec()))
        assert client.from_memory == 1 and seen == [mgr.host_manager]
        assert client in rc.clients()
        metrics = {m.name: {tuple(s.labels.values()): s.value for s in m.samples}
                   for m in rc.ReportClientCollector(lambda: [client]).collect()}
        assert metrics["shm_allocation_candidates"][("memory", "")] == 1
        assert metrics["shm_placement_requests"][("claim",)] == 0
    finally:
        shm.set_cache_provider(None)
        shm.uninstall()
        rc.set_view_provider(None)
        rc.uninstall()
    assert service.SERVICE_MANAGERS["nova-scheduler"] == "nova.scheduler.manager.SchedulerManager"
