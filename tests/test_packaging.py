"""setup.py declares exactly the filters and weighers the loader knows; a missing extra is named."""

import os
import re
import subprocess
import sys

import pytest

from shared_host_manager.decision.plugins import entry_point_lines

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_entry_points_match_the_builtin_tables():
    setup_py = open(os.path.join(TOP, "setup.py"), encoding="utf-8").read()
    for group, lines in entry_point_lines().items():
        block = re.search(rf'"{re.escape(group)}": \[(.*?)\]', setup_py, re.S)
        assert block, f"setup.py has no {group} entry points"
        declared = re.findall(r'"([^"]+ = [^"]+)"', block.group(1))
        assert declared == lines, group


@pytest.mark.parametrize("blocked,argv,expected", [
    ("sqlalchemy", ["sim", "--nodes", "10"],
     "shm sim: sqlalchemy is not installed; pip install 'shared-host-manager[sim]'"),
    ("nova", ["sim", "--nodes", "10"],
     "shm sim: nova is not installed; pip install 'shared-host-manager[sim]'"),
    ("nova", ["sim", "--scheduler", "nova", "--nodes", "10"],
     "shm sim --scheduler nova: nova is not installed; pip install 'shared-host-manager[nova-sim]'"),
])
def test_a_missing_extra_is_named_not_a_traceback(blocked, argv, expected):
    """Without an extra's modules, the command says what to install (exit 2), in one line."""
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from shm_cli.main import main\n"
            f"raise SystemExit(main({argv!r}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TOP,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == expected
