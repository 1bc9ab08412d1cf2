"""The three host managers the simulator compares, behind one interface.

Every mode decides with the same :class:`~shared_host_manager.decision.engine.DecisionEngine`
(same filters, same weighers); only where host state comes from differs:

* ``shared`` – this project: a :class:`~shared_host_manager.service.SchedulerService`
  keeps every host in memory from the stream; decisions read no database;
  pending claims are deducted until the compute node's delta includes them;
  a rejected claim moves to the next alternate after a re-check in the view
  (:class:`~shared_host_manager.decision.request_tracker.RequestTracker`).
* ``legacy`` – nova's filter scheduler before this project: every request
  reads all compute nodes (and, when it needs them, the instance lists) from
  SQL; nothing is remembered between requests.
* ``caching`` – nova's removed CachingScheduler: all compute nodes are read
  from SQL every ``refresh_interval`` seconds; between refreshes each decision
  consumes from the cached copy (and a failed build does not give it back).

Compute nodes arbitrate claims in every mode.  The database modes get nova's
compute-side claim and reschedule behaviour: a rejected build goes to the next
alternate as chosen at decision time, without a second look.

Life cycle of a mode object: ``start()``, then ``schedule(spec)`` from many
client threads (it blocks until the request is placed or has failed), then
``stop()``.  ``receiver`` is the view the staleness sampler reads.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.codec import Decoder, Encoder
from protocol.errors import ProtocolError
from protocol.messages import Claim, ClaimResult, Snapshot
from protocol.receiver import ReceiverMachine
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.claims import claim_payload
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost, Selection
from shared_host_manager.decision.manager import RequestResult, SchedulerManager
from shared_host_manager.decision.request import RequestSpec
from shared_host_manager.service import SchedulerService
from simulator.database import HostDatabase
from transport.base import ControlPlane, DataPlane
from transport.rpcapi import ReporterAPI

#: seconds a client waits for a request before counting it lost
REQUEST_TIMEOUT = 60.0
#: seconds between a scheduler's entries on the stream ([cache] membership_interval)
MEMBERSHIP_INTERVAL = 2.0


Outcome = RequestResult


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.outcome = Outcome()
        self.remaining = 0  # instances not yet placed or failed


@dataclass(frozen=True)
class ModeSettings:
    name: str
    scheduler_topic: str
    reporter_topic: str
    live_schedulers: int
    seed: int
    config: SchedulerConfig
    down_interval: float = 6.0
    claim_deadline: float = 30.0
    refresh_interval: float = 60.0
    #: shared mode: cast every claim to the live peers too ([cache] announce_claims)
    announce_claims: bool = True


class SharedScheduler(SchedulerManager):
    """This project's scheduler, as deployed: the manager over the stream-fed cache."""

    def __init__(self, s: ModeSettings, data: DataPlane, control: ControlPlane,
                 cell_planes: Mapping[str, DataPlane] | None = None) -> None:
        service = SchedulerService(
            s.name, data, control, reporter_topic=s.reporter_topic,
            scheduler_topic=s.scheduler_topic, down_interval=s.down_interval,
            claim_deadline=s.claim_deadline, reorder_timeout=0.1, resync_timeout=1.0,
            membership_interval=MEMBERSHIP_INTERVAL, announce_claims=s.announce_claims,
            cell_planes=cell_planes)
        super().__init__(service, config=s.config, rng=random.Random(f"{s.seed}-{s.name}"),
                         request_timeout=REQUEST_TIMEOUT)
        self.engine.live_schedulers = s.live_schedulers
        self.receiver = service.receiver

    def schedule(self, spec: RequestSpec) -> Outcome:
        return self.select_destinations(spec)


class _Attempt:
    """One instance of a request being built, with the alternates chosen for it."""

    def __init__(self, waiter: _Waiter, instance: str, hosts: list[Selection],
                 resources: dict[str, int], payload: dict[str, Any]) -> None:
        self.waiter = waiter
        self.instance = instance
        self.hosts = hosts
        self.index = 0
        self.resources = resources
        self.payload = payload


class DatabaseScheduler:
    """nova's database-backed scheduler: ``refresh_interval=None`` reads per request (legacy),
    a number reads that often and consumes locally in between (caching)."""

    def __init__(self, s: ModeSettings, control: ControlPlane, db: HostDatabase,
                 refresh_interval: float | None, endpoints: dict[str, str]) -> None:
        self.name = s.name
        #: source -> the reporter that serves it (nova: the compute host's RPC topic)
        self.endpoints = endpoints
        self._settings = s
        self._db = db
        self.refresh_interval = refresh_interval
        self._control = control
        self._encoder, self._decoder = Encoder(), Decoder()
        self.lock = threading.RLock()
        self._rng = random.Random(f"{s.seed}-{s.name}")

        self.receiver = ReceiverMachine(s.name, down_interval=3600.0, claim_deadline=1e9)
        self.engine = self._new_engine(self.receiver)
        self._versions: dict[str, tuple[int, int]] = {}
        self._attempts: dict[str, _Attempt] = {}
        self._attempts_lock = threading.Lock()
        self._stop = threading.Event()
        self.refreshes = 0

    def _new_engine(self, receiver: ReceiverMachine) -> DecisionEngine:
        return DecisionEngine(receiver, config=self._settings.config,
                              rng=self._rng,
                              live_schedulers=self._settings.live_schedulers)

    # -- life cycle -------------------------------------------------------------

    def start(self) -> None:
        self._client = self._control.control_client()
        self._api = ReporterAPI(self._client, self._encoder, self._settings.reporter_topic)
        self._server = self._control.control_server(self._settings.scheduler_topic, self.name,
                                                    self._on_control)
        self._server.start()
        if self.refresh_interval is not None:
            self._refresh()
            self._refresher = threading.Thread(target=self._refresh_loop, daemon=True,
                                               name=f"{self.name}-refresh")
            self._refresher.start()

    def stop(self) -> None:
        self._stop.set()
        self._server.stop()
        self._client.close()

    # -- host state from the database ------------------------------------------------

    def _read(self, with_instances: bool) -> tuple[ReceiverMachine, dict[str, tuple[int, int]]]:
        rows = self._db.read_hosts()
        inst = self._db.read_instances() if with_instances else {}
        receiver = ReceiverMachine(self.name, down_interval=3600.0, claim_deadline=1e9)
        now = time.monotonic()
        versions = {}
        for source, epoch, seq, doc in rows:
            if with_instances:
                doc["instances"] = inst.get(source, {})
            receiver.receive(Snapshot(source, epoch, seq, doc), now)
            versions[source] = (epoch, seq)
        return receiver, versions

    def _refresh(self) -> None:
        receiver, versions = self._read(with_instances=True)
        with self.lock:
            self.receiver, self._versions = receiver, versions
            self.engine = self._new_engine(receiver)
            self.refreshes += 1

    def _refresh_loop(self) -> None:
        assert self.refresh_interval is not None
        while not self._stop.wait(self.refresh_interval):
            self._refresh()

    @staticmethod
    def _needs_instances(spec: RequestSpec) -> bool:
        hints = spec.scheduler_hints or {}
        return spec.instance_group is not None or "same_host" in hints or "different_host" in hints

    # -- deciding --------------------------------------------------------------------

    def schedule(self, spec: RequestSpec) -> Outcome:
        waiter = _Waiter()
        out = waiter.outcome
        start = time.perf_counter()
        if self.refresh_interval is None:
            # legacy: this request's view is what the database says now, and nothing
            # of it is kept (requests run concurrently, each with its own engine)
            receiver, versions = self._read(with_instances=self._needs_instances(spec))
            engine = self._new_engine(receiver)
            lock: Any = threading.Lock()
            with self.lock:
                self.receiver, self._versions = receiver, versions
        else:
            lock = self.lock
        with lock:
            if self.refresh_interval is not None:
                engine, versions = self.engine, self._versions
            try:
                decision = engine.select_destinations(spec, time.monotonic())
            except NoValidHost as exc:
                out.decision_s = time.perf_counter() - start
                out.failed = {u: exc.reason for u in spec.instance_uuids}
                return out
            out.decision_s = time.perf_counter() - start
        # cast once the decision is complete, out of the lock
        claims = decision.claims
        payload = claim_payload(spec)
        resources = dict(spec.resources)
        pending = {}
        for hosts, claim in zip(decision.rows, claims, strict=True):
            pending[claim.claim_id] = _Attempt(waiter, hosts[0].instance_uuid, list(hosts),
                                               resources, payload)
        with self._attempts_lock:
            self._attempts.update(pending)
            waiter.remaining = len(pending)
        for claim in claims:
            self._api.claim(self.endpoints[claim.source], claim)
            out.claims += 1
        if not waiter.event.wait(REQUEST_TIMEOUT):
            out.timed_out = True
        return out

    def _on_control(self, body: bytes) -> None:
        try:
            result = self._decoder.decode(body)
        except ProtocolError:
            return
        if type(result) is not ClaimResult:
            return
        with self._attempts_lock:
            attempt = self._attempts.pop(result.claim_id, None)
        if attempt is None:
            return
        out = attempt.waiter.outcome
        if result.accepted:
            out.placed[attempt.instance] = result.source
        else:
            out.rejected += 1
            attempt.index += 1
            if attempt.index < len(attempt.hosts):
                # nova's conductor: the next alternate, as chosen at decision time
                alt = attempt.hosts[attempt.index]
                epoch, seq = self._versions.get(alt.source, (-1, 0))
                claim = Claim(f"{result.claim_id}.{attempt.index}", self.name, alt.source,
                              epoch, seq, attempt.resources, attempt.instance, attempt.payload)
                with self._attempts_lock:
                    self._attempts[claim.claim_id] = attempt
                out.claims += 1
                self._api.claim(self.endpoints[claim.source], claim)
                return
            out.failed[attempt.instance] = f"Exceeded max scheduling attempts {len(attempt.hosts)}"
        waiter = attempt.waiter
        with self._attempts_lock:
            waiter.remaining -= 1
            done = waiter.remaining == 0
        if done:
            waiter.event.set()

    def versions(self, sources: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        with self.lock:
            if sources is None:
                return dict(self._versions)
            return {s: self._versions[s] for s in sources if s in self._versions}
