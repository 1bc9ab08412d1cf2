"""Checkpoints over the real RabbitMQ (design §4.5): a newcomer starts from a fresh one.

One scheduler publishes a checkpoint on ``<stream>.checkpoint``; a second, started with no
state file, asks for one on the peer topic (kombu), restores the checkpoint the first took
in answer rather than the older one, reads the host-state stream after its offset only, and
holds every source active at the reporter's versions without asking the sources for
snapshots.
"""

from __future__ import annotations

import time

import pytest
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from shared_host_manager import checkpoint
from transport import no_eventlet  # noqa: F401  (before oslo_messaging)

pytestmark = [pytest.mark.rabbit, pytest.mark.slow]

HOSTS = 200


def test_a_newcomer_restores_the_checkpoint_and_is_active_for_every_source(planes):
    data, control, topics = planes
    reporter = make_reporter(data, control, "r", hosts=HOSTS, seed=6, topics=topics,
                             change_interval=2.0, heartbeat_interval=5.0)
    publisher = make_scheduler(data, control, "s0", topics=topics, checkpoint_interval=60.0,
                               down_interval=15.0)
    publisher.start()
    reporter.start()
    try:
        wait_for(lambda: publisher.figures()["sources"]["active"] == HOSTS, 60, "sources")
        assert publisher.checkpoints is not None and publisher.checkpoints.publish()
        size, offset, sources = publisher.checkpoints.last_published
        assert sources == HOSTS and offset is not None
        published = reporter.stats["published"]
        wait_for(lambda: reporter.stats["published"] > published + 20, 30, "changes after it")
        # a newcomer waits for the answer to its ask no longer than the newest checkpoint is
        # old (replaying less is quicker): this one old enough for the whole wait
        time.sleep(checkpoint.ANSWER_WAIT)
        newcomer = make_scheduler(data, control, "s1", topics=topics, checkpoint_interval=60.0,
                                  down_interval=15.0)
        newcomer.start()
        try:
            restored = newcomer.checkpoints.restored if newcomer.checkpoints else None
            assert restored is not None and restored.scheduler == "s0"
            assert newcomer.checkpoints.asked_token in restored.answers
            assert newcomer.resumed_from == restored.offset and restored.offset > offset
            wait_for(lambda: newcomer.figures()["sources"]["active"] == HOSTS, 30, "all active")
            quiesce([reporter])
            wait_for(lambda: converged([reporter], [publisher, newcomer]), 60, "convergence")
            # resync requests << sources (a source is asked only if its delta was lost)
            assert newcomer.receiver.stats["resyncs_requested"] <= HOSTS // 100
            assert newcomer.retention_gaps == 0
            # it read the stream after the checkpoint only
            assert newcomer.cache.messages < publisher.cache.messages
        finally:
            newcomer.stop()
        # a third, with checkpoints off, starts cold from the stream as before
        cold = make_scheduler(data, control, "s2", topics=topics, down_interval=15.0)
        cold.start()
        try:
            assert cold.checkpoints is None and cold.resumed_from is None
            wait_for(lambda: converged([reporter], [cold]), 60, "cold start convergence")
        finally:
            cold.stop()
    finally:
        reporter.stop()
        publisher.stop()
