"""SameHostFilter: hint ``same_host=[instance uuids]``: only hosts running one of them (nova 34)."""

from __future__ import annotations

from typing import Any

from shared_host_manager.decision.filters import BaseHostFilter, utils
from shared_host_manager.decision.index import PASS_ALL, HostIndex, Only, VectorResult


class SameHostFilter(BaseHostFilter):
    """Schedule the instance on the same host as another instance in a set of instances."""

    run_filter_once_per_request = True

    def active(self, spec_obj: Any) -> bool:
        return bool(spec_obj.get_scheduler_hint("same_host"))

    def host_passes(self, host_state: Any, spec_obj: Any) -> bool:
        affinity_uuids = spec_obj.get_scheduler_hint("same_host")
        if affinity_uuids:
            return utils.instance_uuids_overlap(host_state, affinity_uuids)
        return True

    def vector(self, index: HostIndex, spec_obj: Any) -> VectorResult | None:
        uuids = utils.hint_list(spec_obj.get_scheduler_hint("same_host"))
        if not uuids:
            return PASS_ALL
        return Only({row for uuid in uuids for row in index.rows_of_instance(uuid)})
