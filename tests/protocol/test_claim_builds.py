"""A pending claim whose instance the source lists under ``builds`` (received, not counted
yet) does not expire by the wall clock: it stays deducted until the source's document
includes it, and once the source drops the build without it, it retires in that step as
"dropped" (docs/design.md §5.2, §5.5).  Pure: the clock is an argument."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.document import DEL, DROP, SET
from protocol.hostdoc import BUILDS, INSTANCES
from protocol.messages import Claim, Delta, Snapshot
from protocol.receiver import Outcome, ReceiverMachine

A, E = "compute-a", 100
DOC = {"compute": {"vcpus": 8, "vcpus_used": 0, "memory_mb": 4096, "memory_mb_used": 0}}


def _receiver() -> ReceiverMachine:
    r = ReceiverMachine("sched-1", down_interval=1e9, claim_deadline=30.0)
    r.receive(Snapshot(A, E, 0, {ns: dict(v) for ns, v in DOC.items()}, []), 0.0)
    return r


def _claim(instance: str) -> Claim:
    return Claim(instance, "sched-1", A, E, 0, {"memory_mb": 1024}, instance)


def test_a_claim_listed_among_the_sources_builds_outlives_its_deadline() -> None:
    r = _receiver()
    for instance in ("i-listed", "i-silent"):
        r.add_claim(_claim(instance), 1.0)
    r.receive(Delta(A, E, 1, [[SET, BUILDS, "i-listed", {}]], []), 2.0)
    for now in (31.0, 62.0, 93.0):
        r.tick(now)
    assert list(r.sources[A].pending) == ["i-listed"]
    assert r.sources[A].pending_usage == {"memory_mb": 1024}
    assert r.stats["claims_expired"] == 1 and r.stats["claims_kept_building"] == 3
    # the source counts the instance: the claim is included, not expired
    r.receive(Delta(A, E, 2, [[DEL, BUILDS, "i-listed"], [SET, INSTANCES, "i-listed", {}],
                              [SET, "compute", "memory_mb_used", 1024]], ["i-listed"]), 94.0)
    assert r.sources[A].pending == {} and r.stats["claims_included"] == 1
    assert ("i-listed", A, Outcome.INCLUDED) in r.drain_outcomes()


def test_a_build_dropped_without_the_instance_frees_its_claim_at_once() -> None:
    r = _receiver()
    r.add_claim(_claim("i-1"), 1.0)
    r.receive(Delta(A, E, 1, [[SET, BUILDS, "i-1", {}]], []), 2.0)
    r.tick(31.0)
    assert "i-1" in r.sources[A].pending
    r.receive(Delta(A, E, 2, [[DEL, BUILDS, "i-1"]], []), 40.0)  # the build failed
    assert r.sources[A].pending == {} and r.sources[A].pending_usage == {}
    assert r.stats["claims_dropped"] == 1 and r.stats["claims_expired"] == 0
    assert r.drain_outcomes() == [("i-1", A, Outcome.DROPPED)]


def test_only_the_builds_that_ended_uncounted_are_dropped() -> None:
    """One report ends three builds: one counted (its claim included), one counted without
    the delta naming its claim (a sink that does not list claims), one refused; a fourth
    build goes on and a claim never listed under builds waits for its deadline."""
    r = _receiver()
    for instance in ("i-built", "i-counted", "i-refused", "i-queued", "i-unlisted"):
        r.add_claim(_claim(instance), 1.0)
    r.receive(Delta(A, E, 1, [[SET, BUILDS, i, {}] for i in
                              ("i-built", "i-counted", "i-refused", "i-queued")], []), 2.0)
    r.receive(Delta(A, E, 2, [[DEL, BUILDS, "i-built"], [DEL, BUILDS, "i-counted"],
                              [DEL, BUILDS, "i-refused"], [SET, INSTANCES, "i-built", {}],
                              [SET, INSTANCES, "i-counted", {}]], ["i-built"]), 3.0)
    assert sorted(r.sources[A].pending) == ["i-counted", "i-queued", "i-unlisted"]
    assert r.drain_outcomes() == [("i-built", A, Outcome.INCLUDED), ("i-refused", A, Outcome.DROPPED)]
    # the namespace dropped whole (its last build ended) counts the same
    r.receive(Delta(A, E, 3, [[DROP, BUILDS]], []), 4.0)
    assert sorted(r.sources[A].pending) == ["i-counted", "i-unlisted"]
    assert r.stats["claims_dropped"] == 2


def test_a_snapshot_without_the_build_drops_its_claim() -> None:
    """A resync's snapshot of the same epoch that no longer lists a build (its ending delta
    was lost) drops the claim as the delta would have."""
    r = _receiver()
    r.add_claim(_claim("i-1"), 1.0)
    r.add_claim(_claim("i-2"), 1.0)
    r.receive(Delta(A, E, 1, [[SET, BUILDS, "i-1", {}], [SET, BUILDS, "i-2", {}]], []), 2.0)
    doc = {**{ns: dict(v) for ns, v in DOC.items()}, BUILDS: {"i-2": {}}}
    r.receive(Snapshot(A, E, 5, doc, []), 3.0)
    assert list(r.sources[A].pending) == ["i-2"]
    assert r.drain_outcomes() == [("i-1", A, Outcome.DROPPED)]


_INSTANCES = ("i-1", "i-2")
_step = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(_INSTANCES)),
    st.tuples(st.just("tick"), st.floats(0.0, 40.0)),
    st.tuples(st.just("delta"), st.lists(st.one_of(
        st.tuples(st.sampled_from([SET, DEL]), st.sampled_from([BUILDS, INSTANCES]),
                  st.sampled_from(_INSTANCES)),
        st.tuples(st.just(DROP), st.sampled_from([BUILDS, INSTANCES]))), max_size=4),
        st.lists(st.sampled_from(_INSTANCES), max_size=1)),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_step, max_size=25))
def test_a_claim_is_dropped_only_when_its_build_ended_uncounted(steps: list[Any]) -> None:
    """Whatever the source does with its builds and instances: a claim retires once; it is
    dropped in the step that takes its instance out of ``builds`` without counting it, and
    only then; a claim whose instance ``builds`` lists never expires; ``pending_usage`` is the
    sum of the pending claims."""
    r = _receiver()
    now, seq, claimed = 1.0, 0, 0
    for step in steps:
        view = r.sources[A]
        doc = view.doc
        before_builds = set(doc.get(BUILDS) or ())
        if step[0] == "claim":
            if step[1] in view.pending:
                continue
            r.add_claim(_claim(step[1]), now)
            claimed += 1
        elif step[0] == "tick":
            now += step[1]
            r.tick(now)
        else:
            ops = [[op[0], op[1], op[2], {}] if op[0] == SET else list(op) for op in step[1]]
            seq += 1
            r.receive(Delta(A, E, seq, ops, list(step[2])), now)
        doc = r.sources[A].doc
        after_builds, counted = set(doc.get(BUILDS) or ()), set(doc.get(INSTANCES) or ())
        for claim_id, _source, outcome in r.drain_outcomes():
            if outcome is Outcome.DROPPED:
                assert step[0] == "delta" and claim_id in before_builds - after_builds - counted
            if outcome is Outcome.EXPIRED:
                assert claim_id not in after_builds
        pending = r.sources[A].pending
        assert not set(pending) & (before_builds - after_builds - counted)
        assert r.sources[A].pending_usage == ({"memory_mb": 1024 * len(pending)} if pending else {})
    retired = sum(r.stats[f"claims_{k}"] for k in ("included", "expired", "dropped"))
    assert retired + len(r.sources[A].pending) == claimed
