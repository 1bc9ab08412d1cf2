"""The API/conductor side as a source: service state, deletions and aggregates, versioned.

Why a source of its own
-----------------------
Part of what nova's scheduler reads is not owned by any compute: an operator
disables or forces down a service, deletes a service or a compute node, and
creates or changes aggregates through nova-api, which writes the database (and
for aggregates casts ``update_aggregates`` to the schedulers).  A compute that
is stopped never learns any of it.  So the processes that make those changes
publish them, as one more source on the same stream (design §2): its document
is versioned, resynced and replayed like a host's, and every scheduler applies
it on top of the hosts' own documents.

What it publishes (namespaces named in :mod:`protocol.hostdoc`)::

    services     {host: {"disabled", "disabled_reason", "forced_down", "deleted", "changed",
                         "stamps": {field: when that field was last written}}}
    nodes        {compute node uuid: {"deleted", "changed"}}
    catalogue    {aggregate uuid: {"name", "metadata", "hosts", "id"?, "deleted"?, "changed"}}

``changed`` is the wall time of the change (``time.time()``): several API and
conductor processes may each run a source (one per process, since a source
has a single writer), and a scheduler takes, per key, the entry changed last;
for a service, per field (``stamps``).  A ``Service.save`` writes only some
fields, and each process merges them into its own copy of the entry, whose
other fields may be older than another process's writes: nova-api's workers
taking a force-down and then a disable of one host in turn would otherwise
publish, last, an entry that still says what the first worker last saw.

Where it hooks (:func:`install`): after nova's ``Service.create/save/destroy``,
``ComputeNode.create/destroy`` and the Aggregate operations succeed, i.e. in the
process that wrote the database (nova-api; nova-conductor for the remotable
ones a compute asks it to run).  Entries are only ever set, never removed, so
a late scheduler learns every deletion from the source's snapshot.

Life cycle: :class:`ApiStateSource` is a tracker for a
:class:`compute_reporter.service.ReporterService` (``hosts()``,
``document()``, ``start(sink)``, ``stop()``): the reporter publishes its changes,
heartbeats, answers resyncs, and says goodbye when it stops cleanly; its
document stays valid after that (the changes it records stay made), so
schedulers keep applying it (``SharedHostManager``, design §2).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from protocol import hostdoc
from protocol.document import SET, Document, Op, copy_document

LOG = logging.getLogger(__name__)

#: what schedulers read of a compute service record
SERVICE_FIELDS = frozenset({"disabled", "forced_down", "disabled_reason"})


class ApiStateSource:
    """One process's API-side source (see the module docstring).  Thread-safe."""

    def __init__(self, source: str, *, role: str = "nova-api",
                 wall: Callable[[], float] = time.time) -> None:
        self.source = source
        self.role = role
        self.wall = wall
        self._lock = threading.Lock()
        # known for what it is from its first message (hostdoc: ``api``), before any change
        self._doc: Document = {hostdoc.API_SOURCE: {"role": role, "started_at": time.time()}}
        self._sink: Any = None
        self.changes = 0
        #: called after a change went to the sink, in the caller's thread: returns True once
        #: the change is on the stream (the reporter's publish_now); None: do not wait
        self.confirm: Callable[[], bool] | None = None
        self.unconfirmed = 0

    # -- the reporter's tracker interface ---------------------------------------------
    def hosts(self) -> list[str]:
        return [self.source]

    def document(self, source: str) -> Document:
        with self._lock:
            return copy_document(self._doc)

    def start(self, sink: Any) -> None:
        self._sink = sink

    def stop(self) -> None:
        self._sink = None

    # -- changes -----------------------------------------------------------------------
    def _set(self, ns: str, key: str, entry: dict[str, Any], changed: float | None = None) -> None:
        self._update(ns, key, lambda held: entry, changed)

    def _update(self, ns: str, key: str,
                build: Callable[[dict[str, Any] | None], dict[str, Any]],
                changed: float | None = None) -> None:
        """Sets the entry ``build`` makes of the one held (without its ``changed``; None if
        none), read and written under one hold of the lock, so two changes of one key
        racing in this process cannot lose either's fields.  ``changed``: when the change
        was made (a record read from the database); None: now.  Once the change went to the
        sink, waits for ``confirm`` (outside the lock: other changes go on meanwhile).

        Every write is published, newly stamped, even one that leaves this process's copy
        as it was: another process may have written another value since (nova-api's
        workers taking a metadata change of one aggregate in turn), and the schedulers'
        merge takes the entry stamped last.  Writes that change nothing the schedulers
        read (a compute's heartbeat) do not come here (:meth:`service_changed`)."""
        with self._lock:
            held = self._doc.get(ns, {}).get(key)
            unstamped = None if held is None else {k: v for k, v in held.items() if k != "changed"}
            entry = dict(build(unstamped), changed=self.wall() if changed is None else changed)
            self._doc.setdefault(ns, {})[key] = entry
            ops: list[Op] = [[SET, ns, key, entry]]
            sink = self._sink
            self.changes += 1
            if sink is None:
                return
            try:
                sink.change(self.source, ops)
            except Exception:  # publishing must never fail nova's API call
                LOG.exception("publishing %s %s failed", ns, key)
                return
        confirm = self.confirm
        if confirm is not None and not confirm():
            self.unconfirmed += 1
            LOG.warning("%s %s: not confirmed on the host-state stream in time; schedulers "
                        "apply it once it is published", ns, key)

    def service_changed(self, service: Any, *, deleted: bool = False,
                        saved: Collection[str] | None = None,
                        changed: float | None = None) -> None:
        """A compute service was created, saved (enabled, disabled, forced down) or deleted.

        ``saved``: the fields a ``Service.save`` wrote (None: all of them, a create or a
        destroy).  Only those are taken from the object: a compute's heartbeat saves
        ``report_count`` from its own copy of the service, loaded when it started, whose
        ``disabled`` may be long stale; publishing it would re-enable a host an operator
        has just disabled, until the next change."""
        if getattr(service, "binary", "nova-compute") != "nova-compute":
            return

        def get(name: str, default: Any = None) -> Any:
            return getattr(service, name) if service.obj_attr_is_set(name) else default

        host = get("host")
        if not host:
            return
        fields = SERVICE_FIELDS if saved is None else SERVICE_FIELDS & set(saved)
        if not fields and not deleted:
            return  # nothing the schedulers read was written
        # read the object before the lock: its fields are all of it for a first hearing
        values = {name: bool(get(name, False)) for name in ("disabled", "forced_down")}
        values["disabled_reason"] = get("disabled_reason")
        stamp = self.wall() if changed is None else changed

        def merged(held: dict[str, Any] | None) -> dict[str, Any]:
            written = fields
            if held is None or saved is None:
                # all of it: a create, a destroy, or the first this source hears of the host
                entry: dict[str, Any] = {}
                written = SERVICE_FIELDS
            else:
                entry = dict(held)
            # every write stamps what it wrote, even a value this copy already held: another
            # process may have written another value since
            stamps = dict(entry.get("stamps") or {})
            stamps.update(dict.fromkeys(written | {"deleted"}, stamp))
            entry["stamps"] = stamps
            entry["deleted"] = deleted
            for name in written & {"disabled", "forced_down"}:
                entry[name] = values[name]
            if "disabled_reason" in written:
                reason = values["disabled_reason"]
                if reason:
                    entry["disabled_reason"] = str(reason)
                else:
                    entry.pop("disabled_reason", None)
            return entry

        self._update(hostdoc.API_SERVICES, host, merged, stamp)

    def node_changed(self, node_uuid: str, *, deleted: bool) -> None:
        """A compute node was created (again) or deleted."""
        self._set(hostdoc.API_NODES, node_uuid, {"deleted": deleted})

    def aggregate_changed(self, aggregate: Any, *, deleted: bool = False,
                          changed: float | None = None) -> None:
        """An aggregate was created, renamed, changed its metadata or hosts, or deleted."""
        entry: dict[str, Any] = {"name": aggregate.name or "",
                                 "metadata": {str(k): str(v) for k, v in (aggregate.metadata or {}).items()},
                                 "hosts": sorted(aggregate.hosts or ()), "deleted": deleted}
        if aggregate.obj_attr_is_set("id"):
            entry["id"] = aggregate.id
        self._set(hostdoc.API_CATALOGUE, aggregate.uuid, entry, changed)

    def preload(self, services: Iterable[Any], aggregates: Iterable[Any]) -> None:
        """What existed before this process started (read from nova's databases, before the
        reporter starts): every compute service's state and every aggregate, each stamped
        with its record's last update, so that a newer change by another API process wins
        the schedulers' merge and a restarted process does not forget a force-down."""
        for service in services:
            self.service_changed(service, changed=_record_time(service))
        for aggregate in aggregates:
            self.aggregate_changed(aggregate, changed=_record_time(aggregate))


# -- the scheduler side: every API source's document merged ------------------------------

class ApiState:
    """What the API sources say, merged: per key, the entry changed last (any source); for a
    service, per field, the value written last (:func:`merge_service`).

    Built by the SharedHostManager from the cache's views of API sources (a
    source whose document has an ``services``, ``nodes`` or ``catalogue``
    namespace) and rebuilt only when one of their versions changes.
    """

    __slots__ = ("key", "services", "nodes", "catalogue")

    def __init__(self, key: tuple[Any, ...] = ()) -> None:
        self.key = key
        self.services: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.catalogue: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_views(cls, views: list[Any]) -> ApiState:
        state = cls(tuple((v.source, v.version) for v in views))
        for view in views:
            doc = view.doc or {}
            for ns, into in ((hostdoc.API_SERVICES, state.services), (hostdoc.API_NODES, state.nodes),
                             (hostdoc.API_CATALOGUE, state.catalogue)):
                for key, entry in (doc.get(ns) or {}).items():
                    if type(entry) is not dict:
                        continue
                    held = into.get(key)
                    if held is None:
                        into[key] = entry
                    elif ns == hostdoc.API_SERVICES and ("stamps" in entry or "stamps" in held):
                        into[key] = merge_service(held, entry)
                    elif _stamp(entry) >= _stamp(held):
                        into[key] = entry
        return state


#: a service entry's fields stamped one by one (``stamps``)
STAMPED_FIELDS = ("disabled", "disabled_reason", "forced_down", "deleted")


def merge_service(held: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """Two sources' entries of one service: each field as written last (``entry``'s on a tie,
    as for whole entries); an absent ``disabled_reason`` is a value too (none).  An entry
    without ``stamps`` stamps every field with its ``changed``."""
    out = dict(entry if _stamp(entry) >= _stamp(held) else held)
    stamps: dict[str, float] = {}
    for name in STAMPED_FIELDS:
        a, b = _field_stamp(held, name), _field_stamp(entry, name)
        winner = entry if b >= a else held
        stamps[name] = max(a, b)
        if name in winner:
            out[name] = winner[name]
        else:
            out.pop(name, None)
    out["stamps"] = stamps
    out["changed"] = max(_stamp(held), _stamp(entry))
    return out


def _field_stamp(entry: dict[str, Any], name: str) -> float:
    stamps = entry.get("stamps")
    if type(stamps) is dict:
        value = stamps.get(name)
        if type(value) is int or type(value) is float:
            return float(value)
    return _stamp(entry)


def _record_time(record: Any) -> float:
    """When a nova record last changed (``updated_at``, else ``created_at``), as wall time;
    0 (oldest) if it says neither."""
    for name in ("updated_at", "created_at"):
        value = getattr(record, name, None) if record.obj_attr_is_set(name) else None
        if value is not None:
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.UTC)  # nova stores UTC
            return float(value.timestamp())
    return 0.0


def _stamp(entry: dict[str, Any]) -> float:
    """An entry's ``changed``; a malformed one counts as oldest instead of failing requests."""
    changed = entry.get("changed")
    return float(changed) if type(changed) is int or type(changed) is float else 0.0


def is_api_source(doc: Any) -> bool:
    """Whether a document is an API-side source's: its ``api`` namespace, there from its
    first message; or, from a source that does not publish one, any of its namespaces."""
    return bool(doc) and not doc.get(hostdoc.COMPUTE) and any(
        doc.get(ns) for ns in (hostdoc.API_SOURCE, hostdoc.API_SERVICES, hostdoc.API_NODES,
                               hostdoc.API_CATALOGUE))


# -- wiring into nova's API and conductor --------------------------------------------------

_installed: dict[str, tuple[Any, str, Any]] = {}
_sources: list[ApiStateSource] = []


def install(source: ApiStateSource) -> None:
    """Publish every service, compute node and aggregate change this process makes to ``source``.

    Wraps the nova object methods that write them (after the original
    succeeded); idempotent; :func:`uninstall` restores them.
    """
    from nova import objects

    _sources[:] = [source]
    if _installed:
        return

    def after(cls: Any, name: str, publish: Callable[[Any, set[str]], None]) -> None:
        original = getattr(cls, name)

        def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
            # what this call writes, read before it (a save resets it)
            changed = set(obj.obj_what_changed()) if hasattr(obj, "obj_what_changed") else set()
            result = original(obj, *args, **kwargs)
            try:
                publish(obj, changed)
            except Exception:  # never fail nova's own call
                LOG.exception("API-side source: %s.%s not published", cls.__name__, name)
            return result

        wrapper.__name__ = name
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]  # functools.wraps' marker, set by hand
        setattr(cls, name, wrapper)
        _installed[f"{cls.__name__}.{name}"] = (cls, name, original)

    def each(fn: Callable[[ApiStateSource], None]) -> None:
        for s in list(_sources):
            fn(s)

    after(objects.Service, "create", lambda svc, a: each(lambda s: s.service_changed(svc)))
    after(objects.Service, "save",
          lambda svc, changed: each(lambda s: s.service_changed(svc, saved=changed)))
    after(objects.Service, "destroy", lambda svc, a: each(lambda s: s.service_changed(svc, deleted=True)))
    after(objects.ComputeNode, "create",
          lambda cn, a: each(lambda s: s.node_changed(cn.uuid, deleted=False)))
    after(objects.ComputeNode, "destroy",
          lambda cn, a: each(lambda s: s.node_changed(cn.uuid, deleted=True)))
    for name in ("create", "save", "update_metadata", "add_host", "delete_host"):
        after(objects.Aggregate, name, lambda agg, a: each(lambda s: s.aggregate_changed(agg)))
    after(objects.Aggregate, "destroy", lambda agg, a: each(lambda s: s.aggregate_changed(agg, deleted=True)))


def uninstall() -> None:
    for cls, name, original in _installed.values():
        setattr(cls, name, original)
    _installed.clear()
    _sources[:] = []


__all__ = ["ApiState", "ApiStateSource", "install", "is_api_source", "uninstall"]
