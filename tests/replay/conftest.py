"""Fixtures of the update-log tests; the helpers live in ulog_harness.py (importable by name)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from ulog_harness import MiniRun  # noqa: E402


@pytest.fixture
def mini_run(tmp_path):
    """Build MiniRuns writing into tmp_path; their recorders are closed at teardown."""
    runs = []

    def make(**kw) -> MiniRun:
        run = MiniRun(str(tmp_path / f"logs{len(runs)}"), **kw)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
