"""The oslo.messaging control plane over fake:// and the real broker."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from oslo_config import cfg

from transport import base, no_eventlet  # noqa: F401  (before oslo_messaging)

# isort: split

import oslo_messaging

from transport.oslo_rpc import NAMESPACE, VERSION, OsloRpcControlPlane

# Not valid UTF-8 on purpose: oslo.messaging cannot carry these raw.
BODIES = [b"\x8f\xff\x00claim-%d" % i for i in range(50)]


def private_conf() -> cfg.ConfigOpts:
    # A private ConfigOpts, where the tracing/metrics groups are missing
    # unless the plane registers them (NoSuchOptError on the first cast).
    conf = cfg.ConfigOpts()
    conf([])
    return conf


class Inbox:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, raw: bytes) -> None:
        with self._lock:
            self.threads.add(threading.get_ident())
            self.bodies.append(raw)

    def __len__(self) -> int:
        with self._lock:
            return len(self.bodies)


def round_trip(url: str, topic: str, wait_until, timeout: float) -> None:
    plane = OsloRpcControlPlane(private_conf(), url)
    assert isinstance(plane, base.ControlPlane)
    node1, node2 = Inbox(), Inbox()
    srv1 = plane.control_server(topic, "node-1", node1)
    srv2 = plane.control_server(topic, "node-2", node2)
    try:
        srv1.start()
        srv2.start()
        client = plane.control_client()
        assert isinstance(client, base.ControlClient)
        for raw in BODIES:
            client.cast(topic, "node-1", raw)
        client.cast(topic, "node-2", b"only for node 2")
        assert wait_until(lambda: len(node1) >= len(BODIES) and len(node2) >= 1, timeout)
        assert node1.bodies == BODIES  # pool size 1 keeps arrival order
        assert node2.bodies == [b"only for node 2"]
        assert len(node1.threads) == 1
        client.close()
        with pytest.raises(base.CastError):
            client.cast(topic, "node-1", b"x")
    finally:
        srv1.stop()
        srv2.stop()
        plane.close()


def test_cast_round_trip_over_fake(wait_until):
    # fake:// polls every 50 ms: bounded waits, never fixed sleeps.
    round_trip("fake://", f"shm-fake-{uuid.uuid4().hex[:8]}", wait_until, timeout=10)


@pytest.mark.rabbit
def test_cast_round_trip_over_rabbit(oslo_rabbit_url, rpc_topic, wait_until):
    round_trip(oslo_rabbit_url, rpc_topic, wait_until, timeout=15)


def test_handler_errors_and_bad_bodies_do_not_kill_the_server(wait_until, caplog):
    topic = f"shm-fake-{uuid.uuid4().hex[:8]}"
    plane = OsloRpcControlPlane(private_conf(), "fake://")
    got: list[bytes] = []

    def handler(raw: bytes) -> None:
        got.append(raw)
        if raw == b"boom":
            raise RuntimeError("claim handler bug")

    srv = plane.control_server(topic, "node-1", handler)
    srv.start()
    try:
        # A foreign sender putting non-base64 text in the body argument.
        raw_client = oslo_messaging.get_rpc_client(
            plane.transport, oslo_messaging.Target(topic=topic, server="node-1",
                                                   namespace=NAMESPACE, version=VERSION))
        with caplog.at_level(logging.WARNING, logger="transport.oslo_rpc"):
            raw_client.cast({}, "deliver", body="not base64 !!")
            client = plane.control_client()
            client.cast(topic, "node-1", b"boom")
            client.cast(topic, "node-1", b"after")
            assert wait_until(lambda: got == [b"boom", b"after"], 10)
        assert srv.errors == 2 and srv.delivered == 2
        assert "not base64" in caplog.text and "claim handler bug" in caplog.text
    finally:
        srv.stop()
        plane.close()


def test_stop_is_clean_and_idempotent(wait_until):
    topic = f"shm-fake-{uuid.uuid4().hex[:8]}"
    plane = OsloRpcControlPlane(private_conf(), "fake://")
    srv = plane.control_server(topic, "node-1", lambda raw: None)
    srv.start()
    with pytest.raises(RuntimeError):
        srv.start()
    srv.stop()
    srv.stop()
    plane.close()
    plane.close()


@pytest.mark.rabbit
def test_cast_to_a_target_nobody_listens_on_is_dropped(oslo_rabbit_url, rpc_topic):
    plane = OsloRpcControlPlane(private_conf(), oslo_rabbit_url)
    try:
        plane.control_client().cast(rpc_topic, "sched-1", b"lost")  # no exception
    finally:
        plane.close()
