"""The vector form of nova's NumInstancesWeigher (``nova/scheduler/weights/num_instances.py``).

The raw weight is one column of the host table, ``num_instances``: the host's instances,
pending claims counted in, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import num_instances

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(num_instances.NumInstancesWeigher, column("num_instances"),
                     ("filter_scheduler", "num_instances_weight_multiplier")),)
