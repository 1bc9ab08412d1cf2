"""The compute side: ResourceTracker._update -> document ops -> reporter -> scheduler view.

Also the claim-owned fields: a scheduler's pending claim is subtracted until the compute
reports the instance, and never twice.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import inspect  # noqa: E402
from typing import Any  # noqa: E402

from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.compute import manager as compute_manager  # noqa: E402
from nova.compute import resource_tracker  # noqa: E402
from nova.scheduler.filters import compute_filter  # noqa: E402

from compute_reporter.manager import ReporterManager  # noqa: E402
from protocol.receiver import ReceiverMachine  # noqa: E402
from shared_host_manager.cache import HostStateCache  # noqa: E402
from shared_host_manager.nova import compute_hook  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()


def test_hooks_the_methods_nova_34_has():
    """The hook wraps ResourceTracker._update(context, compute_node, startup) and
    ComputeManager.set_host_enabled(context, enabled): nova 34's persist and disable paths."""
    params = list(inspect.signature(resource_tracker.ResourceTracker._update).parameters)
    assert params == ["self", "context", "compute_node", "startup"]
    params = list(inspect.signature(compute_manager.ComputeManager.set_host_enabled).parameters)
    assert params == ["self", "context", "enabled"]
    source = inspect.getsource(resource_tracker.ResourceTracker._update)
    assert "compute_node.save()" in source


class FakeRT:
    """A ResourceTracker's state and its _update (which in nova pushes to placement and saves)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.tracked_instances: set[str] = set()
        self.tracked_migrations: dict[str, Any] = {}
        self.service_ref = objects.Service(host=host, binary="nova-compute", disabled=False,
                                           forced_down=False)  # version: this nova's, 74
        self.saved = 0
        self.fail = False

    def _update(self, context, compute_node, startup=False):
        if self.fail:
            raise RuntimeError("placement is down")
        self.saved += 1

    def instance_claim(self, cn, instance_uuid, memory_mb=2048, vcpus=2, root_gb=20):
        """What nova's RT does under COMPUTE_RESOURCE_SEMAPHORE, then _update."""
        self.tracked_instances.add(instance_uuid)
        cn.memory_mb_used += memory_mb
        cn.free_ram_mb = cn.memory_mb - cn.memory_mb_used
        cn.vcpus_used += vcpus
        cn.local_gb_used += root_gb
        cn.free_disk_gb = cn.local_gb - cn.local_gb_used
        stats = dict(cn.stats)
        stats["num_instances"] = str(int(stats["num_instances"]) + 1)
        stats["io_workload"] = str(int(stats["io_workload"]) + 1)
        cn.stats = stats
        self._update(nova_context.get_admin_context(), cn)

    def move_claim(self, cn, instance_uuid, source_host, source_node, memory_mb=4096):
        """nova's _move_claim on the destination ``cn``: the new flavor's usage counted, the
        instance tracked as an incoming migration (also when it stays on its node)."""
        self.tracked_migrations[instance_uuid] = objects.Migration(
            instance_uuid=instance_uuid, source_compute=source_host, source_node=source_node,
            dest_compute=cn.host, dest_node=cn.hypervisor_hostname)
        self._use(cn, memory_mb)

    def drop_move_claim_at_dest(self, cn, instance_uuid, memory_mb=4096):
        """nova's revert on the destination: the new flavor's usage dropped, and the instance
        forgotten (nova's _drop_move_claim discards it from tracked_instances too)."""
        self.tracked_migrations.pop(instance_uuid, None)
        self.tracked_instances.discard(instance_uuid)
        self._use(cn, -memory_mb)

    def _use(self, cn, memory_mb):
        cn.memory_mb_used += memory_mb
        cn.free_ram_mb = cn.memory_mb - cn.memory_mb_used
        self._update(nova_context.get_admin_context(), cn)


class FakeComputeManager:
    host = "host1"

    def set_host_enabled(self, context, enabled):
        return "enabled" if enabled else "disabled"


class Pipeline:
    """hook -> NovaTracker -> ReporterManager -> batches -> the scheduler's cache."""

    def __init__(self, hook: compute_hook.ComputeHook) -> None:
        self.now = 0.0
        tracker = compute_hook.NovaTracker(hook)
        self.reporter = ReporterManager("reporter-1", {s: tracker.document(s) for s in tracker.hosts()},
                                        dict.fromkeys(tracker.hosts(), 1), coalesce_window=0.0)
        pipeline = self

        class Sink:
            def change(self, source, ops):
                pipeline.reporter.change(source, ops, pipeline.now)

            def claims_included(self, source, claim_ids):
                pipeline.reporter.claims_included(source, claim_ids, pipeline.now)

        tracker.start(Sink())
        self.cache = HostStateCache(ReceiverMachine("sched-1", claim_deadline=30.0), lambda e, m: None,
                                    clock=lambda: pipeline.now)
        self.flush()

    def flush(self) -> None:
        self.now += 0.1
        batches, _ = self.reporter.poll(self.now)
        with self.cache.lock:
            for batch in batches:
                self.cache.receiver.receive(batch, self.now)


@pytest.fixture
def installed():
    hook = compute_hook.ComputeHook(reserved=ndoc.Reserved(0, 512, 0), aggregate_refresh_interval=0,
                                    cell_uuid=fx.CELL1)
    compute_hook.install(hook, resource_tracker_cls=FakeRT, compute_manager_cls=FakeComputeManager)
    yield hook
    compute_hook.uninstall()


def _view(manager, cn):
    return next(h for h in manager.get_host_states_by_uuids(None, [cn.uuid], None))


def test_rt_update_feeds_the_scheduler_and_claims_are_never_subtracted_twice(installed):
    cn = fx.compute_node(1, free_ram_mb=40000)
    rt = FakeRT(cn.host)
    rt._update(nova_context.get_admin_context(), cn)  # nova's first update_available_resource
    assert rt.saved == 1
    pipe = Pipeline(installed)
    manager = shm.SharedHostManager(pipe.cache, register_claims=True)
    view = _view(manager, cn)
    assert (view.free_ram_mb, view.vcpus_used, view.num_instances) == (40000, 2, 3)

    # the scheduler places an instance: nova's placement claim succeeded, consume -> pending claim
    instance = fx.uuid_for("inst", 1)
    view.consume_from_request(fx.request_spec(instance_uuid=instance))
    pending = _view(manager, cn)
    assert (pending.free_ram_mb, pending.vcpus_used, pending.num_instances, pending.num_io_ops) == \
        (40000 - 2048, 4, 4, 2)
    assert instance in pending.instances
    assert pipe.cache.receiver.pending_claims() == 1

    # the compute claims it and reports: usage and instance list change in the same delta
    rt.instance_claim(cn, instance)
    ops, included = installed.report(cn, instances=rt.tracked_instances)  # idempotent: nothing new
    assert ops == [] and included == []
    pipe.flush()
    after = _view(manager, cn)
    assert after.free_ram_mb == cn.free_ram_mb == 40000 - 2048  # once, not twice
    assert (after.vcpus_used, after.num_instances, after.num_io_ops) == (4, 4, 2)
    assert list(after.instances) == [instance]


def test_a_moves_claim_retires_when_its_destination_counts_the_migration(installed):
    """A resize or migration is claimed on its destination as an incoming migration, not a
    tracked instance: the scheduler's claim for it retires in that report (counted once),
    instead of being subtracted on top of the tracker's count until its deadline."""
    source, dest = fx.compute_node(1, free_ram_mb=40000), fx.compute_node(2, free_ram_mb=40000)
    rt = FakeRT(dest.host)
    FakeRT(source.host)._update(nova_context.get_admin_context(), source)
    rt._update(nova_context.get_admin_context(), dest)
    pipe = Pipeline(installed)
    manager = shm.SharedHostManager(pipe.cache, register_claims=True)
    instance = fx.uuid_for("inst", 7)
    _view(manager, dest).consume_from_request(fx.request_spec(instance_uuid=instance))
    assert pipe.cache.receiver.pending_claims() == 1

    rt.move_claim(dest, instance, source.host, source.hypervisor_hostname, memory_mb=2048)
    pipe.flush()
    assert pipe.cache.receiver.pending_claims() == 0
    assert _view(manager, dest).free_ram_mb == dest.free_ram_mb == 40000 - 2048  # once


def test_a_migration_without_its_destination_set_does_not_stop_the_report(installed):
    """A tracked migration whose destination fields are not set yet (nova raises on reading
    them) is not this node's incoming one; the node's report is published all the same."""
    cn = fx.compute_node(4, free_ram_mb=40000)
    rt = FakeRT(cn.host)
    rt._update(nova_context.get_admin_context(), cn)
    rt.tracked_migrations[fx.uuid_for("inst", 9)] = objects.Migration(
        instance_uuid=fx.uuid_for("inst", 9))
    rt.instance_claim(cn, fx.uuid_for("inst", 10))
    assert fx.uuid_for("inst", 10) in installed.document(cn.uuid)["instances"]
    assert installed.counters["sink_errors"] == 0


def test_a_resize_on_its_own_node_leaves_no_claim_behind_when_reverted(installed):
    """The instance is tracked on the node already, so only the move's own entry is new;
    after a revert (which also drops the instance from tracked_instances, as nova's
    _drop_move_claim does) nothing of the resize is subtracted any more."""
    cn = fx.compute_node(3, free_ram_mb=40000)
    rt = FakeRT(cn.host)
    rt._update(nova_context.get_admin_context(), cn)
    pipe = Pipeline(installed)
    manager = shm.SharedHostManager(pipe.cache, register_claims=True)
    instance = fx.uuid_for("inst", 8)
    rt.instance_claim(cn, instance)
    pipe.flush()
    _view(manager, cn).consume_from_request(fx.request_spec(instance_uuid=instance))  # resize
    assert pipe.cache.receiver.pending_claims() == 1

    rt.move_claim(cn, instance, cn.host, cn.hypervisor_hostname)
    pipe.flush()
    assert pipe.cache.receiver.pending_claims() == 0
    rt.drop_move_claim_at_dest(cn, instance)
    pipe.flush()
    assert instance not in installed.document(cn.uuid).get("instances", {})
    assert _view(manager, cn).free_ram_mb == cn.free_ram_mb == 40000 - 2048


def test_service_disable_reaches_compute_filter(installed):
    cn = fx.compute_node(1)
    rt = FakeRT(cn.host)
    rt._update(nova_context.get_admin_context(), cn)
    pipe = Pipeline(installed)
    manager = shm.SharedHostManager(pipe.cache)
    assert compute_filter.ComputeFilter().host_passes(_view(manager, cn), None)
    assert FakeComputeManager().set_host_enabled(None, False) == "disabled"
    pipe.flush()
    view = _view(manager, cn)
    assert view.service["disabled"] is True
    assert not compute_filter.ComputeFilter().host_passes(view, None)
    FakeComputeManager().set_host_enabled(None, True)
    pipe.flush()
    assert compute_filter.ComputeFilter().host_passes(_view(manager, cn), None)


def test_failures_publish_nothing_and_never_break_the_tracker(installed):
    cn = fx.compute_node(2)
    rt = FakeRT(cn.host)
    rt._update(None, cn)
    before = installed.document(cn.uuid)
    rt.fail = True
    cn.vcpus_used = 9
    with pytest.raises(RuntimeError):
        rt._update(None, cn)  # nova's own failure propagates, as without the hook
    assert installed.document(cn.uuid) == before

    class BrokenSink:
        def change(self, source, ops):
            raise OSError("broker down")

    rt.fail = False
    installed.sink = BrokenSink()
    rt._update(None, cn)  # the sink fails: the tracker does not notice
    assert installed.counters["sink_errors"] == 1
    installed.sink = None


def test_periodic_refresh_reads_service_and_aggregates(installed, monkeypatch):
    cn = fx.compute_node(3)
    agg = objects.Aggregate(id=5, uuid=fx.uuid_for("agg", 5), name="gpu", metadata={"gpu": "yes"},
                            hosts=[cn.host])
    service = objects.Service(host=cn.host, binary="nova-compute", disabled=True, forced_down=True,
                              disabled_reason="broken fan")
    monkeypatch.setattr(objects.Service, "get_by_compute_host", classmethod(lambda cls, ctx, host: service))
    monkeypatch.setattr(objects.AggregateList, "get_by_host", classmethod(lambda cls, ctx, host: [agg]))
    installed.aggregate_refresh_interval = 60
    FakeRT(cn.host)._update(None, cn)
    doc = installed.document(cn.uuid)
    assert doc["service"] == {"disabled": True, "forced_down": True, "disabled_reason": "broken fan",
                              "version": 74}
    assert doc["aggregates"] == {agg.uuid: {"id": 5, "name": "gpu", "metadata": {"gpu": "yes"}}}
    assert doc["compute"]["cell_uuid"] == fx.CELL1


def test_install_and_uninstall_restore_nova(installed):
    assert FakeRT._update.__wrapped__ is not None
    compute_hook.uninstall()
    assert not hasattr(FakeRT._update, "__wrapped__")
    assert not hasattr(FakeComputeManager.set_host_enabled, "__wrapped__")


class FakeBuildingManager(FakeComputeManager):
    """nova 34's build path: the RPC call queues the build, _do_build_and_run_instance runs it
    in a build slot (the tracker's instance_claim inside, unless the build fails first)."""

    def __init__(self, host: str, rt: FakeRT, cn: Any) -> None:
        self.host, self.rt, self.cn = host, rt, cn
        self.queued: list[tuple[Any, str]] = []

    def build_and_run_instance(self, context, instance, image, request_spec, filter_properties,
                               accel_uuids, admin_password=None, injected_files=None,
                               requested_networks=None, security_groups=None,
                               block_device_mapping=None, node=None, limits=None, host_list=None):
        self.queued.append((instance, node))

    def _do_build_and_run_instance(self, context, instance, image, request_spec,
                                   filter_properties, admin_password, injected_files,
                                   requested_networks, security_groups, block_device_mapping,
                                   node=None, limits=None, host_list=None, accel_uuids=None,
                                   fail=False):
        if fail:
            return "failed"  # nova's build_results.FAILED: the tracker never claimed it
        self.rt.instance_claim(self.cn, instance.uuid)
        return "active"

    def run_next(self, fail: bool = False) -> None:
        instance, node = self.queued.pop(0)
        self._do_build_and_run_instance(None, instance, None, None, {}, None, None, None, None,
                                        None, node=node, fail=fail)


def test_a_claim_the_compute_has_queued_stays_deducted_past_its_deadline(installed):
    """A build waiting for a build slot longer than claim_deadline: the node lists it under
    ``builds``, the scheduler keeps its claim until the tracker counts the instance (then once,
    not twice); a build that ends without it frees its claim with the report that ends it."""
    cn = fx.compute_node(5, free_ram_mb=40000)
    rt = FakeRT(cn.host)
    rt._update(nova_context.get_admin_context(), cn)
    compute = FakeBuildingManager(cn.host, rt, cn)
    compute_hook.install(installed, resource_tracker_cls=FakeRT,
                         compute_manager_cls=FakeBuildingManager)
    pipe = Pipeline(installed)
    manager = shm.SharedHostManager(pipe.cache, register_claims=True)
    built, failed = fx.uuid_for("inst", 21), fx.uuid_for("inst", 22)
    for instance in (built, failed):
        _view(manager, cn).consume_from_request(fx.request_spec(instance_uuid=instance))
        compute.build_and_run_instance(
            nova_context.get_admin_context(), instance=objects.Instance(uuid=instance),
            image={}, request_spec=None, filter_properties={}, accel_uuids=[],
            node=cn.hypervisor_hostname)
    pipe.flush()
    assert sorted(installed.document(cn.uuid)["builds"]) == sorted([built, failed])
    assert _view(manager, cn).free_ram_mb == 40000 - 2 * 2048

    receiver = pipe.cache.receiver

    def wait(seconds: float) -> None:  # the host heartbeats meanwhile
        for _ in range(int(seconds / 5)):
            pipe.now += 5.0
            pipe.flush()
            with pipe.cache.lock:
                receiver.tick(pipe.now)

    wait(95.0)  # three deadlines pass while both wait for a slot
    assert receiver.pending_claims() == 2 and receiver.stats["claims_expired"] == 0
    assert _view(manager, cn).free_ram_mb == 40000 - 2 * 2048

    compute.run_next()  # built: the tracker counts it, the delta includes the claim
    compute.run_next(fail=True)  # failed: no longer among the node's builds
    pipe.flush()
    assert "builds" not in installed.document(cn.uuid)
    assert receiver.stats["claims_included"] == 1 and receiver.stats["claims_dropped"] == 1
    assert receiver.pending_claims() == 0 and receiver.stats["claims_expired"] == 0
    assert _view(manager, cn).free_ram_mb == cn.free_ram_mb == 40000 - 2048  # once
    compute_hook.uninstall()
    assert not hasattr(FakeBuildingManager.build_and_run_instance, "__wrapped__")
