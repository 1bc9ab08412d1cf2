"""Targets for processes the tests spawn: importable by name in a spawned child (the tests'
folder is on the child's path, as it is on the parent's), which a test module is not."""

from __future__ import annotations

import gc
from multiprocessing.connection import Connection


def report_gc_thresholds(ctl: Connection) -> None:
    """Send the child's garbage-collector thresholds up its control pipe."""
    ctl.send(("gc", gc.get_threshold()))
