"""The request tracker: claim outcomes in, alternates claimed or NoValidHost out.

Theory of operation
-------------------
A decision claims one host per instance and keeps ``max_attempts - 1``
alternates (see :mod:`shared_host_manager.decision.engine`).  The compute node
arbitrates: the receiver reports each claim's fate through
``receiver.drain_outcomes()``; this tracker turns those into the next step
of each instance (nova's conductor reschedule loop, without the conductor)::

                        +--(ACCEPTED or INCLUDED)--------------------> DONE    [InstanceScheduled]
    submit() --> CLAIMED|
                        +--(REJECTED, EXPIRED, EPOCH_CHANGED)--+
                                                                v
                     next alternate still fits in our view? --yes--> CLAIMED  [InstanceRescheduled]
                                      |no (try the next one)
                                      +--(no alternate left, claims < max_attempts)--+
                                      |    fresh alternates: the best untried hosts  |
                                      |    in our view now (engine.fresh_alternates) |
                                      |    <-----------------------------------------+
                                      +--(none, or max_attempts claims)-> FAILED [InstanceFailed: NoValidHost]

    a request finishes when every instance is DONE or FAILED         [RequestFinished]

Rules:

* An instance is complete at the first ACCEPTED or INCLUDED of its current
  claim; later outcomes of that claim (the INCLUDED after an ACCEPTED, or an
  EXPIRED after an acceptance whose delta was lost) are ignored: an accepted
  claim is never retried, so an instance is never placed twice by the tracker.
* ``max_attempts`` bounds the claims made for an instance, as nova's
  ``[scheduler] max_attempts`` bounds its builds: the alternates a decision
  chose are tried first, and when they run out early (a scarce request may
  have none) the best untried hosts of the view at that moment, which by then
  holds the rejected host's correction.  Failing sooner would refuse a
  request the cloud had room for.
* Outcomes of claims the tracker does not know (a previous attempt, another
  caller's) are ignored.
* Every first resolution of a tracked claim feeds the adaptive subset
  (rejected: a collision; accepted: not); EXPIRED and EPOCH_CHANGED say
  nothing about collisions and are not fed.
* Pure: no clock (``now`` is an argument), no I/O.  It sends nothing: the
  claims it makes are returned, a decision's by :meth:`RequestTracker.submit`
  (:class:`Submitted`), an alternate's in the :class:`InstanceRescheduled` event
  that :meth:`RequestTracker.process` returns (:func:`claims_of`); the caller
  casts them once it released its lock.  Not thread-safe: call it under the same
  lock as the engine (the service layer drains outcomes and processes them under it).

The contract: docs/design.md §5.4.
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from protocol.messages import Claim
from protocol.receiver import Outcome
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost, Selection
from shared_host_manager.decision.request import RequestSpec


class InstanceState(enum.Enum):
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class TrackedInstance:
    request_id: str
    instance_uuid: str
    #: the selected host followed by its alternates, in order of preference
    hosts: list[Selection]
    attempt: int = 0
    claim_id: str | None = None
    #: claims made for this instance (at most max_attempts)
    claims: int = 1
    state: InstanceState = InstanceState.CLAIMED
    #: "host: why it did not work" for every host that failed
    history: list[str] = field(default_factory=list)

    @property
    def selection(self) -> Selection:
        """The host currently claimed (or where the instance landed)."""
        return self.hosts[self.attempt]


@dataclass(slots=True)
class TrackedRequest:
    request_id: str
    spec: RequestSpec
    instances: dict[str, TrackedInstance]
    selections: list[list[Selection]]

    @property
    def finished(self) -> bool:
        return all(i.state is not InstanceState.CLAIMED for i in self.instances.values())

    @property
    def placed(self) -> dict[str, Selection]:
        return {u: i.selection for u, i in self.instances.items() if i.state is InstanceState.DONE}

    @property
    def failed(self) -> dict[str, str]:
        return {u: "; ".join(i.history) for u, i in self.instances.items()
                if i.state is InstanceState.FAILED}


@dataclass(frozen=True, slots=True)
class InstanceScheduled:
    request_id: str
    instance_uuid: str
    selection: Selection
    claim_id: str


@dataclass(frozen=True, slots=True)
class InstanceRescheduled:
    request_id: str
    instance_uuid: str
    failed_source: str
    outcome: Outcome
    selection: Selection
    #: the alternate's claim, pending in the receiver: the caller casts it
    claim: Claim

    @property
    def claim_id(self) -> str:
        return self.claim.claim_id


@dataclass(frozen=True, slots=True)
class InstanceFailed:
    request_id: str
    instance_uuid: str
    error: NoValidHost


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request_id: str
    placed: dict[str, Selection]
    failed: dict[str, str]


Event = InstanceScheduled | InstanceRescheduled | InstanceFailed | RequestFinished


def claims_of(events: Iterable[Event]) -> list[Claim]:
    """The claims ``events`` made (an alternate's per InstanceRescheduled), to be cast."""
    return [e.claim for e in events if type(e) is InstanceRescheduled]


class Submitted(NamedTuple):
    """A decision tracked (:meth:`RequestTracker.submit`) and the claims it registered,
    which the caller casts."""

    request: TrackedRequest
    claims: list[Claim]

_SUCCESS = (Outcome.ACCEPTED, Outcome.INCLUDED)
_FAILURE = (Outcome.REJECTED, Outcome.EXPIRED, Outcome.DROPPED, Outcome.EPOCH_CHANGED)


class RequestTracker:
    """Follows every claimed instance to DONE or FAILED; see the module docstring."""

    def __init__(self, engine: DecisionEngine, *, keep_finished: int = 1024) -> None:
        self.engine = engine
        self.requests: dict[str, TrackedRequest] = {}
        self.finished: OrderedDict[str, TrackedRequest] = OrderedDict()
        self._keep_finished = keep_finished
        self._by_claim: dict[str, TrackedInstance] = {}
        self._ids = itertools.count(1)
        self.stats = {"submitted": 0, "no_valid_host_at_once": 0, "scheduled": 0,
                      "rescheduled": 0, "failed": 0, "fresh_alternates": 0}
        #: claims rejected, by how their host was chosen (Selection.choice)
        self.rejected_by_choice: Counter[str] = Counter()

    # -- intake ---------------------------------------------------------------------

    def submit(self, spec: RequestSpec, now: float, **kwargs: Any) -> Submitted:
        """Decide ``spec`` (engine.select_destinations) and track its claims; returns the
        tracked request and the claims, which the caller casts.

        NoValidHost and Delegated from the decision propagate (nothing was claimed).
        """
        self.stats["submitted"] += 1
        try:
            decision = self.engine.select_destinations(spec, now, **kwargs)
        except NoValidHost:
            self.stats["no_valid_host_at_once"] += 1
            raise
        return Submitted(self.track(spec, decision.rows), decision.claims)

    def track(self, spec: RequestSpec, selections: list[list[Selection]]) -> TrackedRequest:
        """Track the claims of a decision made with ``engine.select_destinations``."""
        request_id = spec.request_id or f"request-{next(self._ids)}"
        if request_id in self.requests:
            request_id = f"{request_id}#{next(self._ids)}"
        instances = {}
        for hosts in selections:
            first = hosts[0]
            inst = TrackedInstance(request_id, first.instance_uuid, list(hosts), 0, first.claim_id)
            instances[first.instance_uuid] = inst
            if first.claim_id:
                self._by_claim[first.claim_id] = inst
        request = TrackedRequest(request_id, spec, instances, selections)
        self.requests[request_id] = request
        return request

    # -- outcomes -------------------------------------------------------------------

    def process(self, outcomes: Iterable[tuple[str, str, Outcome]], now: float) -> list[Event]:
        """Feed ``receiver.drain_outcomes()``; returns what happened to tracked instances,
        with the claims of the alternates it claimed in their InstanceRescheduled events
        (:func:`claims_of`), for the caller to cast."""
        events: list[Event] = []
        for claim_id, source, outcome in outcomes:
            inst = self._by_claim.pop(claim_id, None)
            if inst is None or inst.state is not InstanceState.CLAIMED or inst.claim_id != claim_id:
                continue
            request = self.requests[inst.request_id]
            if outcome in _SUCCESS:
                self.engine.subset.observe(False)
                inst.state = InstanceState.DONE
                self.stats["scheduled"] += 1
                events.append(InstanceScheduled(inst.request_id, inst.instance_uuid,
                                                inst.selection, claim_id))
            elif outcome in _FAILURE:
                if outcome is Outcome.REJECTED:
                    self.engine.subset.observe(True)
                    self.rejected_by_choice[inst.selection.choice] += 1
                events.append(self._next_host(request, inst, source, outcome, now))
            elif outcome is Outcome.CANCELLED:
                # this scheduler gave the build up (cancel_claim): no alternate is tried
                inst.history.append(f"{inst.selection.host}: claim cancelled")
                inst.state = InstanceState.FAILED
                inst.claim_id = None
                self.stats["failed"] += 1
                events.append(InstanceFailed(inst.request_id, inst.instance_uuid, NoValidHost(
                    f"the build of instance {inst.instance_uuid} was given up")))
            else:  # pragma: no cover - a new Outcome member must be handled explicitly
                self._by_claim[claim_id] = inst
                continue
            if request.finished:
                del self.requests[request.request_id]
                self.finished[request.request_id] = request
                while len(self.finished) > self._keep_finished:
                    self.finished.popitem(last=False)
                events.append(RequestFinished(request.request_id, request.placed, request.failed))
        return events

    def _next_host(self, request: TrackedRequest, inst: TrackedInstance, source: str,
                   outcome: Outcome, now: float) -> Event:
        inst.history.append(f"{inst.selection.host}: claim {outcome.value}")
        siblings = [u for u in request.instances if u != inst.instance_uuid]
        max_attempts = self.engine.config.max_attempts
        ranked = False
        while inst.claims < max_attempts:
            if inst.attempt + 1 == len(inst.hosts):
                if ranked:  # once per rejection: every host it found failed its recheck
                    break
                ranked = True
                fresh = self.engine.fresh_alternates(
                    request.spec, inst.instance_uuid, siblings, {h.source for h in inst.hosts},
                    max_attempts - inst.claims)
                if not fresh:
                    break
                inst.hosts.extend(fresh)
                self.stats["fresh_alternates"] += 1
            inst.attempt += 1
            alternate = inst.selection
            claim, reason = self.engine.claim_alternate(alternate, request.spec, now, siblings)
            if claim is not None:
                inst.claim_id = claim.claim_id
                inst.claims += 1
                self._by_claim[claim.claim_id] = inst
                self.stats["rescheduled"] += 1
                return InstanceRescheduled(inst.request_id, inst.instance_uuid, source, outcome,
                                           alternate, claim)
            inst.history.append(f"{alternate.host}: {reason}")
        inst.state = InstanceState.FAILED
        inst.claim_id = None
        self.stats["failed"] += 1
        if inst.claims < max_attempts:
            why = (f"No valid host left for instance {inst.instance_uuid} after {inst.claims} "
                   f"of {max_attempts} attempts")
        else:
            why = f"Exceeded max scheduling attempts {inst.claims} for instance {inst.instance_uuid}"
        return InstanceFailed(inst.request_id, inst.instance_uuid,
                              NoValidHost(f"{why}: {'; '.join(inst.history)}"))

    # -- reading ----------------------------------------------------------------------

    def in_flight(self) -> int:
        """Claims awaiting an outcome."""
        return len(self._by_claim)

    def request(self, request_id: str) -> TrackedRequest | None:
        return self.requests.get(request_id) or self.finished.get(request_id)


__all__ = ["Event", "InstanceFailed", "InstanceRescheduled", "InstanceScheduled", "InstanceState",
           "RequestFinished", "RequestTracker", "Submitted", "TrackedInstance", "TrackedRequest",
           "claims_of"]
