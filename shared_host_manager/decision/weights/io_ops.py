"""IoOpsWeigher: weighs concurrent I/O operations (io_ops_weight_multiplier, default -1.0).

The default negative multiplier prefers lightly loaded hosts; our pending
claims count as operations in flight.
"""

from __future__ import annotations

from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.weights import BaseHostWeigher


class IoOpsWeigher(BaseHostWeigher):
    multiplier_name = "io_ops_weight_multiplier"
    index_column = "num_io_ops"
    minval = 0.0  # nova 34: weighs x / max

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        return host_state.num_io_ops
