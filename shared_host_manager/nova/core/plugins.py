"""nova's own filters and weighers as the engine's plugins, deciding through the vector core.

Role
----
The project's engine (``decision/engine.py``: ``shm sim``, ``shm bench decisions``,
``shm replay --decisions``) loads filters and weighers by name and runs them
two ways: a vector form over its incremental index, and per host on a
HostView.  :func:`load_filters` and :func:`load_weighers` give it nova 34's own
classes in both roles (design §10, item 13):

* the vector form is the drop-in's (:mod:`.vector`), over the engine's index
  through :class:`~.index_table.IndexTable`, so the engine decides with nova's
  semantics and no host object per host per decision;
* per host (the engine's slow path, hosts an earlier instance of the request
  consumed, a filter whose vector form declines this request), nova's class
  runs on a ``SharedHostState`` of the host (``index_table.host_state``), net of
  the pending claims and of the request's scratch;
* a name nova has no class for (ResourceFitFilter, AvailabilityZoneFilter,
  VolumeLocalityFilter: what placement, the API and cinder decide in nova)
  stays the engine's own filter.

The engine's request (``decision/request.py``) becomes nova's RequestSpec once
per request (:class:`_NovaRequest`, in the request's memo; requests alike but
for their instances share one, with what is kept for them all: each class's
engagement, what the forms derive from the request), updated per instance as
nova's ``_consume_selected_host`` updates it, for the readers of what is set
per instance (``vector.PER_INSTANCE``, and nova's classes per host).  A class
the request does not engage (``vector.engaged``) is left out, as the engine's
own ports leave themselves out (``active``).  Liveness: the engine's receiver
is the servicegroup (``IndexTable`` without ``now``).

Life cycle: one :class:`Shared` per loaded set (the templates outlive
decisions), one ``_NovaRequest`` per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar, TypeVar

import numpy as np
from nova import objects
from nova.scheduler import filters as nova_filters
from nova.scheduler import weights as nova_weights

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision import plugins
from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HasAggregates, HostView
from shared_host_manager.decision.index import PASS_ALL, HostIndex, VectorResult
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.weights import BaseHostWeigher
from shared_host_manager.nova.core import vector
from shared_host_manager.nova.core.index_table import (
    IndexTable,
    Templates,
    heard_by_status,
    host_state,
)

_P = TypeVar("_P")


class Shared:
    """What the nova plugins of one engine share: the templates of its hosts."""

    def __init__(self, default_cell: str | None = None) -> None:
        self.templates = Templates(default_cell)
        self.objects = _Objects()
        #: the request asked last and its nova face (its memo's, found without a look-up)
        self._last: tuple[RequestView | None, Any] = (None, None)

    def request(self, index: HostIndex | None, req: RequestView) -> _NovaRequest:
        """The request's nova face (made once per request, see the module docstring)."""
        last = self._last  # asked a dozen times per decision, for the same request
        if last[0] is req:
            nova_req: _NovaRequest = last[1]
        else:
            nova_req = req.memo("nova-core", lambda: _NovaRequest(self, req))
            self._last = (req, nova_req)
        if index is not None and nova_req.table is None:
            nova_req.table = IndexTable(index, self.templates, alike=nova_req.alike)
        return nova_req


class _NovaRequest:
    """One engine request as nova's classes read it."""

    def __init__(self, shared: Shared, req: RequestView) -> None:
        self.shared = shared
        self.req = req
        self.table: IndexTable | None = None
        #: what is kept for the requests alike (made and dropped with their shared spec):
        #: the classes' engagement (form) and what their forms derive (IndexTable.derived)
        self._spec, self.alike = shared.objects.request_spec(req)
        #: the instance being placed: (its number in the request, the group's hosts so far)
        self._for: tuple[int, int] | None = None
        #: id of a filter -> its form for the instance being placed (:meth:`form`)
        self._forms: dict[int, bool | None] = {}

    def spec(self, instance: bool = True) -> Any:
        """nova's RequestSpec for the instance being placed: its uuid and its group's hosts
        and members set.  ``instance=False``: the spec as requests alike share it, for a
        reader of none of those (they may be another request's)."""
        req = self.req
        group = req.instance_group
        key = (req.index, len(group.hosts) if group is not None else 0)
        if key != self._for:
            self._for, self._forms = key, {}
        if instance:
            made = self.shared.objects
            set_for = made.set_for.get(id(self._spec))
            if set_for is None or set_for[0] is not self or set_for[1] != key:
                # the spec is shared with earlier requests alike: set what is this instance's
                self._spec.instance_uuid = req.instance_uuid
                if group is not None:
                    self._spec.instance_group.hosts = list(group.hosts)
                    self._spec.instance_group.members = list(group.members)
                made.set_for[id(self._spec)] = (self, key)
        return self._spec

    def form(self, f: Any) -> bool | None:
        """How nova's filter ``f`` decides this instance: None, as nova's class per host (no
        vector form, or a method replaced since nova shipped it); else its vector form, and
        whether the instance engages it (False: ``f`` would pass every host).  Asked once
        per filter and instance; the engagement of a class that reads nothing set per
        instance is kept for all requests alike (``vector.engaged_key``)."""
        self.spec(instance=False)  # a new instance asks its forms again
        forms = self._forms
        if id(f) in forms:
            return forms[id(f)]
        answer: bool | None
        if type(f) not in vector.VECTOR_FILTERS or not vector.is_base_filter_all(f):
            answer = None
        else:
            key = vector.engaged_key(f)
            answer = None if key is None else self.alike.get(("engaged", key))
            if answer is None:
                # what an engagement reads per instance is its group's: without one, nothing
                answer = vector.engaged(f, self.spec(
                    key is None and self.req.instance_group is not None))
                if key is not None:
                    self.alike[("engaged", key)] = answer
        self._forms[id(f)] = answer
        return answer

    def rows(self) -> Any:
        """The rows a filter's vector form is asked about: those the filters before it left."""
        assert self.table is not None
        index = self.table.index
        if self.req.candidates is None:
            return np.flatnonzero(index.live[: index.size])
        return self.req.candidate_row_numbers(index.size)

    def host(self, hv: HostView) -> Any:
        """nova's host object of ``hv``: its pending claims and the request's scratch counted."""
        if self.table is not None:
            row = self.table.index.row_of.get(hv.uuid)
            if row is not None:
                if hv.overlay is None:
                    return self.table.host(row)
                return self.table.consumed_host(row, hv.overlay)
        view = hv.view
        tpl = self.shared.templates.of(hv.uuid, view)
        return host_state(tpl, view, heard_by_status(view, time.time()), hv.aggregates,
                          hv.overlay)


class _Objects:
    """nova's RequestSpec, Flavor and ImageMeta objects of the requests seen lately, made once
    each: nova's filters and weighers only read them, and making them costs more than a
    decision.  A RequestSpec serves every request alike but for its instances
    (:meth:`request_spec`); :attr:`set_for` says which request last set its instance."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._flavors: dict[Any, Any] = {}
        self._images: dict[Any, Any] = {}
        self._specs: dict[Any, Any] = {}
        #: id of a RequestSpec made here -> the _NovaRequest that set its instance last, and
        #: that instance (_NovaRequest._for)
        self.set_for: dict[int, tuple[Any, Any]] = {}

    def request_spec(self, req: RequestView) -> tuple[Any, dict[Hashable, Any]]:
        """nova's RequestSpec of ``req`` (see :func:`nova_spec`), shared with the earlier
        requests that differ from it in their instances only; and what is kept for those
        requests alike (made and dropped with the spec)."""
        spec = req.spec
        g = req.instance_group
        key = (_flavor_key(spec.flavor), _image_key(spec.image_properties), spec.project_id,
               spec.user_id, max(1, len(spec.instance_uuids) or spec.num_instances),
               spec.is_bfv, None if g is None else (g.policy, g.uuid, repr(sorted(
                   g.rules.items()))), repr(sorted(spec.scheduler_hints.items())),
               tuple(spec.ignore_hosts), tuple(spec.force_hosts), tuple(spec.force_nodes),
               spec.availability_zone)
        if len(self.set_for) > self.size:
            self.set_for.clear()  # bounded: a request then sets its instance again, no more
        return self._made(self._specs, key, lambda: (nova_spec(req, self), {}))

    def flavor(self, f: Any) -> Any:
        return self._made(self._flavors, _flavor_key(f), lambda: objects.Flavor(
            flavorid="shm", name="shm", memory_mb=f.memory_mb, vcpus=f.vcpus,
            root_gb=f.root_gb, ephemeral_gb=f.ephemeral_gb, swap=f.swap,
            extra_specs=dict(f.extra_specs)))

    def image(self, properties: Any) -> Any:
        return self._made(self._images, _image_key(properties),
                          lambda: objects.ImageMeta.from_dict({"properties": dict(properties)}))

    def _made(self, table: dict[Any, Any], key: Any, make: Callable[[], Any]) -> Any:
        """``table[key]``, made on a miss; at most ``size`` kept, the least recently used
        made again when asked (a RequestSpec costs about 0.4 ms to make, and a cloud's
        requests come in more shapes than a few hundred: flavors times projects times
        groups times counts)."""
        hit = table.pop(key, None)
        if hit is None:
            hit = make()
            while table and len(table) >= self.size:
                del table[next(iter(table))]
        table[key] = hit
        return hit


def _flavor_key(f: Any) -> Any:
    return (f.vcpus, f.memory_mb, f.root_gb, f.ephemeral_gb, f.swap,
            tuple(sorted(f.extra_specs.items())))


def _image_key(properties: Any) -> Any:
    return tuple(sorted((k, repr(v)) for k, v in properties.items()))


def nova_spec(req: RequestView, made: _Objects | None = None) -> Any:
    """nova's RequestSpec of an engine request, as nova's conductor would hand it over
    (``made``: where to find the Flavor and ImageMeta objects made for earlier requests)."""
    made = made or _Objects(0)
    spec = req.spec
    group = None
    g = req.instance_group
    if g is not None:
        group = objects.InstanceGroup(policy=g.policy, policies=g.policies,
                                      members=list(g.members), hosts=list(g.hosts),
                                      rules=dict(g.rules))
        if g.uuid:
            group.uuid = g.uuid
    hints = {k: (list(v) if isinstance(v, (list, tuple)) else [v])
             for k, v in spec.scheduler_hints.items()}
    return objects.RequestSpec(
        instance_uuid=req.instance_uuid, project_id=spec.project_id or None,
        user_id=spec.user_id or None, num_instances=max(1, len(spec.instance_uuids) or
                                                          spec.num_instances),
        is_bfv=spec.is_bfv,
        flavor=made.flavor(spec.flavor), image=made.image(spec.image_properties),
        numa_topology=None, pci_requests=objects.InstancePCIRequests(requests=[]),
        instance_group=group, scheduler_hints=hints, ignore_hosts=list(spec.ignore_hosts),
        force_hosts=list(spec.force_hosts), force_nodes=list(spec.force_nodes),
        requested_resources=[], availability_zone=spec.availability_zone,
        request_level_params=objects.RequestLevelParams(),
        security_groups=objects.SecurityGroupList())


class NovaFilter(BaseHostFilter):
    """One of nova's filter classes as an engine filter (see the module docstring).

    Active for every instance of a request, unlike nova's ``run_filter_for_index``: nova
    filters the previous instance's survivors, the engine ranks every instance over all
    hosts, so a once-per-request filter must decide again (with the same answers).
    """

    placement: ClassVar[bool] = False

    def __init__(self, nova_filter: Any, shared: Shared, config: SchedulerConfig | None = None
                 ) -> None:
        super().__init__(config)
        self.nova = nova_filter
        self.shared = shared
        # what only the class decides, looked up once here rather than on every decision:
        # its vector form (asked only while the class is as shipped: _NovaRequest.form),
        # and whether that form reads what is set per instance
        cls = type(nova_filter)
        self._name = cls.__name__
        self._answer = vector.VECTOR_FILTERS.get(cls)
        self._per_instance = cls in vector.PER_INSTANCE

    @property
    def name(self) -> str:
        return self._name

    def active(self, spec_obj: RequestView) -> bool:
        # a request that does not engage nova's class: it would pass every host
        return self.shared.request(None, spec_obj).form(self.nova) is not False

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        nova_req = self.shared.request(index, spec_obj)
        form = nova_req.form(self.nova)
        if not form:
            return None if form is None else PASS_ALL
        assert nova_req.table is not None and self._answer is not None  # a form: it has one
        rows = nova_req.rows()
        mask = self._answer(self.nova, nova_req.table, rows, nova_req.spec(self._per_instance))
        if mask is None or mask is PASS_ALL:
            return mask
        if mask.all():
            return PASS_ALL  # the engine keeps its candidates (and their row numbers)
        out = np.zeros(index.size, dtype=bool)
        out[rows] = mask
        return out

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        nova_req = self.shared.request(None, spec_obj)
        return bool(self.nova._filter_one(nova_req.host(host_state), nova_req.spec()))


class NovaWeigher(BaseHostWeigher):
    """One of nova's weigher classes as an engine weigher (see the module docstring)."""

    def __init__(self, nova_weigher: Any, shared: Shared, config: SchedulerConfig | None = None
                 ) -> None:
        super().__init__(config)
        self.nova = nova_weigher
        self.shared = shared
        self.minval = nova_weigher.minval
        self.maxval = nova_weigher.maxval
        # what only the class decides, looked up once here (see NovaFilter)
        cls = type(nova_weigher)
        self._name = cls.__name__
        self._raw = vector.VECTOR_WEIGHERS.get(cls)
        self._per_instance = cls in vector.PER_INSTANCE

    @property
    def name(self) -> str:
        return self._name

    @property
    def default_multiplier(self) -> float:
        return vector.default_multiplier(self.nova)  # the per-group multipliers' key

    def weight_multiplier(self, host_state: HasAggregates) -> float:
        return float(self.nova.weight_multiplier(vector.Probe(list(host_state.aggregates), "",
                                                              "")))

    def vector_weights(self, index: HostIndex, spec_obj: RequestView, rows: Any) -> Any:
        vw = self._raw
        if vw is None or not vector.is_base_weigher(self.nova):
            return None
        nova_req = self.shared.request(index, spec_obj)
        assert nova_req.table is not None
        raw = vw(self.nova, nova_req.table, np.asarray(rows, dtype=np.int64),
                 nova_req.spec(self._per_instance))
        return None if raw is None else np.asarray(raw, dtype=np.float64)

    def _weigh_object(self, host_state: HostView, weight_properties: RequestView) -> float:
        nova_req = self.shared.request(None, weight_properties)
        return float(self.nova._weigh_object(nova_req.host(host_state), nova_req.spec()))


#: options nova's classes read that the engine's configuration holds too (same names, same
#: meaning, [filter_scheduler] in both)
SHARED_OPTIONS = ("ram_weight_multiplier", "cpu_weight_multiplier", "disk_weight_multiplier",
                  "num_instances_weight_multiplier", "io_ops_weight_multiplier",
                  "max_instances_per_host", "max_io_ops_per_host",
                  "image_properties_default_architecture")


def configure(config: SchedulerConfig) -> None:
    """Have nova's classes read the engine's values of :data:`SHARED_OPTIONS` (nova reads its
    options from its own, process-wide CONF on every call)."""
    from nova import conf as nova_conf

    for name in SHARED_OPTIONS:
        nova_conf.CONF.set_override(name, getattr(config, name), group="filter_scheduler")


def _load(names: Iterable[str], config: SchedulerConfig, nova_classes: Iterable[type],
          wrap: Callable[[Any], _P], ours: Callable[[list[str], SchedulerConfig], list[_P]]
          ) -> list[_P]:
    configure(config)
    by_name = {cls.__name__: cls for cls in nova_classes}
    out: list[_P] = []
    for name in names:
        cls = by_name.get(name)
        out.append(wrap(cls()) if cls is not None else ours([name], config)[0])
    return out


def load_filters(names: Iterable[str], config: SchedulerConfig, shared: Shared
                 ) -> list[BaseHostFilter]:
    """The engine's filters for ``names``: nova's class where nova has one, else ours.
    nova's classes read ``config`` from then on (:func:`configure`)."""
    return _load(names, config, nova_filters.all_filters(),
                 lambda f: NovaFilter(f, shared, config), plugins.load_filters)


def load_weighers(names: Iterable[str], config: SchedulerConfig, shared: Shared
                  ) -> list[BaseHostWeigher]:
    """The engine's weighers for ``names``: nova's class where nova has one, else ours.
    nova's classes read ``config`` from then on (:func:`configure`)."""
    return _load(names, config, nova_weights.all_weighers(),
                 lambda w: NovaWeigher(w, shared, config), plugins.load_weighers)


def load_core(config: SchedulerConfig) -> tuple[list[BaseHostFilter], list[BaseHostWeigher]]:
    """The ``nova`` decision core (``[filter_scheduler] decision_core = nova``, entry point
    ``shm.scheduler.cores``): one engine's filters and weighers, nova's classes sharing one
    :class:`Shared`.  For the processes that run the engine (the simulator, replay, the
    benchmarks; never a nova service): nova's objects registered and an empty nova
    configuration parsed first, once per process."""
    from shared_host_manager.nova.core import nova_setup

    nova_setup.setup_nova_objects()
    shared = Shared()
    return (load_filters(config.enabled_filters, config, shared),
            load_weighers(config.weight_classes, config, shared))


__all__ = ["SHARED_OPTIONS", "NovaFilter", "NovaWeigher", "Shared", "configure", "load_core",
           "load_filters", "load_weighers", "nova_spec"]
