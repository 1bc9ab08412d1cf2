"""Host weighers: the weigher contract and nova's BaseWeightHandler arithmetic, for the engine.

Role: rank the hosts that passed every filter.  The weighers themselves are
nova's own classes (the ``nova`` decision core, :mod:`shared_host_manager.nova.core.plugins`
wraps each in a :class:`BaseHostWeigher`); this module holds what the engine
does around them, as nova's handler does: each weigher's raw value per host is
clamped to the weigher's ``minval``/``maxval`` where it sets them, normalised to
0..1 (``(x - min) / (max - min)``, all 0 when min == max, with ``min``/``max``
the weigher's bounds where set, else those of the hosts being weighed), then
multiplied by the weigher's multiplier for that host and summed.  Hosts are
ordered by weight, highest first; equal weights are ordered by source id so
both decision paths and every scheduler break ties the same way (nova keeps its
host iteration order; docs/design.md §5.7).

Fast path contract: a weigher names the index column holding its raw value
(``index_column``), or computes the raw values of many rows at once
(``vector_weights``); the engine then normalises with numpy using the same
float operations in the same order as :func:`weigh_hosts`, so both paths
produce bit-identical weights.  A weigher with neither is evaluated per host.

Contract: ``_weigh_object`` is given a
:class:`~shared_host_manager.decision.hostview.HostView` and the
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

if TYPE_CHECKING:
    from shared_host_manager.decision.hostview import HasAggregates, HostView
    from shared_host_manager.decision.index import FloatArray, HostIndex, IntArray
    from shared_host_manager.decision.request import RequestView


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
        """The multiplier for ``host_state`` (nova's weighers let an aggregate's metadata
        override it; a weigher that does overrides this)."""
        return self.default_multiplier

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


#: built-in weighers: name -> "module:class" (the fallback when entry points are not installed);
#: none: every weigher nova has is nova's own class (the ``nova`` decision core)
BUILTIN_WEIGHERS: dict[str, str] = {}

__all__ = ["BUILTIN_WEIGHERS", "BaseHostWeigher", "WeighedHost", "bounds", "clamp",
           "normalize", "weigh_hosts"]
