"""ServerGroupAffinityFilter: instances of an "affinity" group go where the group already is.

nova 34 semantics: with policy ``affinity`` and a non-empty ``group.hosts``,
only those hosts pass.  ``group.hosts`` is derived per request from where the
group's members are (the ``instances`` namespaces and our pending claims)
plus the hosts chosen for earlier instances of the same request.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import PASS_ALL, HostIndex, Only, VectorResult
from shared_host_manager.decision.request import RequestView


class ServerGroupAffinityFilter(BaseHostFilter):
    """Schedule the instance onto a host of its affinity group."""

    policy_name = "affinity"

    def active(self, spec_obj: RequestView) -> bool:
        group = spec_obj.instance_group
        return group is not None and group.policy == self.policy_name

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        group = spec_obj.instance_group
        if group is None or self.policy_name not in group.policies:
            return True
        if group.hosts:
            return host_state.host in group.hosts
        return True

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        group = spec_obj.instance_group
        if group is None or not self.active(spec_obj) or not group.hosts:
            return PASS_ALL
        return Only(index.rows_of_hosts(group.hosts))
