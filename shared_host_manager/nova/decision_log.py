"""The drop-in's decisions in the update log, and their replay through the same core.

Role
----
In nova-scheduler-shared, nova's SchedulerManager decides, calling our
:class:`~shared_host_manager.nova.host_manager.SharedHostManager`; the project's
DecisionEngine (and its DECISION records) is not on that path.  So that ``shm
replay --decisions`` can re-run what an operator's scheduler decided, and say
where a re-run differs, the host manager tells the update log's recorder each step
nova's manager takes on it, as HOST_MANAGER records of plain data
(:mod:`shared_host_manager.updatelog.format`).  This module writes them
(:class:`StepLog`) and says their shape; :mod:`shared_host_manager.nova.replay.steps`
reads them back with the same digest and the same host manager.

The recorder is the cache's observer; the cache's contract (``CacheObserver``) knows
nothing of host managers, so the step log calls it through its own,
:class:`StepObserver`, when the cache's observer also takes steps (the update log's
``Recorder`` does; another observer is left alone).

Steps (``{"step": name, ...}``)::

    config      once per recorder, before its first other step: the nova options a
                decision reads ([filter_scheduler], [metrics], service_down_time), a
                digest of each enabled filter's and weigher's code, and the drop-in's
                own options (vector_decisions, host_ownership)
    hosts       get_host_states_by_uuids sealed a request's rows, recorded under the
                cache lock so the record sits where the snapshot was taken: id, the
                hosts it returned (every KEYFRAME requests ``uuids``, sorted; else
                ``base``, the previous request's id, with ``added`` and ``removed``),
                ``n``, nova's RequestSpec (its primitive), wall time, the live peers
    filter      get_filtered_hosts: id, index, instance uuid, wall time, how many
                hosts passed and a digest of which; for the first instance of a request
                whose NUMA topology or PCI devices nova's filters fit to placement's
                allocation candidates, ``candidates``: the candidates' mappings of every
                host whose candidates are not just its own one (:func:`candidates`)
    weigh       get_weighed_hosts: id, how many, the best TOP (uuid, weight)
    consume     nova's manager consumed a chosen host: id, its uuid, the instance
    hint, aggregates, delete_aggregate
                nova's RPC feeds that change decisions without the stream
                (instance info, aggregate changes): their arguments

Recording costs nothing without an update log: every method returns at once
when the cache has no recorder.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from hashlib import blake2b
from typing import Any, Protocol, runtime_checkable

from shared_host_manager.nova.core import vector

#: weighed hosts recorded per decision (nova claims the first that fits, alternates follow)
TOP = 10

#: a request's hosts are recorded whole every KEYFRAME requests, else as the change from the
#: previous request's (placement's candidates change little from one request to the next)
KEYFRAME = 64

#: nova's option groups a decision reads (filters, weighers, their multipliers)
NOVA_GROUPS = ("filter_scheduler", "metrics")


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def digest(uuids: Iterable[str]) -> bytes:
    """Which hosts (order aside): 8 bytes of BLAKE2b over the sorted uuids."""
    return blake2b("\n".join(sorted(uuids)).encode(), digest_size=8).digest()


def nova_options() -> dict[str, dict[str, Any]]:
    from nova import conf as nova_conf

    conf = nova_conf.CONF
    out = {group: {name: _plain(conf[group][name]) for name in conf[group]} for group in NOVA_GROUPS}
    out["DEFAULT"] = {"service_down_time": conf.service_down_time}
    return out


def code_digest(cls: type) -> str:
    """The code of a filter or weigher class and its bases: what a re-run must share with the
    recording scheduler (another nova version, or a class patched at run time, differs)."""
    h = blake2b(digest_size=8)
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in sorted(vars(klass).items()):
            fn = getattr(attr, "__func__", attr)  # staticmethod, classmethod
            code = getattr(fn, "__code__", None)
            if code is not None:
                h.update(name.encode() + b"\0" + code.co_code)
            elif callable(attr) and not isinstance(attr, type):
                h.update(name.encode() + b"\0" + type(attr).__qualname__.encode())
    return h.hexdigest()


def code_digests(manager: Any) -> dict[str, str]:
    """Per enabled filter and weigher class (by name), its :func:`code_digest`."""
    return {type(o).__name__: code_digest(type(o)) for o in [*manager.enabled_filters,
                                                              *manager.weighers]}


def reads_candidates(spec_obj: Any) -> bool:
    """Whether nova's filters read placement's allocation candidates for this request:
    NUMATopologyFilter fits a requested NUMA topology, PciPassthroughFilter requested PCI
    devices, to each candidate's mappings (and keep the candidates that fit)."""
    if spec_obj is None:
        return False
    if "numa_topology" in spec_obj and spec_obj.numa_topology:
        return True
    pci = spec_obj.pci_requests if "pci_requests" in spec_obj else None
    return bool(pci and pci.requests)


def own_candidate(uuid: str) -> list[dict[str, list[str]]]:
    """The mappings of a host whose only candidate is its own provider (nothing nested or
    shared): what most hosts have, so the log leaves them out."""
    return [{"": [uuid]}]


def candidates(rows: Any) -> list[list[Any]] | None:
    """[uuid, [mappings of each candidate]] for every host of ``rows`` whose candidates (nova's
    alloc_reqs_by_rp_uuid, taken over with the rows) are not just :func:`own_candidate`;
    None when the rows carry no candidates.  Only the mappings: nova's filters read nothing
    else of a candidate."""
    by_rp = rows.alloc_reqs
    if by_rp is None:
        return None
    out = []
    for tpl in rows.tpls:
        uuid = tpl.attrs["uuid"]
        mappings = [_plain(c.get("mappings") or {}) for c in by_rp.get(uuid, ())]
        if mappings != own_candidate(uuid):
            out.append([uuid, mappings])
    return out


def uuids_of(hosts: Iterable[Any]) -> list[str]:
    """The hosts' compute node uuids, without materialising our shells."""
    return [vector.node_uuid(h) for h in hosts]


@runtime_checkable
class StepObserver(Protocol):
    """What the step log tells the update log: the drop-in's contract, here where it is
    called (the update log's ``Recorder`` has it, and is told nothing else of nova)."""

    def host_manager_step(self, now: float, step: dict[str, Any]) -> None:
        """A step of a decision nova's manager took on the host manager, plain data (see the
        module docstring): recorded as it is, for replay to re-run."""


class StepLog:
    """Writes one SharedHostManager's steps to its cache's recorder (if it has one)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._config_for: Any = None
        #: the previous hosts step's (id, host set), which the next one is recorded against
        self._last: tuple[int, frozenset[str]] | None = None
        #: (the cache's observer, it as a StepObserver or None) last seen: the Protocol's
        #: isinstance costs microseconds, and recorder() runs for every step
        self._seen: tuple[object, StepObserver | None] = (None, None)

    def recorder(self) -> StepObserver | None:
        """The cache's observer if it takes steps, else None (then nothing is built for it)."""
        cache = self._manager._cache
        observer = None if cache is None else cache.recorder
        seen, steps = self._seen
        if observer is not seen:
            steps = observer if isinstance(observer, StepObserver) else None
            self._seen = (observer, steps)
        return steps

    def spec(self, spec_obj: Any) -> Any:
        """nova's RequestSpec as plain data if recording (taken before the cache lock), else None."""
        if spec_obj is None or self.recorder() is None:
            return None
        try:
            return spec_obj.obj_to_primitive()
        except Exception:  # noqa: BLE001 — an unserialisable spec: its steps are not re-runnable
            return None

    def hosts(self, rows: Any, spec: Any, now: float, wall: float, peers: Iterable[str]) -> None:
        """A request's rows are sealed (under the cache lock); ``spec`` from :meth:`spec`."""
        rec = self.recorder()
        if rec is None:
            return
        self._configured(rec, now)
        hosts = frozenset(t.attrs["uuid"] for t in rows.tpls)
        step: dict[str, Any] = {"step": "hosts", "n": len(hosts), "spec": spec, "wall": wall,
                                "peers": sorted(peers)}
        with self._lock:
            rows.log_id = step["id"] = next(self._ids)
            last, self._last = self._last, (rows.log_id, hosts)
        if last is None or rows.log_id % KEYFRAME == 0:
            step["uuids"] = sorted(hosts)
        else:
            step.update(base=last[0], added=sorted(hosts - last[1]), removed=sorted(last[1] - hosts))
        rec.host_manager_step(now, step)

    def filtered(self, rows: Any, spec_obj: Any, index: int, out: Any, wall: float) -> None:
        rec = self.recorder()
        if rec is None or rows is None or getattr(rows, "log_id", None) is None:
            return
        if type(out) is vector.Hosts:  # our rows: the uuids without touching the shells
            tpls = rows.tpls
            passed = [tpls[i].attrs["uuid"] for i in out.idx]
        else:
            passed = uuids_of(out) if out else []
        step = {"step": "filter", "id": rows.log_id, "index": index,
                "instance": _instance(spec_obj), "wall": wall, "n": len(passed),
                "digest": digest(passed)}
        if index == 0 and reads_candidates(spec_obj):
            recorded = candidates(rows)
            if recorded is not None:
                step["candidates"] = recorded
        rec.host_manager_step(self._manager.cache.clock(), step)

    def weighed(self, rows: Any, weighed: list[Any]) -> None:
        rec = self.recorder()
        if rec is None or rows is None or getattr(rows, "log_id", None) is None:
            return
        rec.host_manager_step(self._manager.cache.clock(), {
            "step": "weigh", "id": rows.log_id, "n": len(weighed),
            "top": [[vector.node_uuid(w.obj), w.weight] for w in weighed[:TOP]]})

    def consumed(self, host_state: Any, spec_obj: Any) -> None:
        rec = self.recorder()
        rows = host_state.__dict__.get("_rows")
        if rec is None or rows is None or getattr(rows, "log_id", None) is None:
            return
        rec.host_manager_step(self._manager.cache.clock(), {
            "step": "consume", "id": rows.log_id, "uuid": vector.node_uuid(host_state),
            "instance": _instance(spec_obj)})

    def feed(self, step: str, now: float, **data: Any) -> None:
        """nova's RPC feeds (instance info, aggregates), under the cache lock."""
        rec = self.recorder()
        if rec is not None:
            self._configured(rec, now)
            rec.host_manager_step(now, {"step": step, **data})

    def _configured(self, rec: StepObserver, now: float) -> None:
        """The config step, before this recorder's first other step."""
        with self._lock:
            if self._config_for is rec:
                return
            self._config_for = rec
            m = self._manager
            rec.host_manager_step(now, {"step": "config", "nova": nova_options(),
                                        "code": code_digests(m),
                                        "vector_decisions": m.vector_decisions,
                                        "host_ownership": m.host_ownership})


def _instance(spec_obj: Any) -> str | None:
    if spec_obj is None or "instance_uuid" not in spec_obj:
        return None
    return spec_obj.instance_uuid
