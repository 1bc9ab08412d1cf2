"""The vector form of nova's IsolatedHostsFilter (``nova/scheduler/filters/isolated_hosts_filter.py``).

nova's rule over host names and the request's image, from the options it reads; PASS_ALL
where the options leave every host in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova import conf as nova_conf
from nova.scheduler.filters import isolated_hosts_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.decision.index import PASS_ALL
from shared_host_manager.nova.core.forms.base import FilterAnswer, FilterForm, IntArray, runs


def _isolated(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    c = nova_conf.CONF.filter_scheduler
    isolated_hosts = c.isolated_hosts
    restrict = c.restrict_isolated_hosts_to_isolated_images
    host_isolated = np.fromiter((rows.name(r) in isolated_hosts for r in idx.tolist()), dtype=bool,
                                count=len(idx))
    if not c.isolated_images:
        return ~host_isolated if restrict else PASS_ALL
    image_ref = spec.image.id if spec.image and "id" in spec.image else None
    image_isolated = image_ref in c.isolated_images
    if restrict:
        return host_isolated == image_isolated
    return host_isolated if image_isolated else PASS_ALL


FORMS = (FilterForm(isolated_hosts_filter.IsolatedHostsFilter, _isolated, engaged=runs),)
