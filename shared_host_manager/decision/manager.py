"""The scheduler's decision endpoint: ``select_destinations`` over the shared cache.

Role: nova's ``SchedulerManager`` for this project.  It ties together the
stream-fed cache (:class:`~shared_host_manager.service.SchedulerService`), the
:class:`~shared_host_manager.decision.engine.DecisionEngine` (filters, weighers,
claims) and the :class:`~shared_host_manager.decision.request_tracker.RequestTracker`
(outcomes -> alternates or NoValidHost).

Life cycle of a request::

    select_destinations(spec)
      under the cache lock: decide on the current view, register the claims as
                            pending, queue them          (no database, no broker wait)
      claim sender thread:  cast each claim with its build request to the
                            reporter of its host
      ingest (any thread):  after every stream/control message the cache calls
                            back here, under its lock: claim outcomes go to the
                            tracker; a rejection claims the next alternate; when
                            every instance is placed or failed, the caller wakes
      -> RequestResult (placed: instance -> host, failed: instance -> reason)

Threads: callers may decide concurrently from many threads; decisions and
ingest serialise on the cache lock, and the engine only ever queues claims,
so no cast happens under the lock.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from protocol.messages import Claim
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import RequestSpec
from shared_host_manager.decision.request_tracker import RequestFinished, RequestTracker
from shared_host_manager.service import SchedulerService


@dataclass
class RequestResult:
    """What happened to one request."""

    placed: dict[str, str] = field(default_factory=dict)  # instance -> source
    failed: dict[str, str] = field(default_factory=dict)  # instance -> reason
    decision_s: float = 0.0
    claims: int = 0
    rejected: int = 0
    timed_out: bool = False


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result = RequestResult()


class ClaimSender:
    """Casts claims from a thread of its own: the engine only queues them (it runs under a lock)."""

    def __init__(self, send: Callable[[Claim], bool]) -> None:
        self._queue: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._send = send
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="claim-sender", daemon=True)
        self._thread.start()

    def put(self, claim: Claim) -> None:
        self._queue.put(claim)

    def _run(self) -> None:
        while (claim := self._queue.get()) is not None:
            try:
                if not self._send(claim):
                    self.failed += 1  # no route: the claim expires at its deadline
            except Exception:  # a lost claim expires at its deadline and is counted there
                self.failed += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


class SchedulerManager:
    def __init__(self, service: SchedulerService, *, config: SchedulerConfig | None = None,
                 rng: random.Random | None = None, peers: Sequence[str] = (),
                 request_timeout: float = 60.0) -> None:
        self.service = service
        self.lock = service.cache.lock
        self.request_timeout = request_timeout
        self._sender = ClaimSender(service.send_claim)
        self.engine = DecisionEngine(service.receiver, self._sender.put, config=config,
                                     rng=rng or random.Random())
        #: follow the live peers the service reads from the stream (design §2), unless
        #: given a fixed list
        self.follow_membership = not peers
        self._peers: tuple[str, ...] = ()
        if peers:
            self.engine.set_peers(peers)
        self.tracker = RequestTracker(self.engine, keep_finished=64)
        self._waiters: dict[str, _Waiter] = {}
        service.cache.ingest_listeners.append(self._on_ingest)

    @property
    def name(self) -> str:
        return self.service.name

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()
        self._sender.close()

    def _on_ingest(self) -> None:  # under the cache lock
        outcomes = self.service.receiver.drain_outcomes()
        if not outcomes:
            return
        for event in self.tracker.process(outcomes, self.service.clock()):
            if type(event) is not RequestFinished:
                continue
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is None:
                continue
            request = self.tracker.finished[event.request_id]
            result = waiter.result
            result.placed = {u: sel.source for u, sel in event.placed.items()}
            result.failed = dict(event.failed)
            result.claims = sum(i.attempt + 1 for i in request.instances.values())
            result.rejected = sum(sum("claim rejected" in h for h in i.history)
                                  for i in request.instances.values())
            waiter.event.set()

    def select_destinations(self, spec: RequestSpec) -> RequestResult:
        """Place every instance of ``spec``; blocks until each is placed or has failed."""
        waiter = _Waiter()
        with self.lock:
            if self.follow_membership and self.service.peers != self._peers:
                # a peer came or left: the hosts are shared out again among the live ones
                self._peers = self.service.peers
                self.engine.set_peers(self._peers)
            start = time.perf_counter()
            try:
                tracked = self.tracker.submit(spec, self.service.clock())
            except NoValidHost as exc:
                waiter.result.decision_s = time.perf_counter() - start
                waiter.result.failed = {u: exc.reason for u in spec.instance_uuids}
                return waiter.result
            waiter.result.decision_s = time.perf_counter() - start
            self._waiters[tracked.request_id] = waiter
        if not waiter.event.wait(self.request_timeout):
            waiter.result.timed_out = True
        return waiter.result

    def versions(self, sources: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        """(epoch, seq) of every view holding a document, or of those of ``sources``."""
        with self.lock:
            held = self.service.receiver.sources
            if sources is None:
                return {s: v.version for s, v in held.items() if v.doc is not None}
            views = ((s, held.get(s)) for s in sources)
            return {s: v.version for s, v in views if v is not None and v.doc is not None}
