"""The placement feed's pure part, and its SQL reader against placement's own tables.

The machine: any sequence of provider changes and deletions in "the
database", polled at any points, with any publishes left unconfirmed, ends --
once a poll's publish is confirmed and the database is quiet -- with the
published document equal to the database's providers.

The reader: ``PlacementDatabase.read_all()`` equals what placement's own
tables say (``RealPlacement.export_state``) on SQLite and on MariaDB.
"""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_host_manager.placement.feed import FeedMachine


def uuid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


class FakeDb:
    """Providers by uuid, with placement's generation rule: every change increments it."""

    def __init__(self) -> None:
        self.providers: dict[str, dict[str, Any]] = {}
        self.next_id = 0
        self.created = 0

    def change(self, i: int, used: int) -> None:
        u = uuid(i)
        p = self.providers.get(u)
        if p is None:
            self.created += 1
            self.providers[u] = {"uuid": u, "generation": 0, "created_at": f"t{self.created}",
                                 "id": self.created, "usages": {"VCPU": used}}
        else:
            self.providers[u] = {**p, "generation": p["generation"] + 1, "usages": {"VCPU": used}}

    def delete(self, i: int) -> None:
        self.providers.pop(uuid(i), None)

    def fingerprint(self) -> tuple[int, int, int]:
        return (len(self.providers), sum(p["generation"] for p in self.providers.values()),
                self.created)

    def listing(self) -> dict[str, tuple[int, str | None, int]]:
        return {u: (p["generation"], p["created_at"], p["id"]) for u, p in self.providers.items()}



def poll(m: FeedMachine, db: FakeDb, now: float, ok: bool, published: dict[str, Any]
         ) -> float | None:
    """One poll begun at ``now``, as the feed runs it; its marker when the broker stored its
    publish (``ok``; a marker-only publish when no listing was wanted), else None."""
    fp = db.fingerprint()
    if not m.wants_listing(fp, now):
        return m.marker(now) if ok else None
    read, deleted = m.plan(db.listing(), fp, now)
    marker = m.marker(now)
    changes = m.changes(read, {u: db.providers[u] for u in read if u in db.providers}, deleted)
    if ok:
        for u, p in changes.items():
            if p is None:
                published.pop(u, None)
            else:
                published[u] = p
    m.published(changes, ok)
    return marker if ok else None


STEP = st.one_of(
    st.tuples(st.just("change"), st.integers(0, 7), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("poll"), st.booleans(), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=40), st.integers(1, 5))
def test_any_changes_polled_anywhere_end_published(steps: list[tuple[str, Any, int]],
                                                   max_reads: int) -> None:
    """... and every poll marker stored comes with every change made before its poll began
    (read-your-writes); a poll that defers reads gives none."""
    db = FakeDb()
    m = FeedMachine(max_reads=max_reads, full_check_interval=1e9)
    # what the broker stored: an unconfirmed publish is taken here as lost
    published: dict[str, Any] = {}
    now = 0.0
    m.start({}, db.fingerprint(), now)
    markers = 0
    for kind, a, b in steps:
        now += 1.0
        if kind == "change":
            db.change(a, b)
        elif kind == "delete":
            db.delete(a)
        elif poll(m, db, now, bool(a), published) is not None:
            markers += 1
            assert published == db.providers
    for _ in range(20):  # quiet, every publish confirmed
        now += 1.0
        marker = poll(m, db, now, True, published)
        assert marker is None or published == db.providers
    assert marker == now
    assert published == db.providers
    assert m.document == db.providers
    assert not m.dirty


def test_an_unconfirmed_publish_is_read_and_published_again() -> None:
    db = FakeDb()
    db.change(1, 1)
    m = FeedMachine()
    m.start(dict(db.providers), db.fingerprint(), 0.0)
    m.published(dict(m.document), True)
    assert not m.wants_listing(db.fingerprint(), 1.0)
    db.change(1, 2)
    assert m.wants_listing(db.fingerprint(), 2.0)
    read, deleted = m.plan(db.listing(), db.fingerprint(), 2.0)
    assert read == [uuid(1)] and deleted == []
    m.published(m.changes(read, db.providers, deleted), False)
    assert m.dirty == {uuid(1)} and m.stats.unconfirmed == 1
    # the fingerprint did not move, the dirty provider is read again all the same
    assert m.wants_listing(db.fingerprint(), 3.0)
    read, _ = m.plan(db.listing(), db.fingerprint(), 3.0)
    assert read == [uuid(1)]
    m.published(m.changes(read, db.providers, []), True)
    assert not m.dirty and m.confirmed[uuid(1)] == (1, "t1", 1)


def test_recreated_under_the_same_uuid_is_read_again() -> None:
    db = FakeDb()
    db.change(1, 1)
    db.change(1, 2)
    m = FeedMachine()
    m.start(dict(db.providers), db.fingerprint(), 0.0)
    m.published(dict(m.document), True)
    db.delete(1)
    db.change(1, 5)  # generation 0 again, another created_at
    db.change(2, 0)
    db.delete(2)
    read, deleted = m.plan(db.listing(), db.fingerprint(), 1.0)
    assert read == [uuid(1)] and deleted == []


def test_recreated_within_the_same_second_at_the_same_generation_is_read_again() -> None:
    """MySQL keeps created_at to the second: the row id tells the new provider from the old."""
    db = FakeDb()
    db.change(1, 1)
    m = FeedMachine()
    m.start({}, None, 0.0)
    published: dict[str, Any] = {}
    poll(m, db, 0.5, True, published)
    assert m.confirmed[uuid(1)] == (0, "t1", 1) and not m.dirty
    db.delete(1)
    db.change(1, 1)
    db.providers[uuid(1)]["created_at"] = "t1"  # the same second as the deleted one
    read, deleted = m.plan(db.listing(), db.fingerprint(), 1.0)
    assert read == [uuid(1)] and deleted == []


# -- the SQL reader against placement's tables -----------------------------------------------

placement_real = pytest.importorskip("simulator.placement_real")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mariadb", marks=pytest.mark.databases)])
def test_the_reader_reads_what_placement_holds(backend: str) -> None:
    pytest.importorskip("placement.deploy")
    from shared_host_manager.placement.database import PlacementDatabase

    if backend == "mariadb":
        if not placement_real.server_available():
            from servers import database_unavailable

            database_unavailable("MariaDB at 127.0.0.1:3306 is not reachable")
        p = placement_real.RealPlacement(placement_real.server_url(
            f"shm_feed_reader_{uuid_mod.uuid4().hex[:12]}"))
    else:
        p = placement_real.RealPlacement()
    db = None
    try:
        p.ok("PUT", "/traits/CUSTOM_FAST")
        p.ok("PUT", "/resource_classes/CUSTOM_GOLD")
        agg = "aaaaaaaa-0000-4000-8000-000000000001"
        for i in range(1, 4):
            u = uuid(i)
            p.ok("POST", "/resource_providers", {"uuid": u, "name": f"cn{i}"})
            gen = p.ok("PUT", f"/resource_providers/{u}/inventories", {
                "resource_provider_generation": 0,
                "inventories": {"VCPU": {"total": 8 * i, "allocation_ratio": 1.1},
                                "CUSTOM_GOLD": {"total": 3, "max_unit": 2}}})["resource_provider_generation"]
            gen = p.ok("PUT", f"/resource_providers/{u}/traits", {
                "resource_provider_generation": gen, "traits": ["CUSTOM_FAST", "HW_CPU_X86_AVX2"][:i]}
            )["resource_provider_generation"]
            p.ok("PUT", f"/resource_providers/{u}/aggregates",
                 {"resource_provider_generation": gen, "aggregates": [agg] if i > 1 else []})
        p.ok("PUT", "/allocations/11111111-1111-4111-8111-111111111111", {
            "allocations": {uuid(2): {"resources": {"VCPU": 3, "CUSTOM_GOLD": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"})
        db = PlacementDatabase(p.db_url)
        expected = {q["uuid"]: {**q, "traits": sorted(q["traits"]), "aggregates": sorted(q["aggregates"])}
                    for q in p.export_state()["providers"]}
        got = db.read_all()
        assert all(g["created_at"] for g in got.values())
        assert len({g["id"] for g in got.values()}) == len(got)
        assert {u: {k: v for k, v in g.items() if k not in ("created_at", "id")}
                for u, g in got.items()} == expected
        assert db.read([uuid(2), uuid(9)]) == {uuid(2): got[uuid(2)]}
        assert {u: m[:2] for u, m in db.listing().items()} == {
            u: (g["generation"], g["created_at"]) for u, g in got.items()}
        assert db.listing()[uuid(2)][2:] == (got[uuid(2)]["id"], 2, 4)
        fp = db.fingerprint()
        # placement does not increment the generation when an allocation is deleted
        p.ok("DELETE", "/allocations/11111111-1111-4111-8111-111111111111")
        assert db.fingerprint() != fp
        assert db.listing()[uuid(2)] == (got[uuid(2)]["generation"], got[uuid(2)]["created_at"],
                                     got[uuid(2)]["id"], 0, 0)
        traits, rcs = db.names()
        assert "CUSTOM_FAST" in traits and {"CUSTOM_GOLD", "VCPU"} <= set(rcs)
        assert db.allocation_ratio_storage == ("single" if backend == "mariadb" else "double")
    finally:
        if db is not None:
            db.close()
        p.close()


def test_a_poll_that_defers_reads_gives_no_marker() -> None:
    db = FakeDb()
    m = FeedMachine(max_reads=2)
    m.start({}, db.fingerprint(), 0.0)
    assert m.marker(0.0) == 0.0  # the first document holds everything read at start
    for i in range(3):
        db.change(i, 1)
    assert m.wants_listing(db.fingerprint(), 1.0)
    read, _ = m.plan(db.listing(), db.fingerprint(), 1.0)
    assert len(read) == 2 and m.marker(1.0) is None
    m.published(m.changes(read, db.providers, []), True)
    assert m.wants_listing(db.fingerprint(), 2.0)  # the deferred one
    read, _ = m.plan(db.listing(), db.fingerprint(), 2.0)
    assert len(read) == 1 and m.marker(2.0) == 2.0


def test_a_provider_the_capacity_check_cannot_read_is_still_published(caplog) -> None:
    """The over-capacity check is an observation: a provider it cannot read (placement's
    schema refuses a step_size of 0, so only a database edited by hand holds one) is named
    in a warning and left out of the count, and the poll goes on."""
    from types import SimpleNamespace

    from shared_host_manager.placement.feed_service import PlacementFeed

    feed = PlacementFeed(SimpleNamespace(allocation_ratio_storage="double"), poll_interval=None)
    good = {"uuid": "a", "generation": 1, "inventories": {"VCPU": {"total": 4}},
            "usages": {"VCPU": 5}}
    bad = {"uuid": "b", "generation": 1, "inventories": {"VCPU": {"total": 4, "step_size": 0}}}
    feed._check_capacity({"a": good, "b": bad})
    assert list(feed.over_capacity) == ["a"] and feed.figures()["over_capacity"] == 1
    assert "resource provider b: capacity not checked" in caplog.text
