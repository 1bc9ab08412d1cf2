"""The vector form of nova's IoOpsWeigher (``nova/scheduler/weights/io_ops.py``).

The raw weight is one column of the host table, ``num_io_ops``: the host's I/O-heavy
operations, pending claims counted in, as nova's host state holds it.
"""

from __future__ import annotations

from nova.scheduler.weights import io_ops

from shared_host_manager.nova.core.forms.base import WeigherForm, column

FORMS = (WeigherForm(io_ops.IoOpsWeigher, column("num_io_ops"),
                     ("filter_scheduler", "io_ops_weight_multiplier")),)
