"""CPUWeigher: more free vCPUs weigh more (multiplier cpu_weight_multiplier, default 1.0: spread).

Raw value: nova's ``vcpus_total * cpu_allocation_ratio - vcpus_used`` (our
pending claims included in vcpus_used).
"""

from __future__ import annotations

from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.weights import BaseHostWeigher


class CPUWeigher(BaseHostWeigher):
    multiplier_name = "cpu_weight_multiplier"
    index_column = "vcpus_free"
    minval = 0.0  # nova 34: weighs x / max; an overcommitted host weighs 0

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        return host_state.vcpus_free
