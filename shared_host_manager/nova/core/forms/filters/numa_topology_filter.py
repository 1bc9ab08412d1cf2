"""The vector form of nova's NUMATopologyFilter (``nova/scheduler/filters/numa_topology_filter.py``).

Without a requested NUMA topology, only nova's CPU policy check runs, once per distinct
(host has a NUMA topology, it has threads); with one, the NUMA fit per host and candidate
is nova's class per host.
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.filters import numa_topology_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    once_per_group,
    runs,
)


def _numa(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    if spec.numa_topology:
        return None  # a NUMA fit per host and candidate: nova's class
    extra_specs = spec.flavor.extra_specs
    image_props = spec.image.properties
    ids = rows.value_ids("numa_policy", lambda t: (bool(t.attrs["numa_topology"]), bool(
        t.attrs["numa_topology"].has_threads) if t.attrs["numa_topology"] else None))
    return once_per_group(idx, ids, lambda row: f._satisfies_cpu_policy(
        rows.host(row), extra_specs, image_props))


FORMS = (FilterForm(numa_topology_filter.NUMATopologyFilter, _numa, engaged=runs),)
