"""Test-suite wide setup: shared helper modules in tests/ are importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import background  # noqa: E402 - from this directory

# The fault simulation (tests/simulator/test_faults.py) runs from a fresh seed each run,
# printed in the header so that any violation can be reproduced (shm faults --seed S).
if not os.environ.get("SHM_FAULTS_SEED"):
    os.environ["SHM_FAULTS_SEED"] = str(int.from_bytes(os.urandom(4), "big"))


#: the test whose worker processes run beside the rest of the suite
_NOVA_FUNCTIONAL = "test_nova_functional.py::test_nova_functional_selection_passes_with_the_drop_in"


def _place(item):
    """Where a test runs: the rest first; then the stand-ins of the background run's tests
    (tests/background.py), which wait for it; then the tests that stop the broker, which
    must have it alone; nova's functional selection last: its workers, started at
    collection, have the whole suite's time to finish beside it before the test waits."""
    if item.nodeid.endswith(_NOVA_FUNCTIONAL):
        return 3
    if item.get_closest_marker("restarts_broker") is not None:
        return 2
    return 1 if item.get_closest_marker("background") is not None else 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_place)


def pytest_configure(config):
    config.pluginmanager.register(background, "shm-background")


def pytest_collection_finish(session):
    """nova's functional selection takes minutes of worker processes: once it is
    among the tests to run, its workers start at the lowest CPU priority and run beside the
    rest of the suite instead of after it (tests/nova_functional/test_nova_functional.py); the
    test itself comes last.  The modules marked ``background`` run beside the rest too, in a
    pytest process of their own (tests/background.py)."""
    if session.config.option.collectonly:
        return
    for item in session.items:
        if item.nodeid.endswith(_NOVA_FUNCTIONAL):
            item.module.start_in_background()
            session.config.add_cleanup(item.module.stop_background)
            return


def pytest_report_header(config):
    return f"shm faults seed: {os.environ['SHM_FAULTS_SEED']} (set SHM_FAULTS_SEED to repeat it)"
