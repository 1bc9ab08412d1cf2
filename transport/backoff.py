"""Reconnect pacing for the broker-backed transports.

Role: compute the delay before the next reconnect attempt (exponential,
capped, jittered) and track an overall deadline for bounded retries.
Life cycle: a ``Backoff`` lives as long as one retry sequence; callers
``reset()`` it after a success so the next outage starts with a short
delay again.
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with a cap and multiplicative jitter.

    Jitter matters at scale: after a broker restart thousands of compute
    reporters would otherwise reconnect in lock-step (a thundering herd
    on the broker).
    """

    def __init__(self, initial: float = 0.1, maximum: float = 5.0,
                 factor: float = 2.0, jitter: float = 0.2,
                 rng: random.Random | None = None) -> None:
        if initial <= 0 or maximum < initial or factor < 1:
            raise ValueError("need 0 < initial <= maximum and factor >= 1")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._current = initial

    def next_delay(self) -> float:
        """Return the delay to sleep now and grow the next one."""
        base = self._current
        self._current = min(self.maximum, self._current * self.factor)
        if self.jitter:
            base *= 1.0 + self._rng.uniform(-self.jitter, self.jitter)
        return base

    def reset(self) -> None:
        self._current = self.initial

    @staticmethod
    def deadline(seconds: float) -> float:
        """Monotonic time *seconds* from now (for bounded retry loops)."""
        return time.monotonic() + seconds
