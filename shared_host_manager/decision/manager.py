"""The scheduler's decision endpoint: ``select_destinations`` over the shared cache.

Role: nova's ``SchedulerManager`` for this project.  It ties together the
stream-fed cache (:class:`~shared_host_manager.service.SchedulerService`), the
:class:`~shared_host_manager.decision.engine.DecisionEngine` (filters, weighers,
claims) and the :class:`~shared_host_manager.decision.request_tracker.RequestTracker`
(outcomes -> alternates or NoValidHost).

Life cycle of a request::

    select_destinations(spec)
      under the cache lock: decide on the current view, register the claims as
                            pending; the tracker returns them (no database, no
                            broker wait)
      the caller's thread:  once the lock is released, cast each claim with its
                            build request to the reporter of its host (ClaimSender.cast)
      ingest (any thread):  after every stream/control message the cache calls
                            back here, under its lock: claim outcomes go to the
                            tracker; a rejection claims the next alternate, which
                            the tracker returns; when every instance is placed or
                            failed, the caller wakes
      claim sender thread:  casts the alternates claimed on ingest (ClaimSender.put)
      -> RequestResult (placed: instance -> host, failed: instance -> reason)

    an affinity group whose listed members no view holds: catch up with the stream
      (our own entry put on it and read back) before deciding

    NoValidHost at once: catch up with the stream (wait [filter_scheduler]
      no_valid_host_catch_up seconds for the hosts' latest changes to be published,
      then put our own entry on the stream and read it back), then decide once more;
      only a second NoValidHost is the answer (design §5.4)

    a scarce request, when another live peer is the coordinator (design §5.4):
      under the cache lock: the engine raises Delegated (nothing claimed)
      the caller's thread:  cast a ScarceRequest to the coordinator; wait for its
                            ScarceAnswer (request_timeout), which becomes the result
      the coordinator:      its peer-topic thread hands the request to a worker, which
                            runs select_destinations(spec, delegable=False) and casts
                            the ScarceAnswer back

Threads: callers may decide concurrently from many threads; decisions and
ingest serialise on the cache lock.  The engine and the tracker send nothing:
they return the claims they registered, and every claim leaves through the one
:class:`ClaimSender`, never under the lock.  A decision's own claims go out from
the caller's thread as soon as it releases the lock (not through the sender
thread's queue): the sooner a claim reaches its host, the sooner its delta
reaches the peers, and the shorter the window in which a peer decides on the
same capacity.  An alternate claimed on ingest goes to the sender thread: the
ingesting thread holds the lock and must not wait on a cast.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from protocol.codec import MAX_REASON
from protocol.messages import Claim, ScarceAnswer, ScarceRequest
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, Delegated, NoValidHost
from shared_host_manager.decision.request import RequestSpec, spec_from_wire, spec_to_wire
from shared_host_manager.decision.request_tracker import RequestFinished, RequestTracker, claims_of
from shared_host_manager.service import SchedulerService

LOG = logging.getLogger(__name__)

#: threads deciding the scarce requests peers hand over (each waits for its claims' outcomes)
SCARCE_WORKERS = 8


@dataclass
class RequestResult:
    """What happened to one request."""

    placed: dict[str, str] = field(default_factory=dict)  # instance -> source
    failed: dict[str, str] = field(default_factory=dict)  # instance -> reason
    decision_s: float = 0.0
    claims: int = 0
    rejected: int = 0
    timed_out: bool = False
    #: the coordinator that decided it in this scheduler's stead ("": decided here)
    decided_by: str = ""


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result = RequestResult()


class ClaimSender:
    """The one route a scheduler's claims leave by: :meth:`cast` from the calling thread
    (a decision's claims, once the cache lock is released), :meth:`put` for a thread of
    its own (claims made under the lock, on ingest, where no cast may wait).  Never
    raises: a claim not cast is counted in ``failed`` and expires at its deadline."""

    def __init__(self, send: Callable[[Claim], bool]) -> None:
        self._queue: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._send = send
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="claim-sender", daemon=True)
        self._thread.start()

    def cast(self, claims: Iterable[Claim]) -> None:
        """Cast ``claims`` from this thread, in order."""
        for claim in claims:
            self._cast(claim)

    def put(self, claims: Iterable[Claim]) -> None:
        """Have the sender thread cast ``claims``, in order."""
        for claim in claims:
            self._queue.put(claim)

    def _cast(self, claim: Claim) -> None:
        try:
            if not self._send(claim):
                self.failed += 1  # no route: the claim expires at its deadline
        except Exception:  # a lost claim expires at its deadline and is counted there
            self.failed += 1

    def _run(self) -> None:
        while (claim := self._queue.get()) is not None:
            self._cast(claim)

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
        #: every claim of this scheduler leaves through it
        self._sender = ClaimSender(service.send_claim)
        self.engine = DecisionEngine(service.receiver, config=config, rng=rng or random.Random())
        #: follow the live peers the service reads from the stream (design §2), unless
        #: given a fixed list
        self.follow_membership = not peers
        self._peers: tuple[str, ...] = ()
        if peers:
            self.engine.set_peers(peers)
        self.tracker = RequestTracker(self.engine, keep_finished=64)
        self._waiters: dict[str, _Waiter] = {}
        service.cache.add_listener(self)
        #: our scarce requests a coordinator is deciding, by request id
        self._handed: dict[str, _Waiter] = {}
        self._handed_lock = threading.Lock()
        self._scarce_workers: ThreadPoolExecutor | None = None
        #: requests handed over (scarce ones to the coordinator, others to the owner of
        #: their best hosts), answered, decided here for peers, given up on
        self.scarce_stats = {"handed_over": 0, "handed_to_owner": 0, "answered": 0,
                             "decided_for_peers": 0, "timed_out": 0}
        service.set_peer_handler(self)
        #: NoValidHost decisions made again after catching up with the stream, and how
        #: many of those then claimed hosts ([filter_scheduler] no_valid_host_catch_up)
        self.catch_ups = 0
        self.caught_up_decided = 0
        #: affinity requests whose listed members no view held, decided after catching up
        self.affinity_catch_ups = 0

    @property
    def name(self) -> str:
        return self.service.name

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()
        self._sender.close()
        if self._scarce_workers is not None:
            self._scarce_workers.shutdown(wait=False, cancel_futures=True)

    def ingest_done(self) -> None:
        """The cache's IngestListener, under its lock: claim outcomes to the tracker, and the
        claims of the alternates it claims to the sender thread."""
        outcomes = self.service.receiver.drain_outcomes()
        if not outcomes:
            return
        events = self.tracker.process(outcomes, self.service.clock())
        self._sender.put(claims_of(events))
        for event in events:
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

    def select_destinations(self, spec: RequestSpec, *, delegable: bool = True) -> RequestResult:
        """Place every instance of ``spec``; blocks until each is placed or has failed.

        A scarce request goes to the peers' coordinator when there is one (design §5.4);
        ``delegable=False`` decides here whatever it is (the coordinator's own call)."""
        waiter = _Waiter()
        if self._members_unlocated(spec) and self.service.catch_up():
            # an affinity group's members are somewhere: their hosts' deltas (published as
            # their claims were accepted) may be on the stream still; deciding without them
            # would start the group on a second host (design §5.4)
            with self._handed_lock:
                self.affinity_catch_ups += 1
        settle = self.engine.config.no_valid_host_catch_up
        try:
            claims = self._decide(spec, waiter, delegable)
            if claims is None and settle > 0 and self.service.catch_up(settle):
                # NoValidHost only on a view holding what the stream held when we decided:
                # a host freed a moment ago may be in a delta still on its way (design §5.4)
                waiter.result.failed = {}
                claims = self._decide(spec, waiter, delegable)
                with self._handed_lock:
                    self.catch_ups += 1
                    self.caught_up_decided += claims is not None
        except Delegated as handed:
            return self._hand_over(spec, handed.coordinator, waiter, handed.why)
        if claims is None:
            return waiter.result
        self._sender.cast(claims)  # the lock is released: from this thread, at once
        if not waiter.event.wait(self.request_timeout):
            waiter.result.timed_out = True
        return waiter.result

    def _members_unlocated(self, spec: RequestSpec) -> bool:
        group = spec.instance_group
        if group is None or group.policy != "affinity" or not group.members:
            return False
        with self.lock:
            return self.engine.members_unlocated(spec)

    def _decide(self, spec: RequestSpec, waiter: _Waiter, delegable: bool = True
                ) -> list[Claim] | None:
        """Decide ``spec`` under the lock; the claims to cast once it is released, or None
        when it failed at once (NoValidHost).  Delegated propagates: the request goes to
        the coordinator."""
        with self.lock:
            # the peers' claims that arrived while the lock was taken count in this decision
            self.service.cache.apply_peer_claims()
            if self.follow_membership and self.service.peers != self._peers:
                # a peer came or left: the hosts are shared out again among the live ones
                self._peers = self.service.peers
                self.engine.set_peers(self._peers)
            start = time.perf_counter()
            try:
                tracked, claims = self.tracker.submit(spec, self.service.clock(),
                                                      delegable=delegable)
            except NoValidHost as exc:
                waiter.result.decision_s += time.perf_counter() - start
                waiter.result.failed = {u: exc.reason for u in spec.instance_uuids}
                return None
            waiter.result.decision_s += time.perf_counter() - start
            self._waiters[tracked.request_id] = waiter
        return claims

    # -- scarce requests: handing over and deciding for peers (design §5.4) -----------

    def _hand_over(self, spec: RequestSpec, coordinator: str, waiter: _Waiter,
                   why: str = "scarce") -> RequestResult:
        """Cast ``spec`` to ``coordinator`` (the scarce requests' coordinator, or the owner
        of its best hosts: ``why``) and wait for what became of it."""
        request_id = f"{self.name}:{uuid.uuid4()}"
        result = waiter.result
        result.decided_by = coordinator
        with self._handed_lock:
            self._handed[request_id] = waiter
            self.scarce_stats["handed_over" if why == "scarce" else "handed_to_owner"] += 1
        try:
            self.service.send_to_peer(coordinator, ScarceRequest(
                request_id, self.name, coordinator, spec_to_wire(spec)))
        except Exception as exc:  # the coordinator is unreachable: the request is not placed
            LOG.warning("scheduler %s could not hand a scarce request to %s: %s",
                        self.name, coordinator, exc)
        waiter.event.wait(self.request_timeout)
        with self._handed_lock:
            self._handed.pop(request_id, None)
            if not waiter.event.is_set():
                result.timed_out = True
                self.scarce_stats["timed_out"] += 1
        return result

    def peer_request(self, msg: ScarceRequest | ScarceAnswer) -> None:
        """The peer topic's thread: an answer wakes its caller; a request handed to us
        goes to a worker (deciding waits for claim outcomes, which arrive on this thread)."""
        if type(msg) is ScarceAnswer:
            if msg.requester != self.name:
                return
            with self._handed_lock:  # so that the caller times out or is answered, not both
                waiter = self._handed.pop(msg.request_id, None)
                if waiter is None:
                    return  # we gave up waiting for it (its claims stand: the host arbitrated)
                self.scarce_stats["answered"] += 1
                result = waiter.result
                result.placed, result.failed = dict(msg.placed), dict(msg.failed)
                result.claims, result.rejected = msg.claims, msg.rejected
                waiter.event.set()
            return
        assert type(msg) is ScarceRequest
        if msg.coordinator != self.name:
            LOG.warning("scheduler %s dropped a scarce request for %s from %s", self.name,
                        msg.coordinator, msg.scheduler)
            return
        if self._scarce_workers is None:
            self._scarce_workers = ThreadPoolExecutor(SCARCE_WORKERS,
                                                      thread_name_prefix=f"{self.name}-scarce")
        self._scarce_workers.submit(self._decide_for_peer, msg)

    def _decide_for_peer(self, msg: ScarceRequest) -> None:
        """A worker: decide and claim a peer's scarce request here, then answer it."""
        try:
            spec = spec_from_wire(msg.spec)
            result = self.select_destinations(spec, delegable=False)
            failed = {u: r[:MAX_REASON] for u, r in result.failed.items()}
            for u in spec.instance_uuids:
                if u not in result.placed and u not in failed:
                    failed[u] = f"no outcome at the coordinator {self.name} in time"
        except Exception as exc:  # a request we cannot read or decide fails; we never crash
            LOG.warning("scheduler %s could not decide the scarce request %s of %s: %s",
                        self.name, msg.request_id, msg.scheduler, exc)
            result, failed = RequestResult(), {"*": f"the coordinator {self.name} failed: "
                                                     f"{type(exc).__name__}"[:MAX_REASON]}
        with self._handed_lock:
            self.scarce_stats["decided_for_peers"] += 1
        try:
            self.service.send_to_peer(msg.scheduler, ScarceAnswer(
                msg.request_id, self.name, msg.scheduler, result.placed, failed, result.claims,
                result.rejected))
        except Exception as exc:  # it times out waiting; the claims stand
            LOG.warning("scheduler %s could not answer %s: %s", self.name, msg.scheduler, exc)

    def versions(self, sources: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        """(epoch, seq) of every view holding a document, or of those of ``sources``."""
        with self.lock:
            held = self.service.receiver.sources
            if sources is None:
                return {s: v.version for s, v in held.items() if v.doc is not None}
            views = ((s, held.get(s)) for s in sources)
            return {s: v.version for s, v in views if v is not None and v.doc is not None}
