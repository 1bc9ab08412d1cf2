"""The vector form of nova's CrossCellWeigher (``nova/scheduler/weights/cross_cell.py``).

For a move allowed to cross cells: 1 for the hosts in the preferred cell (the request's
``requested_destination.cell``), -1 for the others; 0 for every host otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova.scheduler.weights import cross_cell

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FloatArray, IntArray, WeigherForm


def _cross_cell(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray:
    rd = spec.requested_destination if "requested_destination" in spec else None
    if rd and "cell" in rd and rd.cell and rd.allow_cross_cell_move:
        cell = rd.cell.uuid
        return np.fromiter((1.0 if rows.cell_uuid(r) == cell else -1.0 for r in idx.tolist()),
                           dtype=np.float64, count=len(idx))
    return np.zeros(len(idx))


FORMS = (WeigherForm(cross_cell.CrossCellWeigher, _cross_cell,
                     ("filter_scheduler", "cross_cell_move_weight_multiplier")),)
