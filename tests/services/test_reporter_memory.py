"""The reporter's per-host delta ring is its bounded buffer: driven far past the bound with
changes, it holds min(ring_size, 256) deltas per host and its memory stops growing
(docs/design.md §4.3). Counts and allocated bytes, no clock."""

from __future__ import annotations

import tracemalloc

import pytest

from compute_reporter.manager import ReporterManager
from compute_reporter.tracker import SimulatedTracker
from protocol.messages import Delta

HOSTS = 20
BOUND = 256  # what a resync answer carries at most: protocol.source max_resync_deltas


class _Sink:
    def __init__(self, manager: ReporterManager) -> None:
        self.manager = manager
        self.now = 0.0

    def change(self, source, ops):
        self.manager.change(source, ops, self.now)

    def release(self, source, instance):
        return self.manager.release(source, instance, self.now)

    def instances(self, source):
        return self.manager.instances(source)

    def claims_included(self, source, ids):
        self.manager.claims_included(source, ids, self.now)


def _drive(manager: ReporterManager, tracker: SimulatedTracker, sink: _Sink, rounds: int) -> None:
    """``rounds`` changes of every host, each published as one delta."""
    for _ in range(rounds):
        sink.now += 1.0
        for host in tracker.hosts():
            tracker.step(sink, host)
        manager.poll(sink.now + 0.5)


@pytest.mark.parametrize("ring_size, held", [pytest.param(512, BOUND, marks=pytest.mark.slow),
                                             (256, BOUND), (40, 40)])
def test_the_ring_holds_at_most_what_a_resync_can_send_and_levels_off(ring_size, held):
    tracker = SimulatedTracker(HOSTS, seed=3, prefix="r0", change_interval=1.0)
    manager = ReporterManager("r0", {h: tracker.document(h) for h in tracker.hosts()},
                              dict.fromkeys(tracker.hosts(), 1), ring_size=ring_size)
    sink = _Sink(manager)
    manager.poll(0.0)  # the announcements
    tracemalloc.start()
    try:
        _drive(manager, tracker, sink, 2 * ring_size)
        filled = tracemalloc.get_traced_memory()[0]
        assert manager.ring_deltas() == HOSTS * held
        _drive(manager, tracker, sink, 2 * ring_size)
        later = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert manager.ring_deltas() == HOSTS * held
    assert all(m.ring_length == held for m in manager.machines.values())
    # twice as many changes again, the same memory (a little slack for dicts resizing)
    assert later - filled < 0.02 * filled, (filled, later)
    # the oldest delta kept is still sent as a catch-up, one older is not
    machine = next(iter(manager.machines.values()))
    epoch, seq = machine.version
    items = machine.catch_up(epoch, seq - held)
    assert len(items) == held and all(isinstance(i, Delta) for i in items)
    assert not isinstance(machine.catch_up(epoch, seq - held - 1)[0], Delta)
