"""The vector form of nova's HypervisorVersionWeigher (``nova/scheduler/weights/hypervisor_version.py``).

The raw weight is one column of the host table, ``hypervisor_version``: the host's
hypervisor version, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import hypervisor_version

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(hypervisor_version.HypervisorVersionWeigher, column("hypervisor_version"),
                     ("filter_scheduler", "hypervisor_version_weight_multiplier")),)
