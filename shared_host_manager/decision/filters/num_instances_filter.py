"""NumInstancesFilter: hosts with max_instances_per_host instances or more are filtered out.

The count is the host's reported ``num_instances`` plus this scheduler's
pending claims that create an instance and the instances earlier in the same
request placed there (nova's consume_from_request).  Default limit 50.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class NumInstancesFilter(BaseHostFilter):
    """Filter out hosts with too many instances."""

    def _get_max_instances_per_host(self, host_state: HostView, spec_obj: RequestView) -> int:
        return self.config.max_instances_per_host

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        return host_state.num_instances < self._get_max_instances_per_host(host_state, spec_obj)

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        if type(self)._get_max_instances_per_host is not NumInstancesFilter._get_max_instances_per_host:
            return None  # a subclass with a per-host limit: per host
        return index.num_instances[: index.size] < self.config.max_instances_per_host
