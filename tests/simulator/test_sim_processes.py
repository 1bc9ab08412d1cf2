"""``shm sim --processes``: the shared mode's schedulers in processes of their own, over RabbitMQ.

The run itself needs the real broker at 127.0.0.1:5672 (skipped without it,
failing instead with SHM_REQUIRE_RABBITMQ=1, as every broker test); the
option checks and the staleness arithmetic do not.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp

import pytest
from integration.conftest import KOMBU_URL, OSLO_URL, _probe, _unavailable
from kombu import Connection
from spawned import report_gc_thresholds

from shared_host_manager.gc_threshold import YOUNG_THRESHOLD, tuned
from shm_cli import sim as sim_cmd
from simulator import run_transport
from simulator.processes import ChildProcess, staleness

# minutes of CPU: beside the rest of the suite, in a pytest process of its own
pytestmark = pytest.mark.background


@pytest.fixture(scope="module")
def rabbit() -> str:
    """oslo.messaging URL of a broker known to answer (skip/fail otherwise)."""
    problem = _probe()
    if problem:
        _unavailable(problem)
    return OSLO_URL


def _queue_exists(name: str) -> bool:
    with Connection(KOMBU_URL, connect_timeout=3) as conn:
        channel = conn.channel()
        try:
            channel.queue_declare(queue=name, passive=True)
            return True
        except Exception:  # NOT_FOUND closes the channel
            return False


@pytest.fixture
def closed(monkeypatch) -> list:
    """The run transports the simulation closed, in order (its close recorded, then run)."""
    done: list = []
    close = run_transport.RunTransport.close

    def recording_close(self):
        done.append(self)
        close(self)

    monkeypatch.setattr(run_transport.RunTransport, "close", recording_close)
    return done


@pytest.mark.rabbit
@pytest.mark.slow
def test_scheduler_processes_keep_the_invariants(rabbit, tmp_path, closed):
    out = tmp_path / "proc.json"
    code = sim_cmd.main(["--host-manager", "shared", "--nodes", "60", "--schedulers", "2",
                         "--processes", "2", "--requests", "200", "--clients", "4",
                         "--heartbeat-interval", "1", "--transport", rabbit, "--quiet",
                         "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["config"]["processes"] == 2 and data["config"]["processes_apply_to"] == ["shared"]
    result = data["results"]["shared"]
    assert result["scheduler_processes"] == 2
    assert result["requests"] == 200
    assert result["overcommitted_hosts"] == 0
    assert result["timed_out"] == 0, "every request must resolve (placed or NoValidHost)"
    assert result["scheduled"] + result["no_valid_host"] >= 200
    assert result["scheduled"] > 0
    assert result["converged"]
    assert result["staleness_samples"] > 0
    # clean shutdown: no scheduler process left, the run's stream and queues deleted
    assert mp.active_children() == []
    (owner,) = [t for t in closed if t.owner]
    names = [owner.stream, *owner.topics, *owner.queues]
    assert any(n.endswith(".shared-1") for n in names)
    assert [n for n in names if _queue_exists(n)] == []


@pytest.mark.parametrize("argv, says", [
    (["--processes", "2"], "--processes needs --transport rabbit://"),
    (["--processes", "2", "--host-manager", "legacy", "--transport", "rabbit://guest:guest@h:5672/"],
     "shared host manager only"),
    (["--processes", "3", "--schedulers", "2", "--transport", "rabbit://guest:guest@h:5672/"],
     "exceeds --schedulers 2"),
])
def test_processes_refuses_what_cannot_run(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        sim_cmd.main(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("young", [YOUNG_THRESHOLD, 0])
def test_a_spawned_child_collects_garbage_as_the_run_does(young):
    """shm sim tunes the collector of the deciding processes; a spawned interpreter starts
    with Python's thresholds, so the child takes the run's (0: Python's own, untuned)."""
    with tuned(young):
        expected = gc.get_threshold()
        child = ChildProcess(mp.get_context("spawn"), "probe", "shm-test-probe",
                             report_gc_thresholds, (), [], [])
    child.start()
    try:
        assert child.expect("gc", timeout=60)[1] == expected
    finally:
        child.process.join(30)


def test_staleness_from_samples_and_first_changes():
    first = {("h1", 1, 5): 10.0, ("h1", 1, 6): 12.0, ("h2", 2, 1): 11.0}
    samples = [
        ("h1", 1, 4, 10.5),  # lacks seq 5, made at 10.0: 0.5 s behind
        ("h1", 1, 4, 9.0),   # seq 5 not made yet: current
        ("h1", 1, 5, 11.0),  # holds seq 5; seq 6 comes at 12.0: current
        ("h1", 1, 6, 13.0),  # nothing newer: current
        ("h2", 1, 7, 11.25),  # epoch 1 is over: behind since epoch 2's first change
    ]
    assert staleness(samples, first) == [0.5, 0.0, 0.0, 0.0, 0.25]


@pytest.mark.rabbit
@pytest.mark.slow
def test_reporter_processes_keep_the_invariants(rabbit, tmp_path, closed):
    out = tmp_path / "reporters.json"
    code = sim_cmd.main(["--host-manager", "shared", "--nodes", "40", "--schedulers", "2",
                         "--processes", "2", "--reporter-processes", "2",
                         "--hosts-per-reporter", "15", "--duration", "4", "--clients", "4",
                         "--heartbeat-interval", "1", "--transport", rabbit, "--quiet",
                         "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())["results"]["shared"]
    assert result["reporter_processes"] == 2 and result["scheduler_processes"] == 2
    assert result["scheduled"] > 0
    assert result["overcommitted_hosts"] == 0
    assert result["timed_out"] == 0
    assert result["converged"]
    # the source-side times came back from the reporter processes: staleness is measured
    assert result["staleness_samples"] > 0
    assert result["staleness_ms_p50"] is not None and result["staleness_ms_p99"] is not None
    assert result["broker_messages_per_s"] > 0
    assert set(result["cpu_pct_per_process"]) == {
        "main", "scheduler-0", "scheduler-1", "reporter-0", "reporter-1"}
    # clean shutdown: no process left, the run's stream and every reporter's queue deleted
    assert mp.active_children() == []
    (owner,) = [t for t in closed if t.owner]
    names = [owner.stream, *owner.topics, *owner.queues]
    # 20 hosts per process in reporters of at most 15: reporter-0..3, named over the cloud
    assert {n.rsplit(".", 1)[1] for n in owner.queues if n.startswith(owner.topics[0])} == {
        "reporter-0", "reporter-1", "reporter-2", "reporter-3"}
    assert [n for n in names if _queue_exists(n)] == []


RABBIT = ["--transport", "rabbit://guest:guest@h:5672/"]


@pytest.mark.parametrize("argv, says", [
    (["--reporter-processes", "2", *RABBIT], "--reporter-processes needs --processes"),
    (["--reporter-processes", "2", "--processes", "2"], "--processes needs --transport rabbit://"),
    (["--reporter-processes", "2", "--processes", "2", "--host-manager", "all", *RABBIT],
     "--reporter-processes applies to the shared host manager only"),
    (["--reporter-processes", "0", "--processes", "2", "--host-manager", "shared", *RABBIT],
     "--reporter-processes must be at least 1"),
    (["--reporter-processes", "11", "--processes", "2", "--host-manager", "shared",
      "--nodes", "10", *RABBIT], "--reporter-processes 11 exceeds --nodes 10"),
    (["--scheduler", "nova", "--reporter-processes", "2"], "--reporter-processes"),
])
def test_reporter_processes_refuse_what_cannot_run(argv, says, capsys):
    _refused(argv, says, capsys)


def _refused(argv: list[str], says: str, capsys) -> None:
    """``shm sim argv`` exits 2 with one error line saying ``says``."""
    with pytest.raises(SystemExit) as exc:
        sim_cmd.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


@pytest.mark.rabbit
@pytest.mark.slow
def test_cells_in_processes_with_one_cells_broker_away(rabbit, tmp_path, closed):
    """4 cell streams, reporters and schedulers in processes; cell2's broker away for 3 s:
    the run keeps scheduling elsewhere, nothing is overcommitted, the cell rejoins, and every
    cell stream is deleted at the end."""
    out = tmp_path / "cells.json"
    code = sim_cmd.main(["--host-manager", "shared", "--nodes", "40", "--schedulers", "2",
                         "--processes", "2", "--reporter-processes", "2", "--cells", "4",
                         "--duration", "8", "--clients", "4", "--heartbeat-interval", "0.5",
                         "--cell-outage", "cell2:1:3", "--transport", rabbit, "--quiet",
                         "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())["results"]["shared"]
    assert result["cells"] == 4 and result["outage_cell"] == "cell2"
    assert result["outage_cell_hosts"] == 10  # one reporter of 10 hosts per cell
    assert result["outage_seconds"] == pytest.approx(3, abs=0.5)
    assert result["outage_placed_elsewhere"] > 0
    assert result["outage_rejoin_s"] is not None
    assert result["overcommitted_hosts"] == 0 and result["converged"]
    (owner,) = [t for t in closed if t.owner]
    streams = [f"{owner.stream}.cell{c}" for c in range(1, 5)]
    assert [n for n in [owner.stream, *streams] if _queue_exists(n)] == []


@pytest.mark.parametrize("argv, says", [
    (["--cells", "-1"], "--cells must be 0"),
    (["--cells", "2", "--host-manager", "all"], "--cells applies to the shared host manager"),
    (["--cells", "2", "--host-manager", "shared", "--cell-outage", "cell3:1:2", *RABBIT],
     "'cell3' is not one of the run's cells"),
    (["--cells", "2", "--host-manager", "shared", "--cell-outage", "cell1:1"],
     "expected CELL:START:SECONDS"),
    (["--cells", "2", "--host-manager", "shared", "--cell-outage", "cell1:1:0", *RABBIT],
     "SECONDS > 0"),
    (["--cells", "2", "--host-manager", "shared", "--cell-outage", "cell1:1:2"],
     "--cell-outage needs --transport rabbit://"),
    (["--scheduler", "nova", "--cells", "2"], "--cells"),
])
def test_cells_refuse_what_cannot_run(argv, says, capsys):
    _refused(argv, says, capsys)
