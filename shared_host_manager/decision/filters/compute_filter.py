"""ComputeFilter: only hosts whose compute service is up and enabled (nova 34 semantics).

nova asks the servicegroup API whether the service is up (heartbeat within
service_down_time, not forced_down) and rejects disabled services.  Here "up"
is what the receiver knows: the source is ACTIVE (heard from within
down_interval, in order) and its ``service`` namespace is not forced_down;
"enabled" is ``service.disabled`` false.  Applied to forced hosts too (a down
or disabled compute node cannot arbitrate a claim).
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class ComputeFilter(BaseHostFilter):
    """Filter on active, enabled compute services."""

    run_filter_once_per_request = True
    placement = True

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        if host_state.service.get("disabled"):
            return False
        return bool(host_state.is_up)

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        return index.compute_ok[: index.size]
