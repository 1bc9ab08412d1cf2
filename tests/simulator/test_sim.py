"""Short simulations of every host-manager mode: invariants, not speed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from servers import database_unavailable

from shm_cli import sim as sim_cmd
from simulator.run import run_mode, summary_table
from simulator.simulation import SimConfig, Simulation
from simulator.workload import Workload

# minutes of CPU: beside the rest of the suite, in a pytest process of its own
pytestmark = pytest.mark.background

SMALL = dict(nodes=40, schedulers=2, clients=4, requests=300, duration=0.0, fill=0.7,
             hosts_per_reporter=20, heartbeat_interval=1.0, progress=False)


@pytest.mark.parametrize("mode", ["shared", "legacy", "caching"])
def test_each_mode_keeps_the_invariants(mode):
    result = run_mode(SimConfig(host_manager=mode, **SMALL), mode)
    assert result["requests"] == 300
    assert result["overcommitted_hosts"] == 0
    assert result["timed_out"] == 0, "every request must resolve (placed or NoValidHost)"
    assert result["scheduled"] + result["no_valid_host"] >= 300 - result["timed_out"]
    assert result["scheduled"] > 0
    if mode != "caching":  # the caching scheduler's copy is stale by design until it refreshes
        assert result["converged"]
    if mode == "shared":
        assert result["db_statements_per_s"] == 0
        # the caching mode's stale copy can split an affinity group (its first member is
        # not in the copy until the next refresh); the shared mode's views must not
        assert result["server_group_violation_details"] == []
        # every rejected claim is counted once, by how its host was chosen
        assert sum(result["claims_rejected_by_choice"].values()) == result["claims_rejected"]


def test_the_shared_mode_over_cell_streams_keeps_the_invariants():
    """3 cells: one reporter per cell (fewer hosts each than hosts_per_reporter asks), each on
    its cell's stream; the schedulers read all three and converge."""
    sim = Simulation(SimConfig(host_manager="shared", cells=3, **SMALL), "shared")
    sim.start()
    try:
        result = sim.run()
        streams = {name: plane.stream for name, plane in sim.transport.cell_planes.items()}
        assert sorted(streams) == ["cell1", "cell2", "cell3"]
        bus = sim.transport.bus
        assert bus is not None
        assert all(bus.stream_bounds(s)[1] > 0 for s in streams.values())
        held = [sched.service.cache.cell_offsets for sched in sim.schedulers]
        assert all(set(offsets) == set(streams) for offsets in held)
    finally:
        sim.stop()
    assert result["cells"] == 3 and len(sim.reporters) == 3
    assert result["overcommitted_hosts"] == 0 and result["timed_out"] == 0
    assert result["scheduled"] > 0 and result["converged"]


@pytest.mark.nova
@pytest.mark.parametrize("mode", ["shared", "legacy", "caching"])
def test_each_mode_decides_with_novas_classes(mode):
    """Every mode's engine loads nova 34's filter and weigher classes (the names nova has no
    class for are the engine's own) and keeps the invariants."""
    sim = Simulation(SimConfig(host_manager=mode, **dict(SMALL, requests=150)), mode)
    sim.start()
    try:
        result = sim.run()
        engine = sim.schedulers[0].engine
    finally:
        sim.stop()
    kinds = {f.name: type(f).__name__ for f in engine.filters}
    assert kinds["ComputeFilter"] == "NovaFilter" and kinds["ResourceFitFilter"] == "ResourceFitFilter"
    assert {type(w).__name__ for w in engine.weighers} == {"NovaWeigher"}
    assert result["overcommitted_hosts"] == 0 and result["timed_out"] == 0
    assert result["scheduled"] > 0 and result["server_group_violation_details"] == []



def test_same_seed_same_workload():
    a, b = Workload(7), Workload(7)
    for _ in range(50):
        ra, rb = a.next_request(), b.next_request()
        assert (ra.flavor, ra.instance_uuids, ra.availability_zone) == (
            rb.flavor, rb.instance_uuids, rb.availability_zone)
    assert Workload(8).next_request().instance_uuids != Workload(7).next_request().instance_uuids


def test_cli_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = sim_cmd.main(["--nodes", "20", "--requests", "60", "--schedulers", "1", "--clients", "2",
                         "--hosts-per-reporter", "10", "--host-manager", "shared", "--quiet",
                         "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    result = data["results"]["shared"]
    for key in ("scheduled_per_s", "decision_ms_p50", "decision_ms_p99", "e2e_ms_p99",
                "claims_rejected", "retries_per_request", "no_valid_host", "staleness_ms_p99",
                "overcommitted_hosts", "converged"):
        assert key in result
    assert result["retries_per_scheduled"] == round(
        result["claims_rejected"] / result["scheduled"], 4)
    assert data["config"]["seed"] == 42 and data["config"]["nodes"] == 20
    assert "scheduled requests/s" in capsys.readouterr().out


def test_summary_table_shows_ratios():
    report = {"results": {"shared": {"scheduled_per_s": 10.0, "no_valid_host": 3,
                                     "no_valid_host_wrong": 2, "no_valid_host_wrong_in_flight": 1,
                                     "claims_rejected_by_choice": {"owned": 4, "anchor": 1,
                                                                   "peer": 2, "alternate": 3}},
                          "legacy": {"scheduled_per_s": 2.0, "no_valid_host": 1,
                                     "no_valid_host_wrong": 0}},
              "ratios": {"shared_vs_legacy_scheduled_per_s": 5.0}}
    table = summary_table(report)
    assert "shared_vs_legacy_scheduled_per_s: 5.0x" in table
    assert "3 (2, 1)" in table and "1 (0, -)" in table
    assert "5/2/0/3" in table
    # a cell wider than the default column keeps a space before it
    report["results"]["legacy"]["no_valid_host"] = 123456789012
    wide = summary_table(report)
    assert " 123456789012 (0, -)" in wide
    assert len({len(line) for line in wide.splitlines()[:-1]}) == 1  # columns line up


def test_the_oracle_tells_a_state_in_flight_from_one_the_scheduler_held():
    sim = Simulation(SimConfig(host_manager="shared", **SMALL), "shared")
    sim.start()
    try:
        spec = sim._next_request()
        decided_at = sim.clock()
        truth = {s: (e, q) for s, (e, q, _) in sim._truth().items()}
        # the scheduler held every host's state: wrong, not in flight
        sim._check_no_valid_host(spec, decided_at, truth)
        # it held none of them, or every one a version behind: wrong, in flight
        sim._check_no_valid_host(spec, decided_at, {})
        sim._check_no_valid_host(spec, decided_at, {s: (e, q - 1) for s, (e, q) in truth.items()})
        m = sim.metrics
        assert (m.nvh_checked, m.nvh_wrong, m.nvh_wrong_in_flight) == (3, 3, 2)
        # a request no host fits is not wrong
        sim._check_no_valid_host(dataclasses.replace(
            spec, flavor=dataclasses.replace(spec.flavor, memory_mb=10**9)), decided_at, {})
        assert (m.nvh_checked, m.nvh_wrong) == (4, 3)
        # who decided is unknown (held None): the in-flight figure is unknown, even with no
        # wrong verdict among those checks
        sim._check_no_valid_host(dataclasses.replace(
            spec, flavor=dataclasses.replace(spec.flavor, memory_mb=10**9)), decided_at, None)
        assert m.nvh_wrong_in_flight is None
    finally:
        sim.stop()


def test_plot_writes_a_png(tmp_path):
    from simulator.plot import plot

    report = {"config": {"nodes": 10, "schedulers": 2, "clients": 2, "seed": 1},
              "results": {name: {"scheduled_per_s": 5.0 * (i + 1), "decision_ms_p50": 0.5,
                                 "decision_ms_p99": 2.0, "e2e_ms_p50": 1.0, "e2e_ms_p99": 4.0,
                                 "_staleness_s": [0.0, 0.001, 0.01 * (i + 1)]}
                          for i, name in enumerate(("shared", "legacy", "caching"))}}
    out = tmp_path / "sim.png"
    plot(report, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recorded_run_replays_with_matching_digests(tmp_path):
    # shm sim --record, then shm replay: every checkpoint's digests are reproduced (invariant 5)
    from shm_cli import replay as replay_cmd

    record = tmp_path / "rec"
    cfg = SimConfig(host_manager="shared", record=str(record),
                    **{**SMALL, "requests": 120, "nodes": 20, "hosts_per_reporter": 10})
    result = run_mode(cfg, "shared")
    assert result["overcommitted_hosts"] == 0
    logs = sorted((record / "shared").glob("scheduler-*.ulog.0001"))
    assert len(logs) == 2
    for log in logs:
        base = str(log)[: -len(".0001")]
        assert replay_cmd.main([base]) == 0
    # and the decisions come out the same, host ownership among the peers of then included
    from shared_host_manager.updatelog.replay import replay

    for log in logs:
        result = replay([str(log)], decisions=True)
        assert result.decisions_checked > 0 and not result.decision_diffs, result.decision_diffs[:1]


@pytest.mark.slow
def test_recorded_run_replays_from_every_later_part(tmp_path, monkeypatch):
    # 3 schedulers announcing their claims, logs in small parts: each log replayed from each of
    # its later parts (as after retention) holds, from the part's base, the claims pending and
    # the peers' claims held there, so no checkpoint, effect or decision differs (design §8)
    import functools

    import simulator.simulation as simulation
    from shared_host_manager.updatelog import recorder
    from shared_host_manager.updatelog.format import CHECKPOINT, DECISION
    from shared_host_manager.updatelog.reader import LogReader, resolve_log
    from shared_host_manager.updatelog.replay import replay

    monkeypatch.setattr(simulation, "record_run", functools.partial(
        recorder.record_run, checkpoint_interval=0.02, max_file_bytes=128 * 1024))
    record = tmp_path / "rec"
    cfg = SimConfig(host_manager="shared", record=str(record),
                    **{**SMALL, "schedulers": 3, "requests": 1000, "fill": 0.8})
    assert run_mode(cfg, "shared")["overcommitted_hosts"] == 0
    logs = sorted((record / "shared").glob("scheduler-*.ulog.0001"))
    assert len(logs) == 3
    held = checked = 0
    for log in logs:
        parts = resolve_log(str(log)[: -len(".0001")])
        assert len(parts) > 2
        for start in range(1, len(parts)):
            base = next(rec for rec in LogReader(parts[start:]) if rec.kind == CHECKPOINT)
            held += bool(base.fields[3]["pending"]) + any(
                state is not None and len(state) > 5 for _, state in base.fields[2])
            result = replay(parts[start:], decisions=True)
            # the last parts may hold only the run's quiet end, with no decision to re-run
            decided = any(rec.kind == DECISION for rec in LogReader(parts[start:]))
            assert result.ok and (result.decisions_checked or not decided), (
                log.name, start, (result.mismatches + result.effect_mismatches
                                  + result.decision_diffs)[:1], result.decisions_note)
            checked += result.decisions_checked
    assert held, "no base held a claim: the test tests nothing"
    assert checked, "no decision was re-run: the test tests nothing"


_DATABASES = {
    "sqlite": None,
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+psycopg2://postgres@127.0.0.1:5432/test",
}


def _database_url(name: str) -> str | None:
    url = _DATABASES[name]
    if url is None:
        return None
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            pass
    except Exception as exc:  # any driver error means: no server here
        database_unavailable(f"no {name} server at {url}: {type(exc).__name__}")
    finally:
        engine.dispose()
    return url


@pytest.mark.parametrize("database", [
    pytest.param(name, marks=[pytest.mark.databases] if _DATABASES[name] else [])
    for name in sorted(_DATABASES)])
def test_legacy_database_holds_every_change_from_the_start(database):
    """Hosts change all the time while the database is loaded: none may keep a stale row."""
    url = _database_url(database)
    config = dict(SMALL, nodes=300, hosts_per_reporter=100, drift_interval=0.3, db_url=url)
    sim = Simulation(SimConfig(host_manager="legacy", **config), "legacy")
    try:
        sim.start()
        for reporter in sim.reporters:
            reporter.tracker.stop()
        truth = {s: (e, q) for s, (e, q, _) in sim._truth().items()}
        rows = {s: (e, q) for s, e, q, _ in sim.db.read_hosts()}
        stale = {s: (rows.get(s), v) for s, v in truth.items() if rows.get(s) != v}
        assert not stale, f"{len(stale)} rows behind their host, e.g. {next(iter(stale.items()))}"
    finally:
        sim.stop()


def test_server_group_violations_say_which_group_and_how():
    from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec

    workload = Workload(3)
    affinity = next(g for g in workload.groups if g.policy == "affinity")
    anti = next(g for g in workload.groups if g.policy == "anti-affinity")

    def boot(group, instance, source):
        spec = RequestSpec(flavor=Flavor(vcpus=1), instance_uuids=[instance],
                           instance_group=InstanceGroup(group.policy, uuid=group.uuid))
        workload.booted(spec, {instance: source})

    boot(affinity, "a1", "cn1")
    boot(affinity, "a2", "cn2")  # split
    boot(anti, "b1", "cn3")
    boot(anti, "b2", "cn3")  # two on one host
    assert workload.violations == {(affinity.uuid, "split"), (anti.uuid, "cn3")}
    assert workload.policy_of(affinity.uuid) == "affinity"
    assert workload.policy_of(anti.uuid) == "anti-affinity" and workload.policy_of("x") == ""
