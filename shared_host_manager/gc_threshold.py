"""Python's young-generation garbage-collector threshold for the processes that decide.

Role: one setting, applied once at a process's start (its edge: a console script, a
benchmark's ``main``), never per decision.  A decision makes a few objects per host
(the request's views, nova's filter and weigher objects over the index, weighed
hosts).  With Python's default first threshold (700) enough of them live through a
young collection to trigger full collections of the whole heap, which holds the
cache's documents and templates: measured in ``shm bench decisions`` at 1 000 hosts,
the collector took 18–20 % of the deciding process's CPU, and the decisions per CPU
second rose by 5–14 % with the threshold below (docs/benchmarks.md).  With a threshold above what
one decision makes, its objects are freed by reference counting first.

nova-scheduler-shared sets it from ``[shared_host_manager] gc_young_threshold`` when
its cache starts; ``shm sim``, ``shm bench decisions``, ``shm bench nova`` and ``shm bench
placement`` set
:data:`YOUNG_THRESHOLD` for their run.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: the first threshold the deciding processes run with (Python's default: 700)
YOUNG_THRESHOLD = 100_000


def tune_gc(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Set Python's first garbage-collector threshold for this process (0: leave it).  The
    older generations keep their thresholds."""
    if young_threshold > 0:
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(young_threshold, g1, g2)


@contextmanager
def tuned(young_threshold: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """:func:`tune_gc` for a block, the thresholds restored after it: for a command's
    ``main`` that may run inside another program (the tests)."""
    before = gc.get_threshold()
    tune_gc(young_threshold)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def add_option(parser: argparse.ArgumentParser, timed: str, note: str = "") -> None:
    """A benchmark's ``--gc-young-threshold N`` (default :data:`YOUNG_THRESHOLD`): the threshold
    while ``timed`` runs, as nova-scheduler-shared sets it; ``note`` ends the help text."""
    parser.add_argument(
        "--gc-young-threshold", type=int, default=YOUNG_THRESHOLD, metavar="N",
        help=f"Python's first garbage-collector threshold while {timed}, as "
             "nova-scheduler-shared sets it ([shared_host_manager] gc_young_threshold; "
             f"default %(default)s; 0: Python's 700){note}")


__all__ = ["YOUNG_THRESHOLD", "add_option", "tune_gc", "tuned"]
