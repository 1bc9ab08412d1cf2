"""The vector form of nova's BuildFailureWeigher (``nova/scheduler/weights/compute.py``).

The raw weight is one column of the host table, ``failed_builds``: the host's recent failed
builds, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import compute

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(compute.BuildFailureWeigher, column("failed_builds"),
                     ("filter_scheduler", "build_failure_weight_multiplier")),)
