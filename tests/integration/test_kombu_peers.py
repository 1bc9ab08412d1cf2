"""The schedulers' peer topic with kombu alone (transport.kombu_peers) on the real broker."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from transport.base import CastError, ControlPlane
from transport.kombu_peers import KombuPeerPlane

pytestmark = pytest.mark.rabbit


def _wait(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_casts_reach_one_server_fanouts_every_server(rabbit_url: str) -> None:
    topic = f"shm-test-peers-{uuid.uuid4().hex[:8]}"
    plane = KombuPeerPlane(rabbit_url)
    assert isinstance(plane, ControlPlane)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    lock = threading.Lock()

    def handler(name: str):
        def handle(body: bytes) -> None:
            with lock:
                got[name].append(body)
        return handle

    servers = [plane.control_server(topic, n, handler(n)) for n in ("a", "b")]
    for s in servers:
        s.start()
    client = plane.control_client()
    try:
        body = b"\x8f\xff\x00not utf-8"  # travels as it is
        client.cast(topic, "b", body)
        client.fanout(topic, b"both")
        client.cast(topic, "nobody", b"dropped")  # no server: the broker drops it
        assert _wait(lambda: len(got["b"]) == 2 and len(got["a"]) == 1)
        assert got["b"] == [body, b"both"] and got["a"] == [b"both"]
        servers[0].stop()
        client.fanout(topic, b"after a left")
        assert _wait(lambda: len(got["b"]) == 3)
        assert got["a"] == [b"both"]
        assert servers[1].delivered == 3
    finally:
        plane.close()
    with pytest.raises(CastError):
        client.cast(topic, "b", b"closed")


def test_a_handler_that_fails_drops_that_cast_only(rabbit_url: str) -> None:
    topic = f"shm-test-peers-{uuid.uuid4().hex[:8]}"
    plane = KombuPeerPlane(rabbit_url)
    got: list[bytes] = []

    def handle(body: bytes) -> None:
        if body == b"bad":
            raise ValueError("bad")
        got.append(body)

    server = plane.control_server(topic, "a", handle)
    server.start()
    client = plane.control_client()
    try:
        for body in (b"bad", b"good"):
            client.cast(topic, "a", body)
        assert _wait(lambda: got == [b"good"])
        assert server.errors == 1
    finally:
        plane.close()
