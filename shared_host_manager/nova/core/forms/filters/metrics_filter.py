"""The vector form of nova's MetricsFilter (``nova/scheduler/filters/metrics_filter.py``).

nova's own class once per distinct set of metric names the hosts report, on one host of
each group; kept across decisions under the names the class parsed from its option (it
reads nothing of the request).
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.filters import metrics_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    grouped,
    runs,
)


def _metrics(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    # nova's class reads the metric names it parsed from its option, not the request
    return grouped(f, rows, idx, spec, "metric_names",
                   lambda t: tuple(sorted(m.name for m in t.attrs["metrics"])),
                   tuple(sorted(f.keys)))


FORMS = (FilterForm(metrics_filter.MetricsFilter, _metrics, engaged=runs),)
