"""ReporterManager's timers: one live entry per source, whatever the change rate."""

from compute_reporter.manager import ReporterManager
from compute_reporter.tracker import SimulatedTracker
from protocol.document import SET


def test_timer_heap_stays_bounded_under_many_changes():
    tracker = SimulatedTracker(20, seed=3)
    docs = {h: tracker.document(h) for h in tracker.hosts()}
    manager = ReporterManager("r", docs, dict.fromkeys(docs, 1), coalesce_window=0.05,
                              heartbeat_interval=1.0)
    now = 0.0
    manager.poll(now)
    published = 0
    sizes = []
    for step in range(4000):
        now += 0.01
        source = tracker.hosts()[step % 20]
        manager.change(source, [[SET, "metrics", "cpu.percent", step]], now)
        batches, _ = manager.poll(now)
        published += sum(len(b.items) for b in batches)
        sizes.append(len(manager._heap))
    # stale entries live at most one heartbeat interval: the heap does not grow with the
    # number of changes (it did: every popped duplicate re-armed itself)
    assert max(sizes) <= 8 * len(docs), max(sizes)
    assert max(sizes[2000:]) <= max(sizes[:2000]) + len(docs)
    assert published > 1000
    # every host still heartbeats on time
    beats, _ = manager.poll(now + 1.0)
    assert sum(1 for b in beats for i in b.items if type(i).__name__ == "Heartbeat") == 20


def test_claims_applied_by_the_hosts_own_arbiter_are_listed_and_retired():
    from protocol.messages import Claim
    from protocol.receiver import Outcome, ReceiverMachine

    tracker = SimulatedTracker(1, seed=4)
    source = tracker.hosts()[0]
    manager = ReporterManager("r", {source: tracker.document(source)}, {source: 7})
    receiver = ReceiverMachine("s")
    for batch in manager.poll(0.0)[0]:
        receiver.receive(batch, 0.0)
    claim = Claim("nova-instance-1", "s", source, 7, 0, {"memory_mb": 512}, "nova-instance-1")
    receiver.add_claim(claim, 0.0)
    # nova's resource tracker claimed it itself and reports usage and instance together
    manager.change(source, [[SET, "compute", "memory_mb_used", 512],
                            [SET, "instances", "nova-instance-1", {"resources": {}}]], 0.1)
    manager.claims_included(source, ["nova-instance-1"], 0.1)
    for batch in manager.poll(1.0)[0]:
        receiver.receive(batch, 1.0)
    assert receiver.drain_outcomes() == [("nova-instance-1", source, Outcome.INCLUDED)]
    assert receiver.view(source).pending_usage == {}
