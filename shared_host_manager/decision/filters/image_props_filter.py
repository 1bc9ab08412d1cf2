"""ImagePropertiesFilter: the host supports the image's architecture, hypervisor type and vm mode.

nova 34 semantics: the image properties ``hw_architecture`` (or the
``image_properties_default_architecture`` option), ``img_hv_type`` and
``hw_vm_mode`` are canonicalised; if none is set every host passes.  Otherwise
the host must advertise a ``supported_instances`` entry ``[arch, hv_type,
vm_mode]`` containing each requested value, and if the image sets
``img_hv_requested_version`` (e.g. ``">=6.0,<6.2"``) the host's
``hypervisor_version`` (nova's integer form, 6001000 = 6.1.0) must satisfy it.

Depends only on (supported_instances, hypervisor_version), so the fast path
evaluates it once per distinct capability set.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HasCapabilities
from shared_host_manager.decision.index import CAPABILITY_GROUPS, PASS_ALL, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView

_ARCH_ALIASES = {"i386": "i686", "i486": "i686", "i586": "i686", "x86_32": "i686",
                 "x86_32p": "i686", "amd64": "x86_64"}
_HV_ALIASES = {"xapi": "xen"}
_VM_MODE_ALIASES = {"pv": "xen", "hv": "hvm", "baremetal": "hvm"}

_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}
_CLAUSE = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(\d+(?:\.\d+)*)\s*$")


def _canon(value: Any, aliases: Mapping[str, str]) -> str | None:
    """nova's fields.*.canonicalize: lower case, legacy aliases mapped (unknown names kept)."""
    if not value:
        return None
    name = str(value).lower()
    return aliases.get(name, name)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (3 - len(parts)) if len(parts) < 3 else parts


def version_int_to_tuple(version: int) -> tuple[int, ...]:
    """nova's versionutils.convert_version_to_str, as a tuple: 6001000 -> (6, 1, 0)."""
    numbers: list[int] = []
    while version:
        numbers.insert(0, version % 1000)
        version //= 1000
    return _version_tuple(".".join(map(str, numbers))) if numbers else (0, 0, 0)


def version_satisfies(version: tuple[int, ...], predicate: str) -> bool:
    """distutils VersionPredicate semantics for ">=6.0,<6.2"-style strings; bad text fails."""
    for clause in predicate.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            return False
        if not _CMP[m.group(1)](version, _version_tuple(m.group(2))):
            return False
    return True


class ImagePropertiesFilter(BaseHostFilter):
    """Filter compute nodes that satisfy the image's architecture, hypervisor and vm mode."""

    run_filter_once_per_request = True
    RUN_ON_REBUILD = True

    def _checked(self, image_props: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
        arch = image_props.get("hw_architecture", self.config.image_properties_default_architecture)
        return (_canon(arch, _ARCH_ALIASES), _canon(image_props.get("img_hv_type"), _HV_ALIASES),
                _canon(image_props.get("hw_vm_mode"), _VM_MODE_ALIASES))

    def active(self, spec_obj: RequestView) -> bool:
        return any(self._checked(spec_obj.image_properties or {}))

    def _instance_supported(self, host_state: HasCapabilities, image_props: Mapping[str, Any]) -> bool:
        checked = self._checked(image_props)
        if not any(checked):
            return True
        supp_instances = host_state.supported_instances
        if not supp_instances:
            return False
        hypervisor_version = host_state.hypervisor_version
        required = image_props.get("img_hv_requested_version")
        for supp_inst in supp_instances:
            if all(not p or p in supp_inst for p in checked):
                if not (hypervisor_version and required):
                    return True
                if version_satisfies(version_int_to_tuple(hypervisor_version), str(required)):
                    return True
        return False

    def host_passes(self, host_state: HasCapabilities, spec_obj: RequestView) -> bool:
        return self._instance_supported(host_state, spec_obj.image_properties or {})

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        props = spec_obj.image_properties or {}
        checked = self._checked(props)
        if not any(checked):
            return PASS_ALL
        key = (self.name, checked, str(props.get("img_hv_requested_version") or ""))
        return index.group_mask(CAPABILITY_GROUPS, key,
                                lambda stub: self._instance_supported(stub, props))
