"""The vector form of nova's ComputeFilter (``nova/scheduler/filters/compute_filter.py``).

A host passes when its service is neither disabled nor forced down (the table's ``down``
column, from the API side's service record where there is one) and it was heard from within
``service_down_time``: the DbDriver's test, with the wall clock of the host's last message
as ``last_seen_up``.  Another servicegroup driver: nova's class per host.
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.filters import compute_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    option,
    runs,
)


def _compute_filter(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    if type(f.servicegroup_api._driver).__name__ != "DbDriver":
        return None  # another servicegroup driver: nova's class asks it per host
    # nova: abs(utcnow - last_seen_up) <= service_down_time, with last_seen_up = wall clock of
    # the last message (host_state.SharedHostState._make); microsecond rounding aside, the same comparison
    up = rows.heard_within(idx, option(None, "service_down_time"))
    return (rows.col("down")[idx] == 0.0) & up


FORMS = (FilterForm(compute_filter.ComputeFilter, _compute_filter, engaged=runs),)
