"""Invariant 7: no database read on the decision path (SQL statements are counted)."""

from __future__ import annotations

import random

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import Engine

from protocol.messages import ClaimResult
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from shared_host_manager.decision.request_tracker import RequestTracker, claims_of
from simulator.synthetic_hosts import cloud, load_receiver


def test_select_destinations_issues_no_sql_statement():
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    # the hook is on the Engine class: it sees every engine, including any created later
    event.listen(Engine, "before_cursor_execute", count)
    try:
        # prove the hook counts: a real SQLite engine, used
        db = sqlalchemy.create_engine("sqlite://")
        with db.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
        assert len(statements) == 1
        statements.clear()

        receiver = load_receiver(cloud(300, seed=3), down_interval=1e9)
        sent = []  # the claims the tracker returns, cast as the manager would
        tracker = RequestTracker(DecisionEngine(receiver, rng=random.Random(0)))
        flavors = [Flavor(vcpus=v, memory_mb=m, root_gb=d) for v, m, d in
                   ((1, 512, 10), (2, 4096, 20), (4, 8192, 40), (8, 16384, 80))]
        placed = 0
        for i in range(300):
            spec = RequestSpec(
                flavor=flavors[i % 4], project_id="p-private" if i % 7 == 0 else "p1",
                num_instances=1 + i % 3, availability_zone="az1" if i % 5 == 0 else None,
                image_properties={"hw_architecture": "x86_64"} if i % 2 else {},
                instance_group=InstanceGroup("anti-affinity") if i % 11 == 0 else None,
                request_id=f"r{i}")
            try:
                sent += tracker.submit(spec, float(i)).claims
                placed += 1
            except NoValidHost:
                pass
            if i % 10 == 0 and sent:  # a rejection now and then: alternates are claimed too
                claim = sent[-1]
                receiver.receive(ClaimResult(claim.claim_id, receiver.name, claim.source, False,
                                             claim.epoch, claim.seq, "no"), float(i))
                sent += claims_of(tracker.process(receiver.drain_outcomes(), float(i)))
        assert placed > 250 and tracker.engine.stats["alternates_claimed"] > 0
        assert statements == []
    finally:
        event.remove(Engine, "before_cursor_execute", count)
