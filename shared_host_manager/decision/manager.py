"""The scheduler's decision endpoint: ``select_destinations`` over the shared cache.

Role: nova's ``SchedulerManager`` for this project.  It ties together the
stream-fed cache (:class:`~shared_host_manager.service.SchedulerService`), the
:class:`~shared_host_manager.decision.engine.DecisionEngine` (filters, weighers,
claims) and the :class:`~shared_host_manager.decision.request_tracker.RequestTracker`
(outcomes -> alternates or NoValidHost).

Life cycle of a request::

    select_destinations(spec)
      under the cache lock: decide on the current view, register the claims as
                            pending                      (no database, no broker wait)
      the caller's thread:  once the lock is released, cast each claim with its
                            build request to the reporter of its host
      claim sender thread:  the same for alternates, claimed on ingest
      ingest (any thread):  after every stream/control message the cache calls
                            back here, under its lock: claim outcomes go to the
                            tracker; a rejection claims the next alternate; when
                            every instance is placed or failed, the caller wakes
      -> RequestResult (placed: instance -> host, failed: instance -> reason)

Threads: callers may decide concurrently from many threads; decisions and
ingest serialise on the cache lock, and the engine only ever queues claims,
so no cast happens under the lock.  A decision's own claims go out from the
caller's thread as soon as it releases the lock (not through the sender thread's
queue): the sooner a claim reaches its host, the sooner its delta reaches the
peers, and the shorter the window in which a peer decides on the same capacity.
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
        #: per thread: the claims of the decision it is making (None: not deciding)
        self._deciding = threading.local()
        self.engine = DecisionEngine(service.receiver, self._queue_claim, config=config,
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

    def _queue_claim(self, claim: Claim) -> None:  # under the cache lock
        mine = getattr(self._deciding, "claims", None)
        if mine is not None:
            mine.append(claim)  # cast by select_destinations once the lock is released
        else:
            self._sender.put(claim)

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
            result.claims = sum(i.claims for i in request.instances.values())
            result.rejected = sum(sum("claim rejected" in h for h in i.history)
                                  for i in request.instances.values())
            waiter.event.set()

    def select_destinations(self, spec: RequestSpec) -> RequestResult:
        """Place every instance of ``spec``; blocks until each is placed or has failed."""
        waiter = _Waiter()
        mine: list[Claim] = []
        self._deciding.claims = mine
        try:
            decided = self._decide(spec, waiter)
        finally:
            self._deciding.claims = None
        for claim in mine:
            try:
                if not self.service.send_claim(claim):
                    self._sender.failed += 1  # no route: the claim expires at its deadline
            except Exception:  # a lost claim expires at its deadline and is counted there
                self._sender.failed += 1
        if decided and not waiter.event.wait(self.request_timeout):
            waiter.result.timed_out = True
        return waiter.result

    def _decide(self, spec: RequestSpec, waiter: _Waiter) -> bool:
        """Decide ``spec`` under the lock; False when it failed at once (NoValidHost)."""
        with self.lock:
            # the peers' claims that arrived while the lock was taken count in this decision
            self.service.cache.apply_peer_claims()
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
                return False
            waiter.result.decision_s = time.perf_counter() - start
            self._waiters[tracked.request_id] = waiter
        return True

    def versions(self, sources: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        """(epoch, seq) of every view holding a document, or of those of ``sources``."""
        with self.lock:
            held = self.service.receiver.sources
            if sources is None:
                return {s: v.version for s, v in held.items() if v.doc is not None}
            views = ((s, held.get(s)) for s in sources)
            return {s: v.version for s, v in views if v is not None and v.doc is not None}
