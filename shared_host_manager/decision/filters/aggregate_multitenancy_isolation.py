"""AggregateMultiTenancyIsolation: hosts in tenant-restricted aggregates take only those tenants.

If any of the host's aggregates has metadata keys starting with
``filter_tenant_id`` (``filter_tenant_id``, ``filter_tenant_id2``, ... as nova
and its ``require_tenant_aggregate`` prefilter accept), the request's project
must be one of their comma-separated values; a host in no such aggregate
accepts every project.  Runs once per distinct aggregate set in the fast path.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter, utils
from shared_host_manager.decision.hostview import HasAggregates
from shared_host_manager.decision.index import AGGREGATE_GROUPS, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView


class AggregateMultiTenancyIsolation(BaseHostFilter):
    """Isolate tenants in specific aggregates."""

    run_filter_once_per_request = True

    def host_passes(self, host_state: HasAggregates, spec_obj: RequestView) -> bool:
        tenant_id = spec_obj.project_id
        metadata = utils.aggregate_metadata_get_by_host(host_state)
        if metadata:
            configured: set[str] = set()
            for name, values in metadata.items():
                if name.startswith("filter_tenant_id"):
                    configured.update(values)
            if configured and tenant_id not in configured:
                return False
        return True

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        return index.group_mask(AGGREGATE_GROUPS, (self.name, spec_obj.project_id),
                                lambda stub: self.host_passes(stub, spec_obj))
