"""A stream per cell over the real RabbitMQ (design §4.6): one cell's broker goes away.

Two cells, each a stream of its own; cell2's "broker" is the local RabbitMQ behind a TCP
relay that the test stops and starts again, as a cell's broker would fail while the
others keep running.  While it is away the scheduler keeps applying cell1's changes,
says on /healthz which cell it lost (and stays up), and cell2's hosts go down after
``down_interval``; when it is back they rejoin from cell2's stream offset, without a
retention gap, and with no resync request but for a delta whose publish the cut itself
lost (counted by the reporter: the protocol repairs it from that host's ring).  And a
cell's computes reached on their cell's broker alone (a vhost of its own here), the control
plane per cell.
"""

from __future__ import annotations

import contextlib
import uuid
from urllib.parse import urlsplit

import pytest
from kombu import Connection
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from shared_host_manager import metrics
from simulator.relay import Relay
from transport.cells import cell_stream_name
from transport.inprocess import InProcessBus
from transport.kombu_stream import KombuStreamDataPlane, StreamSettings

pytestmark = [pytest.mark.rabbit, pytest.mark.slow]

HOSTS = 20
DOWN = 2.0


@pytest.fixture
def cells(rabbit_url):
    broker = urlsplit(rabbit_url)
    relay = Relay((broker.hostname or "127.0.0.1", broker.port or 5672))
    relay.start()
    name = f"shm-test-cells-{uuid.uuid4().hex[:10]}"
    relayed = f"amqp://guest:guest@127.0.0.1:{relay.port}//"

    def plane(url: str, stream: str) -> KombuStreamDataPlane:
        return KombuStreamDataPlane(StreamSettings(
            url=url, name=stream, reconnect_interval=0.2, reconnect_interval_max=0.5,
            tail_probe_interval=0.5, publish_timeout=2.0, connect_timeout=2.0))

    planes = {"cell1": plane(rabbit_url, cell_stream_name(name, "cell1")),
              "cell2": plane(relayed, cell_stream_name(name, "cell2"))}
    top = plane(rabbit_url, name)
    try:
        yield relay, top, planes
    finally:
        relay.stop()
        for p in (top, *planes.values()):
            p.close()
        with Connection(rabbit_url, connect_timeout=5) as conn:
            for queue in (name, *(cell_stream_name(name, c) for c in planes)):
                with contextlib.suppress(Exception):
                    conn.channel().queue_delete(queue=queue)


def test_a_cell_whose_broker_is_gone_leaves_the_others_running_and_rejoins_from_its_offset(
        cells) -> None:
    relay, top, planes = cells
    control = InProcessBus(threaded=True)  # the streams are what this test is about
    reporters = [make_reporter(planes[c], control, f"r-{c}", HOSTS, seed=i, change_interval=0.5,
                               heartbeat_interval=0.3)
                 for i, c in enumerate(planes)]
    sched = make_scheduler(top, control, "s0", cell_planes=planes, down_interval=DOWN,
                           membership_interval=0.5)
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), 60, "both cells held")
        cell1 = {s for s in reporters[0].manager.machines}
        cell2 = {s for s in reporters[1].manager.machines}

        relay.stop()  # cell2's broker is gone
        wait_for(lambda: "cell cell2 not connected" in metrics.health(sched)[1], 20,
                 "/healthz naming cell2")
        assert metrics.health(sched)[0]  # degraded, still serving
        applied = sched.cache.cell_offsets["cell1"]
        wait_for(lambda: all(sched.receiver.sources[s].status.value == "down" for s in cell2),
                 DOWN * 10, "cell2's hosts down after down_interval")
        assert all(sched.receiver.sources[s].status.value == "active" for s in cell1)
        assert sched.cache.cell_offsets["cell1"] > applied  # cell1's changes still applied
        resyncs = sched.receiver.stats["resyncs_requested"]
        offset = sched.cache.cell_offsets["cell2"]

        relay.start()  # back: cell2 resumes after the offset it had applied
        wait_for(lambda: all(sched.receiver.sources[s].status.value == "active" for s in cell2),
                 60, "cell2's hosts active again")
        assert sched.cache.cell_offsets["cell2"] > offset
        quiesce(reporters)
        wait_for(lambda: converged(reporters, [sched]), 60, "converged after the outage")
        lost = sum(reporters[1].stats[k] for k in ("publish_unconfirmed", "publish_errors"))
        # a batch on the wire when the cell went away may be lost: at most one resync per
        # host of that cell then, none otherwise
        assert sched.receiver.stats["resyncs_requested"] - resyncs <= (len(cell2) if lost else 0)
        assert sched.retention_gaps == 0
        assert "cell" not in metrics.health(sched)[1]
        status = metrics.status(sched)["cells"]
        assert status["cell2"]["connected"] and status["cell2"]["reconnects"] >= 1
    finally:
        for r in reporters:
            r.stop()
        sched.stop()
        control.close()


@pytest.fixture
def cell_vhost(rabbitmqctl, oslo_rabbit_url):
    """A vhost of its own standing in for a cell's broker (the guest user may use it), and
    its oslo.messaging URL; deleted after the test with everything in it."""
    vhost = f"shm-test-cell-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"{oslo_rabbit_url.rstrip('/')}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def test_a_cells_computes_talk_only_to_their_cells_broker(cells, oslo_rabbit_url,
                                                          cell_vhost) -> None:
    """cell2's reporter takes resync requests and claims and answers on cell2's vhost alone;
    the scheduler reaches it there (oslo.messaging, as deployed), and cell1's reporter on the
    deployment's control plane."""
    from oslo_config import cfg

    from transport import no_eventlet  # noqa: F401  (before oslo_messaging)
    from transport.oslo_rpc import OsloRpcControlPlane

    relay, top, planes = cells
    conf = cfg.ConfigOpts()
    conf([])
    api_control = OsloRpcControlPlane(conf, oslo_rabbit_url)
    cell2_control = OsloRpcControlPlane(conf, cell_vhost)
    suffix = uuid.uuid4().hex[:8]
    topics = (f"shm-it-reporter-{suffix}", f"shm-it-scheduler-{suffix}")
    reporters = [make_reporter(planes["cell1"], api_control, "r-cell1", 4, seed=0, topics=topics),
                 make_reporter(planes["cell2"], cell2_control, "r-cell2", 4, seed=1,
                               topics=topics)]
    sched = make_scheduler(top, api_control, "s0", cell_planes=planes, topics=topics,
                           cell_control_planes={"cell2": cell2_control})
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), 60, "both cells held")
        answered = sched.cache.control_received["resync_answer"]
        asked = [r.manager.stats["resync_requests"] for r in reporters]
        assert sched.cache.resync_all(full=True) == 8
        # each cell's reporter got its own 4 requests (cell2's on cell2's broker alone) and
        # answered; at least: a gap the ongoing changes open meanwhile adds its own resync
        wait_for(lambda: all(r.manager.stats["resync_requests"] >= n + 4
                             for r, n in zip(reporters, asked, strict=True)), 30,
                 "each cell's reporter asked on its own cell's broker")
        wait_for(lambda: sched.cache.control_received["resync_answer"] >= answered + 8, 30,
                 "every host's resync answer, each from its own cell's broker")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, [sched]), 60, "converged")
    finally:
        for r in reporters:
            r.stop()
        sched.stop()
        api_control.close()
        cell2_control.close()
        with Connection(top.settings.url, connect_timeout=5) as conn:
            for topic in topics:
                for queue in (topic, *(f"{topic}.{s}" for s in ("s0", "r-cell1", "r-cell2"))):
                    with contextlib.suppress(Exception):
                        conn.channel().queue_delete(queue=queue)
