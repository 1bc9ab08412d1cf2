"""The vector form of nova's AggregateInstanceExtraSpecsFilter
(``nova/scheduler/filters/aggregate_instance_extra_specs.py``).

nova's own class once per aggregate group, on a probe holding the group's aggregates; the
answers are kept across decisions under the flavor's extra specs (all it reads of a
request).  Engaged by every request.
"""

from __future__ import annotations

from nova.scheduler.filters import aggregate_instance_extra_specs

from shared_host_manager.nova.core.forms.base import FilterForm, by_aggregates

FORMS = (FilterForm(
    aggregate_instance_extra_specs.AggregateInstanceExtraSpecsFilter,
    by_aggregates(lambda spec: tuple(sorted(spec.flavor.extra_specs.items()))
                  if "extra_specs" in spec.flavor else None)),)
