"""Issue 13's three defects, each with its own test: every state nova's scheduler reads
reaches the cache from its owner when it changes (design §2).

1. a move's source host publishes the instance gone (the tracker's change complete);
2. a stopped compute says goodbye, a deleted service or node is not eligible;
3. forced_down, written by the API only, reaches ComputeFilter.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import objects  # noqa: E402
from nova.scheduler.filters import compute_filter  # noqa: E402

from compute_reporter.manager import ReporterManager  # noqa: E402
from protocol.messages import Snapshot  # noqa: E402
from shared_host_manager.nova import api_source, compute_hook  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()


class MoveRT:
    """nova's ResourceTracker as far as a confirmed move goes: ``drop_move_claim_at_source``
    persists the node (``_update``) *before* it forgets the instance, as nova 34 does."""

    def __init__(self, host: str, cn) -> None:
        self.host = host
        self.cn = cn
        self.tracked_instances: set[str] = set()
        self.service_ref = objects.Service(host=host, binary="nova-compute", disabled=False,
                                           forced_down=False)

    def _update(self, context, compute_node, startup=False):
        pass  # nova: placement and compute_node.save()

    def instance_claim(self, instance: str) -> None:
        self.tracked_instances.add(instance)
        self._update(None, self.cn)

    def drop_move_claim_at_source(self, instance: str) -> None:
        self._update(None, self.cn)  # nova's _drop_move_claim: persisted first...
        self.tracked_instances.discard(instance)  # ...the instance forgotten after


class NoManager:
    def set_host_enabled(self, context, enabled):
        return enabled


@pytest.fixture
def two_computes():
    """Two nova-computes in one process, each with its own hook (as nova's functional tests run)."""
    compute_hook.install(resource_tracker_cls=MoveRT, compute_manager_cls=NoManager)
    hooks = {}
    for host in ("host0", "host1"):
        hooks[host] = compute_hook.ComputeHook(aggregate_refresh_interval=0)
        compute_hook.register(host, hooks[host])
    yield hooks
    for host in hooks:
        compute_hook.unregister(host)
    compute_hook.uninstall()


def test_a_confirmed_move_publishes_the_source_host_without_the_instance(two_computes):
    source_cn, dest_cn = fx.compute_node(0), fx.compute_node(1)
    source, dest = MoveRT("host0", source_cn), MoveRT("host1", dest_cn)
    moved = fx.uuid_for("i", 1)
    source.instance_claim(moved)
    assert list(two_computes["host0"].document(source_cn.uuid)["instances"]) == [moved]
    dest.instance_claim(moved)
    assert two_computes["host1"].document(dest_cn.uuid)["instances"] == {moved: {}}
    source.drop_move_claim_at_source(moved)
    # published once the tracker's call is complete: the instance is gone from the source
    assert "instances" not in two_computes["host0"].document(source_cn.uuid)
    assert compute_hook.hook_for("host1") is two_computes["host1"]
    assert compute_hook.hook_for("host9") is None  # a compute nobody registered publishes nothing


def _world():
    nodes = [fx.compute_node(i) for i in range(3)]
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host), cell_uuid=fx.CELL1)
            for cn in nodes}
    cache = fx.cache_from_documents(docs)
    return nodes, cache, shm.SharedHostManager(cache)


def _hosts(manager):
    return {h.host: h for h in manager.get_host_states_by_uuids(None, None, None)}


def _publish(cache, api: api_source.ApiStateSource, seq: int) -> None:
    with cache.lock:
        cache.receiver.receive(Snapshot(api.source, 1, seq, api.document(api.source)), cache.clock())


def test_a_stopped_compute_says_goodbye_and_leaves_at_once():
    nodes, cache, manager = _world()
    source = nodes[0].uuid
    reporter = ReporterManager("compute-host0", {source: dict(cache.receiver.sources[source].doc)},
                               {source: 2}, coalesce_window=0.0)
    with cache.lock:  # the reporter's first epoch replaces the document the cache held
        for batch in reporter.poll(cache.clock())[0]:
            cache.receiver.receive(batch, cache.clock())
    assert "host0" in _hosts(manager)
    batches, _ = reporter.goodbye(cache.clock())
    with cache.lock:
        for batch in batches:
            cache.receiver.receive(batch, cache.clock())
    assert "host0" not in _hosts(manager)  # not down_interval later: now
    assert set(_hosts(manager)) == {"host1", "host2"}


def test_a_deleted_service_or_node_is_not_eligible_until_created_again():
    nodes, cache, manager = _world()
    api = api_source.ApiStateSource("nova-api-1")
    api.service_changed(objects.Service(host="host1", binary="nova-compute", disabled=False,
                                        forced_down=False), deleted=True)
    api.node_changed(nodes[2].uuid, deleted=True)
    _publish(cache, api, 0)
    assert set(_hosts(manager)) == {"host0"}  # nova skips nodes without a service record
    api.service_changed(objects.Service(host="host1", binary="nova-compute", disabled=False,
                                        forced_down=False))
    api.node_changed(nodes[2].uuid, deleted=False)
    _publish(cache, api, 1)
    assert set(_hosts(manager)) == {"host0", "host1", "host2"}


def test_forced_down_written_by_the_api_reaches_compute_filter():
    nodes, cache, manager = _world()
    assert compute_filter.ComputeFilter().host_passes(_hosts(manager)["host1"], None)
    api = api_source.ApiStateSource("nova-api-1")
    api.service_changed(objects.Service(host="host1", binary="nova-compute", disabled=False,
                                        forced_down=True))
    _publish(cache, api, 0)
    host1 = _hosts(manager)["host1"]
    assert host1.service["forced_down"] is True  # the compute's own document still says False
    assert not compute_filter.ComputeFilter().host_passes(host1, None)
    assert compute_filter.ComputeFilter().host_passes(_hosts(manager)["host0"], None)


def test_api_sources_merge_by_the_time_of_the_change():
    nodes, cache, manager = _world()
    clock = iter([10.0, 20.0])
    older = api_source.ApiStateSource("nova-api-1", wall=lambda: next(clock))
    newer = api_source.ApiStateSource("nova-conductor-1", wall=lambda: next(clock))
    older.service_changed(objects.Service(host="host0", binary="nova-compute", disabled=True,
                                          forced_down=False, disabled_reason="maintenance"))
    newer.service_changed(objects.Service(host="host0", binary="nova-compute", disabled=False,
                                          forced_down=False))
    _publish(cache, newer, 0)
    _publish(cache, older, 0)  # arrives last, but changed first
    assert _hosts(manager)["host0"].service["disabled"] is False


def test_a_heartbeat_from_a_stale_copy_of_the_service_does_not_re_enable_it():
    # An operator disables host0 through the API; the compute's heartbeat then saves
    # report_count from the copy of its service it loaded at start (disabled=False). Only
    # what a save writes is published, so host0 stays disabled for the schedulers.
    nodes, cache, manager = _world()
    api = api_source.ApiStateSource("nova-api-1")
    stale = objects.Service(host="host0", binary="nova-compute", disabled=False,
                            forced_down=False, report_count=1)
    api.service_changed(stale)  # created: all of it
    operator = objects.Service(host="host0", binary="nova-compute", disabled=False,
                               forced_down=False)
    operator.obj_reset_changes()
    operator.disabled, operator.disabled_reason = True, "maintenance"
    api.service_changed(operator, saved=operator.obj_what_changed())
    stale.obj_reset_changes()
    stale.report_count += 1
    assert stale.obj_what_changed() == {"report_count"}
    changes = api.changes
    api.service_changed(stale, saved=stale.obj_what_changed())
    assert api.changes == changes  # nothing the schedulers read was written
    _publish(cache, api, 0)
    host0 = _hosts(manager)["host0"]
    assert host0.service["disabled"] is True
    assert not compute_filter.ComputeFilter().host_passes(host0, None)
    # a save that writes forced_down from that stale copy leaves disabled as it was
    stale.obj_reset_changes()
    stale.forced_down = True
    api.service_changed(stale, saved=stale.obj_what_changed())
    entry = api.document(api.source)["services"]["host0"]
    assert (entry["disabled"], entry["forced_down"], entry["disabled_reason"]) == (
        True, True, "maintenance")


class _SavedWhileRead:
    """A service whose ``disabled`` is read while another save of the same service runs
    (two API threads of one process saving different fields at once)."""

    binary, host = "nova-compute", "host0"

    def __init__(self, meanwhile):
        self._meanwhile = meanwhile

    def obj_attr_is_set(self, name):
        return name in ("binary", "host", "disabled")

    @property
    def disabled(self):
        if self._meanwhile is not None:
            meanwhile, self._meanwhile = self._meanwhile, None
            meanwhile()
        return True


def test_two_saves_of_one_service_at_once_keep_both_fields():
    api = api_source.ApiStateSource("nova-api-1")
    api.service_changed(objects.Service(host="host0", binary="nova-compute", disabled=False,
                                        forced_down=False))
    forced = objects.Service(host="host0", binary="nova-compute", disabled=False, forced_down=False)
    forced.obj_reset_changes()
    forced.forced_down = True
    api.service_changed(_SavedWhileRead(lambda: api.service_changed(
        forced, saved=forced.obj_what_changed())), saved={"disabled"})
    entry = api.document(api.source)["services"]["host0"]
    assert (entry["disabled"], entry["forced_down"]) == (True, True)


def test_a_late_aggregate_fanout_does_not_undo_the_api_sides_newer_catalogue():
    """nova casts update_aggregates after each aggregate call (create, metadata, add_host);
    casts may arrive out of order, after the API side's source published the aggregate's
    latest state.  The catalogue (a versioned source) decides for the aggregates it has:
    nova's functional test_aggregate_multitenancy_isolation_filter failed about one run in
    two on this (the add_host cast arriving after the metadata one)."""
    nodes, cache, manager = _world()
    api = api_source.ApiStateSource("nova-api-1")
    agg = objects.Aggregate(id=9, uuid=fx.uuid_for("agg", 9), name="private",
                            metadata={"filter_tenant_id": "p1"}, hosts=["host2"])
    api.aggregate_changed(agg)
    _publish(cache, api, 0)
    # an older state's cast, arriving last: before host2 was added and host1 removed
    late = objects.Aggregate(id=9, uuid=agg.uuid, name="private", metadata={},
                             hosts=["host1"])
    manager.update_aggregates([late])
    hosts = _hosts(manager)
    assert [a.metadata for a in hosts["host2"].aggregates] == [{"filter_tenant_id": "p1"}]
    assert hosts["host1"].aggregates == []
    # an aggregate the catalogue does not have: the fanout decides
    other = objects.Aggregate(id=10, uuid=fx.uuid_for("agg", 10), name="other",
                              metadata={"x": "1"}, hosts=["host1"])
    manager.update_aggregates([other])
    assert [a.metadata for a in _hosts(manager)["host1"].aggregates] == [{"x": "1"}]


# -- the API-side source is known from its first message, whatever its document holds ------

def _receive(cache, message) -> None:
    with cache.lock:
        cache.receiver.receive(message, cache.clock())


def _force_down(api: api_source.ApiStateSource, host: str) -> None:
    api.service_changed(objects.Service(host=host, binary="nova-compute", disabled=False,
                                        forced_down=True), saved={"forced_down"})


def _snapshot(api: api_source.ApiStateSource, epoch: int, seq: int) -> Snapshot:
    return Snapshot(api.source, epoch, seq, api.document(api.source))


@pytest.mark.parametrize("order", ["api_first", "api_after_a_request", "api_restarted",
                                   "conductor_joins_later"])
@pytest.mark.parametrize("change", ["forced_down", "disabled", "service_deleted",
                                    "node_deleted", "aggregate"])
def test_a_fresh_api_source_is_applied_from_its_first_change(order, change):
    """nova-api's source starts with no change to tell: a scheduler that saw it empty must
    still apply everything it publishes afterwards (a force-down once ignored this way let
    3 of 6 builds land on the forced-down compute)."""
    nodes, cache, manager = _world()
    api = api_source.ApiStateSource("nova-api-0", role="nova-api")
    epoch = 1
    if order == "api_restarted":
        old = api_source.ApiStateSource("nova-api-0", role="nova-api")
        _force_down(old, "host2")  # the old process's word, replaced by the new epoch's
        _receive(cache, _snapshot(old, 1, 0))
        assert not compute_filter.ComputeFilter().host_passes(_hosts(manager)["host2"], None)
        epoch = 2
    if order != "api_first":
        _hosts(manager)  # a request before the API source is heard of at all
    _receive(cache, _snapshot(api, epoch, 0))  # its first message: nothing changed yet
    hosts = _hosts(manager)  # a request sees it empty (a new epoch: the old word is gone)
    assert all(compute_filter.ComputeFilter().host_passes(h, None) for h in hosts.values())
    if order == "conductor_joins_later":
        conductor = api_source.ApiStateSource("nova-conductor-0", role="nova-conductor")
        _receive(cache, _snapshot(conductor, 1, 0))
        _hosts(manager)
    if change == "forced_down":
        _force_down(api, "host1")
    elif change == "disabled":
        api.service_changed(objects.Service(host="host1", binary="nova-compute", disabled=True,
                                            forced_down=False), saved={"disabled"})
    elif change == "service_deleted":
        api.service_changed(objects.Service(host="host1", binary="nova-compute", disabled=False,
                                            forced_down=False), deleted=True)
    elif change == "node_deleted":
        api.node_changed(nodes[1].uuid, deleted=True)
    else:
        api.aggregate_changed(objects.Aggregate(uuid=fx.uuid_for("agg", 1), name="az1",
                                                metadata={"availability_zone": "az1"},
                                                hosts=["host1"]))
    _receive(cache, _snapshot(api, epoch, 1))
    hosts = _hosts(manager)
    if change == "forced_down":
        assert not compute_filter.ComputeFilter().host_passes(hosts["host1"], None)
    elif change == "disabled":
        assert not compute_filter.ComputeFilter().host_passes(hosts["host1"], None)
    elif change == "aggregate":
        assert [a.name for a in hosts["host1"].aggregates] == ["az1"]
    else:
        assert "host1" not in hosts
    assert compute_filter.ComputeFilter().host_passes(hosts["host0"], None)


# -- read your writes: a fenced change counts in the next decision ---------------------------

@pytest.mark.slow
def test_a_decision_after_a_fenced_force_down_never_places_on_the_host():
    """The API call returned once its force-down was on the stream and fenced; this
    scheduler's stream is behind (the change arrives 0.3 s later): the next decision waits
    for it instead of deciding on the old state."""
    import threading
    import time

    from protocol.codec import Encoder
    from protocol.messages import Fence

    nodes, cache, manager = _world()
    cache.fence_timeout = 10.0
    api = api_source.ApiStateSource("nova-api-0", role="nova-api")
    _receive(cache, _snapshot(api, 1, 0))
    _force_down(api, "host1")
    assert cache.ingest_control(Encoder().encode(Fence(api.source, 1, 1))) is not None

    late = threading.Timer(0.3, lambda: _receive(cache, _snapshot(api, 1, 1)))
    late.start()
    started = time.monotonic()
    hosts = _hosts(manager)
    late.join()
    assert not compute_filter.ComputeFilter().host_passes(hosts["host1"], None)
    assert time.monotonic() - started >= 0.25  # it waited for the stream
    assert cache.fence_stats["met"] == 1 and cache.fence_stats["waits"] == 1
    assert not cache.fences


def test_a_fence_the_stream_never_brings_is_given_up_after_its_timeout():
    from protocol.codec import Encoder
    from protocol.messages import Fence

    nodes, cache, manager = _world()
    cache.fence_timeout = 0.05
    cache.ingest_control(Encoder().encode(Fence("nova-api-9", 1, 3)))
    assert set(_hosts(manager)) == {"host0", "host1", "host2"}  # decided, not stuck
    assert cache.fence_stats["expired"] == 1 and not cache.fences
    cache.ingest_control(Encoder().encode(Fence(nodes[0].uuid, 1, 0)))  # already held
    assert cache.fence_stats["met"] == 1 and not cache.fences


def _saved(host: str, **fields) -> objects.Service:
    """A Service as nova-api saves it: loaded, then ``fields`` set (what obj_what_changed says)."""
    service = objects.Service(host=host, binary="nova-compute", disabled=False, forced_down=False)
    service.obj_reset_changes()
    for name, value in fields.items():
        setattr(service, name, value)
    return service


def test_two_api_workers_taking_turns_each_field_as_written_last():
    """Force down, unforce, disable, enable within a second, taken by nova-api's two workers in
    turn: each worker holds its own copy of the entry, so whole-entry merging published the
    first worker's stale forced_down=True last and the host never came back."""
    nodes, cache, manager = _world()
    clock = iter(float(t) for t in range(10, 100))
    a = api_source.ApiStateSource("nova-api-a", wall=lambda: next(clock))
    b = api_source.ApiStateSource("nova-api-b", wall=lambda: next(clock))
    for w in (a, b):  # both started knowing the host enabled and up
        w.preload([objects.Service(host="host1", binary="nova-compute", disabled=False,
                                   forced_down=False)], [])
    for worker, fields in ((a, {"forced_down": True}), (b, {"forced_down": False}),
                           (b, {"disabled": True, "disabled_reason": "x"}), (a, {"disabled": False})):
        service = _saved("host1", **fields)
        worker.service_changed(service, saved=set(service.obj_what_changed()))
    for seq, w in enumerate((a, b)):
        _publish(cache, w, seq)
    host1 = _hosts(manager)["host1"]
    assert host1.service["forced_down"] is False and host1.service["disabled"] is False
    assert compute_filter.ComputeFilter().host_passes(host1, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["disabled", "forced_down"]),
                          st.booleans()), max_size=12))
def test_api_workers_merged_say_what_was_written_last(writes):
    """Any interleaving of saves over three API processes: the schedulers' merge of their
    documents is, field by field, the value written last (the database's)."""
    clock = iter(float(t) for t in range(1, 1000))
    workers = [api_source.ApiStateSource(f"nova-api-{i}", wall=lambda: next(clock)) for i in range(3)]
    truth = {"disabled": False, "forced_down": False}
    for w in workers:
        w.preload([objects.Service(host="h", binary="nova-compute", **truth)], [])
    for i, name, value in writes:
        service = _saved("h", **{name: value})
        workers[i].service_changed(service, saved=set(service.obj_what_changed()))
        truth[name] = value
    views = [type("View", (), {"source": w.source, "version": (1, 0),
                               "doc": w.document(w.source)})() for w in workers]
    merged = api_source.ApiState.from_views(views).services["h"]
    assert {name: merged[name] for name in truth} == truth


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["project-a", "project-b", None])),
                max_size=12))
def test_api_workers_merged_hold_each_aggregate_as_written_last(writes):
    """Any interleaving of an aggregate's metadata changes over three API processes (nova-api's
    workers take them in turn): the schedulers' merge holds the metadata written last.  A
    worker that took a change whose value its own copy already held (it named the tenant
    once, another worker unnamed it since) published nothing, and the other worker's older
    entry stayed: servers went where the aggregate no longer sent them."""
    clock = iter(float(t) for t in range(1, 1000))
    workers = [api_source.ApiStateSource(f"nova-api-{i}", wall=lambda: next(clock)) for i in range(3)]

    def aggregate(metadata: dict[str, str]) -> objects.Aggregate:
        return objects.Aggregate(id=1, uuid="agg-1", name="tenants", hosts=["h"],
                                 metadata=metadata)

    truth: dict[str, str] = {}
    for w in workers:
        w.preload([], [aggregate(truth)])
    for i, project in writes:
        truth = {} if project is None else {"filter_tenant_id": project}
        workers[i].aggregate_changed(aggregate(truth))
    views = [type("View", (), {"source": w.source, "version": (1, 0),
                               "doc": w.document(w.source)})() for w in workers]
    merged = api_source.ApiState.from_views(views).catalogue["agg-1"]
    assert merged["metadata"] == truth


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=10))
def test_api_workers_merged_hold_each_node_as_deleted_or_created_last(writes):
    """A compute node deleted and created again in turn through several processes (nova-api
    deletes, the conductor creates it when the compute starts again): the merge says what
    was done last."""
    clock = iter(float(t) for t in range(1, 1000))
    workers = [api_source.ApiStateSource(f"nova-api-{i}", wall=lambda: next(clock)) for i in range(3)]
    deleted = False
    for w in workers:
        w.node_changed("node-1", deleted=False)
    for i, deleted in writes:
        workers[i].node_changed("node-1", deleted=deleted)
    views = [type("View", (), {"source": w.source, "version": (1, 0),
                               "doc": w.document(w.source)})() for w in workers]
    assert api_source.ApiState.from_views(views).nodes["node-1"]["deleted"] is deleted
