"""The decisions benchmark runs end to end and writes its JSON (no timing is asserted)."""

from __future__ import annotations

import json

from simulator import bench_decisions


def test_bench_decisions_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench_decisions.main(["--hosts", "50", "--runs", "2", "--decisions", "20",
                               "--slow-decisions", "3", "--json", str(out)],
                              prog="shm bench decisions")
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["hosts"] == 50
    assert result["decisions_per_s"] > 0 and result["slow_decisions_per_s"] > 0
    assert result["ratio"] > 0
    assert len(result["fast"]["runs"]) == 2 and len(result["slow"]["runs"]) == 2
    assert result["fast"]["no_valid_host"] == [0, 0]
    assert len(result["fast"]["cpu_runs"]) == 2 and result["fast"]["cpu_median"] > 0
    assert "fast path" in capsys.readouterr().out


def test_bench_plugs_into_the_shm_bench_registry(tmp_path, monkeypatch):
    from shm_cli import bench

    monkeypatch.setitem(bench.BENCHMARKS, "decisions", (
        "simulator.bench_decisions:main", "scheduling decisions per second"))
    out = tmp_path / "b.json"
    assert bench.main(["decisions", "--hosts", "20", "--runs", "1", "--decisions", "5",
                       "--slow-decisions", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["hosts"] == 20


def test_bench_decisions_reports_memory_per_host(tmp_path):
    import sys

    out = tmp_path / "bench.json"
    assert bench_decisions.main(["--hosts", "200", "--runs", "1", "--decisions", "10",
                                 "--slow-decisions", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    fast = result["fast"]
    assert fast["setup_cpu_s"] > 0 and result["index_sync_rows_per_cpu_s"] > 0
    if sys.platform.startswith("linux"):
        # inside a test run the process may reuse memory freed by earlier tests, so only the
        # fields' presence and a sane upper bound are stable, not the figure itself
        assert result["rss_per_host_bytes"] == fast["rss_per_host_bytes"]
        assert isinstance(fast["rss_per_host_bytes"], int)
        assert fast["rss_before_mb"] > 0 and fast["rss_after_mb"] > 0
        assert result["rss_per_host_bytes"] < 1_000_000
    else:
        assert result["rss_per_host_bytes"] is None
