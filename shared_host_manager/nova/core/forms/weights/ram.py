"""The vector form of nova's RAMWeigher (``nova/scheduler/weights/ram.py``).

The raw weight is one column of the host table, ``free_ram_mb``: the host's free RAM, net of
this scheduler's pending claims, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import ram

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(ram.RAMWeigher, column("free_ram_mb"),
                     ("filter_scheduler", "ram_weight_multiplier")),)
