"""The vector forms of nova's ServerGroupSoftAffinityWeigher and
ServerGroupSoftAntiAffinityWeigher (``nova/scheduler/weights/affinity.py``).

For a request whose group has the weigher's policy: per host, the members of the group
it holds (negated for anti-affinity); only the hosts holding one are asked, the others
weigh 0.  They read the group's members, set per instance: ``vector.PER_INSTANCE``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova.scheduler.weights import affinity

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FloatArray,
    IntArray,
    VectorWeigher,
    WeigherForm,
    holding,
)


def _soft(sign: float) -> VectorWeigher:
    def vw(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
        group = spec.instance_group
        if not group or w.policy_name != group.policy:
            return np.zeros(len(idx))
        members = set(group.members)
        out = np.zeros(len(idx))
        for j in np.flatnonzero(holding(rows, idx, members)).tolist():
            out[j] = sign * len(members.intersection(rows.instances_of(int(idx[j]))))
        return out
    return vw


FORMS = (
    WeigherForm(affinity.ServerGroupSoftAffinityWeigher, _soft(1.0),
                ("filter_scheduler", "soft_affinity_weight_multiplier"), per_instance=True),
    WeigherForm(affinity.ServerGroupSoftAntiAffinityWeigher, _soft(-1.0),
                ("filter_scheduler", "soft_anti_affinity_weight_multiplier"), per_instance=True),
)
