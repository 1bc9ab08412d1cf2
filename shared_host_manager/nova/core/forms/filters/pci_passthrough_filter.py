"""The vector form of nova's PciPassthroughFilter
(``nova/scheduler/filters/pci_passthrough_filter.py``).

Engaged only by a request with PCI requests; then nova's class per host, on its
allocation candidates.  Every other request leaves it out.
"""

from __future__ import annotations

from typing import Any

from nova.scheduler.filters import pci_passthrough_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FilterAnswer, FilterForm, IntArray, runs


def _pci(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    return None  # PCI devices asked for: nova's class per host, on its candidates


FORMS = (FilterForm(pci_passthrough_filter.PciPassthroughFilter, _pci,
                    engaged=lambda f, spec: runs(f, spec) and bool(spec.pci_requests)
                    and bool(spec.pci_requests.requests)),)
