"""The vector form of nova's JsonFilter (``nova/scheduler/filters/json_filter.py``).

Engaged only by a ``query`` hint, which is rare: then nova's class per host.
"""

from __future__ import annotations

from nova.scheduler.filters import json_filter

from shared_host_manager.nova.core.forms.base import FilterForm, hint, per_host

FORMS = (FilterForm(json_filter.JsonFilter, per_host, engaged=hint("query")),)
