"""``shm replay``: output, JSON and exit status."""

from __future__ import annotations

import json

import pytest

from shared_host_manager.updatelog.reader import resolve_log
from shm_cli.replay import main


@pytest.fixture
def logs(mini_run):
    run = mini_run(checkpoint_interval=0.2)
    run.run(10)
    run.claim("s0", "cn02", {"vcpus": 1, "memory_mb": 256})
    run.drop_delta["s1"] = "cn04"
    run.change(0)
    run.sources["cn04"].change([[0, "compute", "num_io_ops", 5]], run.clock())
    run.run(10)
    run.settle(15)
    run.close()
    return run


def test_summary_of_a_clean_log(logs, capsys):
    assert main([logs.log("s0")]) == 0
    out = capsys.readouterr().out
    assert "replayed scheduler 's0'" in out and "invariant 5 holds" in out and "log intact" in out


def test_directory_lists_the_logs(logs, capsys):
    assert main([logs.directory]) == 0
    out = capsys.readouterr().out
    assert "scheduler-s0.ulog" in out and "scheduler-s1.ulog" in out and "reporter-r0.ulog" in out


def test_source_state_at_a_record_as_json(logs, capsys):
    assert main([logs.log("s0"), "--source", "cn02", "--at", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["replay"]["last_record"] == 40 and out["replay"]["stopped_early"]
    state = out["state"]
    assert state["held"] and state["source"] == "cn02" and state["record"] == 40
    assert state["document"]["compute"]["host"] == "h2"


def test_source_state_until_a_time(logs, capsys):
    assert main([logs.log("s1"), "--source", "cn04", "--until", "100.5"]) == 0
    out = capsys.readouterr().out
    assert "cn04 at record" in out and "document:" in out and "compute:" in out


def test_history_shows_versions_ops_claims_and_events(logs, capsys):
    assert main([logs.log("s0"), "--source", "cn02", "--history", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "history of cn02" in out and "snapshot via stream" in out and "SET compute." in out
    assert "claim s0-c1 added" in out and "includes claims s0-c1" in out and "claim s0-c1 included" in out
    assert main([logs.log("s1"), "--source", "cn04", "--history", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["history"]
    events = [r["event"] for r in rows if r["type"] == "event"]
    assert "gap" in events or any(e == "resync_requested" for e in events)
    assert any(r["type"] == "version" and r["plane"] == "resync" for r in rows)


def test_diff_reports_the_missed_delta(logs, capsys):
    assert main([logs.log("s0"), "--diff", logs.log("s1")]) == 1
    out = capsys.readouterr().out
    assert "cn04 first diverged at version" in out and "missed delta" in out
    assert main([logs.log("r0"), "--diff", logs.log("s1"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert "cn04" in [d["source"] for d in data["diverged"]]
    assert main([logs.log("s0"), "--diff", logs.log("s0")]) == 0


def test_damaged_log_exits_3_and_says_where(logs, capsys, tmp_path):
    [path] = resolve_log(logs.log("s0"))
    damaged = tmp_path / "cut.ulog.0001"
    data = open(path, "rb").read()
    damaged.write_bytes(data[: len(data) * 2 // 3])
    assert main([str(damaged)]) == 3
    out = capsys.readouterr().out
    assert "LOG DAMAGED: stopped at byte" in out and "(record " in out
    assert main([str(damaged), "--json"]) == 3
    dmg = json.loads(capsys.readouterr().out)["replay"]["damage"]
    assert 0 < dmg["offset"] < len(data) * 2 // 3 and dmg["record"] > 0


def test_usage_errors(logs, capsys, tmp_path):
    assert main([str(tmp_path / "missing.ulog")]) == 2
    with pytest.raises(SystemExit) as exc:
        main([logs.log("s0"), "--history"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main([logs.log("s0"), "--decision-option", "x=1"])
    with pytest.raises(SystemExit) as exc:
        main([logs.log("s0"), "--decisions", "--decision-option", "no_such_option=1"])
    assert exc.value.code == 2
    assert "unknown option 'no_such_option'" in capsys.readouterr().err
