"""Bugs planted in a receiver, to show that the fault simulation finds them (design §6).

A simulation that never fails proves little.  Each :class:`PlantedBug` breaks one
rule of design §4.2 or §5.2 the way a plausible regression would; the tests of
``shm faults`` (``tests/simulator/test_faults.py``) plant each in turn and
require some schedule to violate an invariant within a bounded number of
schedules.  ``shm faults --plant BUG`` does the same by hand.

The bugs reach the receiver only through the seam it offers for them: a
:class:`~protocol.receiver.ReceiverPolicy` given to the
:class:`~protocol.receiver.ReceiverMachine` at construction (:func:`receiver_policy`).
The receiver does not know which bugs exist; a deployment never passes a policy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from protocol.messages import ClaimResult, Delta
from protocol.receiver import KEEP_RULES, ReceiverPolicy, SourceView


class PlantedBug(enum.StrEnum):
    """Known bugs the fault simulator must be able to find (``shm faults --plant``)."""

    #: a delta past a gap is applied at once instead of waiting in the reorder buffer
    DELTA_OUT_OF_ORDER = "delta_out_of_order"
    #: a delta at or below the held seq is applied again instead of dropped
    SKIP_DUPLICATE_CHECK = "skip_duplicate_check"
    #: a snapshot of another epoch leaves the pending claims in the ledger
    PENDING_ACROSS_EPOCH = "pending_across_epoch"
    #: a rejection's correction is ignored (the claim retires, the view stays behind)
    FORGET_CORRECTION = "forget_correction"


class PlantedPolicy(ReceiverPolicy):
    """A receiver policy that breaks the rules of the bugs it is given, and keeps the rest."""

    __slots__ = ("bugs",)

    def __init__(self, bugs: Iterable[PlantedBug]) -> None:
        self.bugs = frozenset(bugs)

    def drop_duplicate(self, view: SourceView, delta: Delta) -> bool:
        return PlantedBug.SKIP_DUPLICATE_CHECK not in self.bugs

    def hold_past_gap(self, view: SourceView, delta: Delta) -> bool:
        return PlantedBug.DELTA_OUT_OF_ORDER not in self.bugs

    def retire_on_new_epoch(self, view: SourceView) -> bool:
        return PlantedBug.PENDING_ACROSS_EPOCH not in self.bugs

    def apply_correction(self, result: ClaimResult) -> bool:
        return PlantedBug.FORGET_CORRECTION not in self.bugs


def receiver_policy(bugs: Iterable[PlantedBug]) -> ReceiverPolicy:
    """The policy a receiver of the simulation gets: the bugs planted, or every rule kept."""
    planted = frozenset(bugs)
    return PlantedPolicy(planted) if planted else KEEP_RULES


__all__ = ["PlantedBug", "PlantedPolicy", "receiver_policy"]
