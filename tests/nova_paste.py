"""nova's functional tests read ``api-paste.ini`` where pip does not put it; made to be found."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest


def paste_config() -> None:
    """nova's ConfFixture reads ``$state_path/etc/nova/api-paste.ini`` with state_path =
    site-packages; pip puts nova's etc/ under the environment's prefix."""
    site = Path(sysconfig.get_paths()["purelib"])
    target = site / "etc"
    if (target / "nova" / "api-paste.ini").exists():
        return
    source = Path(sys.prefix) / "etc"
    if not (source / "nova" / "api-paste.ini").exists():
        pytest.fail(f"nova's api-paste.ini is in neither {target}/nova nor {source}/nova")
    if target.is_symlink() or not target.exists():
        if target.is_symlink():
            target.unlink()
        target.symlink_to(source, target_is_directory=True)
