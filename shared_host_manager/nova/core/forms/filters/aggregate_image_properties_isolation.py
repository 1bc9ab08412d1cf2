"""The vector form of nova's AggregateImagePropertiesIsolation
(``nova/scheduler/filters/aggregate_image_properties_isolation.py``).

nova's own class once per aggregate group, on a probe holding the group's aggregates;
asked again every request (no key of what it reads of the request, the image's
properties, is declared, so no answer is kept across decisions).  Engaged by every
request.
"""

from __future__ import annotations

from nova.scheduler.filters import aggregate_image_properties_isolation

from shared_host_manager.nova.core.forms.base import FilterForm, by_aggregates

FORMS = (FilterForm(aggregate_image_properties_isolation.AggregateImagePropertiesIsolation,
                    by_aggregates()),)
