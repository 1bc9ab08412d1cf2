"""The nova-compute side: every ComputeNode the ResourceTracker persists becomes document ops.

Where it hooks
--------------
nova 34 persists a compute node in ``ResourceTracker._update(context,
compute_node, startup=False)``: it pushes inventory to placement, syncs the
PCI pools into ``compute_node.pci_device_pools`` and calls
``compute_node.save()`` when something changed.  Every path that changes
usage ends there (instance claims, move claims, aborts, deletions through
``update_usage``, and the ``update_available_resource`` periodic task), always
under the tracker's ``COMPUTE_RESOURCE_SEMAPHORE`` -- but not always last:
``_drop_move_claim`` persists the node, then forgets the moved instance.  So
:func:`install` wraps ``_update`` to *mark* the node, and every public method of
the tracker to publish the marked nodes when the outermost one returns, i.e.
once the tracker's change is complete (design §2, §5.5); an ``_update`` called
outside any public method publishes at once.  Publishing is
:meth:`ComputeHook.report`: it builds the node's document
(:func:`~shared_host_manager.nova.core.document.document_from_compute_node`) from the
ComputeNode, the tracker's ``tracked_instances`` and the service state, diffs it
against the last one it built and hands the ops to the sink.  If the original
raises (placement or DB failure), nothing is published: nova's scheduler would
not see that state either.

Several computes in one process (nova's functional tests, an ironic-like compute
with many nodes): each compute host registers its own hook
(:func:`register`); a tracker feeds the hook of its host, else the one given to
:func:`install`.

Builds waiting for a slot
-------------------------
nova-compute queues a build it received behind its build slots
(``max_concurrent_builds``) before its tracker claims it; on a busy host that
can outlast a scheduler's ``claim_deadline``.  :func:`install` wraps
``ComputeManager.build_and_run_instance`` (the RPC call arriving) and
``_do_build_and_run_instance`` (the build, run in its slot) so the node's
``builds`` namespace lists every build received and not finished; a scheduler
keeps its pending claim of a listed instance past the deadline until the
tracker counts the instance (the claim is included) or the build ends without
it (the claim then expires by the clock; design §5.5).

:func:`install` also wraps ``ComputeManager.set_host_enabled``, which the API
calls when an operator disables or enables the service (nova 34 syncs the
COMPUTE_STATUS_DISABLED trait through it), so ``service.disabled`` changes at
once; ``disabled_reason``, ``forced_down`` and the host's aggregates (which
nova-compute otherwise never learns) are re-read every
``aggregate_refresh_interval`` seconds inside the same ``_update`` calls.

Claim-owned fields
------------------
The reporter's rule is that ``*_used``, ``num_instances`` and ``instances`` are
written by the arbiter when it accepts a claim, never diffed from a tracker
that may not have seen a just-accepted claim yet.  In a nova deployment the
ResourceTracker *is* the arbiter: it accepts an instance claim
(``instance_claim``: NUMA and PCI fit; placement already arbitrated RAM, CPU and
disk) and updates ``*_used``, ``stats`` and ``tracked_instances`` under its
semaphore, then calls ``_update`` under the same semaphore.  The document
built there therefore always includes every claim the tracker accepted, and a
later report can never erase one.  So for nova hosts:

* the hook publishes ``*_used`` and ``num_instances`` from the tracker (the
  reserved amounts split out, see :mod:`.document`), and ``instances`` =
  ``tracked_instances`` — the instances whose usage ``*_used`` includes;
* the reporter's own arbiter (``handle_claim``) is not used: no Claim is
  sent to it; the build request travels through nova's conductor as today;
* the scheduler-side pending claim of an instance (id = its uuid, recorded by
  the SharedHostManager) stops being subtracted in the very delta that adds
  the instance to ``instances``, because usage and instance list change in
  the same report.  :meth:`ComputeHook.report` also returns those uuids as
  "claims included"; a sink with ``claims_included(source, ids)`` gets them so
  the delta can list them and retire the claims at once (the reporter's sink
  has it: :meth:`compute_reporter.manager.ReporterManager.claims_included`).
* a move (resize, cold or live migration, evacuation) is claimed on its
  destination node by the tracker's ``_move_claim``: the usage of the new
  flavor is counted and the instance joins ``tracked_migrations``, not
  ``tracked_instances`` (for a resize to the same node it is in both).  So the
  instance of each *incoming* migration a report counts for the first time is
  a "claim included" too: otherwise the scheduler's claim for the move would
  stay pending until its deadline, subtracted on top of the tracker's own
  count, and, once the move is reverted or the instance leaves the list
  (nova's ``_drop_move_claim`` discards it even when the resize stayed on the
  node), hold the destination's PCI devices and NUMA cells for nothing
  (design §5.5).

Sink
----
Anything with ``change(source, ops)``: the reporter service's tracker sink
(through :class:`NovaTracker`, the
:class:`compute_reporter.tracker.ResourceTracker` adapter), or a test double.
Sources are compute node uuids; a node the reporter was not started with
(an ironic node enrolled later) is counted and logged, not published: the
reporter has no way to add a source while running.

The contract: docs/design.md §5.5.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from protocol import hostdoc
from protocol.document import Document, Op, copy_document, diff
from shared_host_manager.nova.core import document as ndoc

LOG = logging.getLogger(__name__)


class ComputeHook:
    """Builds and diffs the documents of one nova-compute's nodes (see the module docstring).

    Thread-safe: the tracker calls it under its semaphore, the compute manager
    from RPC threads.
    """

    def __init__(self, sink: Any = None, *, cell_uuid: str | None = None,
                 reserved: ndoc.Reserved = ndoc.NO_RESERVED,
                 aggregate_refresh_interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.cell_uuid = cell_uuid
        self.reserved = reserved
        self.aggregate_refresh_interval = aggregate_refresh_interval
        self.clock = clock
        self._lock = threading.RLock()
        self._docs: dict[str, Document] = {}
        self._host_of: dict[str, str] = {}
        self._service: dict[str, dict[str, Any]] = {}
        self._aggregates: dict[str, list[Any]] = {}
        self._refreshed: dict[str, float] = {}
        #: per node, what its last report counted the usage of: ("instance", uuid) per
        #: tracked instance, ("move", uuid) per incoming migration; the "claims included" of
        #: a report are the instances of the entries new here (a resize to the same node
        #: adds a move of an instance already counted)
        self._counted: dict[str, frozenset[tuple[str, str]]] = {}
        #: per node, the builds it received and has not finished (nova's
        #: build_and_run_instance until _do_build_and_run_instance returns), published as
        #: the ``builds`` namespace: a scheduler keeps its claim of such an instance
        #: however long the build waits for a build slot (design §5.5)
        self._builds: dict[str, set[str]] = {}
        self.counters: Counter[str] = Counter()

    # -- reading (the reporter's ResourceTracker interface uses these) ----------------
    def sources(self) -> list[str]:
        with self._lock:
            return list(self._docs)

    def document(self, source: str) -> Document:
        with self._lock:
            return copy_document(self._docs[source])

    # -- input -------------------------------------------------------------------------
    def report(self, compute_node: Any, *, instances: Iterable[str] | None = None,
               moving_in: Iterable[str] = (), service: Any = None,
               aggregates: Iterable[Any] | None = None) -> tuple[list[Op], list[str]]:
        """Publish one node's state; returns (ops, instance uuids newly included).

        ``instances``: the tracker's tracked instances (None: keep the last
        ones).  ``moving_in``: the instances of the incoming migrations whose
        usage the node counts (see the module docstring).  ``service`` /
        ``aggregates``: new values for the whole host (None: keep what was last
        set for it).
        """
        source = compute_node.uuid
        host = compute_node.host
        with self._lock:
            if service is not None:
                self._service[host] = ndoc.service_namespace(service)
            if aggregates is not None:
                self._aggregates[host] = list(aggregates)
            old = self._docs.get(source)
            if instances is None:
                instances = (old or {}).get(hostdoc.INSTANCES, {})
            instances = sorted(instances)
            doc = ndoc.document_from_compute_node(
                compute_node, instances=instances, aggregates=self._aggregates.get(host, ()),
                cell_uuid=self.cell_uuid, reserved=self.reserved)
            doc[hostdoc.SERVICE] = dict(self._service.get(host) or ndoc.service_namespace(None))
            _set_builds(doc, self._builds.get(source))
            self._host_of[source] = host
            counted = frozenset([*(("instance", u) for u in instances),
                                 *(("move", u) for u in moving_in)])
            before = self._counted.get(source, frozenset())
            self._counted[source] = counted
            return self._publish(source, old, doc, sorted({u for _, u in counted - before}))

    def building(self, host: str, nodename: str | None, instance: str, received: bool) -> None:
        """A build of ``instance`` for ``host``'s node ``nodename`` was received (``received``)
        or has finished, built or not: the node's ``builds`` namespace changes at once."""
        with self._lock:
            sources = self._sources_of(host)
            if nodename is not None:
                sources = [s for s in sources
                           if (self._docs[s].get(hostdoc.COMPUTE) or {}).get("nodename") == nodename]
            if len(sources) != 1:
                self.counters["builds_unknown_node"] += 1
                return
            source = sources[0]
            builds = self._builds.setdefault(source, set())
            if received:
                builds.add(instance)
            else:
                builds.discard(instance)
            old = self._docs[source]
            doc = copy_document(old)
            _set_builds(doc, builds)
            self._publish(source, old, doc)

    def set_service(self, host: str, **fields: Any) -> None:
        """Change the service state of every node of ``host`` (disabled, disabled_reason, forced_down)."""
        with self._lock:
            ns = dict(self._service.get(host) or ndoc.service_namespace(None))
            ns.update({k: v for k, v in fields.items() if v is not None})
            for k in [k for k, v in fields.items() if v is None]:
                ns.pop(k, None)
            self._service[host] = ns
            for source in self._sources_of(host):
                doc = copy_document(self._docs[source])
                doc[hostdoc.SERVICE] = dict(ns)
                self._publish(source, self._docs[source], doc)

    def set_aggregates(self, host: str, aggregates: Iterable[Any]) -> None:
        """Replace the aggregates of every node of ``host`` (nova Aggregate objects)."""
        with self._lock:
            aggs = list(aggregates)
            self._aggregates[host] = aggs
            ns = {agg.uuid: ndoc.aggregate_entry(agg) for agg in aggs}
            for source in self._sources_of(host):
                doc = copy_document(self._docs[source])
                if ns:
                    doc[hostdoc.AGGREGATES] = dict(ns)
                else:
                    doc.pop(hostdoc.AGGREGATES, None)
                self._publish(source, self._docs[source], doc)

    def set_cell(self, cell_uuid: str) -> None:
        """The cell of this compute's nodes, learnt after they were first published."""
        with self._lock:
            self.cell_uuid = cell_uuid
            for source, old in list(self._docs.items()):
                doc = copy_document(old)
                doc[hostdoc.COMPUTE] = dict(doc.get(hostdoc.COMPUTE) or {}, cell_uuid=cell_uuid)
                self._publish(source, old, doc)

    def forget(self, source: str) -> None:
        """A node the tracker no longer reports (deleted); its document stays as last published."""
        with self._lock:
            self._docs.pop(source, None)
            self._host_of.pop(source, None)
            self._counted.pop(source, None)
            self._builds.pop(source, None)

    def knows_service(self, host: str) -> bool:
        with self._lock:
            return host in self._service

    def _sources_of(self, host: str) -> list[str]:
        return [s for s, h in self._host_of.items() if h == host]

    def _publish(self, source: str, old: Document | None, doc: Document,
                 included: list[str] | None = None) -> tuple[list[Op], list[str]]:
        """Hand the ops from ``old`` to ``doc`` to the sink, and ``included`` (instances whose
        usage ``doc`` counts for the first time) as claims included."""
        ops = diff(old or {}, doc)
        self._docs[source] = doc
        included = included or []
        sink = self.sink
        if not (ops or included) or sink is None:
            return ops, included
        try:
            if ops:
                sink.change(source, ops)
                self.counters["changes"] += 1
            claims_included = getattr(sink, "claims_included", None)
            if included and claims_included is not None:
                # even without ops: a move whose usage the node counted already (a zero-size
                # flavor) must not leave its claim pending until the deadline
                claims_included(source, included)
        except KeyError:
            self.counters["unknown_source"] += 1
            LOG.warning("compute node %s is not served by the reporter (enrolled after it "
                        "started?); restart nova-compute to publish it", source)
        except Exception:  # publishing must never break nova's resource tracking
            self.counters["sink_errors"] += 1
            LOG.exception("publishing the state of compute node %s failed", source)
        return ops, included

    # -- periodic refresh of what nova-compute does not learn by itself ----------------
    def refresh_due(self, host: str) -> bool:
        if self.aggregate_refresh_interval <= 0:
            return False
        with self._lock:
            last = self._refreshed.get(host)
            now = self.clock()
            if last is not None and now - last < self.aggregate_refresh_interval:
                return False
            self._refreshed[host] = now
            return True


class NovaTracker:
    """The :class:`compute_reporter.tracker.ResourceTracker` face of a :class:`ComputeHook`.

    ``hosts()`` and ``document()`` are read when the reporter starts (after
    nova-compute's first ``update_available_resource``); then the hook feeds
    the reporter's sink.
    """

    def __init__(self, hook: ComputeHook) -> None:
        self.hook = hook

    def hosts(self) -> list[str]:
        return self.hook.sources()

    def document(self, source: str) -> Document:
        return self.hook.document(source)

    def start(self, sink: Any) -> None:
        self.hook.sink = sink

    def stop(self) -> None:
        self.hook.sink = None


# -- wiring into nova-compute -------------------------------------------------------------
#
# Which hook a tracker feeds: the one registered for its host (a process may run several
# nova-computes, each with its own hook and reporter: nova's functional tests do, and so
# does :class:`shared_host_manager.nova.fixtures.SharedHostManagerFixture`), else the one
# given to install() (nova-compute-shared: one compute per process).

_installed: dict[str, Any] = {}
_hooks: dict[str, ComputeHook] = {}
_default: list[ComputeHook] = []
_local = threading.local()


def register(host: str, hook: ComputeHook) -> None:
    """Route the trackers of nova-compute ``host`` to ``hook``."""
    _hooks[host] = hook


def unregister(host: str) -> ComputeHook | None:
    return _hooks.pop(host, None)


def hook_for(host: str) -> ComputeHook | None:
    """The hook the tracker of ``host`` feeds (None: no hook; nothing is published)."""
    hook = _hooks.get(host)
    if hook is None and _default:
        hook = _default[0]
    return hook


def _publish(rt: Any, context: Any, dirty: dict[str, Any]) -> None:
    """Publish the nodes a finished tracker call persisted, as the tracker now holds them."""
    from nova import objects

    hook = hook_for(getattr(rt, "host", None) or "")
    if hook is None:
        return
    for compute_node in dirty.values():
        try:
            service = None
            aggregates = None
            host = compute_node.host
            if hook.refresh_due(host):
                try:
                    service = objects.Service.get_by_compute_host(context, host)
                    aggregates = objects.AggregateList.get_by_host(context, host)
                except Exception as exc:  # the conductor is down: publish what we have
                    LOG.debug("cannot refresh service/aggregates of %s: %s", host, exc)
            if service is None and not hook.knows_service(host):
                service = getattr(rt, "service_ref", None)
            hook.report(compute_node, instances=set(rt.tracked_instances),
                        moving_in=_moving_in(rt, compute_node), service=service,
                        aggregates=aggregates)
        except Exception:  # never break the resource tracker
            LOG.exception("shared host manager hook failed for compute node %s",
                          getattr(compute_node, "uuid", "?"))


def _moving_in(rt: Any, compute_node: Any) -> list[str]:
    """The instances of the migrations into ``compute_node`` whose usage the tracker counts
    (nova's ``_update_usage_from_migration``: incoming means this host and this node are
    the migration's destination; a resize to the same node is incoming too)."""
    node = compute_node.hypervisor_hostname
    return [uuid for uuid, migration in (getattr(rt, "tracked_migrations", None) or {}).items()
            if _field(migration, "dest_compute") == compute_node.host
            and _field(migration, "dest_node") == node]


def _field(obj: Any, name: str) -> Any:
    """A field of a nova object, None when it is not set (nova raises then, and one unset
    field must not keep the node's report from being published)."""
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - NotImplementedError / ObjectActionError of an unset field
        return None


def install(hook: ComputeHook | None = None, *, resource_tracker_cls: Any = None,
            compute_manager_cls: Any = None) -> None:
    """Feed the registered hooks (and ``hook``, for any host) from nova-compute.

    Publishes when a tracker's change is *complete*: ``ResourceTracker._update``
    only marks the node it persisted, and the outermost public tracker method
    publishing it when it returns (so ``_drop_move_claim``, which persists
    before it discards the instance, publishes the instance gone, design §2).
    A ``_update`` outside any public method publishes at once.  Also wraps
    ``ComputeManager.set_host_enabled``.  Idempotent; :func:`uninstall`
    restores the originals.
    """
    if resource_tracker_cls is None:
        from nova.compute.resource_tracker import ResourceTracker
        resource_tracker_cls = ResourceTracker
    if compute_manager_cls is None:
        from nova.compute.manager import ComputeManager
        compute_manager_cls = ComputeManager

    uninstall()
    _default[:] = [hook] if hook is not None else []
    original_update = resource_tracker_cls._update
    original_enabled = compute_manager_cls.set_host_enabled

    def _update(rt: Any, context: Any, compute_node: Any, startup: bool = False) -> Any:
        result = original_update(rt, context, compute_node, startup=startup)
        calls = getattr(_local, "calls", None)
        if calls:
            # inside a public tracker method: published when it returns, complete
            calls[-1][1][compute_node.uuid] = compute_node
            calls[-1][2].append(context)
        else:
            _publish(rt, context, {compute_node.uuid: compute_node})
        return result

    def complete(name: str, method: Any) -> Any:
        def wrapper(rt: Any, *args: Any, **kwargs: Any) -> Any:
            calls = getattr(_local, "calls", None)
            if calls is None:
                calls = _local.calls = []
            outermost = not calls
            calls.append((rt, {}, []))
            try:
                return method(rt, *args, **kwargs)
            finally:
                _, dirty, contexts = calls.pop()
                if dirty:
                    if outermost:
                        _publish(rt, contexts[-1], dirty)
                    else:
                        calls[-1][1].update(dirty)
                        calls[-1][2].extend(contexts)
        wrapper.__name__ = name
        wrapper.__doc__ = method.__doc__
        wrapper.__wrapped__ = method  # type: ignore[attr-defined]  # functools.wraps' marker, set by hand
        return wrapper

    def set_host_enabled(manager: Any, context: Any, enabled: bool) -> Any:
        result = original_enabled(manager, context, enabled)
        try:
            target = hook_for(manager.host)
            if target is not None:
                target.set_service(manager.host, disabled=not enabled,
                                   disabled_reason=None if enabled else "disabled through the API")
        except Exception:
            LOG.exception("shared host manager hook failed on set_host_enabled")
        return result

    _update.__wrapped__ = original_update  # type: ignore[attr-defined]  # functools.wraps' marker, set by hand
    set_host_enabled.__wrapped__ = original_enabled  # type: ignore[attr-defined]  # functools.wraps' marker, set by hand
    publics = {name: value for name, value in vars(resource_tracker_cls).items()
               if not name.startswith("_") and inspect.isfunction(value)}
    for name, value in publics.items():
        setattr(resource_tracker_cls, name, complete(name, value))
    resource_tracker_cls._update = _update
    compute_manager_cls.set_host_enabled = set_host_enabled
    _installed["rt"] = (resource_tracker_cls, original_update, publics)
    _installed["cm"] = (compute_manager_cls, original_enabled)
    builds = {name: getattr(compute_manager_cls, name, None)
              for name in ("build_and_run_instance", "_do_build_and_run_instance")}
    if all(builds.values()):
        compute_manager_cls.build_and_run_instance = _builds_wrapper(
            builds["build_and_run_instance"], True)
        compute_manager_cls._do_build_and_run_instance = _builds_wrapper(
            builds["_do_build_and_run_instance"], False)
        _installed["builds"] = (compute_manager_cls, builds)


def _set_builds(doc: Document, builds: set[str] | None) -> None:
    if builds:
        doc[hostdoc.BUILDS] = {instance: {} for instance in sorted(builds)}
    else:
        doc.pop(hostdoc.BUILDS, None)


def _builds_wrapper(original: Any, received: bool) -> Any:
    """``original`` (a ComputeManager build method) telling the host's hook that the build
    of its ``instance`` for its ``node`` was received, or (``received`` False) has finished,
    when it returns or raises."""
    signature = inspect.signature(original)

    def tell(manager: Any, args: tuple[Any, ...], kwargs: dict[str, Any], now: bool) -> None:
        try:
            target = hook_for(manager.host)
            arguments = signature.bind_partial(manager, *args, **kwargs).arguments
            instance = arguments.get("instance")
            uuid = getattr(instance, "uuid", None)
            if target is not None and uuid:
                target.building(manager.host, arguments.get("node"), uuid, now)
        except Exception:  # the build must never fail for the hook
            LOG.exception("shared host manager hook failed on %s", original.__name__)

    def wrapper(manager: Any, *args: Any, **kwargs: Any) -> Any:
        if received:
            tell(manager, args, kwargs, True)
            try:
                return original(manager, *args, **kwargs)
            except BaseException:
                tell(manager, args, kwargs, False)  # refused before it was queued
                raise
        try:
            return original(manager, *args, **kwargs)
        finally:
            tell(manager, args, kwargs, False)

    functools.update_wrapper(wrapper, original)  # nova's markers (rpc tracking) included
    return wrapper


def uninstall() -> None:
    if "rt" in _installed:
        cls, original, publics = _installed.pop("rt")
        cls._update = original
        for name, value in publics.items():
            setattr(cls, name, value)
    if "cm" in _installed:
        cls, original = _installed.pop("cm")
        cls.set_host_enabled = original
    if "builds" in _installed:
        cls, builds = _installed.pop("builds")
        for name, value in builds.items():
            setattr(cls, name, value)
    _default[:] = []


__all__ = ["ComputeHook", "NovaTracker", "hook_for", "install", "register", "uninstall",
           "unregister"]
