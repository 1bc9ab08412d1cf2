"""A stream per cell (design §4.6): reporters publish on their cell's stream, a scheduler
reads the deployment's stream and every cell's, each at its own offset."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from oslo_config import cfg
from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for

from protocol.messages import Claim
from shared_host_manager import metrics
from shared_host_manager.service import SchedulerService
from transport import cells, factory
from transport import opts as transport_opts
from transport.base import StreamConsumerStats, StreamPublisherStats
from transport.inprocess import InProcessBus, InProcessStreamPlane
from transport.startup import OperatorError

CELLS = ("cell1", "cell2")


def _cell_planes(bus: InProcessBus) -> dict[str, InProcessStreamPlane]:
    return {c: InProcessStreamPlane(bus, cells.cell_stream_name(bus.default_stream, c))
            for c in CELLS}


def _claim(sched: SchedulerService, source: str) -> None:
    """A claim of 256 MB on ``source``, registered and cast as a decision's would be."""
    with sched.cache.lock:
        view = sched.receiver.sources[source]
        claim = Claim(uuid.uuid4().hex, sched.name, source, view.epoch, view.seq,
                      {"memory_mb": 256}, uuid.uuid4().hex)
        sched.receiver.add_claim(claim, sched.clock())
    assert sched.send_claim(claim)


def _cloud(bus: InProcessBus, **sched_kw):
    planes = _cell_planes(bus)
    reporters = [make_reporter(planes[c], bus, f"r-{c}", 3, seed=i) for i, c in enumerate(CELLS)]
    sched = make_scheduler(bus, bus, "s0", cell_planes=planes, **sched_kw)
    return planes, reporters, sched


def test_a_scheduler_holds_every_cells_hosts_and_no_cell_stream_carries_another_cells() -> None:
    bus = InProcessBus(threaded=True)
    planes, reporters, sched = _cloud(bus)
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), what="both cells' hosts held")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, [sched]), what="converged after the drift")
        # each cell's stream holds only its reporter's messages; the deployment's, neither
        lo, hi = bus.stream_bounds()
        assert hi - lo == 0
        for c in CELLS:
            first, end = bus.stream_bounds(planes[c].stream)
            assert end > first and sched.cache.cell_offsets[c] == end - 1
        assert sched.cache.offset is None
        assert set(sched.figures()["cell_offsets"]) == set(CELLS)
    finally:
        for r in reporters:
            r.stop()
        sched.stop()
        bus.close()


class _Recorded(InProcessStreamPlane):
    """A cell's plane that notes where each consumer was started."""

    def __init__(self, bus: InProcessBus, stream: str) -> None:
        super().__init__(bus, stream)
        self.starts: list[object] = []
        self.on_retention_gap = None

    def stream_consumer(self, on_retention_gap=None):
        self.on_retention_gap = on_retention_gap
        consumer = super().stream_consumer(on_retention_gap)
        start = consumer.start

        def recorded(on_message, offset="first", **kw):
            self.starts.append(offset)
            return start(on_message, offset, **kw)

        consumer.start = recorded  # type: ignore[method-assign]
        return consumer


def test_a_restart_resumes_each_cell_from_its_own_offset_without_a_resync(tmp_path) -> None:
    bus = InProcessBus(threaded=True)
    planes, reporters, sched = _cloud(bus, state_dir=str(tmp_path))
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), what="both cells' hosts held")
        sched.stop()  # writes its state: both cells' offsets
        saved = dict(sched.cache.cell_offsets)
        assert set(saved) == set(CELLS)
        # and which cell carries each source, for the control plane of its cell
        restored = make_scheduler(bus, bus, "s0", cell_planes=planes)
        restored.cache.load(str(tmp_path / "cache-s0.msgpack"))
        for cell, reporter in zip(CELLS, reporters, strict=True):
            assert {restored.cache.cell_of(s) for s in reporter.manager.machines} == {cell}
        recorded = {c: _Recorded(bus, p.stream) for c, p in planes.items()}
        again = make_scheduler(bus, bus, "s0", cell_planes=recorded, state_dir=str(tmp_path))
        again.start()
        try:
            assert {c: p.starts for c, p in recorded.items()} == {
                c: [saved[c] + 1] for c in CELLS}
            wait_for(lambda: converged(reporters, [again]), what="converged after the restart")
            assert again.receiver.stats["resyncs_requested"] == 0
        finally:
            again.stop()
    finally:
        for r in reporters:
            r.stop()
        bus.close()


def test_catch_up_waits_for_its_marker_on_every_cell_stream() -> None:
    bus = InProcessBus(threaded=False)
    planes, reporters, sched = _cloud(bus, membership_interval=60.0)
    sched.start()
    try:
        bus.pump()
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(sched.catch_up(timeout=5.0)))
        waiter.start()
        # the marker is on each stream; until each is read, catch_up waits
        wait_for(lambda: all(bus.stream_bounds(p.stream)[1] > 0 for p in planes.values()),
                 what="the marker on each cell stream")
        first = sched._cell_consumers["cell1"]
        first.poll()  # cell1 read; the deployment's and cell2's not yet
        waiter.join(0.2)
        assert waiter.is_alive() and not result
        bus.pump()
        waiter.join(5)
        assert result == [True]
        own = sched.cache.marker_source
        held = sched.receiver.sources[own].version
        assert all(sched.cache.cell_marks[c] == held for c in CELLS)
    finally:
        sched.stop()
        bus.close()


class _Down:
    """A cell consumer whose broker went away (what a KombuStreamConsumer reports then)."""

    def stats(self) -> StreamConsumerStats:
        return StreamConsumerStats(connected=False, reconnects=3, delivered=0, duplicates=0,
                                   errors=0, retention_gaps=0, applied_offset=7, tail_offset=None,
                                   tail_checked_at=None, applied_published_at=None,
                                   tail_published_at=None, state_since=0.0)

    def stop(self) -> None:
        pass


def test_health_names_a_cell_out_of_reach_and_stays_up() -> None:
    bus = InProcessBus(threaded=True)
    planes, reporters, sched = _cloud(bus)
    sched.start()
    try:
        healthy, line = metrics.health(sched)
        assert healthy and "cell" not in line
        sched._cell_consumers["cell2"] = _Down()  # type: ignore[assignment]
        healthy, line = metrics.health(sched)
        assert healthy and "degraded: cell cell2 not connected to its broker" in line
        status = metrics.status(sched)
        assert status["cells"]["cell2"]["connected"] is False
        assert status["cells"]["cell1"]["connected"] is None  # in-process: no figures
        text = "".join(str(m) for m in metrics.SchedulerCollector(sched).collect())
        assert "cell2" in text
    finally:
        sched.stop()
        bus.close()


def _conf(**data_plane: object) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    transport_opts.register_opts(conf)
    conf([])
    for k, v in data_plane.items():
        conf.set_override(k, v, group="data_plane")
    return conf


def test_a_cells_computes_are_reached_only_on_their_cells_control_plane() -> None:
    """cell2's reporter listens and answers on cell2's broker alone (cells v2: a compute
    talks only to its cell's message queue): the scheduler's resync requests and claims for
    cell2's hosts go out there, and their answers come back there; cell1's stay on the
    deployment's control plane."""
    bus = InProcessBus(threaded=True)
    cell2_broker = InProcessBus(threaded=True)  # the control plane on cell2's broker
    planes = _cell_planes(bus)
    reporters = [make_reporter(planes["cell1"], bus, "r-cell1", 3, seed=0),
                 make_reporter(planes["cell2"], cell2_broker, "r-cell2", 3, seed=1)]
    sched = make_scheduler(bus, bus, "s0", cell_planes=planes,
                           cell_control_planes={"cell2": cell2_broker})
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), what="both cells' hosts held")
        cell2 = sorted(reporters[1].manager.machines)
        assert {sched.cache.cell_of(s) for s in cell2} == {"cell2"}
        # a resync of every host: each answered on its own cell's control plane
        answered = sched.cache.control_received["resync_answer"]
        assert sched.cache.resync_all(full=True) == 6
        wait_for(lambda: sched.cache.control_received["resync_answer"] == answered + 6, 10,
                 "every host's resync answer")
        # a claim on a cell2 host, judged by its reporter and answered
        for source in (cell2[0], sorted(reporters[0].manager.machines)[0]):
            _claim(sched, source)
        wait_for(lambda: sched.cache.control_received["claim_accepted"] == 2, 10,
                 "both claims' answers")
        quiesce(reporters)
        wait_for(lambda: converged(reporters, [sched]), what="converged")
    finally:
        for r in reporters:
            r.stop()
        sched.stop()
        bus.close()
        cell2_broker.close()


def test_a_cell_streams_retention_gap_resyncs_that_cells_hosts_only() -> None:
    bus = InProcessBus(threaded=True)
    planes = {c: _Recorded(bus, p.stream) for c, p in _cell_planes(bus).items()}
    reporters = [make_reporter(planes[c], bus, f"r-{c}", 3, seed=i) for i, c in enumerate(CELLS)]
    sched = make_scheduler(bus, bus, "s0", cell_planes=planes)
    sched.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [sched]), what="both cells' hosts held")
        asked: list[str] = []
        sched.receiver.set_observer(_Asked(asked))
        planes["cell2"].on_retention_gap(5, 9)  # what cell2's consumer reports
        assert sorted(asked) == sorted(reporters[1].manager.machines)
        assert sched.retention_gaps == 1
        wait_for(lambda: converged(reporters, [sched]), what="converged after the resyncs")
    finally:
        for r in reporters:
            r.stop()
        sched.stop()
        bus.close()


class _Asked:
    """A receiver observer noting the sources asked to resync."""

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def resync_asked(self, source: str, now: float, full: bool, sends: list) -> None:
        self.asked.append(source)

    def __getattr__(self, name: str):
        return lambda *args, **kw: None


def test_the_configuration_names_each_cells_stream_and_broker() -> None:
    conf = _conf(backend="rabbit", stream_url="amqp://top//", stream_name="hs",
                 cells=["cell1", "cell2"])
    assert cells.cell_urls(conf) == {"cell1": "amqp://top//", "cell2": "amqp://top//"}
    conf.set_override("stream_url", "amqp://c2//", group="data_plane:cell2")
    planes = factory.build_cell_planes(conf)
    assert {c: (p.settings.url, p.settings.name) for c, p in planes.items()} == {  # type: ignore[attr-defined]
        "cell1": ("amqp://top//", "hs.cell1"), "cell2": ("amqp://c2//", "hs.cell2")}
    # a cell's computes are reached on its own broker only where one is named
    assert cells.cell_control_urls(conf) == {}
    conf.set_override("transport_url", "rabbit://c2:5672/", group="data_plane:cell2")
    assert cells.cell_control_urls(conf) == {"cell2": "rabbit://c2:5672/"}
    # a reporter in a cell publishes on the cell's stream
    publisher = _conf(backend="rabbit", stream_url="amqp://c2//", stream_name="hs", cell="cell2")
    data = factory.build_data_plane(publisher, cell=cells.publish_cell(publisher))
    assert (data.settings.url, data.settings.name) == ("amqp://c2//", "hs.cell2")  # type: ignore[attr-defined]


def test_no_cells_is_one_stream_and_in_process_cells_share_the_bus() -> None:
    assert factory.build_cell_planes(_conf()) == {}
    assert factory.build_cell_control_planes(_conf(cells=["a"])) == {}
    bus = InProcessBus(threaded=False)
    planes = factory.build_cell_planes(_conf(cells=["a"]), bus)
    assert isinstance(planes["a"], InProcessStreamPlane) and planes["a"].bus is bus
    assert planes["a"].stream == "shm-hoststate.a"
    bus.close()


@pytest.mark.parametrize("option, value, says", [
    ("cells", ["cell 1"], "not a cell name"),
    ("cells", ["default"], "not a cell name"),
    ("cells", ["a", "a"], "listed twice"),
    ("cell", "x/y", "not a cell name"),
])
def test_a_bad_cell_name_is_one_line(option: str, value: object, says: str) -> None:
    conf = _conf(**{option: value})
    with pytest.raises(OperatorError) as exc:
        factory.check_urls(conf)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_service_from_configuration_reads_the_listed_cells(tmp_path) -> None:
    from shared_host_manager import service as service_mod

    conf = cfg.ConfigOpts()
    service_mod.register_service_opts(conf)
    conf([])
    conf.set_override("cells", ["cell1"], group="data_plane")
    bus = InProcessBus(threaded=True)
    try:
        svc: SchedulerService = service_mod.service_from_conf(conf)
        assert list(svc.cell_planes) == ["cell1"]
    finally:
        factory.close_default_bus()
        bus.close()


class _Stuck:
    """A stream whose broker went away: a publish blocks (as a kombu publisher retrying for
    publish_timeout does) until ``release`` is set, then goes through; meanwhile the
    publisher says it is not connected (a kombu publisher does from its first failed
    attempt)."""

    def __init__(self, plane: InProcessStreamPlane) -> None:
        self.plane = plane
        self.stuck = threading.Event()
        self.release = threading.Event()
        self.blocked = threading.Event()

    def stream_publisher(self):
        inner = self.plane.stream_publisher()
        outer = self

        class Publisher:
            def publish(self, body: bytes) -> None:
                if outer.stuck.is_set() and not outer.release.is_set():
                    outer.blocked.set()
                    outer.release.wait(30)
                inner.publish(body)
                outer.blocked.clear()

            def stats(self) -> StreamPublisherStats:
                return StreamPublisherStats(connected=not outer.blocked.is_set(), published=0,
                                            published_bytes=0, retries=0, failures=0,
                                            connects=1, state_since=None)

            def close(self) -> None:
                inner.close()

        return Publisher()

    def stream_consumer(self, on_retention_gap=None):
        return self.plane.stream_consumer(on_retention_gap)

    def close(self) -> None:
        pass


def test_a_reporter_answers_claims_while_its_stream_does_not_take_its_deltas() -> None:
    bus = InProcessBus(threaded=True)
    planes = _cell_planes(bus)
    stuck = _Stuck(planes["cell2"])
    reporter = make_reporter(stuck, bus, "r-cell2", 3, seed=1, change_interval=3600.0)
    sched = make_scheduler(bus, bus, "s0", cell_planes=planes)
    sched.start()
    reporter.start()
    try:
        wait_for(lambda: converged([reporter], [sched]), what="the cell's hosts held")
        stuck.stuck.set()
        wait_for(stuck.blocked.is_set, 5, "the reporter's loop held by a publish")
        _claim(sched, sorted(reporter.manager.machines)[0])
        # the answer comes while the delta listing the claim is stuck on its way
        wait_for(lambda: sched.cache.control_received["claim_accepted"] == 1, 10,
                 "the claim's answer")
        assert stuck.blocked.is_set() and not stuck.release.is_set()
        stuck.release.set()
        wait_for(lambda: converged([reporter], [sched]), what="the delta after it")
    finally:
        stuck.release.set()
        reporter.stop()
        sched.stop()
        bus.close()


def test_catch_up_is_not_held_by_a_cell_whose_publish_hangs() -> None:
    bus = InProcessBus(threaded=True)
    planes: dict[str, object] = dict(_cell_planes(bus))
    stuck = _Stuck(planes["cell2"])  # type: ignore[arg-type]
    stuck.stuck.set()
    planes["cell2"] = stuck
    sched = make_scheduler(bus, bus, "s0", cell_planes=planes, membership_interval=0.2)
    sched.start()
    try:
        started = time.monotonic()
        assert sched.catch_up(timeout=0.5) is False  # cell2's marker never comes back
        assert time.monotonic() - started < 5
        # the timer thread is not held either: this scheduler's entry keeps being published
        held = sched.receiver.sources[sched.cache.marker_source].version
        wait_for(lambda: sched.receiver.sources[sched.cache.marker_source].version > held, 5,
                 "the next membership entry")
    finally:
        stuck.release.set()
        sched.stop()
        bus.close()


@pytest.mark.parametrize("membership", [0.5, None], ids=["membership", "no-membership"])
def test_a_newcomer_resumes_each_cell_stream_after_the_checkpoints_offsets(membership) -> None:
    """With membership the schedulers' entries give the deployment's stream an offset;
    without, it holds nothing and the cells' offsets are the checkpoint's whole cut."""
    bus = InProcessBus(threaded=True)
    planes, reporters, first = _cloud(bus, checkpoint_interval=30.0,
                                      membership_interval=membership)
    first.start()
    for r in reporters:
        r.start()
    try:
        wait_for(lambda: converged(reporters, [first]), what="both cells' hosts held")
        if membership is not None:
            wait_for(lambda: first.cache.offset is not None, what="an offset on the main stream")
        else:
            assert first.cache.offset is None
        assert first.checkpoints is not None and first.checkpoints.publish()
        with first.cache.lock:
            taken = dict(first.cache.cell_offsets)
        recorded = {c: _Recorded(bus, p.stream) for c, p in planes.items()}
        newcomer = make_scheduler(bus, bus, "s1", cell_planes=recorded, checkpoint_interval=30.0,
                                  membership_interval=membership)
        newcomer.start()
        try:
            assert newcomer.checkpoints is not None and newcomer.checkpoints.restored is not None
            assert {c: p.starts for c, p in recorded.items()} == {
                c: [taken[c] + 1] for c in CELLS}
            quiesce(reporters)
            wait_for(lambda: converged(reporters, [first, newcomer]), what="convergence")
            assert newcomer.receiver.stats["resyncs_requested"] == 0
        finally:
            newcomer.stop()
    finally:
        for r in reporters:
            r.stop()
        first.stop()
        bus.close()
