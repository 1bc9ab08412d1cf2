"""select_destinations: selection, alternates, multi-instance consumption, claims, NoValidHost."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.resources import check_fit
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from shared_host_manager.decision.subset import AdaptiveSubset, RendezvousChoice
from simulator.synthetic_hosts import host_doc, load_receiver

PATHS = ("fast", "slow")


def _engine(docs, path="fast", seed=1, **cfg):
    rec = load_receiver(docs, down_interval=1e9)
    return DecisionEngine(rec, config=SchedulerConfig(**cfg), path=path, rng=random.Random(seed))


def _docs(n=5, **kw):
    # host i has i*1024 MB free beyond the base, so RAM weighing orders them h4 > h3 > ...
    return {f"cn{i}": host_doc(f"h{i}", memory_mb=8192 + 1024 * i, **kw) for i in range(n)}


@pytest.mark.parametrize("path", PATHS)
def test_best_host_claimed_with_alternates(path):
    engine = _engine(_docs(), path)
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512), instance_uuids=["vm1"])
    decision = engine.select_destinations(spec, 0.0)
    [[chosen, *alts]] = decision.rows
    assert (chosen.source, chosen.instance_uuid) == ("cn4", "vm1") and chosen.claim_id
    assert [a.source for a in alts] == ["cn3", "cn2"] and all(a.claim_id is None for a in alts)
    # the claim is pending in the receiver and returned for the caller to cast
    [claim] = decision.claims
    assert claim.claim_id == chosen.claim_id
    view = engine.receiver.sources["cn4"]
    assert claim.claim_id in view.pending and claim.instance == "vm1"
    assert (claim.epoch, claim.seq) == view.version
    assert claim.resources == {"vcpus": 1, "memory_mb": 512}
    assert view.pending_usage == {"vcpus": 1, "memory_mb": 512}


@pytest.mark.parametrize("path", PATHS)
def test_multi_instance_consumes_as_it_goes(path):
    # each host fits exactly one 4-vcpu instance
    docs = {f"cn{i}": host_doc(f"h{i}", vcpus=4, cpu_ratio=1.0, memory_mb=8192 + i) for i in range(3)}
    engine = _engine(docs, path)
    spec = RequestSpec(flavor=Flavor(vcpus=4, memory_mb=1024), num_instances=3)
    decision = engine.select_destinations(spec, 0.0)
    assert sorted(r[0].source for r in decision.rows) == ["cn0", "cn1", "cn2"]
    assert len({c.claim_id for c in decision.claims}) == 3
    # nothing is left for a fourth, and the failure claims nothing
    with pytest.raises(NoValidHost, match="ResourceFitFilter"):
        engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1)), 0.0)
    assert engine.receiver.pending_claims() == 3


@pytest.mark.parametrize("path", PATHS)
def test_all_or_nothing(path):
    docs = {f"cn{i}": host_doc(f"h{i}", vcpus=4, cpu_ratio=1.0) for i in range(2)}
    engine = _engine(docs, path)
    with pytest.raises(NoValidHost, match="instance 3 of 3"):
        engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=4), num_instances=3), 0.0)
    assert engine.receiver.pending_claims() == 0
    # and the hosts are still whole for the next request
    assert len(engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=4), num_instances=2),
                                          0.0).rows) == 2


@pytest.mark.parametrize("path", PATHS)
def test_anti_affinity_within_one_request(path):
    engine = _engine(_docs(3), path)
    group = InstanceGroup("anti-affinity")
    result = engine.select_destinations(
        RequestSpec(flavor=Flavor(vcpus=1), num_instances=3, instance_group=group), 0.0).rows
    assert len({r[0].source for r in result}) == 3
    with pytest.raises(NoValidHost):
        engine.select_destinations(
            RequestSpec(flavor=Flavor(vcpus=1), num_instances=4, instance_group=group), 0.0)
    assert group.hosts == [] and group.members == []  # the caller's spec is not mutated


@pytest.mark.parametrize("path", PATHS)
def test_affinity_within_one_request_and_across_requests(path):
    engine = _engine(_docs(4), path)
    group = InstanceGroup("affinity")
    result = engine.select_destinations(
        RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=["a", "b", "c"], instance_group=group), 0.0).rows
    assert len({r[0].source for r in result}) == 1
    # a later request of the same group follows its members (pending claims count)
    group.members = ["a", "b", "c"]
    [[later, *_]] = engine.select_destinations(
        RequestSpec(flavor=Flavor(vcpus=1), instance_group=group), 0.0).rows
    assert later.source == result[0][0].source


@pytest.mark.parametrize("path", PATHS)
def test_an_affinity_anchor_that_cannot_take_the_whole_request_is_passed_over(path):
    # cn1 weighs less and fits one 4-vcpu instance, cn0 fits two; the group's rendezvous
    # prefers cn1 (the uuid is chosen so), which would leave the second member nowhere
    # (nova's loop, taking the best host first, places both on cn0)
    docs = {"cn0": host_doc("h0", vcpus=8, cpu_ratio=1.0, memory_mb=16384),
            "cn1": host_doc("h1", vcpus=4, cpu_ratio=1.0, memory_mb=8192)}
    group_uuid = next(u for u in (f"g{i}" for i in range(100))
                      if RendezvousChoice(u).index(["cn0", "cn1"]) == 1)
    engine = _engine(docs, path)
    spec = RequestSpec(flavor=Flavor(vcpus=4, memory_mb=1024), instance_uuids=["a", "b"],
                       instance_group=InstanceGroup("affinity", uuid=group_uuid))
    decision = engine.select_destinations(spec, 0.0)
    assert [r[0].source for r in decision.rows] == ["cn0", "cn0"]
    assert engine.stats["anchors_refused"] == 1 and len(decision.claims) == 2
    # a group no host can take whole is NoValidHost, and claims nothing
    too_big = RequestSpec(flavor=Flavor(vcpus=4, memory_mb=1024), instance_uuids=["c", "d", "e"],
                          instance_group=InstanceGroup("affinity", uuid=group_uuid + "x"))
    engine = _engine(docs, path)
    with pytest.raises(NoValidHost):
        engine.select_destinations(too_big, 0.0)
    assert engine.receiver.pending_claims() == 0 and engine.stats["anchors_refused"] == 2


@pytest.mark.parametrize("path", PATHS)
def test_an_affinity_group_is_followed_before_its_members_are_listed(path):
    # nova's API lists a member once it is created; a request issued while the group's
    # first member is still being built lists none. Its claim carries the group: the next
    # request goes to the same host, although the first one's weight dropped out of the
    # best hosts the first member's host was chosen from (design §5.4)
    docs = {f"cn{i}": host_doc(f"h{i}", memory_mb=16384) for i in range(40)}
    engine = _engine(docs, path)
    flavor = Flavor(vcpus=1, memory_mb=4096)
    hosts, claims = set(), []
    for i in range(3):
        group = InstanceGroup("affinity", uuid="g1")
        decision = engine.select_destinations(
            RequestSpec(flavor=flavor, instance_uuids=[f"vm{i}"], instance_group=group), 0.0)
        hosts.add(decision.rows[0][0].source)
        claims.extend(decision.claims)
    assert len(hosts) == 1
    assert all(c.group is not None and c.group.uuid == "g1" for c in claims)


@pytest.mark.parametrize("path", PATHS)
def test_an_anti_affinity_group_counts_the_members_it_does_not_list(path):
    # stacking: without the first member counted, the second would take the same host and
    # be rejected by it
    engine = _engine(_docs(3), path, ram_weight_multiplier=-1.0)
    chosen, claims = [], []
    for i in range(2):
        decision = engine.select_destinations(RequestSpec(
            flavor=Flavor(vcpus=1), instance_uuids=[f"vm{i}"],
            instance_group=InstanceGroup("anti-affinity", uuid="g")), 0.0)
        chosen.append(decision.rows[0][0].source)
        claims.extend(decision.claims)
    assert len(set(chosen)) == 2
    assert claims[1].group is not None and claims[1].group.members == ("vm0", "vm1")


@pytest.mark.parametrize("path", PATHS)
def test_an_affinity_group_is_located_by_its_recorded_members_and_peer_claims(path):
    from protocol.messages import Claim
    from shared_host_manager.decision.request import RequestView
    from shared_host_manager.decision.world import IndexWorld, ReceiverWorld

    docs = _docs(6)
    # the arbiter records the group of an instance it accepted (protocol.groups)
    docs["cn1"] = host_doc("h1", memory_mb=9216, instances={
        "placed": {"claim": "c0", "resources": {"vcpus": 1}, "group": "g-rec"}})
    engine = _engine(docs, path)
    spec = RequestSpec(flavor=Flavor(vcpus=1), instance_group=InstanceGroup("affinity", uuid="g-rec"))
    [[s, *_]] = engine.select_destinations(spec, 0.0).rows
    assert s.source == "cn1"
    # a live peer's announced claim carries its group too
    from protocol.groups import ClaimGroup

    view = engine.receiver.sources["cn2"]
    peer = Claim("peer:1", "sched-b", "cn2", view.epoch, view.seq, {"vcpus": 1}, "elsewhere",
                 group=ClaimGroup("g-peer", "affinity"))
    assert engine.receiver.restore_claim(peer, 100.0, peer=True)
    engine.index.sync()
    world = IndexWorld(engine.index) if path == "fast" else ReceiverWorld(engine.receiver)
    assert world.members_of_group("g-peer") == ["elsewhere"]
    req = RequestView(RequestSpec(instance_group=InstanceGroup("affinity", uuid="g-peer")), world,
                      ("new",))
    assert req.instance_group is not None and req.instance_group.hosts == ["h2"]
    assert req.instance_group.members == ["elsewhere", "new"]
    # once the peer's claim is gone (its time to live is over), so is the group's member
    engine.receiver.tick(101.0)
    engine.index.sync()
    assert world.members_of_group("g-peer") == []


@pytest.mark.parametrize("path", PATHS)
def test_force_and_ignore_hosts(path):
    engine = _engine(_docs(), path)
    [[s, *alts]] = engine.select_destinations(RequestSpec(force_hosts=["H1"]), 0.0).rows
    assert s.source == "cn1" and alts == []
    [[s, *_]] = engine.select_destinations(RequestSpec(ignore_hosts=["h4", "h3"]), 0.0).rows
    assert s.source == "cn2"
    [[s, *_]] = engine.select_destinations(RequestSpec(force_nodes=["h0"]), 0.0).rows
    assert s.source == "cn0"
    # forcing skips ordinary filters but not what placement decides (resource fit)
    engine2 = _engine(_docs(), path, enabled_filters=("ComputeFilter", "ResourceFitFilter",
                                                         "AvailabilityZoneFilter"))
    [[s, *_]] = engine2.select_destinations(RequestSpec(force_hosts=["h1"], availability_zone="x"), 0.0).rows
    assert s.source == "cn1"
    with pytest.raises(NoValidHost):
        engine2.select_destinations(RequestSpec(force_hosts=["h1"], flavor=Flavor(vcpus=1000)), 0.0)


@pytest.mark.parametrize("path", PATHS)
def test_alternates_stay_in_the_cell(path):
    docs = _docs(6)
    for i in (5, 3, 1):
        docs[f"cn{i}"]["compute"]["cell_uuid"] = "cell2"
    engine = _engine(docs, path)
    [[s, *alts]] = engine.select_destinations(RequestSpec(), 0.0).rows
    assert s.source == "cn5" and [a.source for a in alts] == ["cn3", "cn1"]


def test_claim_ids_are_unique_and_carry_the_version():
    engine = _engine(_docs(), "fast")
    claims = [c for _ in range(20) for c in engine.select_destinations(
        RequestSpec(flavor=Flavor(vcpus=1, memory_mb=1)), 0.0).claims]
    ids = [c.claim_id for c in claims]
    assert len(set(ids)) == 20
    assert all(c.claim_id.endswith(f"@{c.epoch}.{c.seq}") for c in claims)
    other = _engine(_docs(), "fast", seed=2)
    [claim] = other.select_destinations(RequestSpec(flavor=Flavor(vcpus=1, memory_mb=1)), 0.0).claims
    assert claim.claim_id not in ids  # another engine (e.g. after a restart) has another nonce


def test_subset_size_spreads_choices_among_the_best():
    # RAM only: zero-sized claims change nothing it weighs (IoOpsWeigher would count them)
    engine = _engine(_docs(8), "fast", host_subset_size_min=1, host_subset_size_max=4,
                        weight_classes=("RAMWeigher",), host_subset_choice="random")
    chosen = {engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=0, memory_mb=0)), 0.0,
                                         live_schedulers=4).rows[0][0].source for _ in range(40)}
    assert chosen == {"cn7", "cn6", "cn5", "cn4"}
    one = {engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=0, memory_mb=0)), 0.0,
                                      live_schedulers=1).rows[0][0].source for _ in range(5)}
    assert len(one) == 1


def test_rendezvous_choice_spreads_schedulers_not_decisions():
    # Each scheduler keeps to its preferred host of the subset; different schedulers
    # prefer different hosts, so concurrent decisions on one view rarely collide.
    spec = RequestSpec(flavor=Flavor(vcpus=0, memory_mb=0))
    picks = {}
    for name in [f"scheduler-{i}" for i in range(8)]:
        rec = load_receiver(_docs(8), down_interval=1e9)
        rec.name = name
        engine = DecisionEngine(rec, config=SchedulerConfig(
            host_subset_size_min=4, host_subset_size_max=4, weight_classes=("RAMWeigher",)))
        own = {engine.select_destinations(spec, 0.0).rows[0][0].source for _ in range(5)}
        assert len(own) == 1, "one scheduler is stable while its subset is"
        picks[name] = own.pop()
        assert picks[name] in {"cn7", "cn6", "cn5", "cn4"}
    assert len(set(picks.values())) >= 3, picks


def test_adaptive_subset():
    s = AdaptiveSubset(1, 10, target=0.05, alpha=0.5)
    assert s.size(1) == 1 and s.size(4) == 4
    for _ in range(5):
        s.observe(True)
    assert s.size(4) == 10 and s.size(1) > 1
    for _ in range(20):
        s.observe(False)
    assert s.size(1) == 1 and s.size(4) == 4
    with pytest.raises(ValueError):
        AdaptiveSubset(3, 2)


def test_selected_hosts_fit_in_the_scheduler_view():
    engine = _engine(_docs(3, vcpus=4, cpu_ratio=1.0), "fast")
    placed = 0
    while True:
        try:
            engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=3, memory_mb=100)), 0.0)
            placed += 1
        except NoValidHost:
            break
    assert placed == 3
    for view in engine.receiver.sources.values():
        assert check_fit(view.doc["compute"], {}, view.pending_usage) is None
        assert view.pending_usage.get("vcpus", 0) <= 4


def test_ordered_hosts_matches_between_paths_and_explains():
    docs = _docs(6)
    docs["cn2"]["service"]["disabled"] = True
    fast = _engine(docs, "fast")
    slow = _engine(docs, "slow")
    spec = RequestSpec(flavor=Flavor(vcpus=1))
    assert fast.ordered_hosts(spec) == slow.ordered_hosts(spec)
    assert "cn2" not in dict(fast.ordered_hosts(spec))
    for engine in (fast, slow):
        with pytest.raises(NoValidHost) as err:
            engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=10_000)), 0.0)
        assert "ComputeFilter: (start: 6, end: 5)" in str(err.value)
        assert "ResourceFitFilter: (start: 5, end: 0)" in str(err.value)


@pytest.mark.parametrize("path", PATHS)
def test_decisions_never_write_to_the_receivers_documents(path):
    engine = _engine(_docs(6, aggregates={"a": {"name": "a", "metadata": {"x": "1"}}}), path)
    before = {s: (v.digest(), v.version) for s, v in engine.receiver.sources.items()}
    group = InstanceGroup("affinity")
    claims = []
    for i in range(10):
        claims += engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1), num_instances=2,
                                                         instance_group=group if i % 2 else None,
                                                         build_request={"image": "cirros"},
                                                         request_id=f"r{i}"), 0.0).claims
    for s, v in engine.receiver.sources.items():
        v._digest = None  # recompute from the document itself
        assert (v.digest(), v.version) == before[s]
    assert claims[0].request == {"image": "cirros", "request_id": "r0"}


def test_peers_claim_hosts_they_own_so_concurrent_decisions_differ():
    # Two schedulers with the same view and the same peer list: each claims the best host
    # it owns, so their concurrent first choices never collide, and each owns about half.
    from shared_host_manager.decision.subset import PeerOwnership

    spec = RequestSpec(flavor=Flavor(vcpus=0, memory_mb=0))
    engines = []
    for name in ("sched-a", "sched-b"):
        rec = load_receiver(_docs(8), down_interval=1e9)
        rec.name = name
        engine = DecisionEngine(rec, config=SchedulerConfig(
            host_subset_size_min=2, host_subset_size_max=2, weight_classes=("RAMWeigher",)))
        engine.set_peers(["sched-a", "sched-b"])
        engines.append(engine)
    first = [e.select_destinations(spec, 0.0).rows[0][0].source for e in engines]
    assert first[0] != first[1]
    for engine, source in zip(engines, first, strict=True):
        assert engine.peer_coordination.ownership.owns(source)
    owners = [PeerOwnership("sched-a", ["sched-b"]).owns(f"cn{i}") for i in range(200)]
    assert 60 < sum(owners) < 140
    # alone again: ownership off, plain subset choice
    engines[0].set_peers([])
    assert engines[0].peer_coordination.ownership is None and engines[0].live_schedulers == 1


PEERS = ["owner", "x", "y"]


def _one_owners_hosts():
    """12 hosts all owned by "owner" among PEERS, each with more memory than the last."""
    from shared_host_manager.decision.subset import PeerOwnership

    ownership = PeerOwnership("owner", PEERS)
    owned = [f"cn{i}" for i in range(200) if ownership.owns(f"cn{i}")][:12]
    return owned, {s: host_doc(f"h{s}", memory_mb=8192 + 1024 * i) for i, s in enumerate(owned)}


def test_a_scheduler_owning_no_candidate_avoids_the_owners_front_and_spreads():
    # Every candidate belongs to one peer ("owner"); the two others fall back to its hosts.
    from shared_host_manager.decision.engine import FRONT_DEPTH
    from shared_host_manager.decision.subset import PeerOwnership

    peers = PEERS
    owned, docs = _one_owners_hosts()
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512))
    # each takes a peer's host itself rather than handing the request to its owner
    engines = _racing_engines(docs, peers, hand_to_owner=False)
    picks = {}
    for name, engine in engines.items():
        picks[name] = engine.select_destinations(spec, 0.0).rows[0][0].source
        assert engine.stats["peer_choices" if name != "owner" else "owned_choices"] == 1
    best_first = sorted(owned, key=lambda s: -docs[s]["compute"]["memory_mb"])
    assert picks["owner"] == best_first[0]  # the owner claims its best host
    for name in ("x", "y"):  # the others stay behind its front, each where it is next in line
        assert best_first.index(picks[name]) >= FRONT_DEPTH
        assert PeerOwnership(name, peers).place(picks[name]) == 1
    assert picks["x"] != picks["y"]


def _racing_engines(docs, peers, **cfg):
    """One engine per peer, each with its own copy of the same view and the same peer list."""
    engines = {}
    for name in peers:
        rec = load_receiver(docs, down_interval=1e9)
        rec.name = name
        engine = DecisionEngine(rec, config=SchedulerConfig(
            weight_classes=("RAMWeigher",), **cfg))
        engine.set_peers(peers)
        engines[name] = engine
    return engines


def _scarce_cloud(fitting, small=20):
    # ``fitting`` hosts fit a 16 GB request, ``small`` hosts fit only small ones
    docs = {f"big{i}": host_doc(f"hb{i}", memory_mb=16384 + 512 * i) for i in range(fitting)}
    docs.update({f"small{i}": host_doc(f"hs{i}", memory_mb=4096 + 64 * i) for i in range(small)})
    return docs


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=5), st.integers(min_value=1, max_value=10),
       st.integers(min_value=0, max_value=10_000))
def test_racing_schedulers_share_a_scarce_requests_few_hosts_out(schedulers, fitting, salt):
    # Every scheduler decides the same scarce request at once on the same view: the matching
    # puts them on min(hosts, schedulers) different hosts, so with enough hosts no two race.
    from shared_host_manager.decision.engine import SCARCE_PER_PEER

    fitting = min(fitting, SCARCE_PER_PEER * schedulers)
    peers = [f"sched-{salt}-{i}" for i in range(schedulers)]
    # each decides its own scarce requests (no coordinator): the matching spreads them
    engines = _racing_engines(_scarce_cloud(fitting), peers, scarce_coordinator=False)
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=16384))
    picks = {name: e.select_destinations(spec, 0.0).rows[0][0].source for name, e in engines.items()}
    assert all(p.startswith("big") for p in picks.values())
    assert len(set(picks.values())) == min(fitting, schedulers)
    for name, engine in engines.items():
        assert engine.stats["scarce_choices"] == 1
        owners = {engine.peer_coordination.ownership.owner(f"big{i}") for i in range(fitting)}
        if name in owners:  # an owner of candidates takes its best one
            assert engine.peer_coordination.ownership.owns(picks[name])


@pytest.mark.parametrize("salt", range(8))
def test_racing_schedulers_claims_on_scarce_hosts_are_all_accepted(salt):
    # The same race with the hosts' own arbiters: every claim fits, none is rejected (each
    # scheduler choosing by ownership, then behind the owners' front, lost some of these).
    from protocol.messages import ClaimResult
    from protocol.source import SourceMachine

    docs = _scarce_cloud(4)
    peers = [f"{name}-{salt}" for name in "abcd"]
    engines = _racing_engines(docs, peers, scarce_coordinator=False)
    arbiters = {s: SourceMachine(s, 1, {ns: dict(v) for ns, v in doc.items()})
                for s, doc in docs.items()}
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=16384))
    claims = [c for engine in engines.values() for c in engine.select_destinations(spec, 0.0).claims]
    results = [m for c in claims for m in (s.message for s in arbiters[c.source].handle_claim(c, 0.0))
               if type(m) is ClaimResult]
    assert len(results) == 4 and all(r.accepted for r in results), [r.reason for r in results]
    assert len({c.source for c in claims}) == 4


def _arbitrate(arbiters, claims):
    from protocol.messages import ClaimResult

    return [m for c in claims for m in (s.message for s in arbiters[c.source].handle_claim(c, 0.0))
            if type(m) is ClaimResult]


@pytest.mark.parametrize("salt", range(4))
def test_a_scarce_request_goes_to_the_coordinator_which_decides_every_one_on_one_view(salt):
    # Four peers each get a scarce request at the same moment, and only three hosts fit.
    # Deciding them themselves (the matching) on views that do not hold each other's claims
    # yet, they claim one host twice and one claim is rejected; handed to the coordinator
    # (the first peer by name), they are decided one after another on its view: three
    # placed, one NoValidHost at once, no claim rejected.
    from protocol.source import SourceMachine
    from shared_host_manager.decision.engine import Delegated

    docs = _scarce_cloud(3)
    peers = [f"{name}-{salt}" for name in "dcba"]
    engines = _racing_engines(docs, peers)
    coordinator = engines[min(peers)]
    arbiters = {s: SourceMachine(s, 1, {ns: dict(v) for ns, v in doc.items()})
                for s, doc in docs.items()}
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=16384))
    claims, outcomes = [], []
    for engine in engines.values():
        assert engine.coordinator == (None if engine is coordinator else min(peers))
        if engine is not coordinator:
            with pytest.raises(Delegated) as handed:
                engine.select_destinations(spec, 0.0)
            assert handed.value.coordinator == min(peers)
            assert engine.stats["delegated"] == 1 and not engine.receiver.pending_claims()
    for _ in peers:  # the coordinator decides its own and the three handed over
        try:
            claims += coordinator.select_destinations(spec, 0.0, delegable=False).claims
            outcomes.append("placed")
        except NoValidHost:
            outcomes.append("no valid host")
    assert sorted(outcomes) == ["no valid host"] + ["placed"] * 3
    results = _arbitrate(arbiters, claims)
    assert len(results) == 3 and all(r.accepted for r in results)
    # a request many hosts fit is never handed over
    small = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512))
    assert all(e.select_destinations(small, 0.0).rows for e in engines.values())
    # the option off: nothing is handed over, and the race costs a rejection
    off = _racing_engines(docs, peers, scarce_coordinator=False)
    raced = []
    for engine in off.values():
        assert engine.coordinator is None
        raced += engine.select_destinations(spec, 0.0).claims
    fresh = {s: SourceMachine(s, 1, {ns: dict(v) for ns, v in doc.items()}) for s, doc in docs.items()}
    assert sorted(r.accepted for r in _arbitrate(fresh, raced)) == [False, True, True, True]


def test_requests_many_hosts_fit_keep_off_the_few_hosts_a_scarce_request_needs():
    from shared_host_manager.decision.engine import SCARCE_MEMORY

    docs = _scarce_cloud(2, small=40)
    peers = ["a", "b"]
    # look deep enough that "a" owns small hosts among the candidates too
    engine = _racing_engines(docs, peers, host_subset_size_min=8)["a"]
    small = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512))
    owned_big = [s for s in ("big0", "big1") if engine.peer_coordination.ownership.owns(s)]
    # before any scarce request: a small one goes to the best host it owns, a big host
    first = engine.select_destinations(small, 0.0).rows[0][0].source
    assert engine.peer_coordination.ownership.owns(first)
    # a scarce request is seen: from now on, small requests stay off big0 and big1
    engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1, memory_mb=16384)), 1.0)
    for i in range(5):
        source = engine.select_destinations(small, 1.0 + i * 0.1).rows[0][0].source
        assert source.startswith("small") and engine.peer_coordination.ownership.owns(source)
    assert engine.stats["scarce_skips"] >= (1 if owned_big else 0)
    # a request as large as the scarce one is not kept off them
    big = engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1, memory_mb=16384)), 1.5).rows
    assert big[0][0].source.startswith("big")
    # and the memory fades
    later = 2.0 + SCARCE_MEMORY
    assert engine.peer_coordination.kept(["big0", "big1"], {"memory_mb": 512}, later) == [False, False]


def test_a_request_many_hosts_fit_is_not_scarce_when_the_subset_is_shallower_than_the_limit():
    # Two peers at the smallest subset: the best k x peers (4) hosts are fewer than make a
    # request scarce (2 per peer, 5 to tell); a request 40 hosts fit is still not scarce:
    # it is not remembered, and it takes a host its scheduler owns, not the matching's.
    engine = _racing_engines(_scarce_cloud(0, small=40), ["a", "b"])["a"]
    assert engine.subset.size(engine.live_schedulers) * 2 < 2 * 2 + 1
    for i in range(4):
        engine.select_destinations(RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512)), i * 0.1)
    assert engine.stats["scarce_choices"] == 0 and engine.scarce_memory == []
    assert engine.stats["owned_choices"] + engine.stats["peer_choices"] == 4


def test_a_scheduler_owning_no_candidate_hands_the_request_to_the_owner_of_the_best():
    # [filter_scheduler] hand_to_owner: the owner decides it with its own requests, so the
    # two never race for its hosts; the owner, deciding it (delegable=False), claims its own.
    from shared_host_manager.decision.engine import Delegated

    owned, docs = _one_owners_hosts()
    spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512))
    engines = _racing_engines(docs, PEERS)
    for name in ("x", "y"):
        with pytest.raises(Delegated) as handed:
            engines[name].select_destinations(spec, 0.0)
        assert (handed.value.coordinator, handed.value.why) == ("owner", "owner")
        assert engines[name].stats["handed_to_owner"] == 1
        assert engines[name].receiver.pending_claims() == 0  # nothing claimed
    best = max(owned, key=lambda s: docs[s]["compute"]["memory_mb"])
    assert engines["owner"].select_destinations(spec, 0.0, delegable=False).rows[0][0].source == best
    # handed to it, a scheduler that owns none decides it itself: no ping-pong
    assert engines["x"].select_destinations(spec, 0.0, delegable=False).rows[0][0].source in owned
    assert engines["x"].stats["peer_choices"] == 1
