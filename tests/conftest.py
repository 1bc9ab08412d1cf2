"""Test-suite wide setup: shared helper modules in tests/ are importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# The fault simulation (tests/simulator/test_faults.py) runs from a fresh seed each run,
# printed in the header so that any violation can be reproduced (shm faults --seed S).
if not os.environ.get("SHM_FAULTS_SEED"):
    os.environ["SHM_FAULTS_SEED"] = str(int.from_bytes(os.urandom(4), "big"))


#: the test whose worker processes run beside the rest of the suite
_NOVA_FUNCTIONAL = "test_nova_functional.py::test_nova_functional_selection_passes_with_the_drop_in"


def pytest_collection_modifyitems(session, config, items):
    """nova's functional selection last: its workers, started at collection, have the whole
    suite's time to finish beside it before the test waits for them."""
    items.sort(key=lambda item: item.nodeid.endswith(_NOVA_FUNCTIONAL))


def pytest_collection_finish(session):
    """nova's functional selection takes minutes of worker processes: once it is
    among the tests to run, its workers start at the lowest CPU priority and run beside the
    rest of the suite instead of after it (tests/nova_functional/test_nova_functional.py); the
    test itself comes last."""
    if session.config.option.collectonly:
        return
    for item in session.items:
        if item.nodeid.endswith(_NOVA_FUNCTIONAL):
            item.module.start_in_background()
            session.config.add_cleanup(item.module.stop_background)
            return


def pytest_report_header(config):
    return f"shm faults seed: {os.environ['SHM_FAULTS_SEED']} (set SHM_FAULTS_SEED to repeat it)"
