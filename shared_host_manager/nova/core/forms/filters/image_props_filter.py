"""The vector form of nova's ImagePropertiesFilter (``nova/scheduler/filters/image_props_filter.py``).

Engaged only when the image sets one of the checked properties (architecture, counting
nova's default architecture in, hypervisor type, VM mode).  nova's own class runs once per
distinct (supported instances, hypervisor version, CPU info), on one host of each group;
the engagement depends on the filter's default architecture as well as on the request.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from nova.scheduler.filters import image_props_filter

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import (
    FilterAnswer,
    FilterForm,
    IntArray,
    grouped,
    option,
    runs,
)


def _checked_image(f: Any, spec: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    """The image properties, and the three ImagePropertiesFilter checks (nova's default
    architecture counted in): none set, the filter passes every host."""
    from nova.objects import fields

    props = spec.image.properties if spec.image else {}
    return props, (fields.Architecture.canonicalize(props.get(
        "hw_architecture", f._get_default_architecture())),
        fields.HVType.canonicalize(props.get("img_hv_type")),
        fields.VMMode.canonicalize(props.get("hw_vm_mode")))


def _image_keys(f: Any, spec: Any) -> Hashable:
    """What ImagePropertiesFilter reads of the request: the checked properties (the default
    architecture counted in), the requested hypervisor version, the address bits."""
    props, checked = _checked_image(f, spec)
    return checked, props.get("img_hv_requested_version"), props.get("hw_maxphysaddr_bits")


def _default_architecture(f: Any) -> Any:
    """nova's ``f._get_default_architecture()`` (a form runs for nova's class as shipped
    only), read by item: it is asked on every decision."""
    return option("filter_scheduler", "image_properties_default_architecture")


def _image_props(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    key = rows.derived((type(f), _default_architecture(f)), lambda: _image_keys(f, spec))
    return grouped(f, rows, idx, spec, "image", lambda t: repr((
        t.attrs["supported_instances"], t.attrs["hypervisor_version"], t.attrs["cpu_info"])),
        key)


FORMS = (FilterForm(image_props_filter.ImagePropertiesFilter, _image_props,
                    engaged=lambda f, spec: runs(f, spec) and any(_checked_image(f, spec)[1]),
                    # counted in when the image has none
                    engaged_by=_default_architecture),)
