"""nova's real SchedulerManager.select_destinations on SharedHostManager: same answers, no SQL.

The database is configured and populated (nova's own schema, SQLite files),
so any database read on the decision path would run and be counted; nova's
own HostManager on the same setup is the positive control.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import sqlalchemy as sa  # noqa: E402
from nova import context as nova_context  # noqa: E402
from nova import exception as nova_exception  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import manager as nova_manager  # noqa: E402
from oslo_messaging import ExpectedException  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

N = 12


class SqlCounter:
    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        self.statements.append(statement)

    @property
    def n(self) -> int:
        return len(self.statements)

    def reset(self) -> None:
        self.statements.clear()


@pytest.fixture(scope="module")
def sql():
    counter = SqlCounter()
    event.listen(Engine, "before_cursor_execute", counter)
    yield counter
    event.remove(Engine, "before_cursor_execute", counter)


@pytest.fixture(scope="module")
def nodes():
    fx.setup_nova()
    # distinct free RAM, so no two hosts tie and both managers must order them the same
    return [fx.compute_node(i, free_ram_mb=20000 + 1000 * i, numa=(i % 3 != 0)) for i in range(N)]


@pytest.fixture(scope="module")
def nova_db(tmp_path_factory, nodes, sql):
    db = fx.NovaDatabase(str(tmp_path_factory.mktemp("novadb")))
    db.configure()
    db.populate(nodes)
    return db


@pytest.fixture
def cache(nodes):
    docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=fx.service_dict(cn.host),
                                                       cell_uuid=fx.CELL1) for cn in nodes}
    return fx.cache_from_documents(docs)


def _select(mgr, spec, uuids=None):
    uuids = uuids or [spec.instance_uuid]
    return mgr.select_destinations(nova_context.get_admin_context(), spec_obj=spec,
                                   instance_uuids=uuids, return_objects=True, return_alternates=True)


def test_the_sql_counter_counts_on_a_real_sqlite_engine(sql):
    engine = sa.create_engine("sqlite://")
    before = sql.n
    with engine.connect() as conn:
        conn.execute(sa.text("select 1"))
        conn.execute(sa.text("select 2"))
    engine.dispose()
    assert sql.n - before == 2


def test_nova_own_host_manager_reads_the_database(nova_db, nodes, sql, nova_conf):
    """Positive control: the same call with nova's HostManager runs SQL on every request."""
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    with fx.patched_scheduler(placement, shared=False):
        mgr = nova_manager.SchedulerManager()
        mgr.host_manager._instance_info = {}
        sql.reset()
        sel = _select(mgr, fx.request_spec(instance_uuid=fx.uuid_for("ctl", 1)))
    assert len(sel[0]) == 3
    assert sql.n > 0
    assert any("compute_nodes" in s for s in sql.statements)


def test_select_destinations_runs_no_sql_and_returns_alternates(nova_db, nodes, cache, sql, nova_conf):
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    shm.set_cache_provider(lambda: cache)
    try:
        with fx.patched_scheduler(placement):
            sql.reset()
            mgr = nova_manager.SchedulerManager()  # __init__: no cells, aggregates, instances query
            assert isinstance(mgr.host_manager, shm.SharedHostManager)
            uuids = [fx.uuid_for("sel", 1), fx.uuid_for("sel", 2)]
            group = objects.InstanceGroup(policy="anti-affinity", policies=["anti-affinity"], rules={},
                                          members=list(uuids), hosts=[])
            spec = fx.request_spec(instance_uuid=uuids[0], group=group, num_instances=2)
            selections = _select(mgr, spec, uuids)
            # the request filters ran for real; the owner filter's version question came from the stream
            assert "COMPUTE_STATUS_DISABLED" in spec.root_forbidden
            assert "OWNER_NOVA" in spec.root_required
            # a forced host goes through get_compute_nodes_by_host_or_node
            forced = fx.request_spec(instance_uuid=fx.uuid_for("sel", 3))
            forced.force_hosts = ["host4"]
            forced_sel = _select(mgr, forced)
            # a requested destination too
            dest = fx.request_spec(instance_uuid=fx.uuid_for("sel", 4))
            dest.requested_destination = objects.Destination(host="host5", node="node5")
            dest_sel = _select(mgr, dest)
            assert sql.n == 0, sql.statements[:5]
    finally:
        shm.set_cache_provider(None)
    assert len(selections) == 2
    for alts in selections:
        assert len(alts) == 3  # the claimed host + max_attempts - 1 alternates
        assert len({s.compute_node_uuid for s in alts}) == 3
        assert {s.cell_uuid for s in alts} == {fx.CELL1}
        assert all(s.allocation_request for s in alts)
    # anti-affinity inside the multi-create: two different hosts
    assert selections[0][0].service_host != selections[1][0].service_host
    assert [c[0] for c in placement.claims[:2]] == uuids
    assert forced_sel[0][0].service_host == "host4"
    assert dest_sel[0][0].service_host == "host5" and dest_sel[0][0].nodename == "node5"
    assert mgr.host_manager.counters["claims_recorded"] == 4


def test_same_decisions_as_nova_fed_from_the_database(nova_db, nodes, cache, sql, nova_conf):
    nova_conf.set(**{"filter_scheduler.enabled_filters": [
        "ComputeFilter", "ComputeCapabilitiesFilter", "ImagePropertiesFilter",
        "ServerGroupAntiAffinityFilter", "ServerGroupAffinityFilter", "NUMATopologyFilter",
        "IoOpsFilter", "NumInstancesFilter"]})
    specs = [
        dict(),
        dict(memory_mb=4096, image_props={"hw_architecture": "x86_64"}),
        dict(numa=objects.InstanceNUMATopology(cells=[objects.InstanceNUMACell(
            id=0, cpuset={0, 1}, pcpuset=set(), memory=1024)])),
    ]
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    answers = {}
    for shared in (False, True):
        shm.set_cache_provider(lambda: cache)
        try:
            with fx.patched_scheduler(placement, shared=shared):
                mgr = nova_manager.SchedulerManager()
                if shared:
                    mgr.host_manager.register_claims = False  # nova has no cross-request deduction
                out = []
                for k, kw in enumerate(specs):
                    sel = _select(mgr, fx.request_spec(instance_uuid=fx.uuid_for("same", k), **kw))
                    out.append([(s.service_host, s.nodename, s.compute_node_uuid, s.cell_uuid)
                                for s in sel[0]])
                answers[shared] = out
        finally:
            shm.set_cache_provider(None)
    assert answers[True] == answers[False]


def test_no_valid_host_is_raised_and_allocations_and_claims_cleaned_up(nodes, cache, sql):
    placement = fx.FakePlacement([cn.uuid for cn in nodes])
    placement.refuse = {cn.uuid for cn in nodes[1:]}  # only host0 can be claimed
    shm.set_cache_provider(lambda: cache)
    first = fx.uuid_for("nvh", 1)
    try:
        with fx.patched_scheduler(placement):
            mgr = nova_manager.SchedulerManager()
            sql.reset()
            group = objects.InstanceGroup(policy="anti-affinity", policies=["anti-affinity"], rules={},
                                          members=[first, fx.uuid_for("nvh", 2)], hosts=[])
            spec = fx.request_spec(instance_uuid=first, num_instances=2, group=group)
            with pytest.raises(ExpectedException) as raised:  # nova's @expected_exceptions wrapper
                _select(mgr, spec, [first, fx.uuid_for("nvh", 2)])
            assert raised.value.exc_info[0] is nova_exception.NoValidHost
            assert sql.n == 0
    finally:
        shm.set_cache_provider(None)
    assert placement.deleted == [first]
    # the first instance's pending claim on host0 went with its allocation: host0 is whole again
    assert mgr.host_manager.counters["claims_recorded"] == 1
    assert mgr.host_manager.counters["claims_cancelled"] == 1
    with cache.lock:
        assert cache.receiver.pending_claims() == 0
        assert cache.receiver.view(nodes[0].uuid).pending_usage == {}
    assert nova_manager.SchedulerManager._cleanup_allocations is not shm._cleanup_allocations  # uninstalled
