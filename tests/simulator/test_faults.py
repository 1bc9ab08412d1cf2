"""The deterministic fault simulation (``shm faults``, design §6): it passes, and it can fail.

* thousands of schedules from a fresh seed (printed in the test header) with no violation;
* every planted bug (simulator.faults.planted, through the receiver's policy) found within a
  bounded number of schedules, and by which invariant;
* a schedule is reproduced exactly, with update logs that ``shm replay`` shows the first
  difference in;
* a damaged cache state file (the bug class this simulator found) means a cold start.
"""

from __future__ import annotations

import json
import os

import pytest

from shm_cli import faults as faults_cmd
from shm_cli import replay as replay_cmd
from simulator.faults.planted import PlantedBug
from simulator.faults.run import reproduce, run_schedules
from simulator.faults.world import FaultWorld

# minutes of CPU: beside the rest of the suite, in a pytest process of its own
pytestmark = pytest.mark.background

SEED = int(os.environ["SHM_FAULTS_SEED"])
#: CI's figure (the issue asks for at least 2 000 a run); SHM_FAULTS_SCHEDULES to change it
SCHEDULES = int(os.environ.get("SHM_FAULTS_SCHEDULES", "2000"))
#: a planted bug must be found within this many schedules (all are found within ~10)
BOUND = 100


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~1-2 min on CI's 2 cores; far longer on a machine shared with others
def test_fault_schedules_keep_every_invariant():
    report = run_schedules(SEED, SCHEDULES, workers=min(2, os.cpu_count() or 1))
    assert report.schedules == SCHEDULES
    assert not report.violations, (
        f"{len(report.violations)} violations; first: {report.violations[0].as_dict()}; "
        f"reproduce: shm faults --seed {SEED} --schedule {report.violations[0].schedule}")


@pytest.mark.parametrize("bug", list(PlantedBug), ids=lambda b: b.value)
def test_planted_bug_is_found(bug, tmp_path):
    for k in range(BOUND):
        violations = FaultWorld(SEED, k, str(tmp_path / str(k)), planted=frozenset([bug])).run()
        if violations:
            v = violations[0]
            print(f"{bug.value}: found by schedule {k} of seed {SEED}, invariant {v.invariant}: {v.detail}")
            return
    pytest.fail(f"planted bug {bug.value} not found in {BOUND} schedules of seed {SEED}")


def test_a_schedule_reproduces_exactly_with_update_logs(tmp_path):
    bug = frozenset([PlantedBug.DELTA_OUT_OF_ORDER])
    k = next(k for k in range(BOUND)
             if FaultWorld(SEED, k, str(tmp_path / f"w{k}"), planted=bug).run())
    first = reproduce(SEED, k, str(tmp_path / "a"), planted=bug)
    again = reproduce(SEED, k, str(tmp_path / "b"), planted=bug)
    assert first and [v.as_dict() for v in first] == [v.as_dict() for v in again]
    logs = sorted(os.listdir(tmp_path / "a"))
    assert any(n.startswith("reporter-") for n in logs) and any(n.startswith("scheduler-") for n in logs)
    # the receiver replayed without the planted bug parts from the recorded one: shm replay
    # exits 1 and names the first difference of at least one scheduler
    codes = [replay_cmd.main([str(tmp_path / "a" / n.rsplit(".", 1)[0])])
             for n in logs if n.startswith("scheduler-") and n.endswith(".0001")]
    assert replay_cmd.EXIT_DIFFERENT in codes


def test_cli_runs_schedules_and_writes_json(tmp_path, capsys):
    out = tmp_path / "faults.json"
    assert faults_cmd.main(["--schedules", "4", "--seed", str(SEED), "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["schedules"] == 4 and data["violations"] == [] and data["seed"] == SEED
    assert data["schedules_per_s"] > 0
    assert f"seed {SEED}" in capsys.readouterr().out


def test_cli_exits_1_on_a_violation_and_says_how_to_reproduce(capsys):
    code = faults_cmd.main(["--schedules", "5", "--seed", str(SEED), "--quiet",
                            "--plant", "pending_across_epoch", "--plant", "delta_out_of_order"])
    assert code == 1
    assert f"shm faults --seed {SEED} --schedule" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--schedules", "0"], ["--record", "x"], ["--schedule", "3"],
                                  ["--workers", "0"]])
def test_cli_usage_errors(argv, capsys):
    assert faults_cmd.main(argv) == 2
    assert "shm faults:" in capsys.readouterr().err
