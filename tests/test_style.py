"""The tree stays ruff-clean: the lint runs with the tests so CI enforces it."""

import os
import shutil
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    result = subprocess.run([ruff, "check", "."], cwd=TOP, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
