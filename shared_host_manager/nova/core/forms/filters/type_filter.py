"""The vector form of nova's AggregateTypeAffinityFilter (``nova/scheduler/filters/type_filter.py``).

nova's own class once per aggregate group, on a probe holding the group's aggregates;
asked again every request (no key of what it reads of the request, the flavor's name, is
declared, so no answer is kept across decisions).  Engaged by every request.
"""

from __future__ import annotations

from nova.scheduler.filters import type_filter

from shared_host_manager.nova.core.forms.base import FilterForm, by_aggregates

FORMS = (FilterForm(type_filter.AggregateTypeAffinityFilter, by_aggregates()),)
