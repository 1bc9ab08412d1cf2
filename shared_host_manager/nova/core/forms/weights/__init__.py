"""The vector forms of nova's weighers, one module per module of ``nova/scheduler/weights/``.

Role
----
Collects the :class:`~..base.WeigherForm` each module declares into :data:`FORMS` (nova's
class -> its form), which :mod:`...vector` runs: a class of nova's without an entry, or a
subclass, runs as nova's own class over every host.  A new form: a module named after
nova's, with ``FORMS``, listed in :data:`MODULES`.
"""

from __future__ import annotations

from shared_host_manager.nova.core.forms.base import WeigherForm
from shared_host_manager.nova.core.forms.weights import (
    affinity,
    compute,
    cpu,
    cross_cell,
    disk,
    hypervisor_version,
    image_props,
    io_ops,
    metrics,
    num_instances,
    pci,
    ram,
)

#: the form modules, in the order their classes are registered
MODULES = (ram, disk, cpu, io_ops, num_instances, compute, hypervisor_version, pci, cross_cell,
           affinity, image_props, metrics)

#: nova weigher class -> its vector form (exact class only: subclasses run as themselves)
FORMS: dict[type, WeigherForm] = {form.cls: form for module in MODULES for form in module.FORMS}
