"""Resource accounting shared by the arbiter (compute side) and the cache (scheduler side).

The ``compute`` namespace of a host document carries, per resource class
``r`` (``vcpus``, ``memory_mb``, ``disk_gb``, or any other integer class):

* ``r`` – the total inventory,
* ``r_used`` – what is consumed,
* ``reserved_r`` – what the host keeps for itself (optional, default 0),
* the allocation ratio: ``cpu_allocation_ratio``, ``ram_allocation_ratio``,
  ``disk_allocation_ratio`` for the three standard classes, ``r_allocation_ratio``
  otherwise (optional, default 1.0).

Usable capacity is ``(total - reserved) * ratio``, as placement computes it.
A request fits when ``used + pending + requested <= capacity`` for every class
it asks for.  The same function decides on both sides, so a scheduler's guess
and a compute node's verdict disagree only when their inputs differ.

This module also holds the range checks the codec applies to resource values,
so a peer cannot inject a negative or absurd inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.errors import FieldError, ValueRangeError
from protocol.hostdoc import COMPUTE

STANDARD_RESOURCES = ("vcpus", "memory_mb", "disk_gb")
RATIO_KEYS = {
    "vcpus": "cpu_allocation_ratio",
    "memory_mb": "ram_allocation_ratio",
    "disk_gb": "disk_allocation_ratio",
}
#: largest amount of any one resource class a host or a request may carry
MAX_AMOUNT = 2**40
MAX_RATIO = 1000.0
#: integer counters of the compute namespace that must be non-negative and bounded
_COUNTERS = frozenset(
    ["num_io_ops", "num_instances", "hypervisor_version"]
)


def ratio_key(resource: str) -> str:
    return RATIO_KEYS.get(resource) or f"{resource}_allocation_ratio"


def capacity(compute: Mapping[str, Any], resource: str) -> float | None:
    """Usable capacity of ``resource`` on a host, or None if it has none."""
    total = compute.get(resource)
    if type(total) not in (int, float):  # absent, or a non-numeric key named by a claim
        return None
    reserved = compute.get(f"reserved_{resource}", 0)
    ratio = compute.get(ratio_key(resource), 1.0)
    return (total - reserved) * ratio


def free(compute: Mapping[str, Any], resource: str, pending: float = 0) -> float:
    """Capacity left for new requests (negative when overcommitted)."""
    cap = capacity(compute, resource)
    if cap is None:
        return 0.0
    return cap - compute.get(f"{resource}_used", 0) - pending


def check_fit(
    compute: Mapping[str, Any],
    requested: Mapping[str, int],
    pending: Mapping[str, int] | None = None,
) -> str | None:
    """None when ``requested`` fits ``compute`` (minus ``pending``), else the reason."""
    for resource, amount in requested.items():
        if not amount:
            continue
        cap = capacity(compute, resource)
        if cap is None:
            return f"host has no {resource} inventory"
        used = compute.get(f"{resource}_used", 0)
        extra = pending.get(resource, 0) if pending else 0
        if used + extra + amount > cap:
            return (
                f"insufficient {resource}: requested {amount}, used {used}"
                f"{f' + pending {extra}' if extra else ''}, capacity {cap:g}"
            )
    return None


def overcommitted(compute: Mapping[str, Any]) -> list[str]:
    """Resource classes whose usage exceeds capacity (docs/design.md §6, invariant 1: never)."""
    out = []
    for key, used in compute.items():
        if key.endswith("_used"):
            resource = key[: -len("_used")]
            cap = capacity(compute, resource)
            if cap is not None and used > cap + 1e-9:
                out.append(resource)
    return out


def check_resources(value: Any, where: str) -> dict[str, int]:
    """Validate a claim's requested resources: {class: non-negative int}."""
    if type(value) is not dict:
        raise FieldError(f"{where}: resources must be a map")
    for k, v in value.items():
        if type(k) is not str or not k:
            raise FieldError(f"{where}: resource class must be a non-empty string")
        if type(v) is not int:
            raise FieldError(f"{where}: resource {k} must be an integer, got {type(v).__name__}")
        if not 0 <= v <= MAX_AMOUNT:
            raise ValueRangeError(f"{where}: resource {k}={v} is negative or absurd")
    return value


def check_namespace_entry(ns: str, key: str, value: Any, where: str) -> None:
    """Range-check the entries whose meaning the protocol knows (the compute namespace)."""
    if ns != COMPUTE:
        return
    if key.endswith("_allocation_ratio"):
        if type(value) not in (int, float) or type(value) is bool:
            raise FieldError(f"{where}: compute.{key} must be a number")
        if not 0 < value <= MAX_RATIO:
            raise ValueRangeError(f"{where}: compute.{key}={value} outside (0, {MAX_RATIO:g}]")
    elif (
        key in STANDARD_RESOURCES
        or key in _COUNTERS
        or key.endswith("_used")
        or key.startswith("reserved_")
    ):
        if type(value) is not int:
            raise FieldError(f"{where}: compute.{key} must be an integer, got {type(value).__name__}")
        if not 0 <= value <= MAX_AMOUNT:
            raise ValueRangeError(f"{where}: compute.{key}={value} is negative or absurd")
