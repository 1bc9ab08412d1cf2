"""`shm status --verify` against real processes under churn: `shm reporter` with simulated hosts
changing many times a second and two `shm scheduler`s over the local RabbitMQ.  A converged
cloud verifies (exit 0) whatever the churn; a scheduler killed with SIGKILL and started again
verifies once it has caught up.

Run as a script, the module measures the same at a larger scale and prints the figures::

    .venv/bin/python tests/integration/test_verify_churn.py --hosts 750 --change-interval 1 \\
        --checks 20

(20 `shm status --verify` runs on the converged cloud, then a SIGKILL and restart of one
scheduler: when it held every source at or after what its peer held a poll earlier, and when
`shm status --verify`, run again and again from the restart, first said so.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.rabbit, pytest.mark.slow]

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KOMBU_URL = "amqp://guest:guest@127.0.0.1:5672//"
OSLO_URL = "rabbit://guest:guest@127.0.0.1:5672/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str, sources: bool = False) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/status{'?sources=1' if sources else ''}",
                                    timeout=10) as r:
            data: dict[str, Any] = json.loads(r.read())
            return data
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Cloud:
    """One `shm reporter` and two `shm scheduler` processes on a stream of their own."""

    def __init__(self, workdir: Path, hosts: int, change_interval: float) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.workdir, self.hosts, self.suffix = workdir, hosts, suffix
        self.stream, rtopic, stopic = f"shm-vc-{suffix}", f"shm-vc-rep-{suffix}", f"shm-vc-sch-{suffix}"
        common = (f"[data_plane]\nbackend = rabbit\nstream_url = {KOMBU_URL}\n"
                  f"stream_name = {self.stream}\ntail_probe_interval = 1\n"
                  f"[control_plane]\nbackend = oslo\ntransport_url = {OSLO_URL}\n"
                  f"reporter_topic = {rtopic}\nscheduler_topic = {stopic}\n")
        self.parties = {"r0": ("reporter", f"[reporter]\nname = r0-{suffix}\nstate_dir = {workdir}/r0\n"
                                           f"simulated_hosts = {hosts}\nsimulated_change_interval = "
                                           f"{change_interval}\n")}
        for s in ("s0", "s1"):
            self.parties[s] = ("scheduler", f"[cache]\nname = {s}-{suffix}\nstate_dir = {workdir}/{s}\n")
        self.queues = [self.stream, f"{self.stream}.checkpoint", rtopic, stopic,
                       f"{rtopic}.r0-{suffix}", f"{stopic}.s0-{suffix}", f"{stopic}.s1-{suffix}"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        for name, (_command, text) in self.parties.items():
            port = _free_port()
            (workdir / f"{name}.conf").write_text(common + text + f"[metrics]\nbind_port = {port}\n")
            self.urls[name] = f"http://127.0.0.1:{port}"
            self.start(name)

    def start(self, name: str) -> None:
        command = self.parties[name][0]
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "shm_cli.main", command, "--config-file",
                 str(self.workdir / f"{name}.conf")], cwd=TOP, stdout=log, stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()  # SIGKILL: no goodbye, no last snapshot
        proc.wait()

    def holding_all(self, *names: str) -> bool:
        for name in names:
            st = _status(self.urls[name])
            if st is None or (st.get("sources") or {}).get("active") != self.hosts:
                return False
        return True

    def verify(self, *args: str) -> tuple[int, str, float]:
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "shm_cli.main", "status",
                                 *self.urls.values(), "--verify", *args], cwd=TOP,
                                capture_output=True, text=True, timeout=600)
        return result.returncode, result.stdout + result.stderr, time.monotonic() - started

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def caught_up_with_peer(cloud: Cloud, name: str, peer: str, started: float,
                        stop: threading.Event) -> list[float]:
    """Poll until ``name`` holds every source at or after what ``peer`` held one poll earlier;
    the time (since ``started``) it first did, in a one-element list (empty if stopped)."""
    found: list[float] = []
    before: dict[str, list[Any]] | None = None
    while not stop.is_set():
        peer_st = _status(cloud.urls[peer], sources=True)
        mine = _status(cloud.urls[name], sources=True)
        if mine is not None and before is not None and peer_st is not None:
            views = mine.get("views", {})
            if all(s in views and (views[s][0], views[s][1]) >= (v[0], v[1])
                   for s, v in before.items()):
                found.append(time.monotonic() - started)
                return found
        if peer_st is not None:
            before = peer_st.get("views", {})
        time.sleep(0.25)
    return found


@pytest.fixture
def cloud(rabbit_url, tmp_path, delete_broker_queues) -> Iterator[Cloud]:
    # 60 hosts changing every 0.05 s: about 1 200 changes a second, and every host's digest
    # pending at most reads (a change within the coalescing window)
    c = Cloud(tmp_path, hosts=60, change_interval=0.05)
    try:
        yield c
    finally:
        c.close()
        delete_broker_queues(c.queues)


def test_verify_under_churn_and_after_a_scheduler_is_killed(cloud):
    _wait(lambda: cloud.holding_all("s0", "s1"), 90, "both schedulers holding every host")
    for _ in range(3):
        code, out, _ = cloud.verify("--timeout", "5", "--interval", "1")
        assert code == 0, out
        assert f"all {cloud.hosts} agree" in out, out
    cloud.kill("s1")
    cloud.start("s1")
    _wait(lambda: _status(cloud.urls["s1"]) is not None, 60, "s1 serving /status again")
    code, out, _ = cloud.verify("--timeout", "120", "--interval", "0.5")
    assert code == 0, out
    assert cloud.holding_all("s1")
    for name in cloud.procs:
        assert "Traceback" not in (cloud.workdir / f"{name}.log").read_text(), name


def _measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Measure `shm status --verify` under churn and after "
                                "a SIGKILL of a scheduler (RabbitMQ at 127.0.0.1:5672).")
    p.add_argument("--hosts", type=int, default=750)
    p.add_argument("--change-interval", type=float, default=1.0)
    p.add_argument("--checks", type=int, default=20)
    args = p.parse_args(argv)
    import tempfile

    sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
    from conftest import delete_queues

    workdir = Path(tempfile.mkdtemp(prefix="shm-verify-churn-"))
    cloud = Cloud(workdir, args.hosts, args.change_interval)
    try:
        _wait(lambda: cloud.holding_all("s0", "s1"), 300, "both schedulers holding every host")
        time.sleep(5)
        codes, took = [], []
        for i in range(args.checks):
            code, out, seconds = cloud.verify()
            codes.append(code)
            took.append(seconds)
            print(f"check {i + 1}: exit {code} in {seconds:.1f} s: {out.strip().splitlines()[-1]}",
                  flush=True)
        print(f"converged cloud: exit 0 in {codes.count(0)} of {len(codes)} checks; "
              f"{min(took):.1f}-{max(took):.1f} s each", flush=True)
        cloud.kill("s1")
        restarted = time.monotonic()
        cloud.start("s1")
        stop = threading.Event()
        truth: list[float] = []
        poller = threading.Thread(target=lambda: truth.extend(
            caught_up_with_peer(cloud, "s1", "s0", restarted, stop)), daemon=True)
        poller.start()
        said, runs = None, 0
        while time.monotonic() - restarted < 300:
            if _status(cloud.urls["s1"]) is None:
                time.sleep(0.2)
                continue
            code, out, _ = cloud.verify()
            runs += 1
            if code == 0:
                said = time.monotonic() - restarted
                break
        poller.join(timeout=60)
        stop.set()
        print(f"after SIGKILL and restart of s1: caught up with s0 after "
              f"{truth[0] if truth else float('nan'):.1f} s; --verify said converged after "
              f"{float('nan') if said is None else said:.1f} s ({runs} runs)", flush=True)
        return 0 if said is not None and codes.count(0) == len(codes) else 1
    finally:
        cloud.close()
        delete_queues(KOMBU_URL, cloud.queues)


if __name__ == "__main__":
    sys.exit(_measure(sys.argv[1:]))
