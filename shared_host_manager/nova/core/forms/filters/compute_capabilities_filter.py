"""The vector form of nova's ComputeCapabilitiesFilter
(``nova/scheduler/filters/compute_capabilities_filter.py``).

Engaged only by a flavor whose extra specs ask about host attributes.  nova's own class
runs once per distinct value of the attributes asked about, on one host of each group;
an attribute this scheduler's pending claims change, or one set per request, sends the
filter to nova's class per host.
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.filters import compute_capabilities_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    grouped,
    runs,
)

#: the numbers this scheduler's pending claims change (host_state.SharedHostState._make does the same)
_ADJUSTED = frozenset({"free_ram_mb", "free_disk_mb", "disk_mb_used", "vcpus_used",
                       "num_instances", "num_io_ops", "pci_free"})


def _capability_names(spec: Any) -> tuple[str, ...]:
    """The host attributes the flavor's extra specs ask ComputeCapabilitiesFilter about."""
    flavor = spec.flavor
    if "extra_specs" not in flavor:
        return ()
    tops: list[str] = []
    for key in flavor.extra_specs:
        if key == "hw:maxphysaddr_bits":
            tops.append("cpu_info")
            continue
        scope = key.split(":")
        if len(scope) == 1:
            tops.append(key)
        elif scope[0] == "capabilities" and len(scope) > 1:
            tops.append(scope[1])
    return tuple(sorted(set(tops)))


def _capabilities(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
    names, extra_specs = rows.derived(cls, lambda: (
        _capability_names(spec), tuple(sorted(spec.flavor.extra_specs.items()))))
    for name in names:
        # a number this scheduler's claims change, or a per-request attribute: per host
        if name in _ADJUSTED or rows.per_request_attribute(name):
            return None
        if name in ("limits", "allocation_candidates", "instances", "aggregates", "service",
                    "updated", "stats", "metrics", "numa_topology", "pci_stats", "host_ip"):
            return None
    # nova's class reads the flavor's extra specs of the request, nothing else
    return grouped(f, rows, idx, spec, "cap:" + ",".join(names), lambda t: repr(tuple(
        (t.attrs.get(n), t.attrs["stats"].get(n)) for n in names)), extra_specs)


FORMS = (FilterForm(compute_capabilities_filter.ComputeCapabilitiesFilter, _capabilities,
                    engaged=lambda f, spec: runs(f, spec) and bool(_capability_names(spec))),)
