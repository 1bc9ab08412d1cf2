"""IoOpsFilter: hosts with max_io_ops_per_host concurrent I/O operations or more are filtered out.

``num_io_ops`` is the host's reported count of builds, resizes and snapshots
in flight, plus this scheduler's pending claims (each is a build in flight)
and the instances earlier in the same request placed there.  Default limit 8.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class IoOpsFilter(BaseHostFilter):
    """Filter out hosts with too many concurrent I/O operations."""

    def _get_max_io_ops_per_host(self, host_state: HostView, spec_obj: RequestView) -> int:
        return self.config.max_io_ops_per_host

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        return host_state.num_io_ops < self._get_max_io_ops_per_host(host_state, spec_obj)

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        if type(self)._get_max_io_ops_per_host is not IoOpsFilter._get_max_io_ops_per_host:
            return None
        return index.num_io_ops[: index.size] < self.config.max_io_ops_per_host
