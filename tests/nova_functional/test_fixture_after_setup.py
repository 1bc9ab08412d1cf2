"""The drop-in's fixture used exactly as nova's functional tests use fixtures (after setUp)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nova.scheduler")
pytest.importorskip("placement")

from nova_paste import paste_config  # noqa: E402

pytestmark = [pytest.mark.nova, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
TOP = HERE.parent.parent


def test_the_fixture_works_after_novas_setup():
    paste_config()
    env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING="1",
               PYTHONPATH=os.pathsep.join([str(TOP), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(HERE / "fixture_after_setup.py"), "-v"], env=env,
                         capture_output=True, text=True, timeout=600, cwd=str(TOP))
    assert run.returncode == 0, run.stderr[-6000:]
