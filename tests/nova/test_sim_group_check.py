"""The nova simulation's computes run nova-compute's late server-group check.

nova's group filters read the group's hosts as the conductor found them when the request
began, so two members decided at once can both pass them; nova-compute checks the policy
again after its instance claim (``_validate_instance_group_policy``) and refuses the build.
``NovaCloud._build`` does the same: these tests drive it on stand-in compute nodes (what the
resource tracker saves and reports is the rest of the simulation's business, tested there).
"""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("nova.objects")

from shared_host_manager.nova.testing import simulation as sim  # noqa: E402

pytestmark = pytest.mark.nova

RES = {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}


class _Node(SimpleNamespace):
    def save(self) -> None:
        pass


def _cloud(hosts: tuple[str, ...] = ("h1", "h2")) -> Any:
    from nova import objects

    objects.register_all()  # the InstanceList a build tells the schedulers of
    cloud: Any = object.__new__(sim.NovaCloud)
    cloud.nodes = {h: _Node(host=h, hypervisor_hostname=h, vcpus=8, memory_mb=8192, local_gb=100,
                            cpu_allocation_ratio=1.0, ram_allocation_ratio=1.0,
                            disk_allocation_ratio=1.0, vcpus_used=0, memory_mb_used=0,
                            local_gb_used=0, stats={}) for h in hosts}
    cloud._locks = {h: threading.Lock() for h in hosts}
    cloud._db_write_lock = threading.Lock()
    cloud.tracked = {h: {} for h in hosts}
    cloud._where = {}
    cloud._members, cloud._group_of, cloud._group_locks = {}, {}, {}
    cloud.hooks = {}
    cloud.schedulers = []
    cloud.compute_client = SimpleNamespace(delete_allocation_for_instance=lambda *a, **k: None)
    cloud._ctx = None
    return cloud


def u(name: str) -> str:
    """An instance's uuid by name (nova's objects take uuids)."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def _req(policy: str | None, group: str = "g1") -> sim.SimRequest:
    return sim.SimRequest(instance_uuids=[], vcpus=1, memory_mb=512, root_gb=1,
                          group_uuid=group if policy else None, group_policy=policy)


def test_a_second_anti_affinity_member_on_a_host_is_refused_and_its_claim_undone():
    cloud = _cloud()
    req = _req("anti-affinity")
    assert cloud._build("h1", u("a"), RES, req) is None
    assert cloud._build("h1", u("b"), RES, req) == sim.GROUP_POLICY
    assert set(cloud.tracked["h1"]) == {u("a")} and u("b") not in cloud._where
    assert cloud.nodes["h1"].vcpus_used == 1 and cloud.nodes["h1"].memory_mb_used == 512
    assert cloud._build("h2", u("b"), RES, req) is None
    # another group, or no group, is not this group's business
    assert cloud._build("h1", u("c"), RES, _req("anti-affinity", group="g2")) is None
    assert cloud._build("h1", u("d"), RES, _req(None)) is None
    # a deleted member leaves its host to the group
    cloud.delete(u("a"))
    assert cloud._build("h1", u("e"), RES, req) is None


def test_an_affinity_member_goes_where_the_group_is():
    cloud = _cloud()
    req = _req("affinity")
    assert cloud._build("h1", u("a"), RES, req) is None
    assert cloud._build("h2", u("b"), RES, req) == sim.GROUP_POLICY
    assert cloud.tracked["h2"] == {}
    assert cloud._build("h1", u("b"), RES, req) is None
    cloud.delete(u("a"))
    cloud.delete(u("b"))
    assert cloud._build("h2", u("c"), RES, req) is None  # an empty group goes anywhere


def test_resources_are_checked_before_the_group():
    cloud = _cloud(("h1",))
    cloud.nodes["h1"].vcpus_used = 8
    assert cloud._build("h1", u("a"), RES, _req("anti-affinity")) == sim.RESOURCES
    assert not cloud._members.get("g1") and not cloud.tracked["h1"]


def _build_at_once(policy: str, members: int = 8) -> tuple[Any, dict[str, str | None]]:
    """``members`` members of one group built at the same moment, alternately on h1 and h2."""
    cloud = _cloud()
    req = _req(policy)
    start = threading.Barrier(members)
    results: dict[str, str | None] = {}

    def build(i: int) -> None:
        start.wait()
        results[u(f"m{i}")] = cloud._build(("h1", "h2")[i % 2], u(f"m{i}"), RES, req)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return cloud, results


@pytest.mark.parametrize("policy", ["anti-affinity", "affinity"])
def test_members_built_at_once_keep_the_policy(policy):
    """Anti-affinity: at most one member per host; affinity: all on one host."""
    for attempt in range(20):
        cloud, results = _build_at_once(policy)
        placed = {m: cloud._where[m] for m, r in results.items() if r is None}
        assert all(r in (None, sim.GROUP_POLICY) for r in results.values())
        if policy == "anti-affinity":
            assert len(placed) == 2 and len(set(placed.values())) == 2, (attempt, placed)
        else:
            assert len(placed) == 4 and len(set(placed.values())) == 1, (attempt, placed)
        built = {m for h in cloud.tracked.values() for m in h}
        assert built == set(placed), "a refused build's claim is undone"
