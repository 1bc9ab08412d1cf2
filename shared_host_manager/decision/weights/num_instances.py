"""NumInstancesWeigher: weighs the number of instances (num_instances_weight_multiplier, default 0.0).

A positive multiplier stacks (prefers busy hosts), a negative one spreads;
the default 0.0 leaves it out of the sum, as in nova.
"""

from __future__ import annotations

from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.weights import BaseHostWeigher


class NumInstancesWeigher(BaseHostWeigher):
    multiplier_name = "num_instances_weight_multiplier"
    index_column = "num_instances"

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        return host_state.num_instances
