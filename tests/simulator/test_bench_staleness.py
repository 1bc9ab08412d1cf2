"""shm bench staleness: the reference file and the comparison (no run, no timing)."""

from __future__ import annotations

import json

import pytest

from simulator.bench_staleness import (
    DEFAULT_REFERENCE,
    compare,
    median_figures,
    read_reference,
)

REF = {"staleness_ms_p99": 40.0, "scheduled_per_s": 80.0}


def _rows(measured: dict[str, float], factor: float = 2.0) -> dict[str, bool]:
    return {r.figure: r.regressed for r in compare(measured, REF, factor)}


def test_within_the_factor_is_no_regression() -> None:
    assert _rows({"staleness_ms_p99": 80.0, "scheduled_per_s": 40.0}) == {
        "staleness_ms_p99": False, "scheduled_per_s": False}


def test_staleness_beyond_the_factor_regresses() -> None:
    # the regression this benchmark is kept for: staleness p99 about tenfold
    assert _rows({"staleness_ms_p99": 400.0, "scheduled_per_s": 80.0})["staleness_ms_p99"]


def test_throughput_below_reference_over_factor_regresses() -> None:
    rows = _rows({"staleness_ms_p99": 10.0, "scheduled_per_s": 39.0})
    assert rows == {"staleness_ms_p99": False, "scheduled_per_s": True}


def test_ratio_is_measured_over_reference() -> None:
    rows = compare({"staleness_ms_p99": 20.0, "scheduled_per_s": 100.0}, REF, 2.0)
    assert [round(r.ratio, 2) for r in rows] == [0.5, 1.25]


def test_a_zero_reference_staleness_tolerates_only_zero() -> None:
    ref = {"staleness_ms_p99": 0.0, "scheduled_per_s": 80.0}
    assert not compare({"staleness_ms_p99": 0.0, "scheduled_per_s": 80.0}, ref, 2.0)[0].regressed
    assert compare({"staleness_ms_p99": 1.0, "scheduled_per_s": 80.0}, ref, 2.0)[0].regressed


def test_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        compare(REF, REF, 0.5)


def test_medians_over_runs() -> None:
    runs = [{"staleness_ms_p99": s, "scheduled_per_s": t, "cpu_s": 30.0, "wall_s": 45.0}
            for s, t in [(10.0, 90.0), (300.0, 50.0), (20.0, 70.0)]]
    med = median_figures(runs)
    assert med["staleness_ms_p99"] == 20.0 and med["scheduled_per_s"] == 70.0


def test_the_committed_reference_reads(tmp_path) -> None:
    ref = read_reference(DEFAULT_REFERENCE)
    assert ref["scheduled_per_s"] > 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"staleness_ms_p99": "fast", "scheduled_per_s": 1}))
    with pytest.raises(ValueError, match="staleness_ms_p99"):
        read_reference(str(bad))
    bad.write_text("[]")
    with pytest.raises(ValueError):
        read_reference(str(bad))


def test_throughput_has_a_factor_of_its_own() -> None:
    # the regression this benchmark is kept for: 0.57x the throughput, staleness unmoved
    measured = {"staleness_ms_p99": 40.0, "scheduled_per_s": 0.57 * 80.0}
    assert not compare(measured, REF, 3.0)[1].regressed
    assert compare(measured, REF, 3.0, throughput_factor=1.5)[1].regressed


def test_the_reference_code_is_run_with_its_own_command(tmp_path) -> None:
    from simulator.bench_staleness import _command_module

    (tmp_path / "shm_cli").mkdir()
    assert _command_module(str(tmp_path)) == "shm_cli.main"
    assert _command_module(str(tmp_path / "older")) == "shared_host_manager.cmd.shm"


def test_the_reference_code_gets_its_own_filters_and_weighers(tmp_path) -> None:
    """The filters and weighers are entry points: a reference checkout run with this
    checkout's package metadata would look for this code's modules (and leave out the
    filters it does not have).  prepare_checkout gives it its own."""
    import subprocess
    import sys

    from simulator.bench_staleness import prepare_checkout

    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\n"
        "setup(name='shared-host-manager', version='0.0.1', py_modules=[],\n"
        "      entry_points={'shm.scheduler.filters': ['OnlyInTheReference = ref_mod:F']})\n")
    prepare_checkout(str(tmp_path))
    code = ("from importlib.metadata import entry_points\n"
            "print(sorted(e.value for e in entry_points(group='shm.scheduler.filters')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(tmp_path)}, check=True).stdout
    assert out.strip() == "['ref_mod:F']"
