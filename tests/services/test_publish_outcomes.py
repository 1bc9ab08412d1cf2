"""A reporter counts a batch it gave up on as a publish failure only when it is known not
stored; one whose confirm was lost with the connection (it may be on the stream) is counted,
logged and shown apart, as unconfirmed."""

from __future__ import annotations

import logging

from svc_harness import make_reporter, wait_for

from compute_reporter import metrics as reporter_metrics
from shm_cli import reporter as reporter_cli
from transport.base import PublishError
from transport.inprocess import InProcessBus


class _Plane:
    """The bus's data plane, with a publisher that gives up on the first batches as told."""

    def __init__(self, bus: InProcessBus, outcomes: list[bool | None]) -> None:
        self.bus = bus
        self.outcomes = outcomes

    def stream_publisher(self):
        inner = self.bus.stream_publisher()
        outcomes = self.outcomes

        class Publisher:
            def publish(self, body: bytes) -> None:
                if outcomes:
                    stored = outcomes.pop(0)
                    raise PublishError("given up", stored=stored)
                inner.publish(body)

            def close(self) -> None:
                inner.close()

        return Publisher()

    def __getattr__(self, name: str):
        return getattr(self.bus, name)


def test_unconfirmed_batches_are_not_counted_as_failures(caplog):
    bus = InProcessBus(threaded=True)
    reporter = make_reporter(_Plane(bus, [None, False, None]), bus, "r0", hosts=3, seed=1,
                             change_interval=0.05)
    with caplog.at_level(logging.WARNING, logger="compute_reporter.service"):
        reporter.start()
        try:
            wait_for(lambda: reporter.stats["published"] > 0, what="a batch stored")
        finally:
            reporter.stop()
            bus.close()
    assert reporter.stats["publish_errors"] == 1
    assert reporter.stats["publish_unconfirmed"] == 2
    status = reporter_metrics.status(reporter)
    assert (status["published"]["failures"], status["published"]["unconfirmed"]) == (1, 2)
    assert "1 not stored, 2 unconfirmed" in reporter_cli.summary(reporter)
    lines = [r.getMessage() for r in caplog.records if "publish of" in r.getMessage()]
    assert sum("unconfirmed (sent, its confirm lost" in line for line in lines) == 2, lines
    assert sum("failed, not stored" in line for line in lines) == 1, lines
