"""The vector forms of nova's filters, one module per module of ``nova/scheduler/filters/``.

Role
----
Collects the :class:`~..base.FilterForm` each module declares into :data:`FORMS` (nova's
class -> its form), which :mod:`...vector` runs: a class of nova's without an entry, or a
subclass, runs as nova's own class, per host.  A new form: a module named after nova's,
with ``FORMS``, listed in :data:`MODULES`.
"""

from __future__ import annotations

from shared_host_manager.nova.core.forms.base import FilterForm
from shared_host_manager.nova.core.forms.filters import (
    affinity_filter,
    aggregate_image_properties_isolation,
    aggregate_instance_extra_specs,
    aggregate_multitenancy_isolation,
    all_hosts_filter,
    compute_capabilities_filter,
    compute_filter,
    image_props_filter,
    io_ops_filter,
    isolated_hosts_filter,
    json_filter,
    metrics_filter,
    num_instances_filter,
    numa_topology_filter,
    pci_passthrough_filter,
    type_filter,
)

#: the form modules, in the order their classes are registered
MODULES = (
    compute_filter, compute_capabilities_filter, image_props_filter, affinity_filter,
    aggregate_instance_extra_specs, aggregate_image_properties_isolation,
    aggregate_multitenancy_isolation, type_filter, num_instances_filter, io_ops_filter,
    isolated_hosts_filter, json_filter, metrics_filter, all_hosts_filter, numa_topology_filter,
    pci_passthrough_filter,
)

#: nova filter class -> its vector form (exact class only: subclasses run as themselves)
FORMS: dict[type, FilterForm] = {form.cls: form for module in MODULES for form in module.FORMS}
