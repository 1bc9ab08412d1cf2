"""Fixtures for tests against the real RabbitMQ at 127.0.0.1:5672.

Without a reachable broker these tests are skipped, unless
SHM_REQUIRE_RABBITMQ=1 is set (CI with a broker), where they fail instead.
Every test gets unique stream/topic names and deletes what it created.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection

HOST, PORT = "127.0.0.1", 5672
KOMBU_URL = f"amqp://guest:guest@{HOST}:{PORT}//"
OSLO_URL = f"rabbit://guest:guest@{HOST}:{PORT}/"


def _unavailable(reason: str) -> None:
    if os.environ.get("SHM_REQUIRE_RABBITMQ") == "1":
        pytest.fail(reason + " (SHM_REQUIRE_RABBITMQ=1)", pytrace=False)
    pytest.skip(reason)


def _probe() -> str | None:
    try:
        with socket.create_connection((HOST, PORT), timeout=2):
            pass
    except OSError as exc:
        return f"RabbitMQ not reachable at {HOST}:{PORT}: {exc}"
    try:
        with Connection(KOMBU_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=0)
    except Exception as exc:
        return f"RabbitMQ not reachable at {HOST}:{PORT}: AMQP login failed: {exc!r}"
    return None


@pytest.fixture(scope="session")
def rabbit_url() -> str:
    """kombu URL of a broker known to answer (skip/fail otherwise)."""
    problem = _probe()
    if problem:
        _unavailable(problem)
    return KOMBU_URL


@pytest.fixture(scope="session")
def oslo_rabbit_url(rabbit_url: str) -> str:
    """The same broker as an oslo.messaging transport URL."""
    return OSLO_URL


def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll *predicate* until true or *timeout* seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture(scope="session")
def wait_until() -> Callable[..., bool]:
    """``wait_until(predicate, timeout)``: bounded polling for tests."""
    return _wait_until


@pytest.fixture(scope="session")
def broker_back() -> Callable[[float], bool]:
    """``broker_back(timeout)``: wait until the broker accepts logins."""
    return wait_for_broker


def delete_queues(url: str, names: list[str]) -> None:
    with Connection(url, connect_timeout=3) as conn:
        for name in names:
            channel = conn.channel()
            try:
                channel.queue_delete(queue=name)
            except Exception:  # already gone: deleting a missing queue closes the channel
                pass
            finally:
                try:
                    channel.close()
                except Exception:
                    pass


def wait_for_broker(timeout: float = 60.0) -> bool:
    return _wait_until(lambda: _probe() is None, timeout, interval=0.25)


@pytest.fixture
def stream_name(rabbit_url: str) -> Iterator[str]:
    """A fresh stream name; the stream is deleted after the test."""
    name = f"shm-test-stream-{uuid.uuid4().hex[:10]}"
    yield name
    if wait_for_broker(30):
        # and the schedulers' checkpoint stream beside it, if one was declared
        delete_queues(rabbit_url, [name, f"{name}.checkpoint"])


@pytest.fixture
def rpc_topic(rabbit_url: str) -> Iterator[str]:
    """A fresh RPC topic; its rabbit queues are deleted after the test."""
    topic = f"shm-test-topic-{uuid.uuid4().hex[:10]}"
    yield topic
    if wait_for_broker(30):
        delete_queues(rabbit_url, [topic] + [f"{topic}.{s}" for s in ("node-1", "node-2", "sched-1")])


@pytest.fixture(scope="session")
def rabbitmqctl(rabbit_url: str) -> Callable[..., str]:
    """Run ``rabbitmqctl`` against the local node (for fault injection)."""
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        _unavailable("rabbitmqctl not found; cannot inject broker faults")

    def run(*args: str, timeout: float = 30.0) -> str:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    try:
        run("-q", "list_vhosts", timeout=20)
    except Exception as exc:
        _unavailable(f"rabbitmqctl cannot reach the local node: {exc}")
    return run


@pytest.fixture(scope="session")
def delete_broker_queues(rabbit_url: str) -> Callable[[list[str]], None]:
    """``delete_broker_queues(names)``: remove queues a test created (once the broker answers)."""

    def run(names: list[str]) -> None:
        if wait_for_broker(30):
            delete_queues(rabbit_url, names)

    return run


#: the RPC servers the services tests start (``<topic>.<server>``): their queues go after a test
SERVER_NAMES = ("r0", "r1", "r2", "r", "s0", "s1", "s2", "s", "late", "early")


@pytest.fixture
def planes(rabbit_url: str, oslo_rabbit_url: str, stream_name: str,
           delete_broker_queues: Callable[[list[str]], None]) -> Iterator[Any]:
    """The real data plane (a kombu stream) and control plane (oslo.messaging) of one test,
    with fresh reporter and scheduler topics; their queues are removed after the test."""
    from oslo_config import cfg

    from transport import no_eventlet  # noqa: F401  (before oslo_messaging)
    from transport.kombu_stream import KombuStreamDataPlane, StreamSettings
    from transport.oslo_rpc import OsloRpcControlPlane

    conf = cfg.ConfigOpts()
    conf([])
    data = KombuStreamDataPlane(StreamSettings(url=rabbit_url, name=stream_name))
    control = OsloRpcControlPlane(conf, oslo_rabbit_url)
    suffix = uuid.uuid4().hex[:8]
    topics = (f"shm-it-reporter-{suffix}", f"shm-it-scheduler-{suffix}")
    yield data, control, topics
    control.close()
    data.close()
    delete_broker_queues([*topics] + [f"{t}.{s}" for t in topics for s in SERVER_NAMES])
