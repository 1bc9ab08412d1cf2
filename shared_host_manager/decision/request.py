"""What a scheduling request asks for (RequestSpec) and the per-request view of it (RequestView).

Role
----
:class:`RequestSpec` is our own, plain-data counterpart of nova's RequestSpec
object: flavor, image properties, project, instance uuids, server group,
scheduler hints, ignore/force hosts and availability zone.  The service layer
builds it from whatever the caller sent; the decision path never mutates it.

:class:`RequestView` is the per-request scratch nova keeps by mutating the
spec and the HostStates during a multi-instance request
(``_consume_selected_host``: the group's ``hosts`` grows, the host's
``instances`` gains a stub, its free resources shrink).  Here that scratch
lives in the RequestView — never in the receiver's documents or the columnar
index, which other requests share.

Life cycle of a RequestView::

    RequestView(spec, world)          group members/hosts derived once from the world
      for each instance:
        begin(i, uuid)                filters see instance_uuid = the one being placed
        consume(source, host, ...)    scratch: resources, instance stub, group host
      claims registered -> view dropped (the pending ledger now carries the consumption)

Filters receive the RequestView as nova's ``spec_obj``: it answers the same
attribute names (``flavor``, ``project_id``, ``instance_group``,
``get_scheduler_hint``...), plus :meth:`memo` for per-request derived data
(e.g. the hosts near a volume) and :attr:`world` for foreign sources.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from shared_host_manager.decision.hostview import Consumption

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Flavor:
    vcpus: int = 1
    memory_mb: int = 512
    root_gb: int = 0
    ephemeral_gb: int = 0
    swap: int = 0  # MB, as nova
    extra_specs: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class InstanceGroup:
    """A server group: ``policy`` is "affinity" or "anti-affinity" (nova's soft policies are weighers)."""

    policy: str
    members: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    rules: Mapping[str, Any] = field(default_factory=dict)
    uuid: str = ""

    @property
    def policies(self) -> list[str]:
        """nova's legacy list form of ``policy``."""
        return [self.policy] if self.policy else []

    @property
    def max_server_per_host(self) -> int:
        """Members an anti-affinity group allows per host (its rule, default 1; a rule that
        is no number counts as 1): what a claim asks the compute node to hold the group to."""
        rules = self.rules
        if rules and "max_server_per_host" in rules:
            try:
                return int(rules["max_server_per_host"])
            except (TypeError, ValueError):
                return 1
        return 1


@dataclass(slots=True)
class RequestSpec:
    """One scheduling request (see module docstring); plain data, never mutated by the scheduler."""

    flavor: Flavor = field(default_factory=Flavor)
    #: image properties as nova's ImageMetaProps names them (hw_architecture, img_hv_type, ...)
    image_properties: Mapping[str, Any] = field(default_factory=dict)
    project_id: str = ""
    user_id: str = ""
    instance_uuids: Sequence[str] = ()
    #: used when instance_uuids is empty (nova's num_instances)
    num_instances: int = 1
    instance_group: InstanceGroup | None = None
    #: nova's scheduler_hints: {name: [values]} (a bare value is accepted too)
    scheduler_hints: Mapping[str, Any] = field(default_factory=dict)
    ignore_hosts: Sequence[str] = ()
    force_hosts: Sequence[str] = ()
    force_nodes: Sequence[str] = ()
    availability_zone: str | None = None
    #: boot from volume: the root disk is not on the host (nova's is_bfv)
    is_bfv: bool = False
    #: extra resource classes (e.g. {"vgpu": 1}), checked with the same fit rule
    extra_resources: Mapping[str, int] = field(default_factory=dict)
    request_id: str = ""
    #: opaque, JSON-like build request sent to the compute node with each claim
    build_request: Mapping[str, Any] = field(default_factory=dict)

    def get_scheduler_hint(self, hint_name: str, default: Any = None) -> Any:
        """nova's RequestSpec.get_scheduler_hint: a one-element list is returned as its element."""
        hints = self.scheduler_hints
        if not hints:
            return default
        value = hints.get(hint_name, default)
        if isinstance(value, list) and len(value) == 1:
            return value[0]
        return value

    @property
    def instance_uuid(self) -> str | None:
        return self.instance_uuids[0] if self.instance_uuids else None

    @property
    def resources(self) -> dict[str, int]:
        """Resource classes and amounts one instance claims (nova's resources_from_flavor)."""
        f = self.flavor
        disk = (0 if self.is_bfv else f.root_gb) + f.ephemeral_gb + math.ceil(f.swap / 1024)
        out = {"vcpus": f.vcpus, "memory_mb": f.memory_mb, "disk_gb": disk}
        for resource, amount in self.extra_resources.items():
            out[resource] = out.get(resource, 0) + amount
        return out


class World(Protocol):
    """What a request may ask about sources other than the host being filtered."""

    def hosts_of_instances(self, uuids: Iterable[str]) -> list[str]:
        """Host names of the hosts holding any of ``uuids`` (reported or pending)."""
        ...

    def members_of_group(self, uuid: str) -> list[str]:
        """The instances of server group ``uuid`` on any host, sorted: recorded with the
        group, or pending with a claim carrying it (listed by the request or not)."""
        ...

    def volume_hosts(self, volume_id: str) -> frozenset[str] | None:
        """Hosts local to the volume backend(s) holding ``volume_id``; None if no source holds it."""
        ...


class RequestView:
    """Per-request scratch and nova-compatible spec face; see the module docstring."""

    __slots__ = ("spec", "world", "instance_group", "instance_uuid", "index", "consumed",
                 "chosen", "_memo", "resources", "candidates", "candidate_rows")

    def __init__(self, spec: RequestSpec, world: World, uuids: Sequence[str] = ()) -> None:
        self.spec = spec
        self.world = world
        self.resources = spec.resources
        group = spec.instance_group
        if group is not None:
            # nova's API makes the instances of the request members of their group, and
            # the conductor fills group.hosts from the members' hosts; we derive the hosts
            # from the instances namespaces (and the pending claims) instead of a database.
            # Members are those listed and those found by the group's uuid: a member placed
            # a moment ago may not be listed yet (design §5.4)
            found = world.members_of_group(group.uuid) if group.uuid else []
            members = list(dict.fromkeys([*group.members, *found,
                                          *(uuids or spec.instance_uuids)]))
            hosts = list(dict.fromkeys([*group.hosts, *world.hosts_of_instances(members)]))
            self.instance_group: InstanceGroup | None = InstanceGroup(
                group.policy, members, hosts, dict(group.rules), group.uuid)
        else:
            self.instance_group = None
        self.instance_uuid: str | None = uuids[0] if uuids else spec.instance_uuid
        self.index = 0
        self.consumed: dict[str, Consumption] = {}
        self.chosen: list[str] = []
        self._memo: dict[str, Any] = {}
        #: on the fast path, while a filter's vector form is asked: the index rows the
        #: filters before it left (a bool per row); a form may answer for these alone, as
        #: nova's handler asks each filter about the survivors only
        self.candidates: Any = None
        #: the row numbers of ``candidates`` once a form asked for them (None: not yet, or
        #: a filter narrowed the candidates since); see :meth:`candidate_row_numbers`
        self.candidate_rows: Any = None

    # -- nova spec_obj face --------------------------------------------------------
    @property
    def flavor(self) -> Flavor:
        return self.spec.flavor

    @property
    def image_properties(self) -> Mapping[str, Any]:
        return self.spec.image_properties

    @property
    def project_id(self) -> str:
        return self.spec.project_id

    @property
    def scheduler_hints(self) -> Mapping[str, Any]:
        return self.spec.scheduler_hints

    @property
    def availability_zone(self) -> str | None:
        return self.spec.availability_zone

    def get_scheduler_hint(self, hint_name: str, default: Any = None) -> Any:
        return self.spec.get_scheduler_hint(hint_name, default)

    # -- scratch -------------------------------------------------------------------
    def begin(self, index: int, instance_uuid: str) -> None:
        """Start placing instance ``index`` (nova sets spec_obj.instance_uuid per instance)."""
        self.index = index
        self.instance_uuid = instance_uuid

    def consume(self, source: str, host: str, instance_uuid: str) -> None:
        """nova's _consume_selected_host, on the request's scratch only."""
        over = self.consumed.get(source)
        if over is None:
            over = self.consumed[source] = Consumption()
        over.add(self.resources, instance_uuid)
        self.chosen.append(source)
        group = self.instance_group
        if group is not None and host not in group.hosts:
            group.hosts.append(host)

    def candidate_row_numbers(self, size: int) -> Any:
        """The row numbers of :attr:`candidates` below ``size``, found once per narrowing
        (the engine clears :attr:`candidate_rows` when a filter removes rows)."""
        rows = self.candidate_rows
        if rows is None:
            rows = self.candidate_rows = np.flatnonzero(self.candidates[:size])
        return rows

    def memo(self, key: str, compute: Callable[[], _T]) -> _T:
        """Per-request cache for data a filter derives once (e.g. hosts near a volume)."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value


def plain_data(value: Any) -> Any:
    """``value`` with every dataclass in it turned into a dict tagged with its type name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__type__": type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = plain_data(getattr(value, f.name))
        return out
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


def spec_to_wire(spec: RequestSpec) -> dict[str, Any]:
    """A RequestSpec as plain msgpack-able data (dataclasses tagged with their type name): what
    update logs record and a scarce request carries to the coordinator."""
    return plain_data(spec)


def spec_from_wire(data: Mapping[str, Any]) -> RequestSpec:
    """Rebuild a RequestSpec recorded by :func:`spec_to_wire` (unknown fields are ignored)."""
    types = {"Flavor": Flavor, "InstanceGroup": InstanceGroup,
             "RequestSpec": RequestSpec}

    def build(value: Any) -> Any:
        if isinstance(value, dict):
            cls = types.get(value.get("__type__", ""))
            if cls is None:
                return {k: build(v) for k, v in value.items()}
            kwargs = {}
            for f in dataclasses.fields(cls):
                if f.name in value:
                    v = build(value[f.name])
                    default = f.default if f.default is not dataclasses.MISSING else None
                    if isinstance(v, list) and isinstance(default, tuple):
                        v = tuple(v)
                    kwargs[f.name] = v
            return cls(**kwargs)
        if isinstance(value, list):
            return [build(v) for v in value]
        return value

    return build(dict(data, __type__="RequestSpec"))


__all__ = ["Flavor", "InstanceGroup", "RequestSpec", "RequestView", "World", "plain_data",
           "spec_from_wire", "spec_to_wire"]
