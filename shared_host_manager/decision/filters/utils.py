"""nova's filter helpers (``nova/scheduler/filters/utils.py``) the engine's own filters need.

Pure functions of a host's ``aggregates`` and of a request's hints; they work
equally on a HostView and on an index group representative (which carries only
what they read), which is what lets AvailabilityZoneFilter run once per
aggregate set.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared_host_manager.decision.hostview import HasAggregates


def aggregate_metadata_get_by_host(host_state: HasAggregates, key: str | None = None
                                   ) -> dict[str, set[str]]:
    """All metadata of the host's aggregates (of those having ``key``), values split on commas."""
    metadata: dict[str, set[str]] = collections.defaultdict(set)
    for agg in host_state.aggregates:
        if key is None or key in agg.metadata:
            for k, v in agg.metadata.items():
                metadata[k].update(x.strip() for x in v.split(","))
    return metadata


def hint_list(value: Any) -> list[str]:
    """A scheduler hint as a list of strings (nova accepts a bare string or a list)."""
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)]
