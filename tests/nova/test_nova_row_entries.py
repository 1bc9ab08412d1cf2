"""The drop-in's kept row entries (row_entries.py) answer exactly what deriving every host
each request answers, whatever changed between requests: documents, pending claims, nova's
instance and aggregate fanouts, the API side's service and node records, sources forgotten
and back, time (hints retire), cell restrictions."""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import weakref  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from nova import objects  # noqa: E402

from protocol.messages import Snapshot  # noqa: E402
from shared_host_manager.nova import api_source  # noqa: E402
from shared_host_manager.nova import host_manager as shm  # noqa: E402
from shared_host_manager.nova.core import document as ndoc  # noqa: E402
from shared_host_manager.nova.row_entries import RowEntries  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()

HOSTS = 5
OTHER_CELL = fx.uuid_for("cell", 2)

step = st.one_of(
    st.tuples(st.just("doc"), st.integers(0, HOSTS - 1), st.integers(1024, 65536),
              st.booleans()),
    st.tuples(st.just("claim"), st.integers(0, HOSTS - 1)),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("hint"), st.integers(0, HOSTS - 1), st.booleans()),
    st.tuples(st.just("aggregate"), st.integers(0, HOSTS - 1), st.sampled_from(["a", "b"])),
    st.tuples(st.just("service"), st.integers(0, HOSTS - 1), st.booleans(), st.booleans()),
    st.tuples(st.just("node"), st.integers(0, HOSTS - 1), st.booleans()),
    st.tuples(st.just("forget"), st.integers(0, HOSTS - 1)),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 400.0])),
    st.tuples(st.just("request"), st.lists(st.integers(0, HOSTS - 1), max_size=HOSTS),
              st.sampled_from([None, fx.CELL1, OTHER_CELL])),
)


class _Cloud:
    def __init__(self) -> None:
        self.now = [1000.0]
        self.seq = dict.fromkeys(range(HOSTS), 0)
        self.uuids = [fx.compute_node(i).uuid for i in range(HOSTS)]
        self.cache = fx.cache_from_documents({self.uuids[i]: self._doc(i, 16384, False)
                                              for i in range(HOSTS)}, clock=lambda: self.now[0])
        # kept: the drop-in as deployed; derived: every entry derived again each request
        self.kept = shm.SharedHostManager(self.cache, default_cell_uuid=fx.CELL1)
        self.derived = shm.SharedHostManager(self.cache, register_claims=False,
                                             default_cell_uuid=fx.CELL1)
        self.api = api_source.ApiStateSource("nova-api-1", wall=lambda: self.now[0])
        self.api_seq = 0
        self.claimed: list[str] = []
        self.n = 0

    def _doc(self, i: int, free_ram_mb: int, other_cell: bool) -> dict:
        cn = fx.compute_node(i, free_ram_mb=free_ram_mb)
        return ndoc.document_from_compute_node(
            cn, service=fx.service_dict(cn.host), cell_uuid=OTHER_CELL if other_cell else fx.CELL1,
            instances=[fx.uuid_for(f"inst-{i}", k) for k in range(2)])

    def _receive(self, message) -> None:
        with self.cache.lock:
            self.cache.receiver.receive(message, self.cache.clock())

    def _both(self, name: str, *args) -> None:
        for manager in (self.kept, self.derived):
            getattr(manager, name)(None, *args) if name.endswith("_info") \
                else getattr(manager, name)(*args)

    def apply(self, op: tuple) -> None:
        kind, *args = op
        self.n += 1
        if kind == "doc":
            i, ram, other_cell = args
            self.seq[i] += 1
            self._receive(Snapshot(self.uuids[i], 1, self.seq[i], self._doc(i, ram, other_cell)))
        elif kind == "claim":
            [i] = args
            hosts = {h.host: h for h in self.kept.get_host_states_by_uuids(None, [self.uuids[i]], None)}
            if f"host{i}" in hosts:
                instance = fx.uuid_for("claimed", self.n)
                hosts[f"host{i}"].consume_from_request(
                    fx.request_spec(instance_uuid=instance, memory_mb=512, vcpus=1))
                self.claimed.append(instance)
        elif kind == "cancel":
            self.kept.cancel_claims(self.claimed)
            self.claimed = []
        elif kind == "hint":
            i, added = args
            instance = fx.uuid_for(f"inst-{i}", 0 if not added else 7)
            if added:
                self._both("update_instance_info", f"host{i}", objects.Instance(uuid=instance))
            else:
                self._both("delete_instance_info", f"host{i}", instance)
        elif kind == "aggregate":
            i, name = args
            agg = objects.Aggregate(uuid=fx.uuid_for("agg", ord(name)), name=name,
                                    hosts=[f"host{i}"], metadata={"ssd": name})
            self._both("update_aggregates", [agg])
        elif kind == "service":
            i, disabled, deleted = args
            self.api.service_changed(objects.Service(host=f"host{i}", binary="nova-compute",
                                                     disabled=disabled, forced_down=False),
                                     deleted=deleted)
            self._publish_api()
        elif kind == "node":
            i, deleted = args
            self.api.node_changed(self.uuids[i], deleted=deleted)
            self._publish_api()
        elif kind == "forget":
            [i] = args
            with self.cache.lock:
                self.cache.receiver.forget(self.uuids[i])
            self.seq[i] += 1
            self._receive(Snapshot(self.uuids[i], 1, self.seq[i], self._doc(i, 8192, False))) \
                if self.n % 2 else None  # back at once, or only with its next document
        elif kind == "tick":
            self.now[0] += args[0]
        else:
            wanted, cell = args
            self.compare([self.uuids[i] for i in wanted] if wanted else None, cell)

    def _publish_api(self) -> None:
        self.api_seq += 1
        self._receive(Snapshot(self.api.source, 1, self.api_seq, self.api.document(self.api.source)))

    def compare(self, uuids, cell) -> None:
        spec = fx.request_spec(instance_uuid=fx.uuid_for("request", self.n))
        if cell is not None:
            spec.requested_destination = objects.Destination(
                cell=objects.CellMapping(uuid=cell), allow_cross_cell_move=False)
        self.derived._entries = RowEntries()
        a = self.kept.get_host_states_by_uuids(None, uuids, spec)
        # the reference applies every API-side service record, even one that changes nothing
        agrees = shm.service_agrees
        shm.service_agrees = lambda service, api_service: False
        try:
            b = self.derived.get_host_states_by_uuids(None, uuids, spec)
        finally:
            shm.service_agrees = agrees
        assert [t.attrs["uuid"] for t in a.tpls] == [t.attrs["uuid"] for t in b.tpls]
        assert [t.version for t in a.tpls] == [t.version for t in b.tpls]
        assert a.aggs == b.aggs
        for rows in (a, b):  # interned aggregate ids group exactly the rows with equal metadata
            gids = rows.group_ids().tolist()
            keys = [repr([(g.uuid, sorted((g.metadata or {}).items())) for g in aggs])
                    for aggs in rows.aggs]
            assert len(set(zip(gids, keys, strict=True))) == len(set(gids)) == len(set(keys))
            assert [gids[r] for r in rows.group_rep()] == list(range(len(rows.group_rep())))
        assert a.last_heard == b.last_heard
        assert {r: o[1] for r, o in a.overrides.items() if o[1]} == \
            {r: o[1] for r, o in b.overrides.items() if o[1]}
        assert {r for r, o in a.overrides.items() if o[0] is not None} <= \
            {r for r, o in b.overrides.items() if o[0] is not None}
        assert {r: sorted(p[0]) for r, p in a.pending.items()} == \
            {r: sorted(p[0]) for r, p in b.pending.items()}
        assert np.array_equal(a.col("free_ram_mb"), b.col("free_ram_mb"))
        assert np.array_equal(a._table, b._table)
        assert [sorted(a.instances_of(r)) for r in range(len(a.tpls))] == \
            [sorted(b.instances_of(r)) for r in range(len(b.tpls))]
        # the service nova's classes read (the shells become full host states here)
        # (but the wall times: each manager reads the wall clock as it builds its rows)
        def service(h):
            return {k: v for k, v in h.service.items() if k not in ("last_seen_up", "updated_at")}
        assert [service(h) for h in a.shells] == [service(h) for h in b.shells]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=30))
def test_kept_entries_answer_what_deriving_every_host_answers(steps: list[tuple]) -> None:
    cloud = _Cloud()
    for op in steps:
        cloud.apply(op)
        cloud.compare(None, None)


def test_a_request_derives_only_the_sources_that_changed() -> None:
    cloud = _Cloud()
    kept = cloud.kept._entries
    cloud.compare(None, None)
    assert kept.stats["kept"] == HOSTS
    cloud.compare(None, None)
    assert kept.stats["kept"] == HOSTS  # nothing changed: nothing derived
    cloud.apply(("doc", 1, 4096, False))
    cloud.compare(None, None)
    assert kept.stats["kept"] == HOSTS + 1
    cloud.apply(("aggregate", 2, "a"))  # every host's aggregates may have changed
    cloud.compare(None, None)
    assert kept.stats["kept"] == 2 * HOSTS + 1 and kept.stats["dropped_all"] == 1


def test_every_change_feed_sees_every_change_once() -> None:
    cloud = _Cloud()
    receiver = cloud.cache.receiver
    first, second = receiver.change_feed(), receiver.change_feed()
    cloud.apply(("doc", 0, 4096, False))
    assert first.drain() == {cloud.uuids[0]}
    cloud.apply(("doc", 1, 4096, False))
    assert second.drain() == {cloud.uuids[0], cloud.uuids[1]}
    assert first.drain() == {cloud.uuids[1]} and first.drain() == set()
    assert receiver.drain_changed() == {cloud.uuids[0], cloud.uuids[1]}  # the index's own
    dropped = weakref.ref(second)
    del second
    assert dropped() is None  # the receiver holds its feeds weakly
    cloud.apply(("doc", 2, 4096, False))
    assert first.drain() == {cloud.uuids[2]}
