"""nova's filter helpers (``nova/scheduler/filters/utils.py``), on our HostView.

Pure functions of a host's ``aggregates`` / ``instances``; they work equally on
a HostView and on an index group representative (which carries only what they
read), which is what lets aggregate filters run once per aggregate set.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from shared_host_manager.decision.hostview import HasAggregates, HostView

_T = TypeVar("_T")


def aggregate_values_from_key(host_state: HasAggregates, key_name: str) -> set[str]:
    """The set of raw values of metadata ``key_name`` over the host's aggregates."""
    return {agg.metadata[key_name] for agg in host_state.aggregates if key_name in agg.metadata}


def aggregate_metadata_get_by_host(host_state: HasAggregates, key: str | None = None
                                   ) -> dict[str, set[str]]:
    """All metadata of the host's aggregates (of those having ``key``), values split on commas."""
    metadata: dict[str, set[str]] = collections.defaultdict(set)
    for agg in host_state.aggregates:
        if key is None or key in agg.metadata:
            for k, v in agg.metadata.items():
                metadata[k].update(x.strip() for x in v.split(","))
    return metadata


def validate_num_values(
    vals: Iterable[str], default: _T, cast_to: Callable[[str], _T],
    based_on: Callable[[list[_T]], _T],
) -> _T:
    """``based_on`` of the values cast with ``cast_to``, or ``default`` when there are none.

    Raises ValueError when a value does not cast (callers fall back to the default).
    """
    vals = list(vals)
    if not vals:
        return default
    return based_on([cast_to(v) for v in vals])


def finite_float(value: str) -> float:
    """float() that refuses nan/inf (an aggregate typo must not poison every weight)."""
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{value!r} is not a finite number")
    return out


def instance_uuids_overlap(host_state: HostView, uuids: str | Iterable[str]) -> bool:
    """True if any of ``uuids`` (a uuid or a list) is on the host."""
    if isinstance(uuids, str):
        uuids = [uuids]
    return not host_state.instances.isdisjoint(uuids)


def hint_list(value: Any) -> list[str]:
    """A scheduler hint as a list of strings (nova accepts a bare string or a list)."""
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)]
