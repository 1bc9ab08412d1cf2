"""``python -m simulator.bench_placement`` runs end to end on a small cloud, and its answers agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("placement.deploy")

from simulator import bench_placement  # noqa: E402


def test_bench_placement_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    assert bench_placement.main(["--providers", "60", "--memory-requests", "40",
                                 "--placement-requests", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (size,) = result["sizes"]
    assert size["providers"] == 60 and size["agree"] == "4/4"
    assert size["memory_cpu_ms"]["n"] == 40 and size["placement_cpu_ms"]["n"] == 4
    assert "placement on sqlite" in capsys.readouterr().out
