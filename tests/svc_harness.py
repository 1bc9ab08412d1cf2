"""Helpers to run reporters and schedulers on one bus and wait for them (shared by service tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

from compute_reporter.service import ReporterService
from compute_reporter.tracker import SimulatedTracker
from shared_host_manager.service import SchedulerService

REPORTER_TOPIC = "shm-reporter-test"
SCHEDULER_TOPIC = "shm-scheduler-test"


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def make_reporter(bus_data, bus_control, name: str, hosts: int, seed: int, *,
                  topics: tuple[str, str] = (REPORTER_TOPIC, SCHEDULER_TOPIC),
                  change_interval: float = 0.5, heartbeat_interval: float = 0.5,
                  coalesce_window: float = 0.02, **kw) -> ReporterService:
    tracker = SimulatedTracker(hosts, seed=seed, prefix=name, change_interval=change_interval)
    return ReporterService(name, tracker, bus_data, bus_control, reporter_topic=topics[0],
                           scheduler_topic=topics[1], heartbeat_interval=heartbeat_interval,
                           coalesce_window=coalesce_window, **kw)


def make_scheduler(bus_data, bus_control, name: str, *,
                   topics: tuple[str, str] = (REPORTER_TOPIC, SCHEDULER_TOPIC),
                   **kw) -> SchedulerService:
    params = dict(down_interval=3.0, reorder_timeout=0.1, resync_timeout=0.5, claim_deadline=5.0)
    params.update(kw)
    return SchedulerService(name, bus_data, bus_control, reporter_topic=topics[0],
                            scheduler_topic=topics[1], **params)


def converged(reporters: list[ReporterService], schedulers: list[SchedulerService]) -> bool:
    """Every scheduler holds every source at the source's published version and digest."""
    for reporter in reporters:
        with reporter.manager._lock:
            truth = {s: (m.version, None if m.has_pending else m.published_digest())
                     for s, m in reporter.manager.machines.items()}
        for sched in schedulers:
            with sched.cache.lock:
                for source, (version, dig) in truth.items():
                    view = sched.receiver.sources.get(source)
                    if view is None or view.doc is None or view.version != version:
                        return False
                    if dig is None or view.digest() != dig:
                        return False
    return True


def quiesce(reporters: list[ReporterService]) -> None:
    """Stop the trackers' drift so versions settle."""
    for r in reporters:
        r.tracker.stop()


def start_peers(bus_data, bus_control, reporter: ReporterService, n: int,
                **manager_kw) -> list:
    """``n`` SchedulerManagers s0..s<n-1> with membership on, started with ``reporter``,
    once each sees all of them as live peers (stop them and the reporter when done)."""
    from shared_host_manager.decision.manager import SchedulerManager

    managers = [SchedulerManager(make_scheduler(bus_data, bus_control, f"s{i}",
                                                membership_interval=0.2), **manager_kw)
                for i in range(n)]
    for m in managers:
        m.start()
    reporter.start()
    names = tuple(f"s{i}" for i in range(n))
    wait_for(lambda: all(m.service.peers == names for m in managers),
             what=f"every scheduler to see the {n}")
    return managers
