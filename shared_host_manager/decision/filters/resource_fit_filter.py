"""ResourceFitFilter: the instance's resources fit the host (what placement decides in nova).

A request fits when, for every resource class it asks a positive amount of,
``used + pending + requested <= (total - reserved) * allocation_ratio`` — the
arbiter's own rule (:func:`protocol.resources.check_fit`), where ``pending`` is
this scheduler's unresolved claims on the host plus what earlier instances of
the same request took.  Using the arbiter's rule means a claim this filter
passes is rejected only if the host changed meanwhile (or another scheduler
claimed first).  Applied to forced hosts too, as placement is in nova.
"""

from __future__ import annotations

import numpy as np

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import PASS_ALL, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class ResourceFitFilter(BaseHostFilter):
    """Filter on vcpus/memory_mb/disk_gb (and any other class) fitting with allocation ratios."""

    placement = True

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        return host_state.fits(spec_obj.resources) is None

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        n = index.size
        mask: np.ndarray | None = None
        for resource, amount in spec_obj.resources.items():
            if not amount:
                continue
            cap = index.cap.get(resource)
            if cap is None:
                return None  # a class the index has no column for: check per host
            # same float operations as check_fit: (used + pending) + amount > capacity fails
            ok = (index.used[resource][:n] + amount) <= cap[:n]
            if mask is None:
                mask = ok
            else:
                mask &= ok
        return PASS_ALL if mask is None else mask
