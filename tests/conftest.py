"""Test-suite wide setup: shared helper modules in tests/ are importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
