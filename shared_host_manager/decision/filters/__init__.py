"""Host filters: nova's BaseHostFilter contract, plus an optional vector form for the fast path.

Role: a filter answers "may this instance go to this host?".  The filters nova
has are nova's own classes (the ``nova`` decision core,
:mod:`shared_host_manager.nova.core.plugins`, wraps each in a
:class:`BaseHostFilter`); this package holds the contract and the filters nova
has no class for, one per module: ResourceFitFilter (placement's fit, for the
modes without placement), AvailabilityZoneFilter (nova's API and placement's
prefilter decide it there) and VolumeLocalityFilter (cinder's locality hint).
A filter's ``host_passes(host_state, spec_obj)`` has nova 34's contract; ``host_state`` is a
:class:`~shared_host_manager.decision.hostview.HostView` and ``spec_obj`` a
:class:`~shared_host_manager.decision.request.RequestView`, which answers nova's
RequestSpec attribute names (a filter that reads only those also works on a plain
:class:`~shared_host_manager.decision.request.RequestSpec`, as tests use it).
The types below are the contract, checked by mypy for every built-in filter.
A filter that runs on the index's group representatives (through
:meth:`~shared_host_manager.decision.index.HostIndex.group_mask`) declares the
narrower host it reads (``HasAggregates``, ``HasCapabilities``): an override may
accept more than a HostView, never less.

Fast path contract (optional, see :mod:`shared_host_manager.decision.ranking`): a
filter may also implement :meth:`BaseHostFilter.vector`, returning the same
answer for *every* row of the columnar index at once (a bool array, ``Only``
rows, ``Exclude`` rows, or ``PASS_ALL``).  It must agree with ``host_passes``
on every host; tests/decision/test_differential.py proves it for every filter.  A
filter without a vector form (None) is run per host on the survivors.

Life cycle: filters are instantiated once per engine (with the engine's
:class:`~shared_host_manager.conf.decision.SchedulerConfig`) and are
stateless across requests; per-request data goes in ``spec_obj.memo``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from shared_host_manager.conf.decision import SchedulerConfig

if TYPE_CHECKING:
    from shared_host_manager.decision.hostview import HostView
    from shared_host_manager.decision.index import HostIndex, VectorResult
    from shared_host_manager.decision.request import RequestView


class BaseHostFilter:
    """Base class of host filters (nova's ``nova.scheduler.filters.BaseHostFilter``)."""

    #: nova: the answer does not change between instances of one request (informational here)
    run_filter_once_per_request: ClassVar[bool] = False
    #: nova: run on rebuild to the same host (we schedule only new placements; informational)
    RUN_ON_REBUILD: ClassVar[bool] = False
    #: decided by placement in nova (not a filter there): still applied to forced hosts
    placement: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()

    @property
    def name(self) -> str:
        return type(self).__name__

    def active(self, spec_obj: RequestView) -> bool:
        """False when ``host_passes`` is True for every host for this request (skip it)."""
        return True

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        """nova's host_passes: may the instance being placed go to ``host_state``?"""
        raise NotImplementedError

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        """The answer for every index row at once; None = no vector form, run per host."""
        return None

    def filter_all(self, hosts: Iterable[HostView], spec_obj: RequestView) -> list[HostView]:
        return [h for h in hosts if self.host_passes(h, spec_obj)]

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: built-in filters: name -> "module:class" (the fallback when entry points are not installed):
#: only what nova has no filter class for (placement, the API and cinder decide it in nova);
#: every other name is nova's own class (the ``nova`` decision core)
BUILTIN_FILTERS: dict[str, str] = {
    "ResourceFitFilter": "shared_host_manager.decision.filters.resource_fit_filter:ResourceFitFilter",
    "AvailabilityZoneFilter":
        "shared_host_manager.decision.filters.availability_zone_filter:AvailabilityZoneFilter",
    "VolumeLocalityFilter":
        "shared_host_manager.decision.filters.volume_locality_filter:VolumeLocalityFilter",
}

__all__ = ["BUILTIN_FILTERS", "BaseHostFilter"]
