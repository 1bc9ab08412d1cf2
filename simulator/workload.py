"""The seeded workload: which servers are asked for, in which order, and which are deleted.

A :class:`Workload` is a deterministic function of its seed: request ``i``
is always the same (flavor, availability zone, server group, multi-create
count, instance uuids), whichever host manager serves it, so the three host
managers of ``--host-manager all`` face the same demand.

The cloud starts pre-filled (``fill``: the fraction of each host's memory
already used by running servers) and is kept near that level: every server
that boots is matched by the deletion of a random running one, so the run
measures scheduling under steady, realistic contention rather than an empty
cloud filling up.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from protocol.document import SET, Document
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec

#: name, vcpus, memory_mb, root_gb, weight, extra_specs
FLAVORS: tuple[tuple[str, int, int, int, int, dict[str, str]], ...] = (
    ("m1.small", 1, 2048, 20, 30, {}),
    ("m1.medium", 2, 4096, 40, 30, {}),
    ("m1.large", 4, 8192, 80, 20, {}),
    ("m1.xlarge", 8, 16384, 160, 10, {}),
    ("ssd.large", 4, 8192, 80, 10, {"aggregate_instance_extra_specs:ssd": "true"}),
)


@dataclass
class Group:
    uuid: str
    policy: str
    members: list[str]


class Workload:
    def __init__(self, seed: int, *, azs: int = 3, group_fraction: float = 0.1,
                 groups: int = 50, az_fraction: float = 0.2, multi_fraction: float = 0.05) -> None:
        self.seed = seed
        self._rng = random.Random(f"workload-{seed}")
        self._delete_rng = random.Random(f"deletes-{seed}")
        self.azs = azs
        self.group_fraction = group_fraction
        self.az_fraction = az_fraction
        self.multi_fraction = multi_fraction
        self.groups = [Group(self._uuid(), "anti-affinity" if i % 5 else "affinity", [])
                       for i in range(groups)]
        self._weights = [f[4] for f in FLAVORS]
        #: running servers: instance uuid -> source
        self.running: dict[str, str] = {}
        # the same servers in a list, for O(1) seeded random deletion (swap-remove)
        self._order: list[str] = []
        self._position: dict[str, int] = {}
        self._group_of: dict[str, Group] = {}
        self.issued = 0
        #: (group uuid, host source) for every anti-affinity group that ever had more members
        #: on one host than allowed, (group uuid, "split") for every affinity group that ever
        #: ran on two hosts at once
        self.violations: set[tuple[str, str]] = set()

    def _uuid(self, rng: random.Random | None = None) -> str:
        return str(uuid.UUID(int=(rng or self._rng).getrandbits(128), version=4))

    def _flavor(self, rng: random.Random) -> Flavor:
        name, vcpus, memory_mb, root_gb, _, extra = rng.choices(FLAVORS, weights=self._weights)[0]
        return Flavor(vcpus=vcpus, memory_mb=memory_mb, root_gb=root_gb, extra_specs=dict(extra))

    # -- the cloud before the run ------------------------------------------------

    def prefill(self, documents: dict[str, Document], fill: float) -> int:
        """Place running servers into the documents until each host's memory is ~``fill`` used."""
        rng = random.Random(f"prefill-{self.seed}")
        placed = 0
        for source in sorted(documents):
            compute = documents[source]["compute"]
            instances = documents[source].setdefault("instances", {})
            target = fill * (compute["memory_mb"] - compute.get("reserved_memory_mb", 0))
            while True:
                flavor = self._flavor(rng)
                if compute["memory_mb_used"] + flavor.memory_mb > target:
                    break
                if compute["vcpus_used"] + flavor.vcpus > compute["vcpus"] * compute[
                        "cpu_allocation_ratio"] or compute["disk_gb_used"] + flavor.root_gb > compute[
                        "disk_gb"]:
                    break
                instance = self._uuid(rng)
                resources = {"vcpus": flavor.vcpus, "memory_mb": flavor.memory_mb,
                             "disk_gb": flavor.root_gb}
                for r, amount in resources.items():
                    compute[f"{r}_used"] += amount
                compute["num_instances"] += 1
                instances[instance] = {"claim": f"prefill-{instance}", "resources": resources}
                self._add(instance, source)
                placed += 1
        return placed

    # -- during the run ------------------------------------------------------------

    def next_request(self) -> RequestSpec:
        rng = self._rng
        self.issued += 1
        flavor = self._flavor(rng)
        count = rng.randint(2, 4) if rng.random() < self.multi_fraction else 1
        uuids = [self._uuid() for _ in range(count)]
        group = None
        if rng.random() < self.group_fraction:
            g = self.groups[rng.randrange(len(self.groups))]
            group = InstanceGroup(g.policy, members=list(g.members), uuid=g.uuid)
        az = f"az{rng.randint(1, self.azs)}" if self.azs and rng.random() < self.az_fraction else None
        return RequestSpec(flavor=flavor, project_id=f"project-{rng.randrange(20)}",
                           instance_uuids=uuids, instance_group=group, availability_zone=az,
                           request_id=f"req-{self.issued}")

    def booted(self, spec: RequestSpec, placed: dict[str, str]) -> None:
        """Servers of ``spec`` are running (instance -> source); group members grow."""
        group = None
        if spec.instance_group is not None:
            group = next(g for g in self.groups if g.uuid == spec.instance_group.uuid)
        for instance, source in placed.items():
            self._add(instance, source)
            if group is not None:
                group.members.append(instance)
                self._group_of[instance] = group
        if group is not None:
            self._check_policy(group)

    def policy_of(self, group_uuid: str) -> str:
        """The policy of one of the workload's server groups ("" if unknown)."""
        return next((g.policy for g in self.groups if g.uuid == group_uuid), "")

    def _check_policy(self, group: Group) -> None:
        """Record a violation of ``group``'s policy by its running members (nova's rules:
        anti-affinity, at most one member per host; affinity, every member on one host)."""
        hosts = [self.running[m] for m in group.members]
        if group.policy == "affinity":
            if len(set(hosts)) > 1:
                self.violations.add((group.uuid, "split"))
            return
        seen: set[str] = set()
        for host in hosts:
            if host in seen:
                self.violations.add((group.uuid, host))
            seen.add(host)

    def _add(self, instance: str, source: str) -> None:
        self.running[instance] = source
        self._position[instance] = len(self._order)
        self._order.append(instance)

    def pick_deletion(self) -> tuple[str, str] | None:
        """A running server to delete (seeded), removed from the running set."""
        if not self._order:
            return None
        order = self._order
        i = self._delete_rng.randrange(len(order))
        instance = order[i]
        last = order.pop()
        if last != instance:
            order[i] = last
            self._position[last] = i
        del self._position[instance]
        source = self.running.pop(instance)
        group = self._group_of.pop(instance, None)
        if group is not None:
            group.members.remove(instance)
        return instance, source


__all__ = ["Workload", "FLAVORS", "SET"]
