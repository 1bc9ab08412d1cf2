"""Many threads in one SchedulerManager (nova runs 64 RPC threads): no request sees another's
allocation candidates or limits, because every request gets its own HostState views.

A probe filter stamps ``limits`` with the request's id, yields the GIL, and checks that
the stamp and every allocation candidate (tagged by the fake placement with the request's
id) are still its own.  The negative control shares one set of HostStates between requests,
as a host manager that cached nova's HostState would, and the same probe catches it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import threading  # noqa: E402
import time  # noqa: E402

from nova import context as nova_context  # noqa: E402
from nova.scheduler import filters as nova_filters  # noqa: E402
from nova.scheduler import host_manager as nova_hm  # noqa: E402
from nova.scheduler import manager as nova_manager  # noqa: E402
from oslo_serialization import jsonutils  # noqa: E402

from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

THREADS = 8
REQUESTS = 4
HOSTS = 12


class LeakProbe(nova_filters.BaseHostFilter):
    """Writes the request id into limits, lets other threads run, then checks nothing changed."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = violations

    def host_passes(self, host_state, spec_obj):
        marker = spec_obj.scheduler_hints["marker"][0]
        host_state.limits["marker"] = marker
        time.sleep(0.0002)
        if host_state.limits.get("marker") != marker:
            self.violations.append(f"limits of {host_state.host}: {host_state.limits.get('marker')}")
        for candidate in host_state.allocation_candidates:
            if candidate.get("shm_marker") != marker:
                self.violations.append(f"candidate of {host_state.host}: {candidate.get('shm_marker')}")
        return True


class SharedStatesManager(shm.SharedHostManager):
    """Negative control: one set of HostStates for every request (what a naive cache would do)."""

    _shared: list | None = None

    def get_host_states_by_uuids(self, context, compute_uuids, spec_obj):
        if self._shared is None:
            self._shared = list(super().get_host_states_by_uuids(context, compute_uuids, spec_obj))
        return iter(self._shared)


def _cloud() -> tuple:
    """HOSTS computes in a cache, and a fake placement holding them."""
    nodes = [fx.compute_node(i, free_ram_mb=30000 + 997 * i) for i in range(HOSTS)]
    cache = fx.cache_from_documents({cn.uuid: ndoc.document_from_compute_node(
        cn, service=fx.service_dict(cn.host), cell_uuid=fx.CELL1) for cn in nodes})
    return cache, fx.FakePlacement([cn.uuid for cn in nodes])


def _at_once(work) -> list[BaseException]:
    """``work(t)`` in THREADS threads started together; what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(t: int) -> None:
        try:
            start.wait()
            work(t)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return errors


def _run(manager_cls, nova_conf):
    nova_conf.set(**{"filter_scheduler.enabled_filters": [
        "ComputeFilter", "ImagePropertiesFilter", "NUMATopologyFilter"]})
    cache, placement = _cloud()
    violations: list[str] = []
    results: list[tuple[str, list]] = []
    with fx.patched_scheduler(placement):
        nova_hm.HostManager = manager_cls  # patched_scheduler restores nova's on exit
        shm.set_cache_provider(lambda: cache)
        mgr = nova_manager.SchedulerManager()
        mgr.host_manager.enabled_filters.append(LeakProbe(violations))

        def worker(t: int) -> None:
            for r in range(REQUESTS):
                marker = f"req-{t}-{r}"
                ctx = nova_context.get_admin_context()
                ctx.shm_marker = marker
                spec = fx.request_spec(instance_uuid=fx.uuid_for(marker, 0),
                                       hints={"marker": [marker]})
                sel = mgr.select_destinations(ctx, spec_obj=spec, instance_uuids=[spec.instance_uuid],
                                              return_objects=True, return_alternates=True)
                results.append((marker, sel))

        errors = _at_once(worker)
        shm.set_cache_provider(None)
    return violations, errors, results, mgr


def test_concurrent_requests_never_see_each_others_candidates_or_limits(nova_conf):
    violations, errors, results, mgr = _run(shm.SharedHostManager, nova_conf)
    assert not errors, errors[:3]
    assert not violations, violations[:5]
    assert len(results) == THREADS * REQUESTS
    for marker, sel in results:
        for s in sel[0]:  # the selected host and its alternates carry this request's candidates
            assert jsonutils.loads(s.allocation_request)["shm_marker"] == marker
    # every request got its own claim recorded; the ledger spread them over the hosts
    assert mgr.host_manager.counters["claims_recorded"] == THREADS * REQUESTS
    assert len({sel[0][0].compute_node_uuid for _, sel in results}) > 1


def test_the_probe_catches_shared_host_states(nova_conf):
    violations, errors, results, _ = _run(SharedStatesManager, nova_conf)
    assert violations or any(
        jsonutils.loads(s.allocation_request)["shm_marker"] != marker
        for marker, sel in results for s in sel[0])


class Yield(nova_filters.BaseHostFilter):
    """Lets the other RPC threads run in the middle of a decision."""

    def host_passes(self, host_state, spec_obj):
        time.sleep(0.0005)
        return True


def test_the_members_of_an_anti_affinity_group_requested_at_once_go_to_different_hosts(nova_conf):
    """nova-api makes each member of a group a request of its own; nova's RPC threads decide
    them side by side, and a scheduler records where a member went only once placement took
    its claim.  The drop-in's manager decides one group's requests one at a time, so each
    member's anti-affinity check sees the members placed before it (no late-check failure
    on the compute).  Without it, all eight took the same host."""
    from nova import objects

    from shared_host_manager.nova import report_client

    nova_conf.set(**{"filter_scheduler.enabled_filters": [
        "ComputeFilter", "ServerGroupAntiAffinityFilter"]})
    cache, placement = _cloud()
    members = [fx.uuid_for("member", i) for i in range(THREADS)]
    chosen: list[str] = []
    with fx.patched_scheduler(placement):
        shm.set_cache_provider(lambda: cache)
        mgr = report_client.AnnouncingSchedulerManager()
        mgr.host_manager.enabled_filters.append(Yield())

        def member(i: int) -> None:
            group = objects.InstanceGroup(
                uuid="6f3b0c9e-1d7a-4b1e-9c55-0a1b2c3d4e5f", policy="anti-affinity",
                policies=["anti-affinity"], rules={}, members=list(members), hosts=[])
            spec = fx.request_spec(instance_uuid=members[i], group=group)
            sel = mgr.select_destinations(nova_context.get_admin_context(), spec_obj=spec,
                                          instance_uuids=[members[i]], return_objects=True,
                                          return_alternates=True)
            chosen.append(sel[0][0].service_host)

        errors = _at_once(member)
        shm.set_cache_provider(None)
    assert not errors, errors[:3]
    assert len(chosen) == THREADS and len(set(chosen)) == THREADS, sorted(chosen)
