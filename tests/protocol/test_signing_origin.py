"""No unsigned path (design §7.4, protocol §7.5): a batch's origin is covered by its items'
signatures, and a claim result is only ever applied by the scheduler it names."""

from __future__ import annotations

import msgpack
import pytest

from protocol import errors
from protocol.codec import Decoder, Encoder
from protocol.document import SET
from protocol.messages import Batch, Claim, ClaimResult, Delta, Heartbeat, Snapshot
from protocol.receiver import ReceiverMachine
from protocol.signing import Keyring

KEYS = Keyring(master=b"origin test master")
ITEMS = [Delta("cn-1", 3, 1, [[SET, "compute", "vcpus_used", 1]]), Heartbeat("cn-2", 4, 0, b"\x01" * 16)]


def test_a_signed_batch_keeps_its_origin():
    msg = Decoder(KEYS).decode(Encoder(KEYS).encode(Batch(list(ITEMS), "rep-0")))
    assert type(msg) is Batch and msg.origin == "rep-0" and msg.items == ITEMS


def test_an_origin_rewritten_in_transit_is_rejected():
    outer = msgpack.unpackb(Encoder(KEYS).encode(Batch(list(ITEMS), "rep-0")))
    for forged in ("rep-evil", ""):
        tampered = dict(outer, o=forged) if forged else {k: v for k, v in outer.items() if k != "o"}
        with pytest.raises(errors.SignatureError, match="origin"):
            Decoder(KEYS).decode(msgpack.packb(tampered))


def test_an_item_moved_into_another_reporters_batch_is_rejected():
    theirs = msgpack.unpackb(Encoder(KEYS).encode(Batch([ITEMS[0]], "rep-1")))
    ours = msgpack.unpackb(Encoder(KEYS).encode(Batch([ITEMS[1]], "rep-0")))
    ours["m"].append(theirs["m"][0])
    with pytest.raises(errors.SignatureError):
        Decoder(KEYS).decode(msgpack.packb(ours))


def test_without_keys_nothing_changes_on_the_wire():
    body = Encoder().encode(Batch(list(ITEMS), "rep-0"))
    assert all("og" not in item for item in msgpack.unpackb(body)["m"])
    assert Decoder().decode(body) == Batch(list(ITEMS), "rep-0")


def test_a_claim_result_for_another_scheduler_is_dropped_and_counted():
    r = ReceiverMachine("sch-a")
    r.receive(Snapshot("cn-1", 3, 0, {"compute": {"vcpus": 8, "vcpus_used": 0}}), 0.0)
    r.add_claim(Claim("sch-a:1", "sch-a", "cn-1", 3, 0, {"vcpus": 1}), 0.0)
    correction = [Snapshot("cn-1", 3, 5, {"compute": {"vcpus": 0}})]
    r.receive(ClaimResult("sch-a:1", "sch-b", "cn-1", False, 3, 5, "no", correction), 1.0)
    assert r.stats["claim_results_foreign"] == 1
    view = r.sources["cn-1"]
    assert view.version == (3, 0) and "sch-a:1" in view.pending
    r.receive(ClaimResult("sch-a:1", "sch-a", "cn-1", False, 3, 5, "no", correction), 1.0)
    assert view.version == (3, 5) and not view.pending
