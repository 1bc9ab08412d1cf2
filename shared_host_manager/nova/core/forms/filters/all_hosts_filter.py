"""The vector form of nova's AllHostsFilter (``nova/scheduler/filters/all_hosts_filter.py``).

No request engages it: every host passes without a look at them.
"""

from __future__ import annotations

from nova.scheduler.filters import all_hosts_filter

from shared_host_manager.decision.index import PASS_ALL
from shared_host_manager.nova.core.forms.base import FilterForm

FORMS = (FilterForm(all_hosts_filter.AllHostsFilter, lambda f, rows, idx, spec: PASS_ALL,
                    engaged=lambda f, spec: False),)
