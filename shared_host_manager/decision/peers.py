"""Peer coordination: which of the best hosts this scheduler claims, given its live peers.

Role: schedulers holding (about) the same view weigh it the same way, so left
alone they would all claim the same best host.  This module decides, without
talking to the peers, which of a request's ranked candidates this scheduler
takes (design §5.4):

* **ownership**: every host has one owner among the live schedulers
  (rendezvous hashing, :class:`~shared_host_manager.decision.subset.PeerOwnership`);
  a request takes the best host this scheduler owns; with none owned, a peer's
  host its owner is least likely to be claiming now (deep behind the owner's
  best ones), or, with ``hand_to_owner``, :class:`Delegated` to the owner of
  the best one;
* **scarce requests** (at most SCARCE_PER_PEER candidates per live scheduler):
  every scheduler computes the same matching of candidates to schedulers
  (:meth:`PeerCoordination.match`), or, with ``scarce_coordinator``, the first
  live peer by name decides them all (:attr:`PeerCoordination.coordinator`);
* **hosts kept for scarce requests**: the resources of recent scarce requests
  are remembered for SCARCE_MEMORY seconds, and while few hosts fit them a
  request many hosts fit takes another host it owns (:meth:`PeerCoordination.kept`).

Alone (no peers): one of the best ``k`` at random (seeded RNG) or by rendezvous
([filter_scheduler] host_subset_choice).

Life cycle: one per engine.  :meth:`PeerCoordination.set_peers` is called
whenever the live peers change (the manager follows the membership the
service reads from the stream; a fixed list in tests and simulators); the
ownership and the per-row owner numbers derived from it are rebuilt then,
and the owner numbers again when the index gains rows.  The scarce memory
ages with the decisions' ``now`` (the caller's clock: no clock is read here)
and is saved and restored by the update log (:attr:`PeerCoordination.scarce_memory`)
so that a replay decides as the scheduler did.  Not thread-safe: called by the
engine under its caller's lock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.claims import ALONE, OWNED, PEER, SCARCE
from shared_host_manager.decision.index import AGGREGATE_GROUPS, FloatArray, HostIndex
from shared_host_manager.decision.ranking import Ranking, normalise
from shared_host_manager.decision.request import RequestView
from shared_host_manager.decision.subset import PeerOwnership, RendezvousChoice

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


class Delegated(Exception):
    """Another live peer decides this request: the coordinator of scarce requests, or the
    owner of the best hosts when this scheduler owns none of them (design §5.4).  Hand it
    over to ``coordinator``; nothing was claimed, as with NoValidHost."""

    def __init__(self, coordinator: str, why: str = "scarce") -> None:
        super().__init__(f"request handed to {coordinator} ({why})")
        self.coordinator = coordinator
        self.why = why


class PeerCoordination:
    """Ownership, scarce coordination and the choice among the best; see the module docstring."""

    def __init__(self, name: str, config: SchedulerConfig, index: HostIndex, ranking: Ranking,
                 rng: random.Random, stats: dict[str, int]) -> None:
        self.name = name
        self.config = config
        self.index = index
        self.ranking = ranking
        self.rng = rng
        #: the engine's counters (owned_choices, peer_choices, scarce_*, handed_to_owner)
        self.stats = stats
        self._rendezvous = (RendezvousChoice(name)
                            if config.host_subset_choice == "rendezvous" else None)
        #: None: alone (no peers known)
        self.ownership: PeerOwnership | None = None
        #: the resources of recent scarce requests -> when last asked for
        self._scarce: dict[tuple[tuple[str, int], ...], float] = {}
        #: (ownership, index rows added, owner number per index row) of owner_depths: the
        #: owners change only with the peers or the rows
        self._owners: tuple[PeerOwnership, int, npt.NDArray[np.int32]] | None = None

    @property
    def peers(self) -> list[str]:
        """The live schedulers host ownership is computed among (this one included); [] alone."""
        return list(self.ownership.peers) if self.ownership is not None else []

    @property
    def coordinator(self) -> str | None:
        """The live peer that decides every scarce request ([filter_scheduler]
        scarce_coordinator): the first by name; None alone, when off, or when it is this
        scheduler (a pure function of the peers and the options, so a replay hands over
        exactly the requests the scheduler handed over)."""
        if self.ownership is None or not self.config.scarce_coordinator:
            return None
        first = min(self.ownership.peers)
        return None if first == self.name else first

    def set_peers(self, peers: Sequence[str]) -> None:
        """The live schedulers (this one included): each claims first the best host it owns.

        An empty or single-name list turns ownership off (plain subset choice).
        """
        names = set(peers) | {self.name}
        self.ownership = PeerOwnership(self.name, list(names)) if len(names) > 1 else None

    def depth(self, k: int) -> int:
        """How many of the best hosts a request chooses among: with known peers, about k
        of the top k × peers are ours."""
        return k * len(self.ownership.peers) if self.ownership is not None else k

    def scarce_limit(self) -> int:
        """A request fewer than this many hosts fit is scarce (0: alone, none is)."""
        return SCARCE_PER_PEER * len(self.ownership.peers) + 1 if self.ownership is not None else 0

    def choose(self, top: list[tuple[str, float]], k: int, now: float = 0.0,
               scarce: bool = False, resources: Mapping[str, int] | None = None,
               to_owner: bool = False, req: RequestView | None = None) -> tuple[int, str]:
        """Which host of the ranked ``top`` to claim, and how it was chosen (OWNED, PEER,
        SCARCE, ALONE: ``Selection.choice``).

        With peers (design §5.4): a ``scarce`` request (``top`` is its whole candidate set,
        at most SCARCE_PER_PEER hosts per live scheduler) takes the host the schedulers'
        shared matching gives this one (:meth:`match`); any other takes the best host
        this scheduler owns, passing over the hosts kept for scarce requests
        (:meth:`kept`) while it owns another; with none owned, the peer's host its owner
        is least likely to be claiming now, or, ``to_owner`` ([filter_scheduler]
        hand_to_owner), Delegated to the owner of the best one, which decides it with its
        own requests.  Alone: one of the best ``k`` (see [filter_scheduler]
        host_subset_choice).
        """
        if self.ownership is not None:
            ownership = self.ownership
            if scarce:
                self.remember_scarce(resources, now)
                self.stats["scarce_choices"] += 1
                return self.match(top), SCARCE
            reserved = self.kept([source for source, _ in top], resources or {}, now)
            places = [ownership.place(source) for source, _ in top]
            if 0 in places:
                self.stats["owned_choices"] += 1
                first = places.index(0)
                if reserved[first]:
                    # a request many hosts fit leaves the few hosts that scarce requests
                    # (of any scheduler) are sharing out to them: it takes another it owns
                    free = next((i for i, p in enumerate(places) if p == 0 and not reserved[i]),
                                None)
                    if free is not None:
                        self.stats["scarce_skips"] += 1
                        return free, OWNED
                return first, OWNED
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
            depths = self.owner_depths([source for source, _ in top], req)
            best = min(range(len(top)),
                       key=lambda i: (reserved[i], depths[i] < FRONT_DEPTH, places[i],
                                      -depths[i], i))
            self.stats["peer_choices"] += 1
            return best, PEER
        if len(top) == 1:
            return 0, ALONE
        if self._rendezvous is not None:
            return self._rendezvous.index([s for s, _ in top]), ALONE
        return self.rng.randrange(len(top)), ALONE

    def remember_scarce(self, resources: Mapping[str, int] | None, now: float) -> None:
        """A scarce request of these resources was decided (or handed over) now: for
        SCARCE_MEMORY the few hosts it fits are kept for such requests (:meth:`kept`)."""
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

    def kept(self, sources: list[str], resources: Mapping[str, int], now: float) -> list[bool]:
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
        ownership = self.ownership
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

    def match(self, top: list[tuple[str, float]]) -> int:
        """A scarce request's host: the one the live schedulers' shared matching gives us.

        Every scheduler computes the same matching from the same candidate set (``top``,
        best first) and peer list, so concurrent scarce requests in different schedulers
        land on different hosts while there are enough of them: each owner of candidates
        takes its best one; the schedulers owning none (in name order) take the other
        candidates in turn, best first, then the owners' best ones (design §5.4).
        """
        ownership = self.ownership
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

    def owner_depths(self, sources: list[str], req: RequestView | None = None) -> list[int]:
        """For each of ``sources``: how many hosts its owner weighs better, by the weighers
        alone (no filter).  A peer claims its hosts best first, so a host deep behind its
        owner's best ones is one that peer is unlikely to claim at the same moment.  A
        weigher without an index column (nova's classes) weighs every live row through its
        vector form, for ``req`` (without one it is left out)."""
        ownership = self.ownership
        ix = self.index
        n = ix.size
        if ownership is None or n == 0:
            return [0] * len(sources)
        live = ix.live[:n]
        score = np.zeros(n, dtype=np.float64)
        for wg, mult in self.ranking.multipliers():
            if isinstance(mult, float) and mult == 0.0:
                continue
            if wg.index_column is not None:
                x = ix.weigher_cols[wg.index_column][:n].copy()
            else:
                rows = np.flatnonzero(live)
                raw = wg.vector_weights(ix, req, rows) if req is not None else None
                if raw is None:
                    continue
                x = np.zeros(n, dtype=np.float64)
                x[rows] = raw
            if not normalise(wg, x, live):
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


__all__ = ["FRONT_DEPTH", "SCARCE_MEMORY", "SCARCE_PER_PEER", "Delegated", "PeerCoordination"]
