"""The vector form of nova's PCIWeigher (``nova/scheduler/weights/pci.py``).

The raw weight is nova's arithmetic over the host's free PCI devices (every pool, net of
the devices pending claims take): ``MAX_DEVS - min(free, MAX_DEVS - 1)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova.scheduler.weights import pci

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FloatArray, IntArray, WeigherForm


def _pci_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    # nova.scheduler.weights.pci: MAX_DEVS - min(free, MAX_DEVS - 1)
    free = rows.col("pci_free")[idx]
    return pci.MAX_DEVS - np.minimum(free, pci.MAX_DEVS - 1)


FORMS = (WeigherForm(pci.PCIWeigher, _pci_weight, ("filter_scheduler", "pci_weight_multiplier")),)
