"""tests/background.py: a module marked ``background`` runs in a child pytest beside the rest,
and each of its tests ends in the parent's report as it ended in the child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import background

def pytest_configure(config):
    config.pluginmanager.register(background, "shm-background")
"""

# runs first (file order): it must still find the background run ended
FIRST = """
import os, pytest

@pytest.mark.restarts_broker
def test_alone_on_the_broker():
    assert os.path.exists("ended"), "ran while the background run was still running"

def test_in_the_parent():
    open("parent-pid", "w").write(str(os.getpid()))
"""

BACKGROUND = """
import os, time, pytest

pytestmark = pytest.mark.background

@pytest.fixture
def breaks_on_teardown():
    yield
    raise RuntimeError("teardown broke in the child")

def test_passes():
    open("background-pid", "w").write(str(os.getpid()))

def test_fails():
    assert 1 == 2, "the child's own words"

def test_skips():
    pytest.skip("not here")

def test_teardown_breaks(breaks_on_teardown):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(n):
    assert n == 1

def test_last():
    time.sleep(1.0)
    open("ended", "w").write("")
"""

# the child dies in the middle of a test: that test and those after it fail in the parent
DIES = """
import os, pytest

pytestmark = pytest.mark.background

def test_before():
    pass

def test_dies():
    os._exit(3)

def test_after():
    pass
"""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(FIRST)
    (tmp_path / "test_b.py").write_text(BACKGROUND)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                             "-o", "addopts=", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), proc.pid


@pytest.mark.slow
def test_a_background_module_runs_in_a_child_and_reports_each_test_as_it_ended(tmp_path):
    result, pid = _run(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out
    assert "PASSED test_a.py::test_alone_on_the_broker" in out
    assert "PASSED test_b.py::test_passes" in out
    assert "FAILED test_b.py::test_fails" in out and "the child's own words" in out
    assert "SKIPPED [1] test_b.py:17: not here" in out
    assert "FAILED test_b.py::test_teardown_breaks" in out
    assert "teardown broke in the child" in out
    assert "PASSED test_b.py::test_parametrized[1]" in out
    assert "FAILED test_b.py::test_parametrized[2]" in out
    assert "== background run ==" in out  # the child's own summary follows
    # each side in its own process: the background module in the child
    assert int((tmp_path / "parent-pid").read_text()) == pid
    assert int((tmp_path / "background-pid").read_text()) != pid


@pytest.mark.slow
def test_a_background_module_alone_runs_in_the_parent(tmp_path):
    result, pid = _run(tmp_path, "test_b.py::test_passes")
    assert result.returncode == 0, result.stdout
    assert int((tmp_path / "background-pid").read_text()) == pid
    assert "background run" not in result.stdout


@pytest.mark.slow
def test_a_background_run_that_dies_fails_the_test_it_was_in_and_those_after(tmp_path):
    (tmp_path / "test_c.py").write_text(DIES)
    result, _ = _run(tmp_path, "test_a.py::test_in_the_parent", "test_c.py")
    out = result.stdout
    assert result.returncode == 1, out
    assert "PASSED test_c.py::test_before" in out
    assert "FAILED test_c.py::test_dies" in out and "ended (exit 3) during this test" in out
    assert "FAILED test_c.py::test_after" in out and "without running this test" in out
