"""RAMWeigher: more free RAM weighs more (multiplier ram_weight_multiplier, default 1.0: spread).

Raw value: nova's ``free_ram_mb`` — total minus reserved minus used (our
pending claims included), without the allocation ratio.
"""

from __future__ import annotations

from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.weights import BaseHostWeigher


class RAMWeigher(BaseHostWeigher):
    multiplier_name = "ram_weight_multiplier"
    index_column = "free_ram_mb"
    minval = 0.0  # nova 34: weighs x / max; an overcommitted host weighs 0

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        return host_state.free_ram_mb
