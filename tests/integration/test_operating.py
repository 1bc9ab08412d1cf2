"""What an operator does, for real: `shm reporter` and `shm scheduler` started as processes with
config files over the local RabbitMQ, their /metrics, /healthz and /status scraped, `shm status
--verify` run against them, SIGTERM; and a wrong password ending a process with one line.

Each test has its own stream, topics, state directories and ports, and removes its queues.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.rabbit

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


#: the labels of the deployment's stream among a scheduler's stream series
DEFAULT = (("cell", "default"),)


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, text = _get(url + "/metrics")
    assert code == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def deployment(rabbit_url, oslo_rabbit_url, tmp_path, delete_broker_queues):
    suffix = uuid.uuid4().hex[:8]
    stream, rtopic, stopic = f"shm-op-{suffix}", f"shm-op-rep-{suffix}", f"shm-op-sch-{suffix}"
    common = (f"[data_plane]\nbackend = rabbit\nstream_url = {rabbit_url}\nstream_name = {stream}\n"
              f"tail_probe_interval = 1\n"
              f"[control_plane]\nbackend = oslo\ntransport_url = {oslo_rabbit_url}\n"
              f"reporter_topic = {rtopic}\nscheduler_topic = {stopic}\n")
    parties = {"r0": ("reporter", f"[reporter]\nname = r0-{suffix}\nstate_dir = {tmp_path}/r0\n"
                                  f"simulated_hosts = {HOSTS}\nsimulated_change_interval = 0.3\n"
                                  "heartbeat_interval = 1\n")}
    for s in ("s0", "s1"):
        parties[s] = ("scheduler", f"[cache]\nname = {s}-{suffix}\nstate_dir = {tmp_path}/{s}\n")
    procs, urls = {}, {}
    for name, (command, text) in parties.items():
        port = _free_port()
        conf = tmp_path / f"{name}.conf"
        conf.write_text(common + text + f"[metrics]\nbind_port = {port}\n")
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed at teardown
        procs[name] = (subprocess.Popen([sys.executable, "-m", "shm_cli.main", command,
                                         "--config-file", str(conf)], cwd=TOP, stdout=log,
                                        stderr=subprocess.STDOUT), log)
        urls[name] = f"http://127.0.0.1:{port}"
    yield procs, urls, tmp_path
    for proc, log in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    delete_broker_queues([stream, f"{stream}.checkpoint", rtopic, stopic, f"{rtopic}.r0-{suffix}",
                          f"{stopic}.s0-{suffix}", f"{stopic}.s1-{suffix}"])


@pytest.mark.slow
def test_an_operator_sees_health_lag_and_convergence_then_stops_everything(deployment):
    procs, urls, tmp_path = deployment

    def healthy() -> bool:
        return all(_get(u + "/healthz")[0] == 200 for u in urls.values())

    _wait(healthy, 60, "every process healthy")
    _wait(lambda: all(_samples(urls[s]).get(("shm_sources", (("state", "active"),))) == HOSTS
                      and _samples(urls[s]).get(("shm_stream_lag_offsets", DEFAULT)) == 0
                      for s in ("s0", "s1")), 30, "both schedulers holding every host, caught up")
    r = _samples(urls["r0"])
    assert r[("shm_broker_connected", (("plane", "stream"),))] == 1
    assert r[("shm_reporter_sources", ())] == HOSTS
    assert r[("shm_reporter_deltas_published_total", ())] > 0
    assert r[("shm_stream_published_bytes_total", ())] > 0
    for s in ("s0", "s1"):
        m = _samples(urls[s])
        assert m[("shm_broker_connected", (*DEFAULT, ("plane", "stream")))] == 1
        assert m[("shm_staleness_seconds_count", DEFAULT)] > 0
        assert m[("shm_stream_tail_offset", DEFAULT)] >= m[("shm_stream_applied_offset", DEFAULT)] - 1
        assert m[("shm_stream_lag_seconds", DEFAULT)] < 30
        assert m[("shm_healthy", ())] == 1
        status = json.loads(_get(urls[s] + "/status")[1])
        assert status["broker"]["connected"] and status["stream"]["staleness"]["count"] > 0
    result = subprocess.run([sys.executable, "-m", "shm_cli.main", "status", *urls.values(),
                             "--verify", "--timeout", "20", "--interval", "0.5"], cwd=TOP,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"all {HOSTS} agree" in result.stdout and "UNHEALTHY" not in result.stdout

    started = time.monotonic()
    for proc, _ in procs.values():
        proc.send_signal(signal.SIGTERM)
    for name, (proc, _) in procs.items():
        assert proc.wait(timeout=15) == 0, name
    assert time.monotonic() - started < 10
    for name in procs:
        log = (tmp_path / f"{name}.log").read_text()
        assert "Traceback" not in log, log[-2000:]
        assert "during closing channel" not in log, name


def test_a_wrong_password_is_one_line(rabbit_url, tmp_path):
    conf = tmp_path / "bad.conf"
    bad = rabbit_url.replace("guest:guest@", "guest:not-the-password@")
    conf.write_text(f"[data_plane]\nbackend = rabbit\nstream_url = {bad}\n[control_plane]\n"
                    f"backend = inprocess\n[metrics]\nbind_port = 0\n")
    result = subprocess.run([sys.executable, "-m", "shm_cli.main", "scheduler", "--config-file",
                             str(conf)], cwd=TOP, capture_output=True, text=True, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line and not line[:2].isdigit()]
    assert result.returncode == 78, result.stderr
    assert lines == ["shm scheduler: error: [data_plane] stream_url: the broker at 127.0.0.1:5672 "
                     "refused the login of user 'guest'; check the user and password in the URL"]
