"""Running many fault schedules (``shm faults``), or reproducing one with its update logs.

Life cycle of :func:`run_schedules`: schedules ``first .. first+count-1`` of a seed, each
independent of the others (its own generator, its own state directory, removed after
it), in this process or spread over ``workers`` forked processes; the result lists
every violation with its seed, schedule, step and invariant, and the timing.  The
same (seed, schedule) gives the same run whatever the number of workers.

:func:`reproduce` runs one schedule again with an update log for every party in a
directory: ``shm replay`` on a scheduler's log then replays it through the
receiver and names the first step whose state or effects differ, and ``--diff``
against a reporter's log names the first version at which the views parted.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.faults.planted import PlantedBug
from simulator.faults.world import INVARIANTS, FaultWorld, Violation, run_schedule


@dataclass
class FaultReport:
    seed: int
    first: int
    schedules: int = 0
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    planted: list[str] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.schedules / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "first_schedule": self.first, "schedules": self.schedules,
            "violations": [v.as_dict() for v in self.violations],
            "seconds": round(self.seconds, 3), "schedules_per_s": round(self.per_second, 2),
            "planted": self.planted, "invariants": INVARIANTS,
        }


def _work_dir() -> str:
    # state files are written and fsynced at every save: keep them in memory where possible
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="shm-faults-", dir=base)


def _chunk(args: tuple[int, int, int, frozenset[PlantedBug]]) -> list[Violation]:
    seed, start, stop, planted = args
    logging.disable(logging.CRITICAL)  # the parties log every fault they survive
    directory = _work_dir()
    try:
        out: list[Violation] = []
        for k in range(start, stop):
            out.extend(run_schedule(seed, k, directory, planted=planted))
        return out
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_schedules(seed: int, count: int, *, first: int = 0, workers: int = 1,
                  planted: frozenset[PlantedBug] = frozenset(),
                  progress: Callable[[int, int], None] | None = None) -> FaultReport:
    """Run ``count`` schedules of ``seed``; ``progress(done, violations)`` after each chunk."""
    report = FaultReport(seed, first, planted=sorted(b.value for b in planted))
    t0 = time.perf_counter()
    step = max(1, min(50, count // max(1, workers * 4) or 1))
    chunks = [(seed, k, min(k + step, first + count), planted) for k in range(first, first + count, step)]
    previous = logging.root.manager.disable
    try:
        if workers <= 1:
            results = map(_chunk, chunks)
            for (_, start, stop, _), violations in zip(chunks, results, strict=True):
                report.schedules += stop - start
                report.violations.extend(violations)
                if progress is not None:
                    progress(report.schedules, len(report.violations))
        else:
            # not fork: a caller with threads (a test run, a service) could hand a child a
            # lock held by a thread that does not exist there
            ctx = multiprocessing.get_context("forkserver")
            with ctx.Pool(workers) as pool:
                for (_, start, stop, _), violations in zip(chunks, pool.imap(_chunk, chunks),
                                                           strict=True):
                    report.schedules += stop - start
                    report.violations.extend(violations)
                    if progress is not None:
                        progress(report.schedules, len(report.violations))
    finally:
        logging.disable(previous)
    report.seconds = time.perf_counter() - t0
    return report


def reproduce(seed: int, schedule: int, record_dir: str, *,
              planted: frozenset[PlantedBug] = frozenset()) -> list[Violation]:
    """Run one schedule again, writing every party's update log into ``record_dir``."""
    os.makedirs(record_dir, exist_ok=True)
    directory = _work_dir()
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        return FaultWorld(seed, schedule, directory, planted=planted, record_dir=record_dir).run()
    finally:
        logging.disable(previous)
        shutil.rmtree(directory, ignore_errors=True)


__all__ = ["FaultReport", "reproduce", "run_schedules"]
