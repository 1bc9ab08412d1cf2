"""The vector forms of nova's NumInstancesFilter and AggregateNumInstancesFilter
(``nova/scheduler/filters/num_instances_filter.py``).

A host passes with fewer instances than its limit; the limit is nova's getter, asked once
per aggregate group (it reads the option and the aggregates, not the request).
"""

from __future__ import annotations

from nova.scheduler.filters import num_instances_filter

from shared_host_manager.nova.core.forms.base import FilterForm, limit, runs

_LIMIT = limit("num_instances", "_get_max_instances_per_host", "max_instances_per_host")

FORMS = (
    FilterForm(num_instances_filter.NumInstancesFilter, _LIMIT, engaged=runs),
    FilterForm(num_instances_filter.AggregateNumInstancesFilter, _LIMIT, engaged=runs),
)
