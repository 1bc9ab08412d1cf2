"""``python -m simulator.bench_placement`` runs end to end on a small cloud, and its answers agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("placement.deploy")

from simulator import bench_placement  # noqa: E402


@pytest.mark.parametrize("trees", ["0", "0.3"])
def test_bench_placement_small(tmp_path: Path, capsys: pytest.CaptureFixture[str], trees: str) -> None:
    out = tmp_path / "result.json"
    assert bench_placement.main(["--providers", "60", "--memory-requests", "40",
                                 "--placement-requests", "4", "--trees", trees, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (size,) = result["sizes"]
    # with trees too, memory answers every request, and as placement does (summaries included)
    assert size["providers"] == 60 and size["agree"] == "4/4"
    assert size["memory_cpu_ms"]["n"] == 40 and size["placement_cpu_ms"]["n"] == 4
    printed = capsys.readouterr().out
    assert "placement on sqlite" in printed
    assert ("with a vGPU child provider" in printed) == (trees != "0")


def test_bench_placement_trees_out_of_range() -> None:
    with pytest.raises(SystemExit) as exc:
        bench_placement.main(["--trees", "1.5"])
    assert exc.value.code == 2
