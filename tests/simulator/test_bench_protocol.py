"""``shm bench protocol`` runs end to end and reports its apply rate per wall and per CPU
second (no timing is asserted: the machine is shared)."""

from __future__ import annotations

import json

from simulator import bench_protocol


def test_bench_protocol_reports_apply_rate_per_cpu_second(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert bench_protocol.main(["--hosts", "20", "--deltas", "500", "--runs", "2", "--quiet",
                                "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["deltas_applied_per_s"] > 0 and result["deltas_applied_per_cpu_s"] > 0
    assert all(r["apply_cpu_seconds"] > 0 for r in result["runs"])
    assert result["delta_bytes_mean"] < result["snapshot_bytes_mean"]
    assert "per CPU second" in capsys.readouterr().out
