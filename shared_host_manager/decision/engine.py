"""The decision path: filter, weigh, pick, claim — over a ReceiverMachine, with no database read.

Theory of operation
-------------------
:meth:`DecisionEngine.select_destinations` is nova's ``_schedule`` over our own
host view.  For each instance of the request::

    rank(request view)                 filters, then weighers, over every host  (ranking.py)
      -> top k (k = adaptive host_subset_size)  -> one of them: at random (seeded RNG),
         or, with peers, the best one this scheduler owns              (peers.py)
      -> consume it in the request's scratch (RequestView), next instance
    alternates: the max_attempts-1 next-best hosts of the same cell     (claims.py)
    claims: one Claim per instance, registered as pending with the receiver
            (add_claim) and returned in the :class:`Decision` — no broker round trip first

All-or-nothing like nova: if any instance finds no host, NoValidHost is raised
before any claim is registered (the scratch is simply dropped).

The engine is the orchestrator of three parts, one module each:
:mod:`.ranking` (the fast and slow ranking paths, which decide identically),
:mod:`.peers` (ownership among peer schedulers, scarce requests, hand-over) and
:mod:`.claims` (claims, nova's Selection rows, alternates).  It sends nothing:
the claims a decision registers are in what it returns, and
:meth:`DecisionEngine.claim_alternate` returns the alternate's claim; the caller
owns the one route claims leave by.

Consistency and threads
-----------------------
The engine is not thread-safe and does no locking: the service layer holds
its cache lock while ingesting (into the receiver) and while deciding, so a
decision sees one consistent version of every host.  The engine calls
``index.sync()`` itself at the start of a decision (every change ingested since
the last one, at once) and after registering claims.  The caller casts the
returned claims once it released the lock; the engine does not withdraw a claim
it registered, so a claim that is never cast stays deducted until its deadline
expires it (or a caller that knows the build was given up calls
``receiver.cancel_claim``).  Pure: the clock is an argument
(``now``), randomness the seeded RNG given at construction.

The contract: docs/design.md §5.1 and §5.4.
"""

from __future__ import annotations

import random
import uuid as uuid_mod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from protocol.groups import AFFINITY
from protocol.messages import Claim
from protocol.receiver import ReceiverMachine
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.claims import ANCHOR, ClaimBuilder, Selection, claim_payload
from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.index import HostIndex
from shared_host_manager.decision.peers import (
    FRONT_DEPTH,
    SCARCE_MEMORY,
    SCARCE_PER_PEER,
    Delegated,
    PeerCoordination,
)
from shared_host_manager.decision.plugins import load_core
from shared_host_manager.decision.ranking import FAST, SLOW, Ranking, apply_vector
from shared_host_manager.decision.request import RequestSpec, RequestView
from shared_host_manager.decision.subset import AdaptiveSubset, RendezvousChoice
from shared_host_manager.decision.weights import BaseHostWeigher
from shared_host_manager.decision.world import IndexWorld

#: the first member of an affinity group goes to one of this many best hosts, the same for
#: every scheduler holding (about) the same view
ANCHOR_DEPTH = 32


class DecisionObserver(Protocol):
    """What a :class:`DecisionEngine` tells its observer (the update log): the engine's
    contract, here where it is called.

    Called under the caller's lock, around each decision (docs/design.md §8):
    the claims a decision registers reach the receiver's observer in between.
    """

    def engine_attached(self, engine: DecisionEngine) -> None:
        """The engine took this observer: its configuration, filters and weighers are final."""

    def decision_started(self, engine: DecisionEngine, spec: RequestSpec, now: float, *,
                         return_alternates: bool, live_schedulers: int | None,
                         path: str | None, delegable: bool = True) -> object:
        """A decision begins (before the RNG is used); returns a token for the end call
        (opaque to the engine, which hands it back as it is)."""

    def decision_finished(self, token: object, rows: list[list[Selection]], now: float) -> None:
        """The decision ``token`` placed every instance (rows as returned)."""

    def decision_failed(self, token: object, error: Exception, now: float) -> None:
        """The decision ``token`` raised ``error`` (NoValidHost, Delegated, or a bug)."""


class NoValidHost(Exception):
    """No host passed the filters (or every attempt for an instance failed); nova's NoValidHost."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"No valid host was found. {reason}")
        self.reason = reason


class _AnchorRefused(Exception):
    """An affinity group's anchor, chosen in this request, refused a later member of it."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision placed: per instance [claimed selection, *alternates] (``rows``),
    and the claims it registered as pending with the receiver, one per instance in the
    order of ``rows``, for the caller to cast (none on a dry run)."""

    rows: list[list[Selection]]
    claims: list[Claim]


class DecisionEngine:
    """Filter, weigh, pick and claim over one receiver; see the module docstring."""

    def __init__(
        self,
        receiver: ReceiverMachine,
        *,
        config: SchedulerConfig | None = None,
        index: HostIndex | None = None,
        rng: random.Random | None = None,
        filters: Sequence[BaseHostFilter] | None = None,
        weighers: Sequence[BaseHostWeigher] | None = None,
        path: str = FAST,
        live_schedulers: int = 1,
    ) -> None:
        if path not in (FAST, SLOW):
            raise ValueError(f"path must be {FAST!r} or {SLOW!r}")
        self.receiver = receiver
        self.config = config or SchedulerConfig()
        self.index = index if index is not None else HostIndex(receiver)
        self.rng = rng or random.Random()
        if filters is None or weighers is None:
            loaded = load_core(self.config)  # [filter_scheduler] decision_core
            filters = loaded[0] if filters is None else filters
            weighers = loaded[1] if weighers is None else weighers
        self.path = path
        self.live_schedulers = live_schedulers
        self.subset = AdaptiveSubset(self.config.host_subset_size_min, self.config.host_subset_size_max,
                                     self.config.claim_rejection_target,
                                     self.config.claim_rejection_ewma_alpha)
        self.stats = {"requests": 0, "instances": 0, "no_valid_host": 0, "claims_sent": 0,
                      "alternates_claimed": 0, "owned_choices": 0, "peer_choices": 0,
                      "affinity_anchors": 0, "anchors_refused": 0, "scarce_choices": 0, "scarce_skips": 0,
                      "fresh_alternates": 0, "delegated": 0, "handed_to_owner": 0}
        self.ranking = Ranking(receiver, self.index, filters, weighers)
        self.peer_coordination = PeerCoordination(receiver.name, self.config, self.index,
                                                  self.ranking, self.rng, self.stats)
        # draws the claim ids' nonce: the first use of the RNG, as a replay expects
        self.claim_builder = ClaimBuilder(receiver, self.index, self.ranking, self.rng, self.stats)
        #: sums over every instance placed: weight of the best host minus the chosen one's,
        #: and the chosen host's rank (0: the best), for the simulator's quality figures
        self.quality = {"weight_gap": 0.0, "rank": 0.0, "picks": 0.0}
        self.observer: DecisionObserver | None = None

    @property
    def filters(self) -> list[BaseHostFilter]:
        return self.ranking.filters

    @property
    def weighers(self) -> list[BaseHostWeigher]:
        return self.ranking.weighers

    def set_observer(self, observer: DecisionObserver) -> None:
        """Have ``observer`` told of every decision from now on (at most one)."""
        if self.observer is not None:
            raise RuntimeError(f"the engine of {self.receiver.name!r} is already observed")
        self.observer = observer
        observer.engine_attached(self)

    # -- public API ------------------------------------------------------------------

    def select_destinations(
        self,
        spec: RequestSpec,
        now: float,
        *,
        return_alternates: bool = True,
        live_schedulers: int | None = None,
        path: str | None = None,
        dry_run: bool = False,
        delegable: bool = True,
    ) -> Decision:
        """Place every instance of ``spec``: per instance [claimed selection, *alternates],
        and the claims registered, which the caller casts.

        Raises NoValidHost (and claims nothing) when an instance finds no host, and
        Delegated (claiming nothing) when an instance is scarce, ``delegable``, and
        another live peer is the coordinator (:attr:`coordinator`); the coordinator
        decides what is handed to it with ``delegable=False``.
        ``now`` is the receiver's clock (claim deadlines); ``live_schedulers``
        overrides :attr:`live_schedulers` for the subset size.  ``dry_run``
        decides without registering the claims (``shm replay --decisions``
        re-runs recorded decisions this way; none are returned) and is not observed.
        """
        observer = self.observer
        if observer is None or dry_run:
            return self._select(spec, now, return_alternates, live_schedulers, path, dry_run,
                                delegable)
        token = observer.decision_started(self, spec, now, return_alternates=return_alternates,
                                          live_schedulers=live_schedulers, path=path,
                                          delegable=delegable)
        try:
            decision = self._select(spec, now, return_alternates, live_schedulers, path, False,
                                    delegable)
        except Exception as exc:
            observer.decision_failed(token, exc, now)
            raise
        observer.decision_finished(token, decision.rows, now)
        return decision

    def _select(self, spec: RequestSpec, now: float, return_alternates: bool,
                live_schedulers: int | None, path: str | None, dry_run: bool,
                delegable: bool = True) -> Decision:
        self.index.sync()
        self.stats["requests"] += 1
        fast = (path or self.path) == FAST
        uuids = self.instance_uuids(spec)
        k = self.subset.size(live_schedulers if live_schedulers is not None else self.live_schedulers)
        peering = self.peer_coordination
        depth = peering.depth(k)
        scarce = peering.scarce_limit()
        coordinator = self.coordinator if delegable else None
        # anchors whose group's later members of this request did not fit there
        refused: set[str] = set()
        while True:
            req = self.ranking.request_view(spec, fast, uuids)
            try:
                picks, ranking = self._pick(req, uuids, depth, scarce, k, now, coordinator,
                                            delegable, fast, refused)
                break
            except _AnchorRefused as exc:
                self.stats["anchors_refused"] += 1
                refused.add(exc.source)
        if not dry_run:
            for _, _, _, _, gap, pick in picks:
                # placement quality: how far below the best host the chosen one weighs
                self.quality["weight_gap"] += gap
                self.quality["rank"] += pick
                self.quality["picks"] += 1

        builder = self.claim_builder
        num_alts = self.config.max_attempts - 1 if return_alternates else 0
        alternates: dict[str | None, list[tuple[str, float]]] = {}
        if num_alts > 0:
            if len(uuids) > 1:
                # nova re-ranks once after consuming every instance (claimed hosts have less left)
                ranking = self.ranking.rank(req, fast)
            alternates = builder.alternates(ranking, {p[1] for p in picks}, num_alts,
                                            peering.ownership)

        rows: list[list[Selection]] = []
        claims: list[Claim] = []
        payload = claim_payload(spec)
        group_of_claims = builder.claim_group(req)
        for uuid, source, weight, choice, _, _ in picks:
            claim = builder.new_claim(source, uuid, req.resources, payload, group_of_claims)
            if not dry_run:
                self.receiver.add_claim(claim, now)
                claims.append(claim)
            cell = builder.cell_of(source)
            row = [builder.selection(source, uuid, weight, claim.claim_id, choice)]
            row.extend(builder.selection(s, uuid, w) for s, w in alternates.get(cell, ())[:num_alts])
            rows.append(row)
        # the pending claims are now in the receiver's ledger: refresh those rows before
        # the next decision, and drop the scratch (it would subtract them twice)
        req.consumed.clear()
        self.index.sync()
        self.stats["instances"] += len(uuids)
        self.stats["claims_sent"] += len(claims)
        return Decision(rows, claims)

    def _pick(self, req: RequestView, uuids: list[str], depth: int, scarce: int, k: int,
              now: float, coordinator: str | None, delegable: bool, fast: bool, refused: set[str],
              ) -> tuple[list[tuple[str, str, float, str, float, int]], Iterable[tuple[str, float]]]:
        """Each instance's host in turn, consuming on the request's scratch: per instance
        (uuid, source, weight, how chosen, gap to the best, rank); and the last ranking.

        Raises _AnchorRefused when an affinity group anchored in this request cannot take
        a later member: the request starts again without that anchor (design §5.4)."""
        picks: list[tuple[str, str, float, str, float, int]] = []
        ranking: Iterable[tuple[str, float]] = ()
        anchored: str | None = None
        for i, uuid in enumerate(uuids):
            req.begin(i, uuid)
            ranking = self.ranking.rank(req, fast)
            group = req.instance_group
            anchor = group is not None and group.policy == AFFINITY and not group.hosts
            # with peers, look far enough to tell a scarce request (few hosts fit) apart
            top = list(islice(ranking, max(depth, ANCHOR_DEPTH) if anchor else max(depth, scarce)))
            if anchor and refused:
                top = [t for t in top if t[0] not in refused]
            if not top:
                if anchored is not None:
                    raise _AnchorRefused(anchored)
                self.stats["no_valid_host"] += 1
                raise NoValidHost(self.ranking.explain(req, fast, i, len(uuids)))
            if anchor:
                assert group is not None
                # the first member of an affinity group: the arbiter cannot see the other
                # hosts, so schedulers racing with first members must agree on the host
                # without talking: rendezvous over the group (design §5.3)
                pick = RendezvousChoice(group.uuid).index([s for s, _ in top])
                self.stats["affinity_anchors"] += 1
                choice = ANCHOR
                anchored = top[pick][0]
            else:
                is_scarce = len(top) < scarce
                if coordinator is not None and is_scarce:
                    # scarce: the peers' coordinator decides it, so that no two scarce
                    # requests are decided on different views (design §5.4); this
                    # scheduler still keeps the hosts it fits off its other requests
                    self.peer_coordination.remember_scarce(req.resources, now)
                    self.stats["delegated"] += 1
                    raise Delegated(coordinator)
                if not is_scarce:  # choose among the best ``depth`` (which may be fewer
                    top = top[:depth]  # than make a request scarce: 2 peers, k = 2)
                pick, choice = self.peer_coordination.choose(
                    top, k, now, is_scarce, req.resources, delegable and self.config.hand_to_owner,
                    req)
            source, weight = top[pick]
            req.consume(source, self.claim_builder.host_of(source), uuid)
            picks.append((uuid, source, weight, choice, top[0][1] - weight, pick))
        return picks, ranking

    # -- peers (peers.py) ----------------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        """The live schedulers host ownership is computed among (this one included); [] alone."""
        return self.peer_coordination.peers

    @property
    def coordinator(self) -> str | None:
        """The live peer that decides every scarce request; None alone, when off, or when it
        is this scheduler (see :attr:`PeerCoordination.coordinator`)."""
        return self.peer_coordination.coordinator

    def set_peers(self, peers: Sequence[str]) -> None:
        """The live schedulers (this one included): each claims first the best host it owns.

        An empty or single-name list turns ownership off (plain subset choice).
        """
        self.peer_coordination.set_peers(peers)
        self.live_schedulers = max(1, len(self.peer_coordination.peers))

    @property
    def scarce_memory(self) -> list[list[Any]]:
        """The recent scarce requests, as the update log records them with each decision."""
        return self.peer_coordination.scarce_memory

    @scarce_memory.setter
    def scarce_memory(self, value: Iterable[Sequence[Any]]) -> None:
        self.peer_coordination.scarce_memory = value

    # -- reading the view -------------------------------------------------------------

    def ordered_hosts(self, spec: RequestSpec, *, path: str | None = None) -> list[tuple[str, float]]:
        """Every host passing the filters for the first instance, best first (a dry run)."""
        self.index.sync()
        fast = (path or self.path) == FAST
        uuids = self.instance_uuids(spec)
        req = self.ranking.request_view(spec, fast, uuids)
        req.begin(0, uuids[0])
        return list(self.ranking.rank(req, fast))

    def request_view(self, spec: RequestSpec, fast: bool = True, uuids: Sequence[str] = ()
                     ) -> RequestView:
        return self.ranking.request_view(spec, fast, uuids)

    def members_unlocated(self, spec: RequestSpec) -> bool:
        """An affinity request listing members none of which this view locates (on a host,
        or in one of our pending claims): the first of them was placed, so its
        host's delta, or a peer's announcement, may be on its way (design §5.4). Deleted
        members stay unlocated, and the request is then a group's first again."""
        group = spec.instance_group
        if group is None or group.policy != AFFINITY or not group.members or group.hosts:
            return False
        self.index.sync()
        world = IndexWorld(self.index)
        return not (world.hosts_of_instances(group.members)
                    or (group.uuid and world.members_of_group(group.uuid)))

    def instance_uuids(self, spec: RequestSpec) -> list[str]:
        """The instances to place: the spec's, or fresh uuids (from the seeded RNG) for num_instances."""
        if spec.instance_uuids:
            return list(spec.instance_uuids)
        return [str(uuid_mod.UUID(int=self.rng.getrandbits(128), version=4))
                for _ in range(max(1, spec.num_instances))]

    # -- the tracker's alternates (claims.py) -------------------------------------------

    def recheck(self, source: str, spec: RequestSpec, instance_uuid: str,
                siblings: Sequence[str] = ()) -> str | None:
        """Why claiming ``source`` for ``instance_uuid`` would be wrong in our view now (None: fine)."""
        return self.ranking.recheck(source, spec, instance_uuid, siblings)

    def fresh_alternates(self, spec: RequestSpec, instance_uuid: str, siblings: Sequence[str],
                         tried: set[str], n: int) -> list[Selection]:
        """The best ``n`` hosts for ``instance_uuid`` in our view now, none of ``tried``
        (see :meth:`ClaimBuilder.fresh_alternates`)."""
        return self.claim_builder.fresh_alternates(spec, instance_uuid, siblings, tried, n)

    def claim_alternate(self, selection: Selection, spec: RequestSpec, now: float,
                        siblings: Sequence[str] = ()) -> tuple[Claim | None, str]:
        """Claim ``selection`` (an alternate) if it still passes: (claim, "") with the claim
        pending and returned for the caller to cast, or (None, reason)."""
        return self.claim_builder.claim_alternate(selection, spec, now, siblings)


# FRONT_DEPTH, SCARCE_*, Delegated, Selection and apply_vector live in the part that uses
# them; they stay importable from here, where every caller found them before the split
__all__ = ["ANCHOR_DEPTH", "FAST", "FRONT_DEPTH", "SCARCE_MEMORY", "SCARCE_PER_PEER", "SLOW",
           "Decision", "DecisionEngine", "DecisionObserver", "Delegated", "NoValidHost",
           "Selection", "apply_vector"]
