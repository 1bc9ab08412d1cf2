"""Collision avoidance: how many of the best-weighed hosts to choose from at random.

Why: every scheduler holds (nearly) the same view and weighs it the same way,
so concurrent requests in different schedulers pick the same best host; the
compute node accepts one claim and rejects the others, which then cost an
extra round trip (an alternate) or, when capacity is scarce, a NoValidHost.
nova's answer is ``host_subset_size``: choose at random among the top k.  A
fixed k is either too small under contention or needlessly bad for packing
when one scheduler runs alone, so k adapts here::

    k = clamp(round(k_min + (S - 1) * (1 + r / r_target)), k_min, k_max)

with S the number of live schedulers (an input from the service layer) and r
the claim-rejection rate, an EWMA over resolved claims.  One scheduler with
no rejections gets k_min (1 by default: always the best host, nova's
default); S schedulers start at about S (they rarely pick the same host),
and k grows further while rejections stay above the target.

Life cycle: one per engine; :meth:`observe` is fed every claim's first
resolution by the request tracker; :meth:`size` is read once per request.
Pure and deterministic (no clock, no randomness).
"""

from __future__ import annotations

import zlib


class AdaptiveSubset:
    __slots__ = ("k_min", "k_max", "target", "alpha", "rate", "observed")

    def __init__(self, k_min: int = 1, k_max: int = 16, target: float = 0.05,
                 alpha: float = 0.05) -> None:
        if k_min < 1 or k_max < k_min:
            raise ValueError(f"need 1 <= host_subset_size_min <= host_subset_size_max, "
                             f"got {k_min}, {k_max}")
        self.k_min = k_min
        self.k_max = k_max
        self.target = target
        self.alpha = alpha
        #: EWMA of rejected / resolved claims
        self.rate = 0.0
        self.observed = 0

    def observe(self, rejected: bool) -> None:
        """One claim resolved: rejected by its compute node, or accepted."""
        self.rate += self.alpha * ((1.0 if rejected else 0.0) - self.rate)
        self.observed += 1

    def size(self, live_schedulers: int = 1) -> int:
        others = max(live_schedulers, 1) - 1
        k = round(self.k_min + others * (1.0 + self.rate / self.target))
        if self.rate > self.target and others == 0:
            # alone yet rejected (the view lags the hosts): widen a little too
            k = round(self.k_min * (1.0 + self.rate / self.target))
        return max(self.k_min, min(self.k_max, k))


class RendezvousChoice:
    """Pick from a subset the host this scheduler prefers: highest hash of (scheduler, host).

    Schedulers deciding on the same view then spread over the subset without
    talking to each other (rendezvous hashing), while each one keeps choosing
    its preferred host until its own pending claims push it out of the subset.
    The hash is stable across processes and runs (CRC32, not Python's salted
    ``hash``), so a seeded simulation is reproducible.
    """

    __slots__ = ("_prefix", "_rank")

    def __init__(self, scheduler: str) -> None:
        self._prefix = scheduler.encode() + b"/"
        self._rank: dict[str, int] = {}

    def rank(self, source: str) -> int:
        r = self._rank.get(source)
        if r is None:
            r = self._rank[source] = zlib.crc32(self._prefix + source.encode())
        return r

    def index(self, sources: list[str]) -> int:
        """Position in ``sources`` of the preferred one."""
        ranks = [self.rank(s) for s in sources]
        return ranks.index(max(ranks))


class PeerOwnership:
    """Which hosts this scheduler *owns* among its live peers (rendezvous hashing).

    Every host has exactly one owner among the peers: the peer with the highest
    CRC32 of (peer name, host).  Each scheduler computes the same answer from
    the same peer list without talking to the others, so when each claims the
    best host *it owns*, concurrent decisions on the same view land on different
    hosts.  A peer missing from the list (down, or not yet known) only means its
    hosts are reached through the fallback (the ordinary subset choice).
    """

    __slots__ = ("me", "peers", "_prefixes", "_order")

    def __init__(self, me: str, peers: list[str]) -> None:
        self.me = me
        self.peers = sorted(set(peers) | {me})
        self._prefixes = [(p, p.encode() + b"/") for p in self.peers]
        #: source -> (owner, this scheduler's place in the source's order of peers)
        self._order: dict[str, tuple[str, int]] = {}

    def _entry(self, source: str) -> tuple[str, int]:
        entry = self._order.get(source)
        if entry is None:
            key = source.encode()
            order = sorted(self._prefixes, key=lambda pp: (-zlib.crc32(pp[1] + key), pp[0]))
            entry = self._order[source] = (order[0][0], [p for p, _ in order].index(self.me))
        return entry

    def owner(self, source: str) -> str:
        """The peer owning ``source``."""
        return self._entry(source)[0]

    def place(self, source: str) -> int:
        """This scheduler's place in ``source``'s order of peers: 0 owns it, 1 is next in
        line (it falls back to ``source`` before the peers further down), and so on."""
        return self._entry(source)[1]

    def owns(self, source: str) -> bool:
        return self._entry(source)[1] == 0


__all__ = ["AdaptiveSubset", "PeerOwnership", "RendezvousChoice"]
