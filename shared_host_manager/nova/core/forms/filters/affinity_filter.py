"""The vector forms of nova's filters in ``nova/scheduler/filters/affinity_filter.py``.

* ServerGroupAntiAffinityFilter: engaged by an anti-affinity group; a host passes holding
  fewer members than the rule's ``max_server_per_host`` (default 1), or the instance
  itself; with a positive limit only the hosts holding a member are looked at.
* ServerGroupAffinityFilter: engaged once the group has hosts; passes the group's hosts.
* SameHostFilter, DifferentHostFilter: the hosts holding (not holding) any instance of
  the hint.
* SimpleCIDRAffinityFilter: engaged by its hint only; then nova's class per host.

The server-group forms read what is set per instance (its uuid, the group's hosts and
members): ``vector.PER_INSTANCE``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova.scheduler.filters import affinity_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    VectorFilter,
    hint,
    holding,
    per_host,
    runs,
)


def _anti_affinity(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    group = spec.instance_group
    members = set(group.members)
    rules = group.rules
    limit = rules["max_server_per_host"] if rules and "max_server_per_host" in rules else 1
    me = spec.instance_uuid
    if limit < 1:  # no row passes for holding none: every row's own answer
        candidates = np.arange(len(idx))
        out = np.empty(len(idx), dtype=bool)
    else:  # a row holding no member passes: only the holders are asked
        candidates = np.flatnonzero(holding(rows, idx, members))
        out = np.ones(len(idx), dtype=bool)
    for j in candidates.tolist():
        insts = rows.instances_of(int(idx[j]))
        out[j] = me in insts or len(members.intersection(insts)) < limit
    return out


def _affinity(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    group_hosts = spec.instance_group.hosts
    return np.fromiter((rows.name(r) in group_hosts for r in idx.tolist()), dtype=bool,
                       count=len(idx))


def _overlap(name: str, same: bool) -> VectorFilter:
    def vf(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
        uuids = spec.get_scheduler_hint(name)
        wanted = {uuids} if isinstance(uuids, str) else set(uuids)
        hit = holding(rows, idx, wanted)
        return hit if same else ~hit
    return vf


def _group_policy(f: Any, spec: Any) -> bool:
    group = spec.instance_group
    return runs(f, spec) and group is not None and f.policy_name == group.policy


FORMS = (
    FilterForm(affinity_filter.ServerGroupAntiAffinityFilter, _anti_affinity,
               engaged=_group_policy, per_instance=True),
    FilterForm(affinity_filter.ServerGroupAffinityFilter, _affinity,
               engaged=lambda f, spec: runs(f, spec) and spec.instance_group is not None
               and f.policy_name in spec.instance_group.policies
               and bool(spec.instance_group.hosts),
               engaged_per_instance=True, per_instance=True),
    FilterForm(affinity_filter.SameHostFilter, _overlap("same_host", True),
               engaged=hint("same_host")),
    FilterForm(affinity_filter.DifferentHostFilter, _overlap("different_host", False),
               engaged=hint("different_host")),
    FilterForm(affinity_filter.SimpleCIDRAffinityFilter, per_host,
               engaged=hint("build_near_host_ip")),
)
