"""A scheduler's placement state: the placement feed's providers, answering allocation candidates.

Role: the scheduler side of "placement state on the stream" (docs/design.md
§11).  The placement feed (:mod:`.feed`) publishes one source whose document
holds every resource provider in the dict form of :mod:`.state`; the
scheduler's cache hands every provider that changed in that document to
:meth:`PlacementView.apply_providers`, and the nova drop-in's report client
asks :meth:`PlacementView.answer` for the body of placement's
``GET /allocation_candidates`` instead of asking placement.

Four inputs change a provider here, each newest-generation-wins:

* the feed (``apply_providers``): the provider as placement's database held it
  when the feed read it.  A provider the feed publishes with another
  ``created_at`` or row ``id`` than the one held was deleted and created again
  under the same uuid (the id tells it within ``created_at``'s one-second
  resolution on MySQL): it replaces the held one whatever its generation.  One of the
  same generation as the one held, but other content, replaces it too:
  placement does not increment a provider's generation when an allocation on
  it is deleted, so the feed publishes that provider again, read after the
  deletion, at the same generation (this scheduler's claims stay added: they
  are newer than that generation);
* this scheduler's own claims (``note_claim``): placement accepted them, so
  they are in placement's usages already, but the feed's next read of the
  provider is up to a poll interval away.  They are added to the provider's
  usages until a newer generation of it arrives (read-your-writes);
* a correction (``correct``): the provider as placement returned it after
  refusing a claim, applied at once when its generation is newer;
* the peers' claims (``note_peer_claim``): a peer scheduler announces the
  host it is about to claim in placement (an intent, design §5.2) and the
  claim placement accepted, each with its allocation request
  (``protocol.messages.ANNOUNCED_ALLOCATIONS``).  The claim is added to the
  providers' usages from its first announcement.  While placement has not
  answered it stays, whatever the feed brings (other claims move a provider's
  generation too); once its acceptance came, the first generation newer than
  the one held then retires it (the feed's copy can hold it from there); an
  acceptance on other providers than the intent named (placement refused the
  intended host, nova claimed its next) moves it there; the host's rejection
  (``drop_peer_claim``) drops it; and ``peer_claim_ttl`` after its last
  announcement, at most ``max_staleness``, it goes (a claim placement refused
  leaves no trace the feed could show; an accepted one is in the feed by then,
  or the view is stale).  A retired claim announced again is not held until
  that deadline.  Without this the view learns of the peers' claims only from
  the feed, a poll interval after placement's answer, and every scheduler
  keeps offering the host a peer is filling.

Freshness: nothing is answered before the feed's first providers arrived
(reason ``no_feed``), nor while the feed's source is marked down or has not
been heard from for ``max_staleness`` seconds (reason ``stale``): placement
answers those requests itself.  Every message of the source counts as heard,
heartbeats included (:meth:`heard`).

Read-your-writes: a request that says when it arrived at nova's API
(``asked_at``, wall-clock seconds) is answered once the view holds a poll
marker of the feed (:meth:`polled`: the wall-clock time a poll began whose
every change the view applied) at or after it, so every placement write that
returned before the request was made (an aggregate's new host, a trait, an
inventory) is in the answer, as it is in placement's.  The request waits for
that marker at most ``wait`` seconds, then is left to placement (reason
``behind``); when no newer marker came for ``max_staleness`` (a feed that
heartbeats but whose polls fail: placement's database unreachable), at once.
A feed that publishes no markers (none held) sets no bar.

Thread safety: :attr:`lock` guards :attr:`state` and everything else here;
every method takes it.  The answer's allocation requests and provider
summaries are the state's cached objects, shared with later answers:
read-only for the caller.

Life cycle::

    created --apply_providers / heard--> fed (answers while fresh; a request asked
                                              at t once a marker >= t came)
    fed --source_down, or silent > max_staleness--> stale (answers 'stale')
    stale --heard / apply_providers--> fed

A peer's claim, per claim id::

    (none) --intent--> intended --acceptance--> accepted --newer generation--> retired
    (none) --acceptance--> accepted          intended --acceptance elsewhere--> accepted
    intended / accepted --drop_peer_claim / deadline--> (none)
    retired --deadline--> (none)
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared_host_manager.placement.candidates import PlacementConfig
from shared_host_manager.placement.candidates import answer as candidates_answer
from shared_host_manager.placement.query import Unanswered
from shared_host_manager.placement.state import ProviderState

#: placement's defaults (PlacementConfig()), the view's when none is given
DEFAULT_CONFIG = PlacementConfig()


def claimed_resources(alloc_request: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{rp: {rc: amount}}`` of an allocation request (placement's PUT /allocations body)."""
    return {rp: {rc: int(n) for rc, n in (alloc.get("resources") or {}).items()}
            for rp, alloc in (alloc_request.get("allocations") or {}).items()}


@dataclass(slots=True)
class _PeerClaim:
    """A peer's claim as the view holds it (the module docstring's life cycle)."""

    #: provider -> the claim's resources there, on the providers the view holds; empty once
    #: retired (remembered until the deadline, so that an announcement again is not held)
    held: dict[str, dict[str, int]]
    #: ``peer_claim_ttl`` after its last announcement, at most ``max_staleness``
    until: float
    #: the held providers' generations when placement's acceptance came (None: an intent)
    accepted: dict[str, int] | None = None


class PlacementView:
    """The placement feed's providers in one scheduler's memory (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_staleness: float = 5.0,
                 config: PlacementConfig = DEFAULT_CONFIG, peer_claim_ttl: float = 1.0) -> None:
        self.clock = clock
        self.max_staleness = max_staleness
        self.peer_claim_ttl = peer_claim_ttl
        self.config = config
        self.lock = threading.Lock()
        #: notified when a newer poll marker arrives (the requests waiting for one)
        self._marker_came = threading.Condition(self.lock)
        self.state = ProviderState()
        #: uuid -> the provider as the feed (or a correction) last gave it, without claims
        self._base: dict[str, Mapping[str, Any]] = {}
        #: uuid -> this scheduler's claims added to the base's usages, per resource class
        self._claims: dict[str, dict[str, int]] = {}
        #: claim id -> a peer's claim, held or retired, until its deadline
        self._peer_claims: dict[str, _PeerClaim] = {}
        #: uuid -> the ids of the peers' claims held on it
        self._peer_on: dict[str, set[str]] = {}
        #: (deadline, claim id) in the order set (one ttl for all: deadlines never decrease)
        self._peer_deadlines: deque[tuple[float, str]] = deque()
        self._last_applied: float | None = None
        self._last_heard: float | None = None
        #: the newest poll marker applied (the feed's wall clock), None: the feed sends none
        self._polled: float | None = None
        #: when (the view's clock) the newest marker came
        self._marker_at: float | None = None
        #: seconds the requests waited for a poll marker, in all
        self.waited = 0.0
        self._down = False
        #: the random source of randomize_allocation_candidates when the caller gives none
        self.rng = random.Random()
        #: "waits" (requests that waited for a poll marker),
        #: "applied", "deleted", "older", "same" (the held copy again), "recreated", "claims",
        #: "claims_unknown", "corrections", "corrections_older", and of the peers' claims
        #: "peer_claims" (held), "peer_claims_included" (a newer generation after the acceptance),
        #: "peer_claims_rejected", "peer_claims_expired", "peer_claims_again" (held or
        #: retired already), "peer_claims_unknown" (no provider of it held),
        #: "peer_claims_malformed", "peer_claims_accepted" (placement's acceptance came),
        #: "peer_claims_moved" (accepted on other providers than the intent named)
        self.counters: Counter[str] = Counter()

    # -- input ---------------------------------------------------------------------

    def apply_providers(self, changed: Mapping[str, Mapping[str, Any] | None], now: float) -> None:
        """Apply provider dicts (None: deleted) as the feed published them; marks the view fresh at now."""
        with self.lock:
            for uuid, doc in changed.items():
                if doc is None:
                    self._forget(uuid)
                    continue
                held = self._base.get(uuid)
                if held is not None:
                    if (held.get("created_at"), held.get("id")) != (doc.get("created_at"), doc.get("id")):
                        # deleted and created again: the generations start over
                        self._forget(uuid)
                        self.counters["recreated"] += 1
                    else:
                        gen, held_gen = int(doc["generation"]), int(held["generation"])
                        if gen < held_gen:
                            self.counters["older"] += 1
                            continue
                        if gen == held_gen:
                            if doc == held:
                                self.counters["same"] += 1
                                continue
                            # read again at the same generation: an allocation deleted
                            self._set(uuid, doc, keep_claims=True)
                            self.counters["applied"] += 1
                            continue
                self._set(uuid, doc)
                self.counters["applied"] += 1
            self._last_applied = now
            self._heard(now)

    def set_known_names(self, *, traits: Iterable[str] | None = None,
                        resource_classes: Iterable[str] | None = None,
                        allocation_ratio_storage: str | None = None) -> None:
        """The names placement defines and how its database stores allocation ratios (the feed's meta)."""
        with self.lock:
            if allocation_ratio_storage and allocation_ratio_storage != self.state.allocation_ratio_storage:
                old = self.state
                self.state = ProviderState(allocation_ratio_storage=allocation_ratio_storage,
                                           capacity=max(64, len(self._base)))
                if old._explicit_traits is not None or old._explicit_rcs is not None:
                    self.state.set_known_names(traits=old._explicit_traits,
                                               resource_classes=old._explicit_rcs)
                for uuid in self._base:
                    self.state.apply(self._effective(uuid))
            self.state.set_known_names(traits=traits, resource_classes=resource_classes)

    def heard(self, now: float) -> None:
        """The feed's source was heard from at ``now`` (any message of it, a heartbeat too)."""
        with self.lock:
            self._heard(now)

    def polled(self, started: float) -> None:
        """The feed's poll marker: every placement write committed before wall-clock ``started``
        is in what the view applied.  Called after the changes that came with it."""
        with self.lock:
            if self._polled is None or started > self._polled:
                self._polled = started
                self._marker_at = self.clock()
                self._marker_came.notify_all()

    def source_down(self) -> None:
        """The feed's source is down (its goodbye, or silence past the receiver's down interval)."""
        with self.lock:
            self._down = True

    def note_claim(self, allocations: Mapping[str, Mapping[str, int]]) -> None:
        """This scheduler's own claim placement accepted: {rp_uuid: {rc: amount}} added to the providers'
        usages until a newer generation of that provider arrives from the feed (read-your-writes)."""
        with self.lock:
            for uuid, resources in allocations.items():
                if uuid not in self._base:
                    self.counters["claims_unknown"] += 1
                    continue
                held = self._claims.setdefault(uuid, {})
                for rc, amount in resources.items():
                    held[rc] = held.get(rc, 0) + int(amount)
                self.state.apply(self._effective(uuid), replace=True)
                self.counters["claims"] += 1

    def note_peer_claim(self, claim_id: str, allocations: Mapping[str, Mapping[str, int]],
                        accepted: bool = False) -> None:
        """A peer's claim of {rp_uuid: {rc: amount}} in placement, announced before it asks
        placement (an intent) or once placement ``accepted`` it: added to the providers' usages
        until the feed's copy can hold it, its rejection or its deadline (see the module
        docstring).  Anything but that shape, with non-negative amounts, is counted and
        ignored."""
        try:
            wanted = {str(u): {str(rc): int(n) for rc, n in res.items()}
                      for u, res in allocations.items()}
        except (AttributeError, TypeError, ValueError):
            wanted = {}
        with self.lock:
            if not wanted or any(n < 0 for res in wanted.values() for n in res.values()):
                self.counters["peer_claims_malformed"] += 1
                return
            now = self.clock()
            self._expire(now)
            claim = self._peer_claims.get(claim_id)
            if claim is not None and (not claim.held or not accepted):
                self.counters["peer_claims_again"] += 1
                return
            if claim is not None and claim.held != wanted:
                # placement refused the intended host and accepted another (nova's next)
                self._drop_peer(claim_id)
                self.counters["peer_claims_moved"] += 1
                claim = None
            if claim is None:
                held = {u: res for u, res in wanted.items() if u in self._base}
                if not held:
                    self.counters["peer_claims_unknown"] += 1
                    return
                claim = self._peer_claims[claim_id] = _PeerClaim(held, now)
                for uuid in held:
                    self._peer_on.setdefault(uuid, set()).add(claim_id)
                    self.state.apply(self._effective(uuid), replace=True)
                self.counters["peer_claims"] += 1
            if accepted:
                # from here a newer generation than the one held can include it
                claim.accepted = {u: int(self._base[u]["generation"]) for u in claim.held}
                self.counters["peer_claims_accepted"] += 1
            # placement's answer reaches the feed within max_staleness or the view is stale: no
            # need to hold a claim for the whole peer_claim_ttl a deployment raises to cover a
            # build's start
            claim.until = now + min(self.peer_claim_ttl, self.max_staleness)
            self._peer_deadlines.append((claim.until, claim_id))

    def drop_peer_claim(self, claim_id: str) -> None:
        """The host rejected a peer's claim: it is no longer held."""
        with self.lock:
            claim = self._peer_claims.get(claim_id)
            if claim is not None and claim.held:
                self._drop_peer(claim_id)
                self.counters["peer_claims_rejected"] += 1

    def correct(self, provider: Mapping[str, Any]) -> None:
        """A provider as placement returned it after refusing a claim (the scheduler read it): applied at
        once if its generation is newer."""
        uuid = str(provider["uuid"])
        with self.lock:
            held = self._base.get(uuid)
            if held is not None and int(provider["generation"]) <= int(held["generation"]):
                self.counters["corrections_older"] += 1
                return
            doc = dict(provider)
            if held is not None and "created_at" not in doc and "created_at" in held:
                doc["created_at"] = held["created_at"]
            self._set(uuid, doc)
            self.counters["corrections"] += 1

    # -- output --------------------------------------------------------------------

    def over_capacity(self, allocations: Mapping[str, Mapping[str, int]]) -> str | None:
        """The first provider of {rp_uuid: {rc: amount}} that placement is known to refuse it on
        (as ``rp_uuid/rc``), or None: the feed's copy and this scheduler's own claims leave no
        room for the amount under either of placement's capacity computations.  The peers'
        claims do not count (an intent may be refused, an acceptance may be in the feed's copy
        already), nor does a provider or an inventory the view does not hold: placement
        decides those.  Not while the view is stale."""
        with self.lock:
            if self._unfresh(self.clock()) is not None:
                return None
            state = self.state
            for uuid, resources in allocations.items():
                base = self._base.get(uuid)
                slot = state.slot_of(uuid)
                if base is None or slot is None:
                    continue
                usages = base.get("usages") or {}
                own = self._claims.get(uuid) or {}
                for rc, amount in resources.items():
                    cols = state.columns(rc)
                    if cols is None or not cols.has[slot]:
                        continue
                    used = int(usages.get(rc, 0)) + own.get(rc, 0)
                    if used + int(amount) > max(float(cols.avail[slot]), int(cols.cap[slot])):
                        return f"{uuid}/{rc}"
            return None

    def answer(self, querystring: str, microversion: str, rng: random.Random | None = None,
               asked_at: float | None = None, wait: float = 0.0) -> dict[str, Any] | Unanswered:
        """placement's GET /allocation_candidates body from memory, or why not: the query/candidates
        reasons, plus 'no_feed' (nothing received yet), 'stale' (the feed's source silent or down
        longer than max_staleness) and 'behind' (no poll marker at or after ``asked_at`` within
        ``wait`` seconds: the module docstring's read-your-writes)."""
        with self.lock:
            if asked_at is not None and self._polled is not None and self._polled < asked_at:
                assert self._marker_at is not None
                quiet = self.clock() - self._marker_at
                if quiet > self.max_staleness:  # the feed heartbeats but completes no poll
                    return Unanswered("behind", f"no poll of the placement feed completed for "
                                                f"{quiet:.1f} s")
                self.counters["waits"] += 1
                began = time.monotonic()
                came = self._marker_came.wait_for(
                    lambda: self._polled is not None and self._polled >= asked_at, wait)
                self.waited += time.monotonic() - began
                if not came:
                    assert self._polled is not None
                    return Unanswered("behind", f"the placement feed's newest poll began "
                                                f"{asked_at - self._polled:.3f} s before the request")
            now = self.clock()
            why = self._unfresh(now)
            if why is not None:
                return why
            self._expire(now)
            return candidates_answer(self.state, querystring, microversion, self.config,
                                     rng if rng is not None else self.rng)

    def status(self) -> dict[str, Any]:
        """providers, last_applied and last_heard (ages in seconds, None: never), fresh, reason and
        detail (None when fresh), down, max_staleness, claims_held, counters."""
        with self.lock:
            now = self.clock()
            why = self._unfresh(now)
            return {
                "providers": len(self.state),
                "last_applied": None if self._last_applied is None else now - self._last_applied,
                "last_heard": None if self._last_heard is None else now - self._last_heard,
                "fresh": why is None,
                "reason": None if why is None else why.reason,
                "detail": None if why is None else why.detail,
                "down": self._down,
                "max_staleness": self.max_staleness,
                "poll_marker": self._polled,
                "waited_seconds": self.waited,
                "claims_held": len(self._claims),
                "peer_claims_held": sum(1 for claim in self._peer_claims.values() if claim.held),
                "counters": dict(self.counters),
            }

    def provider(self, uuid: str) -> dict[str, Any] | None:
        """The provider as held (the feed's, with this scheduler's claims and the peers'
        added), or None."""
        with self.lock:
            self._expire(self.clock())
            return self._effective(uuid) if uuid in self._base else None

    # -- internals (under the lock) ----------------------------------------------------

    def _heard(self, now: float) -> None:
        if self._last_heard is None or now > self._last_heard:
            self._last_heard = now
        self._down = False

    def _unfresh(self, now: float) -> Unanswered | None:
        if self._last_applied is None:
            return Unanswered("no_feed", "nothing received from the placement feed yet")
        if self._down:
            return Unanswered("stale", "the placement feed's source is down")
        assert self._last_heard is not None
        silent = now - self._last_heard
        if silent > self.max_staleness:
            return Unanswered("stale", f"the placement feed's source silent for {silent:.1f} s")
        return None

    def _set(self, uuid: str, doc: Mapping[str, Any], keep_claims: bool = False) -> None:
        self._base[uuid] = doc
        if keep_claims:
            self.state.apply(self._effective(uuid), replace=True)
            return
        # a newer generation includes every claim placement accepted before it was read: this
        # scheduler's, and a peer's whose acceptance came when an older one was held (one
        # still in placement's hands is not in it: other claims move the generation too)
        self._claims.pop(uuid, None)
        gen = int(doc["generation"])
        for claim_id in list(self._peer_on.get(uuid, ())):
            claim = self._peer_claims[claim_id]
            if claim.accepted is not None and gen > claim.accepted.get(uuid, gen):
                self._release(claim_id, claim, applied_next=uuid)
                self.counters["peer_claims_included"] += 1
        self.state.apply(self._effective(uuid), replace=True)

    def _forget(self, uuid: str) -> None:
        if self._base.pop(uuid, None) is not None:
            self.counters["deleted"] += 1
        self._claims.pop(uuid, None)
        for claim_id in list(self._peer_on.get(uuid, ())):
            self._release(claim_id, self._peer_claims[claim_id])
        self.state.delete(uuid)

    def _release(self, claim_id: str, claim: _PeerClaim, applied_next: str | None = None) -> None:
        """Stop holding a peer's claim on its providers (retired: its id stays until its
        deadline); each is applied again but ``applied_next``, which the caller applies."""
        for uuid in claim.held:
            on = self._peer_on[uuid]
            on.discard(claim_id)
            if not on:
                del self._peer_on[uuid]
            if uuid != applied_next and uuid in self._base:
                self.state.apply(self._effective(uuid), replace=True)
        claim.held = {}
        claim.accepted = None

    def _drop_peer(self, claim_id: str) -> None:
        """Forget a peer's claim: released, and its id too."""
        claim = self._peer_claims.pop(claim_id, None)
        if claim is not None:
            self._release(claim_id, claim)

    def _expire(self, now: float) -> None:
        deadlines = self._peer_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, claim_id = deadlines.popleft()
            claim = self._peer_claims.get(claim_id)
            if claim is None or claim.until > now:
                continue  # gone already, or announced again since with a later deadline
            if claim.held:
                self.counters["peer_claims_expired"] += 1
            self._drop_peer(claim_id)

    def _effective(self, uuid: str) -> dict[str, Any]:
        base = self._base[uuid]
        claims = self._claims.get(uuid)
        peer = self._peer_on.get(uuid)
        doc = dict(base)
        if claims or peer:
            usages = dict(base.get("usages") or {})
            held = [self._peer_claims[claim_id].held[uuid] for claim_id in peer or ()]
            for resources in (claims or {}, *held):
                for rc, amount in resources.items():
                    usages[rc] = usages.get(rc, 0) + amount
            doc["usages"] = usages
        return doc


__all__ = ["PlacementView", "claimed_resources"]
