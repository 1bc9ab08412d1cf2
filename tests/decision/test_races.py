"""Races: 4 schedulers, N compute nodes, concurrent requests against scarce capacity.

One deterministic loop (seeded) plays the network: every message is encoded
with protocol.codec, delayed by a random amount (so messages of different
senders interleave and data items arrive out of order), optionally dropped,
and decoded on delivery.  Compute nodes are real SourceMachines arbitrating
claims; schedulers are ReceiverMachine + HostIndex + DecisionEngine +
RequestTracker, wired as the service layer wires them (ingest, sync, drain
outcomes, process).  Clients fire requests at random schedulers, several per
tick, before the others' claims are visible.

Checked: no compute node ever goes beyond capacity x ratio; every claim
resolves exactly once; every instance ends placed on exactly one host (the one
its tracker names) or failed with NoValidHost; a rejected instance lands on an
alternate or fails; views converge once traffic stops.  With ``announce``,
each scheduler also casts its claims to the three others, as
``SchedulerService.send_claim`` does (design §5.2): the same holds, every
peer claim leaves the ledgers, and fewer claims are rejected.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections import Counter, defaultdict

import pytest

from protocol.codec import decode, encode
from protocol.messages import Claim, Send
from protocol.receiver import Outcome, ReceiverMachine
from protocol.resources import overcommitted
from protocol.source import SourceMachine
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.index import HostIndex
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from shared_host_manager.decision.request_tracker import (
    InstanceFailed,
    InstanceRescheduled,
    InstanceScheduled,
    RequestFinished,
    RequestTracker,
    claims_of,
)
from simulator.synthetic_hosts import host_doc

TERMINAL = {Outcome.INCLUDED, Outcome.REJECTED, Outcome.EXPIRED, Outcome.EPOCH_CHANGED}


class Scheduler:
    def __init__(self, name, cluster, rng, claim_deadline, announce=False):
        self.name = name
        self.receiver = ReceiverMachine(name, reorder_timeout=0.2, resync_timeout=1.0,
                                        down_interval=30.0, claim_deadline=claim_deadline)
        self.index = HostIndex(self.receiver)
        self.claims: list[Claim] = []
        self.cluster = cluster
        self.announce = announce
        self.engine = DecisionEngine(self.receiver, index=self.index, rng=rng,
                                     config=SchedulerConfig(host_subset_size_max=4),
                                     live_schedulers=4)
        self.tracker = RequestTracker(self.engine)
        self.outcomes: list[tuple[str, str, Outcome]] = []
        self.events: list = []

    def send_claims(self, claims):
        for claim in claims:
            self.claims.append(claim)
            self.cluster.send(Send(claim.source, claim))
            if self.announce:
                for peer in self.cluster.schedulers:
                    if peer != self.name:
                        self.cluster.send(Send(peer, dataclasses.replace(claim, request={})))

    def submit(self, spec, now):
        """Decide ``spec`` and cast its claims, as the manager does."""
        request, claims = self.tracker.submit(spec, now)
        self.send_claims(claims)
        return request

    def after_ingest(self, now):
        """What the service layer does after each ingest step, under its lock."""
        self.index.sync()
        outcomes = self.receiver.drain_outcomes()
        self.outcomes.extend(outcomes)
        events = self.tracker.process(outcomes, now)
        self.send_claims(claims_of(events))
        self.events.extend(events)


class Cluster:
    def __init__(self, seed, n_sources, drop, claim_deadline, announce=False):
        self.rng = random.Random(seed)
        self.drop = drop
        self.now = 0.0
        self.heap: list = []
        self.order = itertools.count()
        self.sources = {
            f"cn{i}": SourceMachine(f"cn{i}", 1, host_doc(f"h{i}", vcpus=8, cpu_ratio=1.0,
                                                          memory_mb=16384, disk_gb=200),
                                    coalesce_window=0.02, heartbeat_interval=0.5)
            for i in range(n_sources)}
        self.schedulers = {f"s{i}": Scheduler(f"s{i}", self, random.Random(seed * 10 + i),
                                              claim_deadline, announce) for i in range(4)}
        self.stats = Counter()

    def send(self, s: Send):
        data = encode(s.message)
        targets = list(self.schedulers) if s.to is None else [s.to]
        for to in targets:
            if self.rng.random() < self.drop:
                self.stats["dropped"] += 1
                continue
            delay = self.rng.uniform(0.001, 0.04)
            heapq.heappush(self.heap, (self.now + delay, next(self.order), to, data))

    def step(self, dt):
        self.now += dt
        now = self.now
        while self.heap and self.heap[0][0] <= now:
            _, _, to, data = heapq.heappop(self.heap)
            msg = decode(data)
            if to in self.sources:
                out = self.sources[to].handle(msg, now)
            else:
                sched = self.schedulers[to]
                out = sched.receiver.receive(msg, now)
                sched.after_ingest(now)
            for s in out:
                self.send(s)
        for src in self.sources.values():
            for s in src.poll(now):
                self.send(s)
            # invariant 1, checked at every step
            assert overcommitted(src.document["compute"]) == [], src.source
        for sched in self.schedulers.values():
            for s in sched.receiver.tick(now):
                self.send(s)
            sched.after_ingest(now)

    def quiet(self):
        return not self.heap and all(
            s.receiver.pending_claims() == 0 and s.tracker.in_flight() == 0
            for s in self.schedulers.values())


def _spec(rng, n):
    group = InstanceGroup("anti-affinity") if rng.random() < 0.15 else None
    return RequestSpec(flavor=Flavor(vcpus=rng.choice((1, 2, 3)), memory_mb=rng.choice((512, 2048)),
                                     root_gb=rng.choice((5, 10))),
                       num_instances=rng.choice((1, 1, 1, 2)), instance_group=group,
                       project_id="p", request_id=f"req{n}")


def _race(cluster, seed):
    """Bursts of requests to random schedulers, with deletions; returns what was submitted
    (request -> scheduler, instances) and the requests refused at once."""
    rng = random.Random(seed)
    for _ in range(30):  # snapshots reach every scheduler
        cluster.step(0.01)
    submitted: dict[str, tuple[str, list[str]]] = {}
    failed_at_once: set[str] = set()
    n = 0
    for _tick in range(300):
        # a burst of requests per tick, to random schedulers, before anyone sees the others
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            sched = cluster.schedulers[rng.choice(sorted(cluster.schedulers))]
            spec = _spec(rng, n)
            n += 1
            try:
                req = sched.submit(spec, cluster.now)
                submitted[req.request_id] = (sched.name, list(req.instances))
            except NoValidHost:
                failed_at_once.add(spec.request_id)
        cluster.step(0.01)
        if rng.random() < 0.4:  # tenants delete instances: capacity comes back, and runs out again
            src = cluster.sources[rng.choice(sorted(cluster.sources))]
            insts = sorted(src.document.get("instances", {}))
            if insts:
                src.release(rng.choice(insts), cluster.now)
                cluster.stats["released"] += 1
    for _ in range(5000):
        cluster.step(0.01)
        if cluster.quiet():
            break
    assert cluster.quiet(), "traffic did not settle"
    for _ in range(200):  # heartbeats settle the views (and outlive every peer claim's ttl)
        cluster.step(0.01)
    return submitted, failed_at_once


@pytest.mark.parametrize("seed, n_sources, drop, announce",
                         [(1, 6, 0.0, False), (2, 8, 0.0, False), (3, 6, 0.03, False),
                          (1, 6, 0.0, True), (3, 6, 0.03, True)])
def test_concurrent_schedulers_never_overcommit_and_resolve_every_claim(seed, n_sources, drop,
                                                                        announce):
    cluster = Cluster(seed, n_sources, drop, claim_deadline=20.0, announce=announce)
    submitted, failed_at_once = _race(cluster, seed)
    if announce:  # every peer claim left the ledgers: included, or dropped at its ttl
        for s in cluster.schedulers.values():
            assert s.receiver.stats["peer_claims"] > 0
            assert all(not v.peer and not v.peer_usage for v in s.receiver.sources.values())
    _check_race(cluster, submitted, failed_at_once)


def _check_race(cluster, submitted, failed_at_once):
    # every claim resolves exactly once (INCLUDED, REJECTED, EXPIRED or EPOCH_CHANGED)
    created = {c.claim_id for s in cluster.schedulers.values() for c in s.claims}
    resolutions = Counter(cid for s in cluster.schedulers.values()
                          for cid, _, o in s.outcomes if o in TERMINAL)
    assert set(resolutions) == created and set(resolutions.values()) == {1}

    # every instance: placed on exactly the host its tracker names, or failed with NoValidHost
    on_hosts = defaultdict(list)
    for src in cluster.sources.values():
        for inst in src.document.get("instances", {}):
            on_hosts[inst].append(src.source)
    placed, failed = {}, set()
    for s in cluster.schedulers.values():
        finished = [e for e in s.events if isinstance(e, RequestFinished)]
        assert {e.request_id for e in finished} == {r for r, (name, _) in submitted.items()
                                                   if name == s.name}
        for e in finished:
            for uuid, sel in e.placed.items():
                placed[uuid] = sel.source
            failed.update(e.failed)
        for e in s.events:
            if isinstance(e, InstanceFailed):
                assert isinstance(e.error, NoValidHost) and e.instance_uuid in failed
            if isinstance(e, InstanceRescheduled):
                assert e.selection.source != e.failed_source
    released = cluster.stats["released"]
    assert len(placed) + len(failed) == sum(len(u) for _, u in submitted.values())
    for uuid, source in placed.items():
        assert on_hosts.get(uuid, [source]) == [source]  # (it may have been released since)
    assert all(uuid in placed for uuid in on_hosts)
    assert sum(len(v) for v in on_hosts.values()) == len(placed) - released

    # contention really happened, and was resolved by alternates or NoValidHost
    rejected = sum(1 for s in cluster.schedulers.values() for _, _, o in s.outcomes
                   if o is Outcome.REJECTED)
    rescheduled = sum(isinstance(e, InstanceRescheduled) for s in cluster.schedulers.values()
                      for e in s.events)
    scheduled = sum(isinstance(e, InstanceScheduled) for s in cluster.schedulers.values()
                    for e in s.events)
    assert rejected > 0 and rescheduled > 0 and scheduled == len(placed)
    assert failed_at_once or failed  # capacity is scarce: some requests cannot be served

    # convergence: every scheduler holds every source's published version
    for s in cluster.schedulers.values():
        for src in cluster.sources.values():
            view = s.receiver.sources[src.source]
            assert view.version == src.version and view.digest() == src.published_digest()


def test_announced_claims_leave_fewer_claims_rejected():
    """The same bursts, seeded alike, with and without announcements: peers that learn of a
    claim before its host's delta reaches them decide around it."""
    rejected = {}
    for announce in (False, True):
        total = 0
        for seed in (1, 2, 3):
            cluster = Cluster(seed, 6, 0.0, claim_deadline=20.0, announce=announce)
            _race(cluster, seed)
            total += sum(1 for s in cluster.schedulers.values() for _, _, o in s.outcomes
                         if o is Outcome.REJECTED)
        rejected[announce] = total
    assert rejected[True] < rejected[False], rejected


@pytest.mark.parametrize("seed", [4, 5])
def test_racing_schedulers_keep_server_group_policies(seed):
    """Members of a few server groups, requested at once from four schedulers that each know
    only the members already placed (nova's API view): no anti-affinity group ever has two
    members on one host (the hosts arbitrate it), and no affinity group is split (its first
    members go to one host by rendezvous over the group)."""
    cluster = Cluster(seed, 8, 0.0, claim_deadline=20.0)
    rng = random.Random(seed)
    for _ in range(30):
        cluster.step(0.01)
    groups = [(f"anti-{i}", "anti-affinity") for i in range(3)] + [("aff-0", "affinity")]
    members: dict[str, list[str]] = {g: [] for g, _ in groups}
    done: set[str] = set()
    n = 0
    for _tick in range(150):
        for _ in range(rng.choice((1, 2, 3))):
            sched = cluster.schedulers[rng.choice(sorted(cluster.schedulers))]
            uuid, policy = rng.choice(groups)
            group = InstanceGroup(policy, members=list(members[uuid]), uuid=uuid)
            spec = RequestSpec(flavor=Flavor(vcpus=1, memory_mb=512, root_gb=5), num_instances=1,
                               instance_group=group, project_id="p", request_id=f"g{n}")
            n += 1
            try:
                sched.submit(spec, cluster.now)
            except NoValidHost:
                pass
        cluster.step(0.01)
        for s in cluster.schedulers.values():  # a placed member joins its group's list
            for e in s.events:
                if isinstance(e, InstanceScheduled) and e.instance_uuid not in done:
                    done.add(e.instance_uuid)
                    spec = s.tracker.request(e.request_id).spec
                    members[spec.instance_group.uuid].append(e.instance_uuid)
    for _ in range(2000):
        cluster.step(0.01)
        if cluster.quiet():
            break
    where = {inst: src.source for src in cluster.sources.values()
             for inst in src.document.get("instances", {})}
    for uuid, policy in groups:
        hosts = [where[m] for m in members[uuid] if m in where]
        if policy == "anti-affinity":
            assert len(hosts) == len(set(hosts)), f"{uuid}: two members on one host"
        else:
            assert len(set(hosts)) <= 1, f"{uuid}: split over {sorted(set(hosts))}"
    assert len(done) > 8  # members were placed, concurrently
