"""Re-running the drop-in's recorded decisions: ``shm replay --decisions`` on a nova scheduler's log.

Role: the reading side of :mod:`shared_host_manager.nova.decision_log`.  The
update log's replay (:mod:`shared_host_manager.updatelog.replay`) rebuilds the
scheduler's receiver record by record and hands each HOST_MANAGER record to a
:class:`StepReplayer`, which re-runs it with the code nova-scheduler-shared runs
(SharedHostManager and its vector core, nova's own filter and weigher classes)
and says whether the outcome is the recorded one.

Life cycle (one :class:`StepReplayer` per replayed log)::

    config  -> nova's options set as recorded, then the what-if options over them
               (cleared again by close()); a SharedHostManager built over the
               replayed receiver: it registers no claims (the log's CLAIM records
               do) and reads time from the records, nova's utcnow included.  Its
               filters and weighers must run the recorded code (digests), or the
               log's decisions are counted as not reproducible, with the reason
    hosts   -> the request's rows rebuilt from the replayed views, kept by id
    filter  -> nova's filters re-run on the request's hosts, compared with the
               record (how many passed, and the digest of which)
    weigh   -> the weighers re-run on the filtered hosts: every recorded host's
               weight must be bit-identical and the best TOP weights the same
    consume -> nova's own ``_consume_selected_host`` on the replayed host
    hint, aggregates, delete_aggregate -> the same SharedHostManager methods

Placement's allocation candidates are recorded with the filter step of a
request whose NUMA topology or PCI devices nova's filters fit to them (their
mappings: what those filters read) and given back to the re-run's hosts; the
other requests' candidates are not recorded (no in-tree filter reads them).
What is not recorded, so a re-run may differ there (and says which step):
whatever a filter plugin reads from outside nova's objects, and the candidates
of a log written before they were.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from shared_host_manager.nova.core import vector
from shared_host_manager.nova.decision_log import code_digests, digest, own_candidate, uuids_of
from shared_host_manager.nova.host_manager import SharedHostManager

#: requests a replay keeps rows for (nova's manager decides several at once in threads)
KEPT_REQUESTS = 64


class _NotInLog(Exception):
    """A step refers to one the replayed log does not hold (older parts deleted)."""


class _ReplayedCache:
    """What SharedHostManager reads of a cache, over the replay's receiver and clock."""

    def __init__(self, receiver: Any) -> None:
        self.receiver = receiver
        self.lock = threading.RLock()
        self.now = 0.0
        self.peers: tuple[str, ...] = ()
        self.recorder = None
        self.claim_announcer = None  # a re-run tells no peer anything

    def clock(self) -> float:
        return self.now

    def apply_peer_claims(self) -> None:
        """The peers' claims are in the replayed receiver already (recorded when applied)."""

    def await_fences(self) -> None:
        """A recorded decision saw what it saw: the stream it waited for is in the log."""


class _Request:
    def __init__(self, spec: Any, hosts: list[Any]) -> None:
        self.spec = spec
        self.hosts = hosts
        self.filtered: list[Any] = []


class StepReplayer:
    """Re-runs HOST_MANAGER records (see the module docstring); one per replayed log."""

    def __init__(self, options: dict[str, str] | None = None) -> None:
        from nova import objects

        objects.register_all()
        #: what-if: "group.option" -> value, applied over the recorded options
        self.options = dict(options or {})
        self.manager: Any = None
        self.cache: _ReplayedCache | None = None
        self._overridden: list[tuple[str, str | None]] = []
        self._requests: OrderedDict[int, _Request] = OrderedDict()
        #: the last config step could not be re-run (reported once; its steps are not re-run)
        self._broken = False
        #: the previous hosts step's (id, host set): the next one is recorded against it
        self._last_hosts: tuple[Any, frozenset[str]] | None = None
        #: requests whose hosts could not be rebuilt: their later steps are not re-run
        self._failed: set[Any] = set()
        self._wall = 0.0

    # -- the replayer protocol (shared_host_manager.updatelog.replay.HostManagerReplayer) ----
    def step(self, receiver: Any, now: float, data: dict[str, Any]) -> dict[str, Any] | None:
        """One record; a check ({"same", "recorded", "replayed", "what"}) for filter and weigh
        steps, ``{"skipped": why}`` for a step of a request that cannot be re-run (the reason
        was reported at the step that failed), None for the others."""
        step = data.get("step")
        if step == "config":
            self.manager = None
            self._broken = True
            self._configure(receiver, data)
            self._broken = False
            return None
        if self.manager is None:
            if self._broken:
                return {"skipped": "the configuration was not loadable"}  # reported once
            raise RuntimeError("a host manager step before its configuration was recorded")
        cache = self.cache
        assert cache is not None
        cache.now = now
        if data.get("id") in self._failed:
            return {"skipped": "its hosts step failed"}  # and was reported
        with self._time(data.get("wall")):
            if step == "hosts":
                try:
                    self._hosts(data)
                except _NotInLog as exc:  # not reproducible, not different
                    self._failed.add(data.get("id"))
                    return {"skipped": str(exc)}
                except Exception:
                    self._failed.add(data.get("id"))
                    raise
            elif step == "filter":
                return self._filter(data)
            elif step == "weigh":
                return self._weigh(data)
            elif step == "consume":
                self._consume(data)
            elif step == "hint":
                self.manager._hint(data["host"], dict(data["hints"]), replace=data.get("replace", False))
            elif step in ("aggregates", "delete_aggregate"):
                self._aggregates(step, data)
        return None

    def close(self) -> None:
        from nova import conf as nova_conf

        for name, group in reversed(self._overridden):
            nova_conf.CONF.clear_override(name, group=group)
        self._overridden.clear()

    # -- steps ---------------------------------------------------------------------------------
    def _configure(self, receiver: Any, data: dict[str, Any]) -> None:
        from nova import conf as nova_conf

        conf = nova_conf.CONF
        self.close()
        values = {(g if g != "DEFAULT" else None, k): v
                  for g, opts in (data.get("nova") or {}).items() for k, v in opts.items()}
        for key, value in self.options.items():
            prefix, _, name = key.rpartition(".")
            group_name = None if prefix in ("", "DEFAULT") else prefix
            opt = conf._get_opt_info(name, group_name)["opt"]  # an unknown option: NoSuchOptError
            values[(group_name, name)] = opt.type(value) if isinstance(value, str) else value
        for (group, name), value in values.items():
            try:
                current = conf[group][name] if group else conf[name]
            except Exception:  # noqa: BLE001 — an option this nova does not have: not set
                continue
            if current != value:
                conf.set_override(name, value, group=group)
                self._overridden.append((name, group))
        self.cache = _ReplayedCache(receiver)
        try:
            self.manager = SharedHostManager(self.cache, register_claims=False,
                                             vector_decisions=data.get("vector_decisions", True),
                                             host_ownership=data.get("host_ownership", False))
        except Exception as exc:
            raise RuntimeError("the recorded filters and weighers cannot be loaded here "
                               f"({type(exc).__name__}: {exc}): the log's decisions are not "
                               "re-run") from exc
        self.manager.wall_clock = lambda: self._wall
        self._requests.clear()
        recorded = data.get("code") or {}
        mine = code_digests(self.manager)
        differ = sorted(n for n in set(recorded) | set(mine) if recorded.get(n) != mine.get(n))
        if differ:
            self.manager = None
            raise RuntimeError(f"the recording scheduler ran other code for {', '.join(differ)} "
                               "(another nova version, or a class patched at run time): its "
                               "decisions are not re-run")

    @contextlib.contextmanager
    def _time(self, wall: float | None) -> Iterator[None]:
        """Time as the recording scheduler saw it: its wall clock (nova's utcnow too)."""
        if wall is None:
            yield
            return
        from oslo_utils import timeutils

        self._wall = wall
        timeutils.set_time_override(
            datetime.datetime.fromtimestamp(wall, datetime.UTC).replace(tzinfo=None))
        try:
            yield
        finally:
            timeutils.clear_time_override()

    def _hosts(self, data: dict[str, Any]) -> None:
        from nova import objects

        spec = (objects.RequestSpec.obj_from_primitive(data["spec"]) if data.get("spec") is not None
                else None)
        assert self.cache is not None
        self.cache.peers = tuple(data.get("peers") or ())
        if data.get("uuids") is not None:
            wanted = frozenset(data["uuids"])
        else:
            last = self._last_hosts
            if last is None or last[0] != data.get("base"):
                raise _NotInLog(f"request {data['id']}: its hosts are recorded against request "
                                f"{data.get('base')}, which is not in the replayed log")
            wanted = (last[1] - frozenset(data["removed"])) | frozenset(data["added"])
        self._last_hosts = (data["id"], wanted)
        hosts = list(self.manager.get_host_states_by_uuids(None, sorted(wanted), spec))
        self._requests[data["id"]] = _Request(spec, hosts)
        while len(self._requests) > KEPT_REQUESTS:
            self._requests.popitem(last=False)
        if len(hosts) != data["n"]:
            raise RuntimeError(f"request {data['id']}: {len(hosts)} of its {data['n']} hosts are "
                               "eligible in the replayed view")

    def _request(self, data: dict[str, Any]) -> _Request:
        req = self._requests.get(data["id"])
        if req is None:
            raise RuntimeError(f"request {data['id']}: its hosts step is not in the replayed log")
        if req.spec is None:
            raise RuntimeError(f"request {data['id']}: its request spec was not recordable")
        return req

    def _filter(self, data: dict[str, Any]) -> dict[str, Any]:
        req = self._request(data)
        spec = req.spec
        if data.get("instance") is not None:
            spec.instance_uuid = data["instance"]
            spec.obj_reset_changes(["instance_uuid"])
        if data.get("candidates") is not None:
            _give_candidates(req.hosts, data["candidates"])
        out = self.manager.get_filtered_hosts(req.hosts, spec, data.get("index", 0))
        req.filtered = list(out or [])
        passed = uuids_of(req.filtered)
        same = len(passed) == data["n"] and digest(passed) == data["digest"]
        return {"same": same, "request": _summary("filter", req), "recorded": {"passed": data["n"]},
                "replayed": {"passed": len(passed)},
                "what": (f"{data['n']} hosts passed the filters, "
                         f"{len(passed)} in the re-run"
                         + ("" if len(passed) != data["n"] else " (other hosts)"))}

    def _weigh(self, data: dict[str, Any]) -> dict[str, Any]:
        req = self._request(data)
        weighed = self.manager.get_weighed_hosts(req.filtered, req.spec)
        # the next instance of the request filters what nova's manager sorted (order aside)
        req.hosts = [w.obj for w in weighed]
        got = {vector.node_uuid(w.obj): w.weight for w in weighed}
        top = [[u, w] for u, w in data["top"]]
        best = sorted((w.weight for w in weighed), reverse=True)[:len(top)]
        same = (len(weighed) == data["n"] and all(got.get(u) == w for u, w in top)
                and best == sorted((w for _, w in top), reverse=True))
        mine = [[vector.node_uuid(w.obj), w.weight] for w in weighed[:len(top)]]
        return {"same": same, "request": _summary("weigh", req), "recorded": {"top": top},
                "replayed": {"top": mine},
                "what": "recorded " + _ranking(top) + " | replayed " + _ranking(mine)}

    def _consume(self, data: dict[str, Any]) -> None:
        from nova.scheduler import manager as nova_manager

        req = self._request(data)
        for host in req.hosts:
            if vector.node_uuid(host) == data["uuid"]:
                nova_manager.SchedulerManager._consume_selected_host(
                    host, req.spec, instance_uuid=data.get("instance"))
                return
        raise RuntimeError(f"request {data['id']}: consumed host {data['uuid']} is not among "
                           "the re-run's hosts")

    def _aggregates(self, step: str, data: dict[str, Any]) -> None:
        from nova import objects

        if step == "aggregates":
            self.manager.update_aggregates(
                [objects.Aggregate.obj_from_primitive(p) for p in data["aggregates"]])
        else:
            self.manager.delete_aggregate(objects.Aggregate(uuid=data["uuid"]))


def _give_candidates(hosts: list[Any], recorded: list[list[Any]]) -> None:
    """Placement's candidates as the recording scheduler's hosts had them (decision_log's
    ``candidates``: the mappings of the hosts whose candidates were not just their own one),
    taken by the hosts as nova's generator gives them (vector.take_over)."""
    rows = vector.rows_of(hosts)
    if rows is None:
        return
    listed = {uuid: mappings for uuid, mappings in recorded}
    rows.alloc_reqs = {
        uuid: [{"allocations": {}, "mappings": m}
               for m in listed.get(uuid, own_candidate(uuid))]
        for uuid in uuids_of(hosts)}


def option_problem(name: str) -> str | None:
    """Why ``GROUP.OPTION`` is not a nova.conf option (None: it is one)."""
    from nova import conf as nova_conf

    group, _, opt = name.rpartition(".")
    try:
        nova_conf.CONF._get_opt_info(opt, None if group in ("", "DEFAULT") else group)
    except Exception:  # noqa: BLE001 — oslo.config's NoSuchOptError / NoSuchGroupError
        return f"nova.conf has no option {opt!r} in [{group or 'DEFAULT'}]"
    return None


def _summary(step: str, req: _Request) -> dict[str, Any]:
    """What ``shm replay`` names a differing step by: the step, the instance, its size."""
    spec = req.spec
    return {"request_id": f"{step} step, instance {spec.instance_uuid}",
            "resources": {"vcpus": spec.vcpus, "memory_mb": spec.memory_mb,
                          "root_gb": spec.root_gb}}


def _ranking(top: list[list[Any]]) -> str:
    return " > ".join(f"{u[:8]}({w:.6g})" for u, w in top[:5]) or "nothing"
