"""The API-side source in a nova-api or nova-conductor process: stable names across restarts,
what existed before the process started, a change on the stream before the API call returns,
a goodbye, and a fresh publisher in a forked child (shared_host_manager.nova.api_publisher)."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

from nova import objects  # noqa: E402
from oslo_config import cfg  # noqa: E402
from svc_harness import make_scheduler, wait_for  # noqa: E402

from compute_reporter import service as reporter_service  # noqa: E402
from protocol import hostdoc  # noqa: E402
from shared_host_manager.nova import api_publisher, api_source  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from transport import factory  # noqa: E402

pytestmark = pytest.mark.nova

fx.setup_nova()

TOPICS = ("shm-reporter-api-test", "shm-scheduler-api-test")
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conf() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    reporter_service.register_service_opts(conf)
    conf([], project="shm-test", default_config_files=[], default_config_dirs=[])
    conf.set_override("name", "ctl1", group="reporter")
    conf.set_override("reporter_topic", TOPICS[0], group="control_plane")
    conf.set_override("scheduler_topic", TOPICS[1], group="control_plane")
    conf.set_override("heartbeat_interval", 0.5, group="reporter")
    return conf


def _service(host: str, *, forced_down: bool = False, disabled: bool = False,
             updated: float = 1000.0) -> objects.Service:
    return objects.Service(host=host, binary="nova-compute", disabled=disabled,
                           forced_down=forced_down, disabled_reason=None,
                           updated_at=datetime.datetime.fromtimestamp(updated, datetime.UTC))


@pytest.fixture
def world(tmp_path):
    """A scheduler on the process-wide in-process bus, and publishers made on it."""
    made: list[api_publisher.ApiPublisher] = []
    data, control = factory.from_conf(_conf())
    sched = make_scheduler(data, control, "sched-api-test", topics=TOPICS)
    sched.start()

    def publisher(load=lambda: ([], []), timeout: float = 5.0) -> api_publisher.ApiPublisher:
        pub = api_publisher.ApiPublisher("nova-api", _conf, publish_timeout=timeout,
                                         lock_dir=str(tmp_path), load=load)
        made.append(pub)
        return pub

    yield sched, publisher
    for pub in made:
        pub.stop()
    sched.stop()
    api_source.uninstall()


def _doc(sched, source: str):
    with sched.cache.lock:
        view = sched.receiver.sources.get(source)
        return None if view is None else view.doc


def test_processes_of_a_host_take_the_lowest_free_slot_and_a_restart_takes_its_own(world):
    sched, publisher = world
    first, second = publisher(), publisher()
    first.ensure_started()
    second.ensure_started()
    assert (first.name, second.name) == ("ctl1-api-0", "ctl1-api-1")
    first.stop()  # a restart of the first process: its slot is free again
    again = publisher()
    again.ensure_started()
    assert again.name == "ctl1-api-0"
    wait_for(lambda: (_doc(sched, "ctl1-api-0") or {}).get(hostdoc.API_SOURCE) is not None,
             what="the restarted source")
    with sched.cache.lock:
        assert set(sched.receiver.sources) == {"ctl1-api-0", "ctl1-api-1"}  # none left behind


def test_a_restarted_process_publishes_what_existed_before_it_started(world):
    sched, publisher = world
    pub = publisher(load=lambda: ([_service("host1", forced_down=True),
                                   _service("host2", disabled=True)], []))
    pub.ensure_started()
    wait_for(lambda: bool((_doc(sched, pub.name) or {}).get(hostdoc.API_SERVICES)),
             what="the preloaded services")
    services = _doc(sched, pub.name)[hostdoc.API_SERVICES]
    assert services["host1"]["forced_down"] is True and services["host1"]["changed"] == 1000.0
    assert services["host2"]["disabled"] is True
    assert _doc(sched, pub.name)[hostdoc.API_SOURCE]["role"] == "nova-api"


def test_a_change_is_on_the_stream_when_the_call_returns(world):
    sched, publisher = world
    pub = publisher()
    pub.ensure_started()
    machine = pub.reporter.manager.machines[pub.name]
    machine.coalesce_window = 60.0  # nothing by the timer
    published = pub.reporter.stats["published"]
    pub.source.service_changed(_service("host3", forced_down=True), saved={"forced_down"})
    # published by the call itself (the reporter's publish_now), not a minute later
    assert not machine.has_pending and pub.reporter.stats["published"] > published
    assert pub.source.unconfirmed == 0
    # and fenced: every scheduler holds its next decision until it has applied the change
    assert pub.reporter.stats["fences"] == 1
    wait_for(lambda: sched.cache.fence_stats["received"] == 1, timeout=5.0, what="the fence")
    wait_for(lambda: "host3" in ((_doc(sched, pub.name) or {}).get(hostdoc.API_SERVICES) or {}),
             timeout=5.0, what="the force-down on the stream")


def test_a_stopped_process_says_goodbye(world):
    sched, publisher = world
    pub = publisher()
    pub.ensure_started()
    name = pub.name
    wait_for(lambda: _doc(sched, name) is not None, what="the source")
    pub.stop()
    wait_for(lambda: hostdoc.said_goodbye(_doc(sched, name)), timeout=5.0, what="the goodbye")


def test_a_forked_child_starts_its_own_publisher(world, tmp_path):
    sched, publisher = world
    pub = publisher()
    pub.ensure_started()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's reporter threads did not come along
        code = 1
        try:
            os.close(read)
            started: list[int] = []
            inherited = pub.started_in != os.getpid()
            pub._start = started.append  # type: ignore[method-assign]  # no threads after a fork
            pub.ensure_started()
            code = 0 if inherited and started == [os.getpid()] else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == bytes([0])
    assert pub.started_in == os.getpid()  # the parent's is untouched


def test_slots_are_held_per_process_and_freed_with_it(tmp_path):
    slot, fd = api_publisher.take_slot(str(tmp_path), "h-api")
    other, fd2 = api_publisher.take_slot(str(tmp_path), "h-api")
    assert (slot, other) == (0, 1)
    os.close(fd)  # the process holding slot 0 exits
    again, fd3 = api_publisher.take_slot(str(tmp_path), "h-api")
    assert again == 0
    os.close(fd2)
    os.close(fd3)


def _signal_set(status: str, field: str) -> set[int]:
    """The signals a /proc ``status`` text lists in ``field`` (``SigBlk``, ``SigIgn``)."""
    mask = int(next(line for line in status.splitlines()
                    if line.startswith(f"{field}:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def _run_python(code: str) -> str:
    """``code`` run by a Python process of its own, which must exit 0; its output."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=TOP)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    return out.stdout


def _blocked_signals(native_id: int) -> set[int]:
    """The signals a thread of this process blocks."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        return _signal_set(f.read(), "SigBlk")


def test_the_publishers_threads_never_receive_a_stop_signal(world):
    """uWSGI exits a worker from the thread its SIGINT or SIGTERM lands in: the threads the
    publisher starts (its reporter's, and those its preload's reads start) block them, so
    they land in the main thread; the caller's mask is as it was."""
    sched, publisher = world
    stop = threading.Event()
    loader_threads: list[threading.Thread] = []

    def load() -> tuple[list, list]:  # as nova's scatter-gather starts its executor's threads
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        loader_threads.append(t)
        return [], []

    before = set(threading.enumerate())
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    pub = publisher(load=load)
    pub.ensure_started()
    try:
        started = [t for t in threading.enumerate() if t not in before and t.native_id]
        assert loader_threads[0] in started and len(started) > 1
        for t in started:
            assert api_publisher.STOP_SIGNALS <= _blocked_signals(t.native_id), t.name
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
        assert not api_publisher.STOP_SIGNALS & _blocked_signals(threading.get_native_id())
    finally:
        stop.set()


def test_once_the_exit_has_begun_stop_signals_are_ignored_from_any_thread():
    """uWSGI's worker exits inside its signal handler; the next stop signal (the master's,
    after systemd's to the whole group) would end it mid-goodbye. Set from a thread other
    than the main one, as the exit can begin there, the process ignores the four."""
    code = (
        "import os, threading\n"
        "from shared_host_manager.nova import api_publisher\n"
        "t = threading.Thread(target=api_publisher.ignore_stop_signals)\n"
        "t.start(); t.join()\n"
        "for sig in sorted(api_publisher.STOP_SIGNALS):\n"
        "    os.kill(os.getpid(), sig)\n"
        "print(open('/proc/self/status').read())\n")
    status = _run_python(code)  # exit 0: alive after the four
    assert api_publisher.STOP_SIGNALS <= _signal_set(status, "SigIgn"), status


def test_each_stop_signals_handler_masks_the_four_once_installed():
    """uWSGI's worker handlers exit from inside themselves; installed with an empty mask, a
    second stop signal (the master's, after one to the whole group) starts the exit again
    inside the first and ends the worker before its goodbye.  Once the handlers change
    after the fork (uWSGI installs its worker's after the post-fork hooks), each stop
    signal's handler is installed again masking all four; the handler itself is kept.  An
    ignored signal stays ignored, with no mask.  SIGINT and SIGQUIT are set first: a process
    started in the background by a shell inherits both ignored."""
    code = (
        "import signal, time\n"
        "from shared_host_manager.nova import api_publisher as ap\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "signal.signal(signal.SIGQUIT, signal.SIG_IGN)\n"
        "watcher = ap.mask_stop_signals_once_installed(ap.stop_handler(), timeout=60)\n"
        "time.sleep(0.05)\n"
        "handler = lambda *args: None\n"
        "signal.signal(signal.SIGTERM, handler)\n"  # as uWSGI does after the post-fork hooks
        "started = time.monotonic()\n"
        "watcher.join(60)\n"
        "print('waited', time.monotonic() - started)\n"
        "for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):\n"
        "    print(int(sig), ap._sigaction(int(sig)).mask[0])\n"
        "assert signal.getsignal(signal.SIGTERM) is handler\n"
        "assert signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN\n")
    out = _run_python(code)
    lines = out.split("\n")
    assert float(lines[0].split()[1]) < 30, out  # the change, not the time-out
    four = sum(1 << (int(sig) - 1) for sig in api_publisher.STOP_SIGNALS)
    masks = dict(map(int, line.split()) for line in lines[1:4])
    assert masks == {int(signal.SIGTERM): four, int(signal.SIGINT): four,
                     int(signal.SIGQUIT): 0}, out


def test_threads_a_request_starts_never_receive_a_stop_signal_and_the_answer_is_sent_first(world):
    """nova's executors start their threads on demand, inside a request: in the WSGI
    wrapper they inherit the stop signals blocked, so the worker's main thread stays the
    only one a stop signal can land in (one landing in nova's thread while the main thread
    handles the first would exit the worker a second time, before its goodbye).  The
    request's own thread takes them again once the server has closed the answer."""
    sched, publisher = world
    pub = publisher()
    stop = threading.Event()
    started: list[threading.Thread] = []
    closed: list[bool] = []

    class Body(list):
        def close(self) -> None:
            closed.append(True)

    def nova_app(environ, start_response):  # as nova's scatter-gather grows its executor
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        started.append(t)
        start_response("200 OK", [])
        return Body([b"answer"])

    def failing_app(environ, start_response):
        raise RuntimeError("nova failed")

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    app = api_publisher.wsgi_application(nova_app, pub)
    try:
        body = app({}, lambda status, headers: None)
        assert api_publisher.STOP_SIGNALS <= _blocked_signals(started[0].native_id)
        # the answer is not sent yet: a stop signal waits for it
        assert api_publisher.STOP_SIGNALS <= _blocked_signals(threading.get_native_id())
        assert list(body) == [b"answer"]
        body.close()
        assert closed == [True]
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
        with pytest.raises(RuntimeError, match="nova failed"):
            api_publisher.wsgi_application(failing_app, pub)({}, lambda *args: None)
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    finally:
        stop.set()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
