"""SameHostFilter: hint ``same_host=[instance uuids]``: only hosts running one of them (nova 34)."""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter, utils
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import PASS_ALL, HostIndex, Only, VectorResult
from shared_host_manager.decision.request import RequestView


class SameHostFilter(BaseHostFilter):
    """Schedule the instance on the same host as another instance in a set of instances."""

    run_filter_once_per_request = True

    def active(self, spec_obj: RequestView) -> bool:
        return bool(spec_obj.get_scheduler_hint("same_host"))

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        affinity_uuids = spec_obj.get_scheduler_hint("same_host")
        if affinity_uuids:
            return utils.instance_uuids_overlap(host_state, affinity_uuids)
        return True

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        uuids = utils.hint_list(spec_obj.get_scheduler_hint("same_host"))
        if not uuids:
            return PASS_ALL
        return Only({row for uuid in uuids for row in index.rows_of_instance(uuid)})
