"""The vector form of nova's AggregateMultiTenancyIsolation
(``nova/scheduler/filters/aggregate_multitenancy_isolation.py``).

nova's own class once per aggregate group, on a probe holding the group's aggregates; the
answers are kept across decisions under the request's project (all it reads of a
request).  Engaged by every request.
"""

from __future__ import annotations

from nova.scheduler.filters import aggregate_multitenancy_isolation

from shared_host_manager.nova.core.forms.base import FilterForm, by_aggregates

FORMS = (FilterForm(aggregate_multitenancy_isolation.AggregateMultiTenancyIsolation,
                    by_aggregates(lambda spec: (spec.project_id,))),)
