"""AvailabilityZoneFilter: only hosts in the requested availability zone.

nova 28 removed this filter in favour of the placement prefilter
(``map_az_to_placement_aggregate``); here it is a filter again because the
aggregates travel in each host's document.  Semantics of the former filter:
a host's zones are the ``availability_zone`` metadata values of its
aggregates, or ``default_availability_zone`` when none has one.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter, utils
from shared_host_manager.decision.hostview import HasAggregates
from shared_host_manager.decision.index import AGGREGATE_GROUPS, PASS_ALL, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class AvailabilityZoneFilter(BaseHostFilter):
    """Filter on the availability zone of the host's aggregates."""

    run_filter_once_per_request = True

    def active(self, spec_obj: RequestView) -> bool:
        return bool(spec_obj.availability_zone)

    def host_passes(self, host_state: HasAggregates, spec_obj: RequestView) -> bool:
        availability_zone = spec_obj.availability_zone
        if not availability_zone:
            return True
        metadata = utils.aggregate_metadata_get_by_host(host_state, key="availability_zone")
        if "availability_zone" in metadata:
            return availability_zone in metadata["availability_zone"]
        return availability_zone == self.config.default_availability_zone

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        if not spec_obj.availability_zone:
            return PASS_ALL
        key = (self.name, spec_obj.availability_zone, self.config.default_availability_zone)
        return index.group_mask(AGGREGATE_GROUPS, key,
                                lambda stub: self.host_passes(stub, spec_obj))
