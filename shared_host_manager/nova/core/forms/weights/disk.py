"""The vector form of nova's DiskWeigher (``nova/scheduler/weights/disk.py``).

The raw weight is one column of the host table, ``free_disk_mb``: the host's free disk, net
of this scheduler's pending claims, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import disk

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(disk.DiskWeigher, column("free_disk_mb"),
                     ("filter_scheduler", "disk_weight_multiplier")),)
