"""Host weighers: nova's BaseHostWeigher and BaseWeightHandler, with an index column per weigher.

Role: rank the hosts that passed every filter.  As in nova, each weigher
produces a raw value per host, the values are clamped to the weigher's
``minval``/``maxval`` where it sets them, normalised to 0..1 (``(x - min) /
(max - min)``, all 0 when min == max, with ``min``/``max`` the weigher's
``minval``/``maxval`` where set, else those of the hosts being weighed), then
multiplied by the weigher's multiplier for that host (the configured one, or
the minimum of its aggregates' metadata override, nova's
``utils.get_weight_multiplier``) and summed.  nova 34's RAM, CPU, disk and
I/O-ops weighers set ``minval = 0``: a host weighs its free amount relative to
the most free one (``x / max``), and an overcommitted host weighs 0.  Hosts are
ordered by weight, highest first; equal weights are ordered by source id so
both decision paths and every scheduler break ties the same way (nova keeps its
host iteration order).  tests/nova/test_own_core_vs_nova.py checks every
built-in weigher against nova's own class (docs/design.md §5.7).

Fast path contract: a weigher names the index column holding its raw value
(``index_column``), or computes the raw values of many rows at once
(``vector_weights``); the engine then normalises with numpy using the same
float operations in the same order as :func:`weigh_hosts`, so both paths
produce bit-identical weights.  A weigher with neither is evaluated per host.

Contract (checked by mypy for every built-in weigher): ``_weigh_object`` is
given a :class:`~shared_host_manager.decision.hostview.HostView` and the
:class:`~shared_host_manager.decision.request.RequestView`; ``weight_multiplier``
reads only the host's aggregates (``HasAggregates``), so the fast path computes
it once per aggregate group.

Life cycle: weighers are instantiated once per engine and hold no per-request
state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.filters import utils as filter_utils

if TYPE_CHECKING:
    from shared_host_manager.decision.hostview import HasAggregates, HostView
    from shared_host_manager.decision.index import FloatArray, HostIndex, IntArray
    from shared_host_manager.decision.request import RequestView


def get_weight_multiplier(host_state: HasAggregates, multiplier_name: str,
                          multiplier_config: float) -> float:
    """nova's utils.get_weight_multiplier: the minimum aggregate override, else the config value."""
    values = filter_utils.aggregate_values_from_key(host_state, multiplier_name)
    try:
        return filter_utils.validate_num_values(values, multiplier_config,
                                                cast_to=filter_utils.finite_float, based_on=min)
    except ValueError:
        return multiplier_config


class BaseHostWeigher:
    """Base class of host weighers (nova's ``nova.weights.BaseHostWeigher``)."""

    #: config option and aggregate metadata key of the multiplier
    multiplier_name: ClassVar[str] = ""
    #: index column with this weigher's raw value (None: evaluated per host)
    index_column: ClassVar[str | None] = None
    #: nova's bounds: raw values are clamped to them, and they replace the hosts' min / max
    #: in the normalisation (None: the hosts' own).  Per class, as nova's; a replay sets the
    #: ones its log recorded on the instance.
    minval: float | None = None
    maxval: float | None = None

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def default_multiplier(self) -> float:
        return float(getattr(self.config, self.multiplier_name, 1.0))

    def weight_multiplier(self, host_state: HasAggregates) -> float:
        return get_weight_multiplier(host_state, self.multiplier_name, self.default_multiplier)

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        """nova's raw weight of ``host_state`` (normalised over the hosts by the caller)."""
        raise NotImplementedError

    def vector_weights(self, index: HostIndex, weight_properties: RequestView, rows: IntArray
                       ) -> FloatArray | None:
        """The raw weights of the index ``rows`` at once, for a weigher without an index
        column (None: evaluated per host)."""
        return None

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass(slots=True)
class WeighedHost:
    obj: HostView
    weight: float = 0.0


def normalize(weight_list: Sequence[float], minval: float, maxval: float) -> list[float]:
    """nova's weights.normalize."""
    if not weight_list:
        return []
    maxval = float(maxval)
    minval = float(minval)
    if minval == maxval:
        return [0.0] * len(weight_list)
    range_ = maxval - minval
    return [(i - minval) / range_ for i in weight_list]


def clamp(weigher: BaseHostWeigher, value: float) -> float:
    """nova's BaseWeigher.weigh_objects: the raw value kept within minval / maxval."""
    if weigher.minval is not None:
        value = max(value, weigher.minval)
    if weigher.maxval is not None:
        value = min(value, weigher.maxval)
    return value


def bounds(weigher: BaseHostWeigher, lowest: float, highest: float) -> tuple[float, float]:
    """The (min, max) nova's normalize uses: the weigher's bounds, else the hosts' own."""
    return (lowest if weigher.minval is None else weigher.minval,
            highest if weigher.maxval is None else weigher.maxval)


def weigh_hosts(
    weighers: Iterable[BaseHostWeigher], hosts: Sequence[HostView], spec_obj: RequestView,
) -> list[WeighedHost]:
    """nova's BaseWeightHandler.get_weighed_objects, ties ordered by source id."""
    weighed = [WeighedHost(h, 0.0) for h in hosts]
    if len(weighed) > 1:
        for weigher in weighers:
            raw = [clamp(weigher, weigher._weigh_object(w.obj, spec_obj)) for w in weighed]
            lo, hi = bounds(weigher, min(raw), max(raw))
            for w, value in zip(weighed, normalize(raw, lo, hi), strict=True):
                w.weight += weigher.weight_multiplier(w.obj) * value
    return sorted(weighed, key=lambda w: (-w.weight, w.obj.uuid))


#: built-in weighers: name -> "module:class" (the fallback when entry points are not installed)
BUILTIN_WEIGHERS: dict[str, str] = {
    "RAMWeigher": "shared_host_manager.decision.weights.ram:RAMWeigher",
    "CPUWeigher": "shared_host_manager.decision.weights.cpu:CPUWeigher",
    "DiskWeigher": "shared_host_manager.decision.weights.disk:DiskWeigher",
    "NumInstancesWeigher": "shared_host_manager.decision.weights.num_instances:NumInstancesWeigher",
    "IoOpsWeigher": "shared_host_manager.decision.weights.io_ops:IoOpsWeigher",
}

__all__ = ["BUILTIN_WEIGHERS", "BaseHostWeigher", "WeighedHost", "bounds", "clamp",
           "get_weight_multiplier", "normalize", "weigh_hosts"]
