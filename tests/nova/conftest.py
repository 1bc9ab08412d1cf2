"""tests/nova: helper modules here are importable by name; nova's config overrides are undone per test.

Every test module starts with ``pytest.importorskip("nova.scheduler")``: without nova
installed the whole directory is skipped and the rest of the suite runs.  Not
``importorskip("nova")``: with ``tests/`` on sys.path, this very directory is an
importable namespace package called ``nova``, so ``import nova`` succeeds even
where nova is not installed.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def nova_conf():
    """nova's CONF (set up once per process); ``set(**{"group.option": value})`` is undone after the test."""
    from shared_host_manager.nova.testing import fixtures as fx

    conf = fx.setup_nova()
    touched: list[tuple[str, str | None]] = []

    class Overrides:
        def __init__(self) -> None:
            self.conf = conf

        def set(self, **overrides):
            for key, value in overrides.items():
                group, _, name = key.rpartition(".")
                conf.set_override(name, value, group=group or None)
                touched.append((name, group or None))
            return conf

    yield Overrides()
    for name, group in reversed(touched):
        conf.clear_override(name, group=group)
