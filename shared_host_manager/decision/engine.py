"""The decision path: filter, weigh, pick, claim — over a ReceiverMachine, with no database read.

Theory of operation
-------------------
:meth:`DecisionEngine.select_destinations` is nova's ``_schedule`` over our own
host view.  For each instance of the request::

    rank(request view)                 filters, then weighers, over every host
      -> top k (k = adaptive host_subset_size)  -> one at random (seeded RNG)
      -> consume it in the request's scratch (RequestView), next instance
    alternates: the max_attempts-1 next-best hosts of the same cell
    claims: one Claim per instance, registered as pending with the receiver
            (add_claim) and handed to ``send_claim`` — no broker round trip first

All-or-nothing like nova: if any instance finds no host, NoValidHost is raised
before any claim is registered or sent (the scratch is simply dropped).

Two interchangeable ranking paths decide identically (the differential tests
prove it):

* **slow** (nova's way): a HostView per host, every filter's ``host_passes``
  per host, every weigher per host, normalise, sort.  O(hosts) Python.
* **fast**: every filter's vector form over the columnar index (bool columns,
  row sets, or per-group answers for aggregate/capability filters), then the
  hosts this request already touched are re-checked in Python with the
  request's scratch, then the weighers as numpy column operations with the
  same float operations as the slow path, then a partial sort that orders
  only the top of the list.  Filters without a vector form (plugins) run per
  host on the survivors: lazily in weight order, stopping once enough hosts
  passed, when the order cannot depend on which hosts they remove (at most one
  weigher with a multiplier, uniform across hosts); otherwise on all survivors
  before weighing, as nova would.

Ties are ordered by source id in both paths.

Consistency and threads
-----------------------
The engine is not thread-safe and does no locking: the service layer holds
its cache lock while ingesting (receiver + :meth:`HostIndex.sync`) and while
deciding, so a decision sees one consistent version of every host.  The engine
calls ``index.sync()`` itself at the start of a decision and after registering
claims.  ``send_claim`` is called with the lock held: it must only queue the
claim (not deliver it synchronously into this receiver), and it must not
raise: the engine does not withdraw a claim it registered, so a claim that
was never sent stays deducted until its deadline expires it (or a caller that
knows the build was given up calls ``receiver.cancel_claim``).  Per-decision work
allocates a few O(hosts) numpy arrays (masks, gathered weigher columns) and
a handful of Python objects; nothing is allocated per host in Python.

The contract: docs/design.md §5.1 and §5.4.
"""

from __future__ import annotations

import random
import uuid as uuid_mod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from protocol.groups import AFFINITY, ANTI_AFFINITY, ClaimGroup
from protocol.hostdoc import compute_of, enabled, host_name, is_host, node_name
from protocol.messages import Claim
from protocol.receiver import ReceiverMachine
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.filters.server_group_anti_affinity_filter import max_server_per_host
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import (
    AGGREGATE_GROUPS,
    PASS_ALL,
    BoolArray,
    Exclude,
    FloatArray,
    HostIndex,
    IntArray,
    Only,
    VectorResult,
)
from shared_host_manager.decision.plugins import load_core
from shared_host_manager.decision.request import RequestSpec, RequestView
from shared_host_manager.decision.subset import AdaptiveSubset, PeerOwnership, RendezvousChoice
from shared_host_manager.decision.weights import BaseHostWeigher, weigh_hosts
from shared_host_manager.decision.world import IndexWorld, ReceiverWorld

FAST = "fast"
SLOW = "slow"

#: the first member of an affinity group goes to one of this many best hosts, the same for
#: every scheduler holding (about) the same view
ANCHOR_DEPTH = 32
#: a peer claims its own hosts best first: a host with fewer than this many of its owner's
#: hosts weighing more is at the owner's "front", which another scheduler avoids if it can
FRONT_DEPTH = 4
#: a request whose filters leave at most this many hosts per live scheduler is *scarce*:
#: schedulers racing with such requests share the few hosts out among themselves (§5.4)
SCARCE_PER_PEER = 2
#: seconds the resources of a scarce request are remembered: while few hosts fit them by
#: size, those hosts are *kept for scarce requests*, and a request many hosts fit takes
#: another host it owns
SCARCE_MEMORY = 2.0

#: how a claimed host was chosen (``Selection.choice``); the tracker counts rejected
#: claims by it
ANCHOR, OWNED, PEER, SCARCE, ALONE, ALTERNATE = ("anchor", "owned", "peer", "scarce", "alone",
                                                 "alternate")

#: positions or rows of the index (np.flatnonzero's result)
RowArray: TypeAlias = npt.NDArray[np.intp]


class DecisionObserver:
    """What a :class:`DecisionEngine` tells its observer (the update log); no-ops here.

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
        return None

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


class Delegated(Exception):
    """Another live peer decides this request: the coordinator of scarce requests, or the
    owner of the best hosts when this scheduler owns none of them (design §5.4).  Hand it
    over to ``coordinator``; nothing was claimed, as with NoValidHost."""

    def __init__(self, coordinator: str, why: str = "scarce") -> None:
        super().__init__(f"request handed to {coordinator} ({why})")
        self.coordinator = coordinator
        self.why = why


@dataclass(frozen=True, slots=True)
class Selection:
    """One destination for one instance (nova's Selection): claimed, or an alternate."""

    source: str  # the compute node's source id (nova: compute_node_uuid)
    host: str
    nodename: str
    cell_uuid: str | None
    instance_uuid: str
    weight: float
    #: set on the selected (claimed) destination, None on alternates
    claim_id: str | None = None
    #: how the claimed destination was chosen (ANCHOR, OWNED, PEER, SCARCE, ALONE);
    #: ALTERNATE on alternates
    choice: str = ALTERNATE


def _top(w: FloatArray, rk: IntArray, n: int) -> RowArray:
    """Positions of the ``n`` best entries, ordered by weight desc then rank asc (exact at ties)."""
    m = len(w)
    if n >= m:
        return np.lexsort((rk, -w))
    kth = m - n
    threshold = np.partition(w, kth)[kth]
    cand = np.flatnonzero(w >= threshold)  # every entry tied with the n-th is a candidate
    order = np.lexsort((rk[cand], -w[cand]))
    return cand[order[:n]]


def apply_vector(mask: BoolArray, res: VectorResult) -> BoolArray:
    """``mask`` narrowed by a filter's vector answer (in place when possible)."""
    if res is PASS_ALL:
        return mask
    if type(res) is Only:
        keep = np.zeros(len(mask), dtype=bool)
        rows = np.fromiter(res.rows, dtype=np.intp)
        keep[rows] = mask[rows]
        return keep
    if type(res) is Exclude:
        mask[np.fromiter(res.rows, dtype=np.intp)] = False
        return mask
    mask &= res
    return mask


def _normalise(wg: BaseHostWeigher, x: FloatArray, among: BoolArray | None = None) -> bool:
    """In place: ``x`` clamped and normalised as weights.clamp, bounds and normalize do for
    ``weigh_hosts`` (the same float operations in the same order, so both paths' weights are
    bit-identical), over the rows ``among`` (default: all); False when all normalise to 0."""
    if not len(x):
        return False
    # clamp only when a value is out of bounds: a pass over x instead of a write
    if wg.minval is not None and float(x.min()) < wg.minval:
        np.maximum(x, wg.minval, out=x)
    if wg.maxval is not None and float(x.max()) > wg.maxval:
        np.minimum(x, wg.maxval, out=x)
    sel = x if among is None else x[among]
    if not len(sel):
        return False
    lo = wg.minval if wg.minval is not None else float(sel.min())
    hi = wg.maxval if wg.maxval is not None else float(sel.max())
    if lo == hi:
        return False
    x -= lo
    x /= hi - lo
    return True


class _FastRanking:
    """Candidates in decision order, computed lazily from the weight vector."""

    __slots__ = ("engine", "req", "idx", "w", "deferred", "hv")

    def __init__(self, engine: DecisionEngine, req: RequestView, idx: RowArray, w: FloatArray,
                 deferred: list[BaseHostFilter], hv: dict[int, HostView]) -> None:
        self.engine = engine
        self.req = req
        self.idx = idx
        self.w = w
        self.deferred = deferred
        self.hv = hv

    def __iter__(self) -> Iterator[tuple[str, float]]:
        idx, w = self.idx, self.w
        m = len(idx)
        if m == 0:
            return
        ix = self.engine.index
        rk = ix.rank[idx]
        sources = ix.sources
        done, n = 0, 8
        while done < m:
            n = min(n, m)
            for p in _top(w, rk, n)[done:]:
                row = int(idx[p])
                if self.deferred and not self._deferred_pass(row):
                    continue
                source = sources[row]
                if source is None:  # cannot be: idx holds live rows only
                    raise LookupError(f"row {row} of the host index holds no source")
                yield source, float(w[p])
            done, n = n, n * 8

    def _deferred_pass(self, row: int) -> bool:
        hv = self.hv.get(row) or HostView(self.engine.index.view(row))
        return all(f.host_passes(hv, self.req) for f in self.deferred)


class DecisionEngine:
    """Filter, weigh, pick and claim over one receiver; see the module docstring."""

    def __init__(
        self,
        receiver: ReceiverMachine,
        send_claim: Callable[[Claim], object],
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
        self.send_claim = send_claim
        self.config = config or SchedulerConfig()
        self.index = index if index is not None else HostIndex(receiver)
        self.rng = rng or random.Random()
        if filters is None or weighers is None:
            loaded = load_core(self.config)  # [filter_scheduler] decision_core
            filters = loaded[0] if filters is None else filters
            weighers = loaded[1] if weighers is None else weighers
        self.filters = list(filters)
        self.weighers = list(weighers)
        self.path = path
        self.live_schedulers = live_schedulers
        self.subset = AdaptiveSubset(self.config.host_subset_size_min, self.config.host_subset_size_max,
                                     self.config.claim_rejection_target,
                                     self.config.claim_rejection_ewma_alpha)
        self._rendezvous = (RendezvousChoice(receiver.name)
                            if self.config.host_subset_choice == "rendezvous" else None)
        self._ownership: PeerOwnership | None = None
        # claim ids: scheduler name, a per-engine nonce (a restarted scheduler must not
        # reuse an id a compute node still remembers), a counter, the view's version
        self._nonce = f"{self.rng.getrandbits(32):08x}"
        self._claims = 0
        self.stats = {"requests": 0, "instances": 0, "no_valid_host": 0, "claims_sent": 0,
                      "alternates_claimed": 0, "owned_choices": 0, "peer_choices": 0,
                      "affinity_anchors": 0, "anchors_refused": 0, "scarce_choices": 0, "scarce_skips": 0,
                      "fresh_alternates": 0, "delegated": 0, "handed_to_owner": 0}
        #: sums over every instance placed: weight of the best host minus the chosen one's,
        #: and the chosen host's rank (0: the best), for the simulator's quality figures
        self.quality = {"weight_gap": 0.0, "rank": 0.0, "picks": 0.0}
        self.observer: DecisionObserver | None = None
        #: how _choose chose the host it returned last (the claimed Selection's choice)
        self._choice = ALONE
        #: the resources of recent scarce requests -> when last asked for
        self._scarce: dict[tuple[tuple[str, int], ...], float] = {}
        #: (ownership, index rows added, owner number per index row) of _owner_depths: the
        #: owners change only with the peers or the rows
        self._owners: tuple[PeerOwnership, int, npt.NDArray[np.int32]] | None = None

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
    ) -> list[list[Selection]]:
        """Place every instance of ``spec``; per instance: [claimed selection, *alternates].

        Raises NoValidHost (and claims nothing) when an instance finds no host, and
        Delegated (claiming nothing) when an instance is scarce, ``delegable``, and
        another live peer is the coordinator (:meth:`coordinator`); the coordinator
        decides what is handed to it with ``delegable=False``.
        ``now`` is the receiver's clock (claim deadlines); ``live_schedulers``
        overrides :attr:`live_schedulers` for the subset size.  ``dry_run``
        decides without registering or sending the claims (``shm replay
        --decisions`` re-runs recorded decisions this way) and is not observed.
        """
        observer = self.observer
        if observer is None or dry_run:
            return self._select(spec, now, return_alternates, live_schedulers, path, dry_run,
                                delegable)
        token = observer.decision_started(self, spec, now, return_alternates=return_alternates,
                                          live_schedulers=live_schedulers, path=path,
                                          delegable=delegable)
        try:
            rows = self._select(spec, now, return_alternates, live_schedulers, path, False,
                                delegable)
        except Exception as exc:
            observer.decision_failed(token, exc, now)
            raise
        observer.decision_finished(token, rows, now)
        return rows

    def _select(self, spec: RequestSpec, now: float, return_alternates: bool,
                live_schedulers: int | None, path: str | None, dry_run: bool,
                delegable: bool = True) -> list[list[Selection]]:
        self.index.sync()
        self.stats["requests"] += 1
        fast = (path or self.path) == FAST
        uuids = self.instance_uuids(spec)
        k = self.subset.size(live_schedulers if live_schedulers is not None else self.live_schedulers)
        # with known peers, look deeper: about k of the top k*peers hosts are ours
        depth = k * len(self._ownership.peers) if self._ownership is not None else k
        # a request at most this many hosts fit is scarce (0: alone, none is)
        scarce = SCARCE_PER_PEER * len(self._ownership.peers) + 1 if self._ownership is not None else 0
        coordinator = self.coordinator if delegable else None
        rank = self._rank_fast if fast else self._rank_slow
        # anchors whose group's later members of this request did not fit there
        refused: set[str] = set()
        while True:
            req = self.request_view(spec, fast, uuids)
            try:
                picks, ranking = self._pick(req, uuids, rank, depth, scarce, k, now, coordinator,
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

        num_alts = self.config.max_attempts - 1 if return_alternates else 0
        alternates: dict[str | None, list[tuple[str, float]]] = {}
        if num_alts > 0:
            if len(uuids) > 1:
                # nova re-ranks once after consuming every instance (claimed hosts have less left)
                ranking = rank(req)
            alternates = self._alternates(ranking, {p[1] for p in picks}, num_alts)

        out: list[list[Selection]] = []
        claims: list[Claim] = []
        payload = self.claim_payload(spec)
        group_of_claims = self._claim_group(req)
        for uuid, source, weight, choice, _, _ in picks:
            claim = self._new_claim(source, uuid, req.resources, payload, group_of_claims)
            if not dry_run:
                self.receiver.add_claim(claim, now)
                claims.append(claim)
            cell = self._cell_of(source)
            row = [self._selection(source, uuid, weight, claim.claim_id, choice)]
            row.extend(self._selection(s, uuid, w) for s, w in alternates.get(cell, ())[:num_alts])
            out.append(row)
        # the pending claims are now in the receiver's ledger: refresh those rows before
        # the next decision, and drop the scratch (it would subtract them twice)
        req.consumed.clear()
        self.index.sync()
        for claim in claims:
            self.send_claim(claim)
        self.stats["instances"] += len(uuids)
        self.stats["claims_sent"] += len(claims)
        return out

    def _pick(self, req: RequestView, uuids: list[str], rank: Callable[[RequestView], Iterable[
              tuple[str, float]]], depth: int, scarce: int, k: int, now: float,
              coordinator: str | None, delegable: bool, fast: bool, refused: set[str],
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
            ranking = rank(req)
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
                raise NoValidHost(self._explain(req, fast, i, len(uuids)))
            if anchor:
                assert group is not None
                # the first member of an affinity group: the arbiter cannot see the other
                # hosts, so schedulers racing with first members must agree on the host
                # without talking: rendezvous over the group (design §5.3)
                pick = RendezvousChoice(group.uuid).index([s for s, _ in top])
                self.stats["affinity_anchors"] += 1
                self._choice = ANCHOR
                anchored = top[pick][0]
            else:
                is_scarce = len(top) < scarce
                if coordinator is not None and is_scarce:
                    # scarce: the peers' coordinator decides it, so that no two scarce
                    # requests are decided on different views (design §5.4); this
                    # scheduler still keeps the hosts it fits off its other requests
                    self._remember_scarce(req.resources, now)
                    self.stats["delegated"] += 1
                    raise Delegated(coordinator)
                if not is_scarce:  # choose among the best ``depth`` (which may be fewer
                    top = top[:depth]  # than make a request scarce: 2 peers, k = 2)
                pick = self._choose(top, k, now, is_scarce, req.resources,
                                    delegable and self.config.hand_to_owner)
            source, weight = top[pick]
            req.consume(source, self._host_of(source), uuid)
            picks.append((uuid, source, weight, self._choice, top[0][1] - weight, pick))
        return picks, ranking

    @property
    def peers(self) -> list[str]:
        """The live schedulers host ownership is computed among (this one included); [] alone."""
        return list(self._ownership.peers) if self._ownership is not None else []

    @property
    def coordinator(self) -> str | None:
        """The live peer that decides every scarce request ([filter_scheduler]
        scarce_coordinator): the first by name; None alone, when off, or when it is this
        scheduler (a pure function of the peers and the options, so a replay hands over
        exactly the requests the scheduler handed over)."""
        if self._ownership is None or not self.config.scarce_coordinator:
            return None
        first = min(self._ownership.peers)
        return None if first == self.receiver.name else first

    def set_peers(self, peers: Sequence[str]) -> None:
        """The live schedulers (this one included): each claims first the best host it owns.

        An empty or single-name list turns ownership off (plain subset choice).
        """
        names = set(peers) | {self.receiver.name}
        self._ownership = PeerOwnership(self.receiver.name, list(names)) if len(names) > 1 else None
        self.live_schedulers = len(names)

    def _choose(self, top: list[tuple[str, float]], k: int, now: float = 0.0,
                scarce: bool = False, resources: Mapping[str, int] | None = None,
                to_owner: bool = False) -> int:
        """Which host of the ranked ``top`` to claim.

        With peers (design §5.4): a ``scarce`` request (``top`` is its whole candidate set,
        at most SCARCE_PER_PEER hosts per live scheduler) takes the host the schedulers'
        shared matching gives this one (:meth:`_match`); any other takes the best host
        this scheduler owns, passing over the hosts kept for scarce requests
        (:meth:`_kept`) while it owns another; with none owned, the peer's host its owner
        is least likely to be claiming now, or, ``to_owner`` ([filter_scheduler]
        hand_to_owner), Delegated to the owner of the best one, which decides it with its
        own requests.  Alone: one of the best ``k`` (see [filter_scheduler]
        host_subset_choice).
        """
        self._choice = ALONE
        if self._ownership is not None:
            ownership = self._ownership
            if scarce:
                self._remember_scarce(resources, now)
                self.stats["scarce_choices"] += 1
                self._choice = SCARCE
                return self._match(top)
            reserved = self._kept([source for source, _ in top], resources or {}, now)
            places = [ownership.place(source) for source, _ in top]
            if 0 in places:
                self.stats["owned_choices"] += 1
                self._choice = OWNED
                first = places.index(0)
                if reserved[first]:
                    # a request many hosts fit leaves the few hosts that scarce requests
                    # (of any scheduler) are sharing out to them: it takes another it owns
                    free = next((i for i, p in enumerate(places) if p == 0 and not reserved[i]),
                                None)
                    if free is not None:
                        self.stats["scarce_skips"] += 1
                        return free
                return first
            if to_owner:
                # Every candidate is a peer's: the owner of the best decides it, under the
                # lock it decides its own requests under, so the two never race for a host
                self.stats["handed_to_owner"] += 1
                raise Delegated(ownership.owner(top[0][0]), "owner")
            # Every candidate is a peer's.  Each peer claims its own hosts best first, so a
            # claim on one of a peer's best hosts races that peer's whole request stream:
            # take a candidate at least FRONT_DEPTH behind its owner's best ones; among
            # those, one where this scheduler is next in line after the owner (so that the
            # other schedulers falling back spread over other hosts), then the deeper, then
            # the better weighed; hosts reserved for scarce requests last.
            depths = self._owner_depths([source for source, _ in top])
            best = min(range(len(top)),
                       key=lambda i: (reserved[i], depths[i] < FRONT_DEPTH, places[i],
                                      -depths[i], i))
            self.stats["peer_choices"] += 1
            self._choice = PEER
            return best
        if len(top) == 1:
            return 0
        if self._rendezvous is not None:
            return self._rendezvous.index([s for s, _ in top])
        return self.rng.randrange(len(top))

    def _remember_scarce(self, resources: Mapping[str, int] | None, now: float) -> None:
        """A scarce request of these resources was decided (or handed over) now: for
        SCARCE_MEMORY the few hosts it fits are kept for such requests (:meth:`_kept`)."""
        if resources:
            self._scarce[tuple(sorted((r, a) for r, a in resources.items() if a))] = now

    @property
    def scarce_memory(self) -> list[list[Any]]:
        """The recent scarce requests' resources and when they were decided, as plain lists
        (the update log records them with each decision, as it records the subset's rate:
        a replay from a checkpoint then decides as the scheduler did)."""
        return [[[list(pair) for pair in shape], seen] for shape, seen in self._scarce.items()]

    @scarce_memory.setter
    def scarce_memory(self, value: Iterable[Sequence[Any]]) -> None:
        self._scarce = {tuple((str(r), int(a)) for r, a in shape): float(seen)
                        for shape, seen in value}

    def _kept(self, sources: list[str], resources: Mapping[str, int], now: float) -> list[bool]:
        """For each of ``sources``: is it kept for scarce requests?

        A host is kept while it is one of the few (at most SCARCE_PER_PEER per live
        scheduler) that fit, by size alone, the resources of a scarce request seen in
        the last SCARCE_MEMORY seconds that this request does not already need.  Every
        scheduler sees about the same requests, so each keeps about the same hosts:
        its own requests that many hosts fit then stay off the hosts where the
        schedulers' scarce requests meet, and off the few holes large enough for them.
        """
        ix = self.index
        n = ix.size
        kept = np.zeros(n, dtype=bool)
        ownership = self._ownership
        limit = SCARCE_PER_PEER * (len(ownership.peers) if ownership is not None else 1)
        for shape, seen in list(self._scarce.items()):
            if now - seen >= SCARCE_MEMORY:
                del self._scarce[shape]
                continue
            if all(resources.get(r, 0) >= a for r, a in shape):
                continue  # this request is as large: the hosts are its own to take
            fits = ix.live[:n].copy()
            for r, a in shape:
                cap = ix.cap.get(r)
                if cap is None:
                    fits[:] = False
                    break
                fits &= ix.used[r][:n] + a <= cap[:n]
            if np.count_nonzero(fits) <= limit:
                kept |= fits
        row_of = ix.row_of
        return [bool(kept[row_of[s]]) if s in row_of else False for s in sources]

    def _match(self, top: list[tuple[str, float]]) -> int:
        """A scarce request's host: the one the live schedulers' shared matching gives us.

        Every scheduler computes the same matching from the same candidate set (``top``,
        best first) and peer list, so concurrent scarce requests in different schedulers
        land on different hosts while there are enough of them: each owner of candidates
        takes its best one; the schedulers owning none (in name order) take the other
        candidates in turn, best first, then the owners' best ones (design §5.4).
        """
        ownership = self._ownership
        assert ownership is not None
        owners = [ownership.owner(source) for source, _ in top]
        me = ownership.me
        if me in owners:
            self.stats["owned_choices"] += 1
            return owners.index(me)
        taken: list[int] = []
        seen: set[str] = set()
        for i, owner in enumerate(owners):
            if owner not in seen:
                seen.add(owner)
                taken.append(i)
        first_of_owner = set(taken)
        others = [i for i in range(len(top)) if i not in first_of_owner]
        order = others + taken
        turn = [p for p in ownership.peers if p not in seen].index(me)
        self.stats["peer_choices"] += 1
        return order[turn % len(order)]

    def _owner_depths(self, sources: list[str]) -> list[int]:
        """For each of ``sources``: how many hosts its owner weighs better, by the weighers
        alone (no request).  A peer claims its hosts best first, so a host deep behind its
        owner's best ones is one that peer is unlikely to claim at the same moment."""
        ownership = self._ownership
        ix = self.index
        n = ix.size
        if ownership is None or n == 0:
            return [0] * len(sources)
        live = ix.live[:n]
        score = np.zeros(n, dtype=np.float64)
        for wg, mult in self._multipliers():
            if wg.index_column is None or (isinstance(mult, float) and mult == 0.0):
                continue
            x = ix.weigher_cols[wg.index_column][:n].copy()
            if not _normalise(wg, x, live):
                continue
            m = mult if isinstance(mult, float) else mult[ix.gid[AGGREGATE_GROUPS][:n]]
            score += x * m
        owners = self._owner_numbers(ownership)
        scores_of: dict[int, FloatArray] = {}  # the live hosts' scores, per owner
        out = []
        for source in sources:
            row = ix.row_of.get(source)
            if row is None:
                out.append(0)
                continue
            o = int(owners[row])
            theirs = scores_of.get(o)
            if theirs is None:
                theirs = scores_of[o] = score[live & (owners == o)]
            out.append(int(np.count_nonzero(theirs > score[row])))
        return out

    def _owner_numbers(self, ownership: PeerOwnership) -> npt.NDArray[np.int32]:
        """Per index row, the number of its owner among ``ownership.peers`` (-1: a free row),
        computed again only when the peers or the index rows changed."""
        ix = self.index
        added = ix.stats["rows_added"]
        cached = self._owners
        if cached is not None and cached[0] is ownership and cached[1] == added:
            return cached[2]
        n = ix.size
        number = {p: i for i, p in enumerate(ownership.peers)}
        owner = ownership.owner
        owners = np.fromiter((number[owner(src)] if src is not None else -1
                              for src in ix.sources[:n]), dtype=np.int32, count=n)
        self._owners = (ownership, added, owners)
        return owners

    def ordered_hosts(self, spec: RequestSpec, *, path: str | None = None) -> list[tuple[str, float]]:
        """Every host passing the filters for the first instance, best first (a dry run)."""
        self.index.sync()
        fast = (path or self.path) == FAST
        uuids = self.instance_uuids(spec)
        req = self.request_view(spec, fast, uuids)
        req.begin(0, uuids[0])
        return list((self._rank_fast if fast else self._rank_slow)(req))

    def request_view(self, spec: RequestSpec, fast: bool = True, uuids: Sequence[str] = ()
                     ) -> RequestView:
        world = IndexWorld(self.index) if fast else ReceiverWorld(self.receiver)
        return RequestView(spec, world, uuids)

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

    def recheck(self, source: str, spec: RequestSpec, instance_uuid: str,
                siblings: Sequence[str] = ()) -> str | None:
        """Why claiming ``source`` for ``instance_uuid`` would be wrong in our view now (None: fine).

        The tracker's check before it claims an alternate (nova checks group policy
        late on the compute node; here the scheduler re-runs its filters): the host is
        up and enabled, the instance is not already there, the resources fit by the
        arbiter's rule, and every filter this request uses still passes.  ``siblings``
        are the request's other instances (members of its server group, like this one).
        """
        view = self.receiver.sources.get(source)
        if view is None or not is_host(view.doc):
            return "host is no longer known"
        hv = HostView(view)
        if not enabled(hv.service) or not hv.is_up:
            return "compute service is down or disabled"
        if instance_uuid and instance_uuid in hv.instances:
            return f"instance {instance_uuid} is already on this host"
        req = self.request_view(spec, True, [instance_uuid, *siblings])
        reason = hv.fits(req.resources)
        if reason is not None:
            return reason
        req.begin(0, instance_uuid)
        for f in self._used_filters(req):
            if not f.host_passes(hv, req):
                return f"{f.name} no longer passes"
        return None

    def fresh_alternates(self, spec: RequestSpec, instance_uuid: str, siblings: Sequence[str],
                         tried: set[str], n: int) -> list[Selection]:
        """The best ``n`` hosts for ``instance_uuid`` in our view now, none of ``tried``.

        The request tracker asks when an instance has used up the alternates its decision
        chose but not its ``max_attempts`` claims (design §5.4): a scarce request may have
        had none, and the rejection that ended the last one has since put its host's
        correction into the view.  ``siblings`` are the request's other instances (their
        claims are pending in the ledger already).  A dry run: nothing is claimed here.
        """
        self.index.sync()
        req = self.request_view(spec, True, [instance_uuid, *siblings])
        req.begin(0, instance_uuid)
        out: list[Selection] = []
        for source, weight in self._rank_fast(req):
            if source not in tried:
                out.append(self._selection(source, instance_uuid, weight))
                if len(out) == n:
                    break
        self.stats["fresh_alternates"] += len(out)
        return out

    def claim_alternate(self, selection: Selection, spec: RequestSpec, now: float,
                        siblings: Sequence[str] = ()) -> tuple[Claim | None, str]:
        """Claim ``selection`` (an alternate) if it still passes; (claim, "") or (None, reason)."""
        self.index.sync()
        reason = self.recheck(selection.source, spec, selection.instance_uuid, siblings)
        if reason is not None:
            return None, reason
        claim = self._new_claim(selection.source, selection.instance_uuid, spec.resources,
                                self.claim_payload(spec),
                                self._claim_group(self.request_view(
                                    spec, True, [selection.instance_uuid, *siblings])))
        self.receiver.add_claim(claim, now)
        self.index.sync()
        self.send_claim(claim)
        self.stats["claims_sent"] += 1
        self.stats["alternates_claimed"] += 1
        return claim, ""

    @staticmethod
    def claim_payload(spec: RequestSpec) -> dict[str, Any]:
        """The build request travelling with a claim (opaque to the arbiter)."""
        payload: dict[str, Any] = dict(spec.build_request)
        if spec.request_id:
            payload["request_id"] = spec.request_id
        if spec.project_id:
            payload["project_id"] = spec.project_id
        return payload

    # -- claims and selections ------------------------------------------------------------

    def _claim_group(self, req: RequestView) -> ClaimGroup | None:
        """The server group the arbiter checks (protocol.groups): anti-affinity lists every
        member we know of; affinity only those located on a host in our view."""
        group = req.instance_group
        if group is None or group.policy not in (AFFINITY, ANTI_AFFINITY) or not group.uuid:
            return None
        members = group.members
        if group.policy == AFFINITY:
            rows = self.index.rows_of_instance
            members = [m for m in members if next(rows(m), None) is not None]
        return ClaimGroup(group.uuid, group.policy, max(1, max_server_per_host(group)), tuple(members))

    def _new_claim(self, source: str, instance_uuid: str, resources: Mapping[str, int],
                   payload: Mapping[str, Any], group: ClaimGroup | None = None) -> Claim:
        view = self.receiver.sources[source]
        self._claims += 1
        claim_id = f"{self.receiver.name}:{self._nonce}:{self._claims}@{view.epoch}.{view.seq}"
        amounts = {r: a for r, a in resources.items() if a}
        return Claim(claim_id, self.receiver.name, source, view.epoch, view.seq, amounts,
                     instance_uuid, dict(payload), group)

    def _compute(self, source: str) -> Mapping[str, Any]:
        view = self.receiver.sources.get(source)
        return compute_of(view.doc if view is not None else None)

    def _host_of(self, source: str) -> str:
        return host_name(self._compute(source), source)

    def _cell_of(self, source: str) -> str | None:
        return self._compute(source).get("cell_uuid")

    def _selection(self, source: str, uuid: str, weight: float, claim_id: str | None = None,
                   choice: str = ALTERNATE) -> Selection:
        compute = self._compute(source)
        return Selection(source, host_name(compute, source), node_name(compute, source),
                         compute.get("cell_uuid"), uuid, weight, claim_id, choice)

    def _alternates(self, ranking: Iterable[tuple[str, float]], chosen: set[str], num_alts: int
                    ) -> dict[str | None, list[tuple[str, float]]]:
        """Per cell of a chosen host: the best ``num_alts`` unclaimed hosts of that cell.

        With peers, among the best ``num_alts`` × peers, the hosts this scheduler owns
        (or is next in line for) come first: an alternate is claimed after a collision,
        and a peer's host is where the next one is likeliest.
        """
        cells = {self._cell_of(s) for s in chosen}
        out: dict[str | None, list[tuple[str, float]]] = {c: [] for c in cells}
        ownership = self._ownership
        wanted = num_alts * len(ownership.peers) if ownership is not None else num_alts
        missing = len(cells)
        for source, weight in ranking:
            if source in chosen:
                continue
            bucket = out.get(self._cell_of(source))
            if bucket is None or len(bucket) >= wanted:
                continue
            bucket.append((source, weight))
            if len(bucket) == wanted:
                missing -= 1
                if missing == 0:
                    break
        if ownership is not None:
            for cell, bucket in out.items():
                order = sorted(range(len(bucket)), key=lambda i: (ownership.place(bucket[i][0]), i))
                out[cell] = [bucket[i] for i in order[:num_alts]]
        return out

    # -- filtering and weighing: common -----------------------------------------------------

    def _used_filters(self, req: RequestView) -> list[BaseHostFilter]:
        forced = bool(req.spec.force_hosts or req.spec.force_nodes)
        return [f for f in self.filters if f.active(req) and (f.placement or not forced)]

    @staticmethod
    def _name_ok(hv: HostView, spec: RequestSpec) -> bool:
        """nova's ignore_hosts / force_hosts / force_nodes (case-insensitive)."""
        if spec.ignore_hosts and hv.host.lower() in {h.lower() for h in spec.ignore_hosts}:
            return False
        if spec.force_hosts and hv.host.lower() not in {h.lower() for h in spec.force_hosts}:
            return False
        if spec.force_nodes and hv.nodename.lower() not in {n.lower() for n in spec.force_nodes}:
            return False
        return True

    def _explain(self, req: RequestView, fast: bool, i: int, n: int) -> str:
        counts = self._filter_counts_fast(req) if fast else self._filter_counts_slow(req)
        results = ", ".join(f"{name}: (start: {a}, end: {b})" for name, a, b in counts)
        what = f"instance {i + 1} of {n} ({req.instance_uuid})" if n > 1 else str(req.instance_uuid)
        return f"There are not enough hosts available for {what}. Filter results: [{results}]"

    # -- slow path ------------------------------------------------------------------------

    def _slow_hosts(self, req: RequestView) -> list[HostView]:
        spec = req.spec
        return [hv for hv in (HostView(v, req.consumed.get(v.source))
                              for v in self.receiver.sources.values() if is_host(v.doc))
                if self._name_ok(hv, spec)]

    def _rank_slow(self, req: RequestView) -> list[tuple[str, float]]:
        hosts = self._slow_hosts(req)
        forced = bool(req.spec.force_hosts or req.spec.force_nodes)
        for f in self.filters:  # every enabled filter, per host, as nova
            if forced and not f.placement:
                continue
            hosts = [h for h in hosts if f.host_passes(h, req)]
            if not hosts:
                break
        return [(w.obj.uuid, w.weight) for w in weigh_hosts(self.weighers, hosts, req)]

    def _filter_counts_slow(self, req: RequestView) -> list[tuple[str, int, int]]:
        hosts = self._slow_hosts(req)
        out = []
        for f in self._used_filters(req):
            start = len(hosts)
            hosts = [h for h in hosts if f.host_passes(h, req)]
            out.append((f.name, start, len(hosts)))
        return out

    # -- fast path ----------------------------------------------------------------------------

    def _fast_mask(self, req: RequestView, counts: list[tuple[str, int, int]] | None = None
                   ) -> tuple[BoolArray, list[BaseHostFilter], dict[int, HostView]]:
        """Hosts passing every vector filter, plus the filters left to run per host.

        With ``counts`` (explaining a failure) every filter is applied in order,
        per host where it has no vector form, and the survivors counted after each.
        """
        ix = self.index
        n = ix.size
        spec = req.spec
        mask = ix.live[:n].copy()
        # nova's ignore_hosts / force_hosts / force_nodes come first
        if spec.ignore_hosts:
            mask[ix.rows_of_hosts(spec.ignore_hosts, lower=True)] = False
        if spec.force_hosts:
            mask = apply_vector(mask, Only(ix.rows_of_hosts(spec.force_hosts, lower=True)))
        if spec.force_nodes:
            mask = apply_vector(mask, Only(ix.rows_of_nodes(spec.force_nodes)))
        # hosts earlier instances of this request went to: the request's scratch changes
        # their answers, so every used filter decides them per host
        touched: dict[int, HostView] = {}
        for source, over in req.consumed.items():
            row = ix.row_of.get(source)
            if row is not None:
                touched[row] = HostView(ix.receiver.sources[source], over)
        used = self._used_filters(req)
        deferred: list[BaseHostFilter] = []
        req.candidate_rows = None
        for f in used:
            before = mask.copy() if counts is not None else mask
            req.candidates = mask
            res = f.vector(ix, req)
            if counts is not None or (res is not None and res is not PASS_ALL):
                req.candidate_rows = None  # the candidates may narrow: their rows are found again
            if counts is not None:
                if res is None:
                    for row in np.flatnonzero(mask).tolist():
                        mask[row] = f.host_passes(touched.get(row) or HostView(ix.view(row)), req)
                else:
                    mask = apply_vector(mask, res)
                for row, hv in touched.items():
                    mask[row] = bool(before[row]) and f.host_passes(hv, req)
                counts.append((f.name, int(np.count_nonzero(before)), int(np.count_nonzero(mask))))
            elif res is None:
                deferred.append(f)
            else:
                mask = apply_vector(mask, res)
        req.candidates = req.candidate_rows = None
        if counts is None:
            for row, hv in touched.items():
                mask[row] = self._name_ok(hv, spec) and all(f.host_passes(hv, req) for f in used)
        return mask, deferred, touched

    def _filter_counts_fast(self, req: RequestView) -> list[tuple[str, int, int]]:
        counts: list[tuple[str, int, int]] = []
        self._fast_mask(req, counts)
        return counts

    def _multipliers(self) -> list[tuple[BaseHostWeigher, float | FloatArray]]:
        """(weigher, its multiplier: one float for every host, or one per aggregate group)."""
        out: list[tuple[BaseHostWeigher, float | FloatArray]] = []
        ix = self.index
        for wg in self.weighers:
            default = wg.default_multiplier
            vals, uniform = ix.group_values(AGGREGATE_GROUPS, (wg.name, wg.multiplier_name, default),
                                            wg.weight_multiplier)
            if uniform:
                out.append((wg, float(vals[0]) if len(vals) else float(default)))
            else:
                out.append((wg, vals))
        return out

    def _rank_fast(self, req: RequestView) -> _FastRanking:
        ix = self.index
        mask, deferred, touched = self._fast_mask(req)
        idx = np.flatnonzero(mask)
        mults = self._multipliers()
        if deferred:
            weighing = [m for m in mults if not isinstance(m[1], float) or m[1] != 0.0]
            if len(weighing) > 1 or (weighing and not isinstance(weighing[0][1], float)):
                # the normalisation (min/max over the final hosts) could reorder hosts
                # depending on which ones the deferred filters remove: filter them all first
                keep = [row for row in idx.tolist()
                        if all(f.host_passes(touched.get(row) or HostView(ix.view(row)), req)
                               for f in deferred)]
                idx = np.asarray(keep, dtype=np.intp)
                deferred = []
        m = len(idx)
        w = np.zeros(m, dtype=np.float64)
        if m > 1:
            touched_pos = []
            for row, hv in touched.items():
                p = int(np.searchsorted(idx, row))
                if p < m and idx[p] == row:
                    touched_pos.append((p, hv))
            gid = None
            for wg, mult in mults:
                if isinstance(mult, float) and mult == 0.0:
                    continue  # adds 0.0 * x: no change (skipped like a zero multiplier)
                column = (ix.weigher_cols[wg.index_column][idx] if wg.index_column is not None
                          else wg.vector_weights(ix, req, idx))
                if column is None:
                    x = np.fromiter(
                        (wg._weigh_object(touched.get(r) or HostView(ix.view(r)), req)
                         for r in idx.tolist()), dtype=np.float64, count=m)
                else:
                    x = column
                    for p, hv in touched_pos:
                        x[p] = wg._weigh_object(hv, req)
                if not _normalise(wg, x):
                    continue
                if isinstance(mult, float):
                    x *= mult
                else:
                    if gid is None:
                        gid = ix.gid[AGGREGATE_GROUPS][idx]
                    x *= mult[gid]
                w += x
        return _FastRanking(self, req, idx, w, deferred, touched)


__all__ = ["FAST", "SLOW", "DecisionEngine", "Delegated", "NoValidHost", "Selection",
           "apply_vector"]
