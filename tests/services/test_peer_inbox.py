"""A peer's announced claim at the cache edge (design §5.2): it never waits for the lock.

The peer topic's server thread must not queue behind a decision or a stream batch holding
the cache lock: a claim that finds the lock taken joins an inbox, and whoever takes the lock
next applies it first, recording it then, as a control message received at that moment.
"""

from __future__ import annotations

import threading

from protocol.codec import encode
from protocol.messages import Claim, Snapshot
from protocol.receiver import ReceiverMachine
from shared_host_manager.cache import CacheObserver, HostStateCache


class _Log(CacheObserver):
    def __init__(self) -> None:
        self.control_at: list[float] = []

    def control(self, body, now, sends=None):  # type: ignore[override]
        self.control_at.append(now)


def test_a_peer_claim_finding_the_lock_taken_waits_in_the_inbox_not_for_the_lock():
    clock = [1.0]
    log = _Log()
    cache = HostStateCache(ReceiverMachine("s0"), lambda endpoint, msg: None,
                           clock=lambda: clock[0], recorder=log)
    cache.receiver.receive(Snapshot("cn-1", 5, 0, {"compute": {"vcpus": 8, "vcpus_used": 0}}), 0.0)
    body = encode(Claim("s1:a:1@5.0", "s1", "cn-1", 5, 0, {"vcpus": 2}, "inst-1"))
    taken, release = threading.Event(), threading.Event()

    def decision() -> None:  # another thread holding the lock, as a decision does
        with cache.lock:
            taken.set()
            release.wait()

    holder = threading.Thread(target=decision)
    holder.start()
    taken.wait()
    server = threading.Thread(target=cache.ingest_peer_claim, args=(body,))
    server.start()
    server.join(timeout=30)  # a guard against a hang, not a figure: it returns at once
    blocked = server.is_alive()
    if blocked:
        release.set()
    assert not blocked, "the peer topic's server waited for the cache lock"
    assert not cache.receiver.sources["cn-1"].peer and log.control_at == []
    clock[0] = 2.0
    release.set()
    holder.join()
    cache.tick()  # the next holder of the lock applies the inbox first
    assert cache.receiver.sources["cn-1"].peer_usage == {"vcpus": 2}
    assert log.control_at == [2.0] and cache.control_received["peer_claim"] == 1


def test_a_peer_claim_with_the_lock_free_is_applied_at_once_and_garbage_is_counted():
    cache = HostStateCache(ReceiverMachine("s0"), lambda endpoint, msg: None, clock=lambda: 1.0)
    cache.receiver.receive(Snapshot("cn-1", 5, 0, {"compute": {"vcpus": 8, "vcpus_used": 0}}), 0.0)
    cache.ingest_peer_claim(encode(Claim("s1:a:1@5.0", "s1", "cn-1", 5, 0, {"vcpus": 2}, "i")))
    assert cache.receiver.sources["cn-1"].peer_usage == {"vcpus": 2}
    cache.ingest_peer_claim(b"\x01garbage")
    cache.ingest_peer_claim(encode(Snapshot("cn-2", 1, 0, {})))  # not a claim: not on this topic
    assert sum(cache.invalid.values()) == 2 and "cn-2" not in cache.receiver.sources
