"""Grouping data-plane items of many sources into :class:`~protocol.messages.Batch` messages.

A reporter process serving many hosts (or one busy host) turns the deltas,
snapshots and heartbeats its source machines emit during one coalescing window
into as few broker messages as the size limit allows: batching is how the
stream scales to 10 000 sources.  Pure: the caller decides when a window ends.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.messages import Batch, DataItem, Delta, Snapshot

#: items per batch; a snapshot counts as many items because it is large
DEFAULT_MAX_ITEMS = 500
SNAPSHOT_WEIGHT = 20


def batches(items: Iterable[DataItem], max_items: int = DEFAULT_MAX_ITEMS) -> list[Batch]:
    """Split ``items`` (in order) into batches of bounded weight; order is preserved."""
    out: list[Batch] = []
    current: list[DataItem] = []
    weight = 0
    for item in items:
        w = SNAPSHOT_WEIGHT if type(item) is Snapshot else 1
        if current and weight + w > max_items:
            out.append(Batch(current))
            current, weight = [], 0
        current.append(item)
        weight += w
    if current:
        out.append(Batch(current))
    return out


__all__ = ["batches", "Batch", "Delta"]
