"""What the control-plane APIs put on the wire: a claim announced to the peers."""

from __future__ import annotations

from protocol.codec import Decoder, Encoder
from protocol.messages import ANNOUNCED_ALLOCATIONS, Claim
from transport.rpcapi import SchedulerAPI


class _Recorder:
    """A ControlClient that keeps what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, bytes]] = []

    def cast(self, topic: str, server: str, body: bytes) -> None:
        self.sent.append((topic, server, body))

    def fanout(self, topic: str, body: bytes) -> None:
        self.sent.append((topic, None, body))

    def close(self) -> None:
        pass


def test_an_announced_claim_carries_its_placement_allocations_and_no_build_request() -> None:
    """The build request goes to the arbiter alone; the allocation request placement is
    asked for goes to the peers too (their placement views deduct it, design §11)."""
    client = _Recorder()
    api = SchedulerAPI(client, Encoder(), topic="peers")
    allocations = {"rp-1": {"VCPU": 2, "MEMORY_MB": 512}}
    build = {"flavor": "m1.small", ANNOUNCED_ALLOCATIONS: allocations}
    api.announce(Claim("c1", "s1", "host-1", 1, 2, {"vcpus": 2}, "i1", build))
    api.announce(Claim("c2", "s1", "host-1", 1, 2, {"vcpus": 2}, "i2", {"flavor": "x"}), to="s2")
    got = [(topic, to, Decoder().decode(body)) for topic, to, body in client.sent]
    assert [(topic, to) for topic, to, _ in got] == [("peers", None), ("peers", "s2")]
    first, second = (msg for _, _, msg in got)
    assert isinstance(first, Claim) and first.request == {ANNOUNCED_ALLOCATIONS: allocations}
    assert isinstance(second, Claim) and second.request == {}
