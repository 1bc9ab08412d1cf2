"""Server-group policy as the arbiter checks it: the group a claim carries, and the verdict.

Why at the arbiter: two schedulers deciding at the same time do not see each
other's new members, so each may put a member of one anti-affinity group on the
same host.  Only the host sees both claims, as it sees both consumptions for
resources (docs/design.md §5.3).  A claim therefore carries its server group
(:class:`ClaimGroup`: uuid, policy, ``max_server_per_host`` and the members the
scheduler saw), and the arbiter records the group uuid in the instance record it
writes on acceptance (``instances[uuid]["group"]``), so that members placed by
other schedulers count on the host although the claiming scheduler never heard
of them.

Verdict on one host (:func:`group_conflict`):

* ``anti-affinity``: members on the host (listed by the claim, or recorded with
  the group by the arbiter) must stay below ``max_server_per_host``;
* ``affinity``: when the scheduler located members on some host (it lists only
  those), one of them, or an instance recorded with the group, must be on this
  host.  The first member of a group cannot be checked locally; schedulers
  locate a group by the uuid its claims carry and its instance records keep, and
  choose a first member's host by rendezvous over the group uuid, so racing
  first members land on one host (``shared_host_manager.decision.engine``).

Other policies (nova's soft ones are weighers) are not checked.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANTI_AFFINITY = "anti-affinity"
AFFINITY = "affinity"
#: the instance record's key naming the server group of an arbiter-placed instance
GROUP_KEY = "group"
#: largest member list a claim may carry
MAX_GROUP_MEMBERS = 10_000


@dataclass(frozen=True, slots=True)
class ClaimGroup:
    """The server group a claimed instance belongs to, as the claiming scheduler saw it."""

    uuid: str
    policy: str
    #: anti-affinity: members one host may hold (nova's rule ``max_server_per_host``)
    max_per_host: int = 1
    #: anti-affinity: every member the scheduler knows of; affinity: those it located
    members: tuple[str, ...] = field(default_factory=tuple)


def group_conflict(instances: Mapping[str, Any], group: ClaimGroup | None,
                   instance: str) -> str | None:
    """Why placing ``instance`` of ``group`` on a host holding ``instances`` breaks the policy."""
    if group is None:
        return None
    listed = set(group.members)
    here = {u for u, record in instances.items()
            if u != instance and (u in listed or (type(record) is dict
                                                  and record.get(GROUP_KEY) == group.uuid))}
    if group.policy == ANTI_AFFINITY:
        if len(here) >= group.max_per_host:
            return (f"server group {group.uuid} (anti-affinity) already has {len(here)} "
                    f"member(s) on this host, at most {group.max_per_host} allowed")
    elif group.policy == AFFINITY:
        if listed - {instance} and not here:
            return f"server group {group.uuid} (affinity) has its members on other hosts"
    return None


__all__ = ["AFFINITY", "ANTI_AFFINITY", "GROUP_KEY", "MAX_GROUP_MEMBERS", "ClaimGroup",
           "group_conflict"]
