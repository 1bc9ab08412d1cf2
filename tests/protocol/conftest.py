"""Protocol test setup: the helper module next to this file is importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
