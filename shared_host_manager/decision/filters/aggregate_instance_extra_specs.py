"""AggregateInstanceExtraSpecsFilter: flavor extra specs must match aggregate metadata (nova 34).

Extra specs without a scope, or scoped ``aggregate_instance_extra_specs:``,
are requirements: the host's aggregates must carry the key, and one of its
(comma-separated) values must match the requirement under nova's
extra_specs_ops operators.  Other scopes are ignored.  Runs once per distinct
aggregate set in the fast path.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter, extra_specs_ops, utils
from shared_host_manager.decision.hostview import HasAggregates
from shared_host_manager.decision.index import AGGREGATE_GROUPS, PASS_ALL, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView

_SCOPE = "aggregate_instance_extra_specs"


class AggregateInstanceExtraSpecsFilter(BaseHostFilter):
    """Filter on flavor extra specs against the host's aggregate metadata."""

    run_filter_once_per_request = True

    def active(self, spec_obj: RequestView) -> bool:
        return bool(spec_obj.flavor.extra_specs)

    def host_passes(self, host_state: HasAggregates, spec_obj: RequestView) -> bool:
        extra_specs = spec_obj.flavor.extra_specs
        if not extra_specs:
            return True
        metadata = utils.aggregate_metadata_get_by_host(host_state)
        for key, req in extra_specs.items():
            scope = key.split(":", 1)
            if len(scope) > 1:
                if scope[0] != _SCOPE:
                    continue
                del scope[0]
            aggregate_vals = metadata.get(scope[0], None)
            if not aggregate_vals:
                return False
            for aggregate_val in aggregate_vals:
                if extra_specs_ops.match(aggregate_val, req):
                    break
            else:
                return False
        return True

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        extra_specs = spec_obj.flavor.extra_specs
        if not extra_specs:
            return PASS_ALL
        key = (self.name, tuple(sorted(extra_specs.items())))
        return index.group_mask(AGGREGATE_GROUPS, key, lambda stub: self.host_passes(stub, spec_obj))
