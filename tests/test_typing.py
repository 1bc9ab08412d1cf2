"""The typed contracts hold: mypy runs with the tests (mypy.ini), so CI enforces them.

Checked: every package — protocol, transport, compute_reporter,
shared_host_manager (its nova/ glue too), shm_cli and simulator — among them the
filter and weigher contract (decision/filters, decision/weights), the observers
and the transport Protocols at the services' edges.  The cache (``.mypy_cache``,
see mypy.ini) makes a run after a small change take about a second.
"""

import os
import shutil
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_clean():
    mypy = shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' installs it)")
    # --python-executable: resolve third-party packages (numpy's stubs, oslo.config...) in
    # the environment running the tests, whichever mypy was found
    result = subprocess.run(
        [mypy, "--config-file", os.path.join(TOP, "mypy.ini"), "--python-executable", sys.executable],
        cwd=TOP, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
