"""The vector forms of nova's IoOpsFilter and AggregateIoOpsFilter
(``nova/scheduler/filters/io_ops_filter.py``).

A host passes with fewer I/O-heavy operations than its limit; the limit is nova's getter,
asked once per aggregate group (it reads the option and the aggregates, not the request).
"""

from __future__ import annotations

from nova.scheduler.filters import io_ops_filter

from shared_host_manager.nova.core.forms.base import FilterForm, limit, runs

_LIMIT = limit("num_io_ops", "_get_max_io_ops_per_host", "max_io_ops_per_host")

FORMS = (
    FilterForm(io_ops_filter.IoOpsFilter, _LIMIT, engaged=runs),
    FilterForm(io_ops_filter.AggregateIoOpsFilter, _LIMIT, engaged=runs),
)
