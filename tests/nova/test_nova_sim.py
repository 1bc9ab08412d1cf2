"""``shm sim --scheduler nova`` on a small cloud: the figures agree with each other and with placement.

Both host managers run (each in a process of its own, as the CLI runs them) on
20 nodes: nova's real SchedulerManager, placement in-process, nova's database
in SQLite.  What must hold whatever the timing: every request is accounted for,
no host is overcommitted at the computes or in placement, every server the
computes run has its placement allocation and no other consumer has one, the
workload's availability zones and SSD aggregate are applied (nova host
aggregates mirrored to placement: servers that asked for them are placed, none
outside them), and the phases of a request add up to no more than its
end-to-end time.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"
pytest.importorskip("placement.deploy")
pytest.importorskip("wsgi_intercept")

from simulator import nova_sim  # noqa: E402

# every test builds the two clouds (a module fixture) or one of its own: tens of seconds
pytestmark = [pytest.mark.nova, pytest.mark.slow]

REQUESTS = 24


@pytest.fixture(scope="module")
def report():
    cfg = nova_sim.NovaSimConfig(host_manager="all", nodes=20, schedulers=2, clients=3,
                                 duration=0.0, requests=REQUESTS, seed=7, fill=0.6, progress=False)
    return nova_sim.run(cfg)


@pytest.mark.timeout(900)  # a guard only: two clouds are built, minutes when loaded
@pytest.mark.parametrize("mode", ["shared", "legacy"])
def test_every_request_accounted_and_no_overcommit(report, mode):
    r = report["results"][mode]
    assert r["requests"] == REQUESTS
    assert r["scheduled"] > 0
    # a request is scheduled, or some of its instances found no host or were refused
    assert r["scheduled"] <= r["requests"]
    assert r["overcommitted_hosts"] == 0
    assert r["placement_overcommitted_hosts"] == 0
    # every server running at a compute has its allocation in placement, and only those
    assert r["allocation_mismatched_hosts"] == 0
    # placement arbitrated every claim: a compute refuses only a member of a server group
    # decided at the same time as another (nova-compute's late group check), and nothing
    # gets past that check
    assert r["compute_rejected"] == r["group_check_rejected"]
    assert r["server_group_violations"] == 0
    assert r["claim_conflicts"] == 0  # SQLite: placement's writes wait for each other
    # a scheduled request made at least one accepted claim per instance; refusals are claims too
    assert r["claims"] - r["claims_rejected"] >= r["scheduled"]
    if mode == "shared":
        # every claim placement accepted was announced to the peer scheduler ([cache]
        # announce_claims, on by default); nova's own host manager has no peers to tell
        assert r["claims_announced"] >= r["scheduled"]
    else:
        assert r["claims_announced"] == 0


@pytest.mark.timeout(900)  # a guard only: two clouds are built, minutes when loaded
@pytest.mark.parametrize("mode", ["shared", "legacy"])
def test_zones_and_aggregate_extra_specs_apply(report, mode):
    """Requests of a zone go to the zone's hosts (nova's request filter asks placement for the
    zone's aggregate), the SSD flavor to the SSD aggregate's (AggregateInstanceExtraSpecsFilter,
    added to nova's defaults): without the aggregates SSD servers would find no host and zone
    servers would land anywhere."""
    r = report["results"][mode]
    assert "AggregateInstanceExtraSpecsFilter" in r["filters"]
    assert r["az_servers"] > 0
    assert r["aggregate_spec_servers"] > 0
    assert r["outside_aggregate_servers"] == 0


@pytest.mark.timeout(900)  # a guard only: two clouds are built, minutes when loaded
@pytest.mark.parametrize("mode", ["shared", "legacy"])
def test_phases_add_up_to_at_most_the_end_to_end_time(report, mode):
    r = report["results"][mode]
    phases = r["phases"]
    assert set(phases) == set(nova_sim.PHASES)
    total = sum(p["mean_ms"] for p in phases.values())
    assert 0 < total <= r["e2e_ms_mean"]
    # every scheduled request got candidates (shared: from its placement view; legacy: from
    # placement), built host states, filtered and claimed
    candidates = "memory_candidates" if mode == "shared" else "placement_query"
    for phase in (candidates, "host_states", "filter_weigh", "placement_claim", "compute"):
        assert phases[phase]["mean_ms"] > 0, phase
    # the scheduler's own time and placement's are parts of select_destinations
    assert 0 < r["scheduler_own_ms_p50"] <= r["decision_ms_p99"]
    assert 0 < r["placement_ms_p50"] <= r["decision_ms_p99"]


def test_candidates_come_from_memory_on_the_shared_side_only(report):
    """The placement feed fed every shared scheduler's view before the run: the default workload
    is answered from memory (placement serves no candidate query); legacy asks placement once
    per request.  A refused claim's providers are read back, never the candidates."""
    shared, legacy = report["results"]["shared"], report["results"]["legacy"]
    assert shared["allocation_candidate_queries"] == 0
    assert shared["candidates_from_memory"] == shared["requests"] == REQUESTS
    assert shared["candidates_from_placement_by_reason"] == {}
    assert shared["placement_feed"]["providers"] == 20
    assert legacy["allocation_candidate_queries"] == legacy["requests"]
    assert legacy["candidates_from_memory"] == 0
    # legacy's HostManager and nova's request filters read nova's database while deciding; the
    # drop-in reads none: its aggregate request filters answer from nova-api's catalogue
    assert legacy["scheduler_sql_statements"] > 0
    assert shared["scheduler_sql_statements"] == 0
    assert shared["request_filters_from_catalogue"] > 0
    assert shared["request_filter_db_fallbacks"] == 0


def test_the_ratio_is_the_two_runs_throughputs(report):
    shared = report["results"]["shared"]["scheduled_per_s"]
    legacy = report["results"]["legacy"]["scheduled_per_s"]
    assert report["ratios"]["shared_vs_legacy_scheduled_per_s"] == round(shared / legacy, 2)


@pytest.mark.timeout(900)  # a guard only: two clouds are built, minutes when loaded
def test_host_ownership_among_the_schedulers():
    """--host-ownership: the schedulers learn each other from the stream and put their own
    hosts first; the same invariants hold."""
    cfg = nova_sim.NovaSimConfig(host_manager="shared", nodes=16, schedulers=2, clients=3,
                                 duration=0.0, requests=12, seed=8, fill=0.5,
                                 host_ownership=True, progress=False)
    r = nova_sim.run(cfg)["results"]["shared"]
    assert r["requests"] == 12 and r["scheduled"] > 0
    assert r["owned_choices"] > 0
    assert r["overcommitted_hosts"] == 0 and r["placement_overcommitted_hosts"] == 0
    assert r["allocation_mismatched_hosts"] == 0
