"""Test-suite wide setup: shared helper modules in tests/ are importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# The fault simulation (tests/simulator/test_faults.py) runs from a fresh seed each run,
# printed in the header so that any violation can be reproduced (shm faults --seed S).
if not os.environ.get("SHM_FAULTS_SEED"):
    os.environ["SHM_FAULTS_SEED"] = str(int.from_bytes(os.urandom(4), "big"))


def pytest_report_header(config):
    return f"shm faults seed: {os.environ['SHM_FAULTS_SEED']} (set SHM_FAULTS_SEED to repeat it)"
