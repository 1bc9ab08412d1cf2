"""The columnar index follows the receiver incrementally: only changed rows, appended rows, freed rows."""

from __future__ import annotations

import numpy as np

from protocol.document import SET
from protocol.messages import Claim, ClaimResult, Delta, Snapshot
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import AGGREGATE_GROUPS, WEIGHER_COLUMNS, HostIndex
from simulator.synthetic_hosts import host_doc, load_receiver


def _row_equals_hostview(ix: HostIndex, source: str) -> None:
    """Every number of a row is what HostView computes from the same receiver view."""
    row = ix.row_of[source]
    hv = HostView(ix.receiver.sources[source])
    expect = dict(zip(WEIGHER_COLUMNS, (hv.free_ram_mb, hv.vcpus_free, hv.free_disk_mb,
                                        hv.num_instances, hv.num_io_ops), strict=True))
    for col, value in expect.items():
        assert ix.weigher_cols[col][row] == value, col
    assert ix.used["vcpus"][row] == hv.vcpus_used
    assert ix.hosts[row] == hv.host


def test_sync_recomputes_only_changed_rows_and_appends_new_sources():
    rec = load_receiver({f"cn{i}": host_doc(f"h{i}") for i in range(50)})
    ix = HostIndex(rec)
    assert len(ix) == 50 and ix.sync() == set()
    before = ix.stats["rows_refreshed"]
    rec.receive(Delta("cn7", 1, 1, [[SET, "compute", "vcpus_used", 5]]), 1.0)
    rec.receive(Snapshot("cn-new", 1, 0, host_doc("hnew")), 1.0)
    assert ix.sync() == {"cn7", "cn-new"}
    assert ix.stats["rows_refreshed"] - before == 2
    assert len(ix) == 51 and ix.row_of["cn-new"] == 50
    _row_equals_hostview(ix, "cn7")
    assert ix.used["vcpus"][ix.row_of["cn7"]] == 5
    # names stay ranked for tie-breaks: "cn-new" sorts before "cn0"
    assert ix.rank[ix.row_of["cn-new"]] == 0


def test_pending_claims_are_deducted_once_and_retired_with_the_delta():
    rec = load_receiver({"cn1": host_doc("h1", vcpus=8, cpu_ratio=1.0)})
    ix = HostIndex(rec)
    rec.add_claim(Claim("c1", rec.name, "cn1", 1, 0, {"vcpus": 3}, "vm1"), 0.0)
    ix.sync()
    row = ix.row_of["cn1"]
    assert ix.used["vcpus"][row] == 3 and ix.num_instances[row] == 1 and ix.num_io_ops[row] == 1
    assert list(ix.rows_of_instance("vm1")) == [row]
    # the arbiter's delta includes the claim: used moves into the document, pending retires
    rec.receive(Delta("cn1", 1, 1, [[SET, "compute", "vcpus_used", 3],
                                    [SET, "compute", "num_instances", 1],
                                    [SET, "instances", "vm1", {"claim": "c1"}]], ["c1"]), 1.0)
    ix.sync()
    assert ix.used["vcpus"][row] == 3 and ix.num_instances[row] == 1 and ix.num_io_ops[row] == 0
    assert list(ix.rows_of_instance("vm1")) == [row]
    _row_equals_hostview(ix, "cn1")


def test_server_groups_follow_claims_records_deletions_and_freed_rows():
    from protocol.document import DEL
    from protocol.groups import ClaimGroup

    rec = load_receiver({"cn1": host_doc("h1"), "cn2": host_doc("h2", instances={
        "old": {"claim": "c0", "group": "g2"}, "plain": {"claim": "c9"}})})
    ix = HostIndex(rec)
    assert ix.members_of_group("g2") == ["old"] and ix.members_of_group("g1") == []
    # pending with our claim, then recorded by the arbiter as it includes the claim
    rec.add_claim(Claim("c1", rec.name, "cn1", 1, 0, {"vcpus": 1}, "vm1", {},
                        ClaimGroup("g1", "affinity")), 0.0)
    ix.sync()
    assert ix.members_of_group("g1") == ["vm1"]
    rec.receive(Delta("cn1", 1, 1, [[SET, "instances", "vm1", {"claim": "c1", "group": "g1"}]],
                      ["c1"]), 1.0)
    ix.sync()
    assert ix.members_of_group("g1") == ["vm1"]
    # a second member there, then the first deleted
    rec.receive(Delta("cn1", 1, 2, [[SET, "instances", "vm2", {"claim": "c2", "group": "g1"}]]), 2.0)
    ix.sync()
    assert sorted(ix.members_of_group("g1")) == ["vm1", "vm2"]
    rec.receive(Delta("cn1", 1, 3, [[DEL, "instances", "vm1"], [DEL, "instances", "vm2"]]), 3.0)
    ix.sync()
    assert ix.members_of_group("g1") == []
    # a source forgotten takes its members along
    rec.forget("cn2")
    ix.sync()
    assert ix.members_of_group("g2") == []


def test_rejected_claim_gives_the_room_back():
    rec = load_receiver({"cn1": host_doc("h1")})
    ix = HostIndex(rec)
    rec.add_claim(Claim("c1", rec.name, "cn1", 1, 0, {"memory_mb": 1024}, "vm1"), 0.0)
    ix.sync()
    rec.receive(ClaimResult("c1", rec.name, "cn1", False, 1, 0, "no room"), 1.0)
    ix.sync()
    row = ix.row_of["cn1"]
    assert ix.used["memory_mb"][row] == 0 and list(ix.rows_of_instance("vm1")) == []


def test_forgotten_and_down_sources():
    rec = load_receiver({"cn1": host_doc("h1", instances={"vm": {}}), "cn2": host_doc("h2")},
                        down_interval=10.0)
    ix = HostIndex(rec)
    rec.forget("cn1")
    ix.sync()
    assert "cn1" not in ix.row_of and list(ix.rows_of_instance("vm")) == []
    assert ix.rows_of_hosts(["h1"]) == []
    rec.tick(100.0)  # cn2 goes down: still indexed, not eligible
    ix.sync()
    row = ix.row_of["cn2"]
    assert ix.live[row] and not ix.compute_ok[row]
    # a new source reuses the freed row
    rec.receive(Snapshot("cn3", 1, 0, host_doc("h3")), 101.0)
    ix.sync()
    assert ix.row_of["cn3"] == 0 and ix.rows_of_hosts(["H3"], lower=True) == [0]


def test_aggregate_groups_are_interned_and_follow_changes():
    a = {"a": {"name": "a", "metadata": {"ssd": "true"}}}
    rec = load_receiver({f"cn{i}": host_doc(f"h{i}", aggregates=a if i % 2 else None)
                         for i in range(10)})
    ix = HostIndex(rec)
    table = ix.tables[AGGREGATE_GROUPS]
    assert len(table.stubs) == 2
    gids = ix.gid[AGGREGATE_GROUPS][: ix.size]
    assert len(set(gids[1::2])) == 1 and len(set(gids[0::2])) == 1
    rec.receive(Delta("cn0", 1, 1, [[SET, "aggregates", "a", a["a"]]]), 1.0)
    ix.sync()
    assert ix.gid[AGGREGATE_GROUPS][ix.row_of["cn0"]] == gids[1]
    mask = ix.group_mask(AGGREGATE_GROUPS, "ssd?", lambda stub: bool(stub.aggregates))
    assert isinstance(mask, np.ndarray) and mask.sum() == 6


def test_group_tables_compact_when_mostly_unused():
    rec = load_receiver({"cn0": host_doc("h0")})
    ix = HostIndex(rec)
    for i in range(200):
        meta = {"a": {"name": "a", "metadata": {"v": str(i)}}}
        rec.receive(Delta("cn0", 1, i + 1, [[SET, "aggregates", "a", meta["a"]]]), 1.0)
        ix.sync()
    table = ix.tables[AGGREGATE_GROUPS]
    assert ix.stats["compactions"] >= 1 and len(table.stubs) < 100
    stub = table.stubs[ix.gid[AGGREGATE_GROUPS][0]]
    assert stub.aggregates[0].metadata == {"v": "199"}


def test_volume_backends_are_indexed_without_rows():
    rec = load_receiver({"cn1": host_doc("h1"),
                         "volume-backend:a": {"locality": {"hosts": ["h1", "h2"]},
                                              "volumes": {"v1": {}, "v2": {}}}})
    ix = HostIndex(rec)
    assert "volume-backend:a" not in ix.row_of
    assert ix.volume_hosts("v1") == {"h1", "h2"} and ix.volume_hosts("v9") is None
    rec.receive(Delta("volume-backend:a", 1, 1, [[SET, "locality", "hosts", ["h3"]]]), 1.0)
    ix.sync()
    assert ix.volume_hosts("v2") == {"h3"}
