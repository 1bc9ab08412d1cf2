"""Claims: what a decision asks of the hosts it chose, and what it answers nova.

Role: turns chosen hosts into :class:`~protocol.messages.Claim` messages (one
per instance, carrying the build request and the view version it was decided
on), into nova's :class:`Selection` rows (the claimed destination and its
alternates), and claims an alternate when the tracker asks for one.  It sends
nothing: every claim it registers is returned to the caller, which owns the one
route claims leave by (``SchedulerManager``'s outbox; the simulators' own casts).

Life cycle of a claim built here::

    new_claim        a unique id: scheduler name, this builder's nonce (a restarted
                     scheduler must not reuse an id a compute node still remembers),
                     a counter, the view's (epoch, seq)
    receiver.add_claim(claim, now)   pending in our ledger: deducted from its host in
                     our view at once, until its host's delta lists it, it is rejected,
                     or its deadline expires it (the engine registers a decision's
                     claims; :meth:`ClaimBuilder.claim_alternate` an alternate's)
    returned         to the caller, which casts it once its lock is released; a claim
                     never cast stays deducted until its deadline (or a caller that knows
                     the build was given up calls ``receiver.cancel_claim``)

Alternates are chosen without a claim: the ``max_attempts - 1`` next-best hosts
of each claimed host's cell (:meth:`ClaimBuilder.alternates`), or, when those run
out, the best untried hosts of the view now (:meth:`ClaimBuilder.fresh_alternates`).
Not thread-safe, like the engine: call it under the caller's cache lock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.groups import AFFINITY, ANTI_AFFINITY, ClaimGroup
from protocol.hostdoc import compute_of, host_name, node_name
from protocol.messages import Claim
from protocol.receiver import ReceiverMachine
from shared_host_manager.decision.index import HostIndex
from shared_host_manager.decision.ranking import Ranking
from shared_host_manager.decision.request import RequestSpec, RequestView
from shared_host_manager.decision.subset import PeerOwnership

#: how a claimed host was chosen (``Selection.choice``); the tracker counts rejected
#: claims by it
ANCHOR, OWNED, PEER, SCARCE, ALONE, ALTERNATE = ("anchor", "owned", "peer", "scarce", "alone",
                                                 "alternate")


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


def claim_payload(spec: RequestSpec) -> dict[str, Any]:
    """The build request travelling with a claim (opaque to the arbiter)."""
    payload: dict[str, Any] = dict(spec.build_request)
    if spec.request_id:
        payload["request_id"] = spec.request_id
    if spec.project_id:
        payload["project_id"] = spec.project_id
    return payload


class ClaimBuilder:
    """Claims, selections and alternates over one receiver; see the module docstring."""

    def __init__(self, receiver: ReceiverMachine, index: HostIndex, ranking: Ranking,
                 rng: random.Random, stats: dict[str, int]) -> None:
        self.receiver = receiver
        self.index = index
        self.ranking = ranking
        #: the engine's counters (claims_sent, alternates_claimed, fresh_alternates)
        self.stats = stats
        self._nonce = f"{rng.getrandbits(32):08x}"
        self._claims = 0

    def claim_group(self, req: RequestView) -> ClaimGroup | None:
        """The server group the arbiter checks (protocol.groups): anti-affinity lists every
        member we know of; affinity only those located on a host in our view."""
        group = req.instance_group
        if group is None or group.policy not in (AFFINITY, ANTI_AFFINITY) or not group.uuid:
            return None
        members = group.members
        if group.policy == AFFINITY:
            rows = self.index.rows_of_instance
            members = [m for m in members if next(rows(m), None) is not None]
        return ClaimGroup(group.uuid, group.policy, max(1, group.max_server_per_host), tuple(members))

    def new_claim(self, source: str, instance_uuid: str, resources: Mapping[str, int],
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

    def host_of(self, source: str) -> str:
        return host_name(self._compute(source), source)

    def cell_of(self, source: str) -> str | None:
        return self._compute(source).get("cell_uuid")

    def selection(self, source: str, uuid: str, weight: float, claim_id: str | None = None,
                  choice: str = ALTERNATE) -> Selection:
        compute = self._compute(source)
        return Selection(source, host_name(compute, source), node_name(compute, source),
                         compute.get("cell_uuid"), uuid, weight, claim_id, choice)

    def alternates(self, ranking: Iterable[tuple[str, float]], chosen: set[str], num_alts: int,
                   ownership: PeerOwnership | None) -> dict[str | None, list[tuple[str, float]]]:
        """Per cell of a chosen host: the best ``num_alts`` unclaimed hosts of that cell.

        With peers (``ownership``), among the best ``num_alts`` × peers, the hosts this
        scheduler owns (or is next in line for) come first: an alternate is claimed after
        a collision, and a peer's host is where the next one is likeliest.
        """
        cells = {self.cell_of(s) for s in chosen}
        out: dict[str | None, list[tuple[str, float]]] = {c: [] for c in cells}
        wanted = num_alts * len(ownership.peers) if ownership is not None else num_alts
        missing = len(cells)
        for source, weight in ranking:
            if source in chosen:
                continue
            bucket = out.get(self.cell_of(source))
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
        req = self.ranking.request_view(spec, True, [instance_uuid, *siblings])
        req.begin(0, instance_uuid)
        out: list[Selection] = []
        for source, weight in self.ranking.rank_fast(req):
            if source not in tried:
                out.append(self.selection(source, instance_uuid, weight))
                if len(out) == n:
                    break
        self.stats["fresh_alternates"] += len(out)
        return out

    def claim_alternate(self, selection: Selection, spec: RequestSpec, now: float,
                        siblings: Sequence[str] = ()) -> tuple[Claim | None, str]:
        """Claim ``selection`` (an alternate) if it still passes: (claim, "") with the claim
        registered as pending and left for the caller to cast, or (None, reason)."""
        self.index.sync()
        reason = self.ranking.recheck(selection.source, spec, selection.instance_uuid, siblings)
        if reason is not None:
            return None, reason
        claim = self.new_claim(selection.source, selection.instance_uuid, spec.resources,
                               claim_payload(spec),
                               self.claim_group(self.ranking.request_view(
                                   spec, True, [selection.instance_uuid, *siblings])))
        self.receiver.add_claim(claim, now)
        self.index.sync()
        self.stats["claims_sent"] += 1
        self.stats["alternates_claimed"] += 1
        return claim, ""


__all__ = ["ALONE", "ALTERNATE", "ANCHOR", "OWNED", "PEER", "SCARCE", "ClaimBuilder", "Selection",
           "claim_payload"]
