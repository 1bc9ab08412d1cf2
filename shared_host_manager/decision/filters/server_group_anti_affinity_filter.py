"""ServerGroupAntiAffinityFilter: at most max_server_per_host members of an anti-affinity group per host.

nova 34 semantics: with policy ``anti-affinity`` a host passes while the
number of group members on it is below the rule ``max_server_per_host``
(default 1); the host already holding the instance being placed passes (a
move).  Members on a host are read from its ``instances`` namespace, our
pending claims and this request's earlier instances; the request's own
instances are members of their group (nova's API adds them).
"""

from __future__ import annotations

from collections import Counter

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import PASS_ALL, Exclude, HostIndex, VectorResult
from shared_host_manager.decision.request import InstanceGroup, RequestView


def max_server_per_host(group: InstanceGroup) -> int:
    rules = group.rules
    if rules and "max_server_per_host" in rules:
        try:
            return int(rules["max_server_per_host"])
        except (TypeError, ValueError):
            return 1
    return 1


class ServerGroupAntiAffinityFilter(BaseHostFilter):
    """Schedule the instance away from the hosts of its anti-affinity group."""

    policy_name = "anti-affinity"

    def active(self, spec_obj: RequestView) -> bool:
        group = spec_obj.instance_group
        return group is not None and group.policy == self.policy_name

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        group = spec_obj.instance_group
        if group is None or group.policy != self.policy_name:
            return True
        instances = host_state.instances
        if spec_obj.instance_uuid in instances:
            return True
        servers_on_host = instances.intersection(group.members)
        return len(servers_on_host) < max_server_per_host(group)

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        group = spec_obj.instance_group
        if group is None or not self.active(spec_obj):
            return PASS_ALL
        counts: Counter[int] = Counter()
        for member in set(group.members):
            counts.update(index.rows_of_instance(member))
        limit = max_server_per_host(group)
        full = [row for row, count in counts.items() if count >= limit]
        if not full:
            return PASS_ALL
        if spec_obj.instance_uuid:
            exempt = set(index.rows_of_instance(spec_obj.instance_uuid))
            full = [row for row in full if row not in exempt]
        return Exclude(full)
