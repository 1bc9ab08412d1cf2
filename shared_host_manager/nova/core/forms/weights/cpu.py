"""The vector form of nova's CPUWeigher (``nova/scheduler/weights/cpu.py``).

The raw weight is the host's free vCPUs as nova's class computes them: total times the
allocation ratio, less those used (pending claims counted in).
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.weights import cpu

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FloatArray, IntArray, WeigherForm


def _cpu(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    return rows.col("vcpus_total")[idx] * rows.col("cpu_allocation_ratio")[idx] \
        - rows.col("vcpus_used")[idx]


FORMS = (WeigherForm(cpu.CPUWeigher, _cpu, ("filter_scheduler", "cpu_weight_multiplier")),)
