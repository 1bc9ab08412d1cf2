"""The vector form of nova's MetricsWeigher (``nova/scheduler/weights/metrics.py``).

Without metrics to weigh (``[metrics] weight_setting`` empty) every host weighs 0;
otherwise nova's own ``_weigh_object`` per host, on a probe holding the host's
aggregates, names and metrics (the metrics memoised per template), not on a full host
state.  The multiplier is ``[metrics] weight_multiplier``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from nova.scheduler.weights import metrics as nova_metrics

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FloatArray, IntArray, Probe, WeigherForm


class MetricsProbe(Probe):
    """What nova's MetricsWeigher reads of a host: its metrics, besides what a probe holds."""

    __slots__ = ("metrics",)

    def __init__(self, aggregates: Sequence[Any], host: str, nodename: str, metrics: Any) -> None:
        super().__init__(aggregates, host, nodename)
        self.metrics = metrics


def _metrics_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray | None:
    if not w.setting:
        return np.zeros(len(idx))
    host_metrics = rows.values("metrics", lambda t: t.attrs["metrics"])
    out = np.empty(len(idx), dtype=np.float64)
    for j, row in enumerate(idx.tolist()):
        out[j] = w._weigh_object(MetricsProbe(rows.aggregates(row), rows.name(row),
                                               rows.nodename(row), host_metrics[row]), spec)
    return out


FORMS = (WeigherForm(nova_metrics.MetricsWeigher, _metrics_weight, ("metrics", "weight_multiplier")),)
