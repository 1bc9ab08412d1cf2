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


__all__ = ["AdaptiveSubset"]
