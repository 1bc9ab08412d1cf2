"""Every message type survives encode -> bytes -> decode, unsigned and signed.

The decoder is the only door for untrusted bytes, so what the encoder writes
must pass it unchanged; unknown fields must be ignored (forward compatibility).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import messages, pack, speakers, unpack

from protocol import codec, errors
from protocol.codec import Decoder, Encoder
from protocol.document import DEL, DROP, SET, digest
from protocol.messages import (
    NO_EPOCH,
    PROTOCOL_VERSION,
    Batch,
    CheckpointAsk,
    Claim,
    ClaimResult,
    Delta,
    Fence,
    Heartbeat,
    ResyncAnswer,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
    Snapshot,
)
from protocol.signing import Keyring, derive_key

HOST_A = "3f0c6c8e-0d7c-4b8e-9d3a-aaaaaaaaaaaa"
HOST_B = "3f0c6c8e-0d7c-4b8e-9d3a-bbbbbbbbbbbb"
AGGREGATES = "aggregates"
SCHED = "scheduler-1"
MASTER = b"master secret of the test deployment"

DOC = {
    "compute": {
        "vcpus": 32, "vcpus_used": 4, "memory_mb": 131072, "memory_mb_used": 8192,
        "disk_gb": 2000, "disk_gb_used": 40, "cpu_allocation_ratio": 4.0,
        "ram_allocation_ratio": 1.5, "disk_allocation_ratio": 1, "hypervisor_type": "QEMU",
        "hypervisor_version": 8002000, "cpu_info": {"arch": "x86_64", "features": ["avx2", "sse4_2"]},
        "supported_instances": [["x86_64", "kvm", "hvm"]], "reserved_memory_mb": 512,
    },
    "service": {"disabled": False, "forced_down": False},
    "instances": {"0e1d": {"claim": "c-1", "resources": {"vcpus": 2}}},
    "metrics": {"cpu.percent": 12.5, "host": None},
}


def _examples() -> dict[str, object]:
    snap = Snapshot(HOST_A, 1_700_000_000_000_000_000, 7, DOC, ["c-1", "c-2"])
    delta = Delta(HOST_A, 1_700_000_000_000_000_000, 8,
                  [[SET, "compute", "vcpus_used", 6], [DEL, "metrics", "host"], [DROP, "pci"]],
                  ["c-3"])
    hb = Heartbeat(HOST_A, 1_700_000_000_000_000_000, 8, digest(DOC))
    other = Delta(HOST_B, 3, 1, [[SET, "instances", "9a", {"resources": {}}]])
    agg = Snapshot(AGGREGATES, 0, 0, {"aggregates": {"agg1": {"hosts": [HOST_A], "metadata": {}}}})
    return {
        "snapshot": snap,
        "delta": delta,
        "delta-no-claims": Delta(HOST_B, 0, 1, []),
        "heartbeat": hb,
        "batch": Batch([delta, hb, other, agg, Heartbeat(HOST_B, 3, 1, bytes(16))]),
        "empty-batch": Batch([]),
        "resync_request": ResyncRequest(HOST_A, SCHED, 1_700_000_000_000_000_000, 5),
        "resync_request-cold": ResyncRequest(HOST_B, SCHED, NO_EPOCH, 0, True),
        "resync_answer-deltas": ResyncAnswer(HOST_A, SCHED, [delta, Delta(HOST_A, delta.epoch, 9, [])]),
        "resync_answer-snapshot": ResyncAnswer(HOST_A, SCHED, [snap]),
        "claim": Claim("c-4", SCHED, HOST_A, 1_700_000_000_000_000_000, 8,
                       {"vcpus": 2, "memory_mb": 2048, "CUSTOM_GPU": 0}, "inst-4",
                       {"flavor": {"name": "m1.small"}, "retry": 1}),
        "claim-minimal": Claim("c-5", SCHED, HOST_A, NO_EPOCH, 0, {}),
        "claim_result-accepted": ClaimResult("c-4", SCHED, HOST_A, True, delta.epoch, 9),
        "claim_result-rejected": ClaimResult(
            "c-4", SCHED, HOST_A, False, delta.epoch, 9, "insufficient vcpus", [delta, snap]),
        "scarce_request": ScarceRequest("scheduler-2:r-1", "scheduler-2", SCHED, {
            "flavor": {"__type__": "Flavor", "vcpus": 16, "memory_mb": 65536},
            "instance_uuids": ["inst-6"]}),
        "scarce_answer": ScarceAnswer("scheduler-2:r-1", SCHED, "scheduler-2", {"inst-6": HOST_A},
                                      {"inst-7": "No valid host was found."}, 2, 1),
        "fence": Fence("nova-api-0", 1_700_000_000_000_000_000, 12),
        "checkpoint_ask": CheckpointAsk("scheduler-3", "5f0c2a9e4b7d4e1f"),
    }


EXAMPLES = _examples()


def _explicit_keys(msg: object) -> dict[str, bytes]:
    return {name: f"key of {name}".encode() for name in speakers(msg)}


def _explicit_keyring(msg: object) -> Keyring:
    return Keyring(_explicit_keys(msg))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_unsigned_roundtrip(name: str) -> None:
    msg = EXAMPLES[name]
    data = codec.encode(msg)
    assert type(data) is bytes
    assert unpack(data)["v"] == PROTOCOL_VERSION
    decoded = codec.decode(data)
    assert type(decoded) is type(msg)
    assert decoded == msg


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_signed_roundtrip_explicit_keys(name: str) -> None:
    msg = EXAMPLES[name]
    data = Encoder(Keyring(_explicit_keys(msg))).encode(msg)
    # a verifier holding the same keys (and nothing else)
    assert Decoder(Keyring(_explicit_keys(msg))).decode(data) == msg
    # one key short: the item of that speaker cannot be verified
    for name in speakers(msg):
        short = {k: v for k, v in _explicit_keys(msg).items() if k != name}
        with pytest.raises(errors.UnknownSourceError):
            Decoder(Keyring(short)).decode(data)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_signed_roundtrip_master_secret(name: str) -> None:
    msg = EXAMPLES[name]
    data = Encoder(Keyring(master=MASTER)).encode(msg)
    assert Decoder(Keyring(master=MASTER)).decode(data) == msg
    # a speaker holding only its derived key signs what a master holder verifies
    derived = Keyring({n: derive_key(MASTER, n) for n in speakers(msg)})
    assert Decoder(Keyring(master=MASTER)).decode(Encoder(derived).encode(msg)) == msg
    assert Decoder(derived).decode(data) == msg


@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if n != "empty-batch"))
def test_signed_message_really_is_signed(name: str) -> None:
    """Not a tautology: the signed form differs and cannot be read without keys."""
    msg = EXAMPLES[name]
    data = Encoder(Keyring(master=MASTER)).encode(msg)
    assert data != codec.encode(msg)
    with pytest.raises(errors.SignatureError):
        codec.decode(data)
    with pytest.raises((errors.SignatureError, errors.UnknownSourceError)):
        Decoder(Keyring(master=b"another deployment")).decode(data)


def test_batch_of_several_sources_signs_each_item_with_its_own_key() -> None:
    batch = EXAMPLES["batch"]
    ring = _explicit_keyring(batch)
    assert speakers(batch) == {HOST_A, HOST_B, AGGREGATES}
    raw = unpack(Encoder(ring).encode(batch))
    assert raw["t"] == "batch"
    assert [item["t"] for item in raw["m"]] == ["sig"] * len(batch.items)
    for item, sent in zip(raw["m"], batch.items, strict=True):
        inner = unpack(item["p"])
        assert inner["s"] == sent.source
        assert item["h"] == ring.sign(sent.source, item["p"])
    assert Decoder(ring).decode(pack(raw)) == batch


def test_correction_items_are_signed_too() -> None:
    result = EXAMPLES["claim_result-rejected"]
    raw = unpack(Encoder(Keyring(master=MASTER)).encode(result))
    inner = unpack(raw["p"])
    assert [i["t"] for i in inner["m"]] == ["sig", "sig"]


def test_unsigned_accepted_when_signatures_optional() -> None:
    msg = EXAMPLES["claim"]
    optional = Keyring(master=MASTER, required=False)
    assert Decoder(optional).decode(codec.encode(msg)) == msg
    assert Decoder(optional).decode(Encoder(Keyring(master=MASTER)).encode(msg)) == msg


# --------------------------------------------------------------------------
# forward compatibility: unknown fields are ignored


def _add_unknown_fields(m: object, salt: int = 0) -> object:
    """Add unknown keys to every map that is a message or an item (not to documents)."""
    if type(m) is dict and "t" in m:
        out = dict(m)
        out[f"zz_future_{salt}"] = {"nested": [1, 2.5, None, "x"], "b": b"\x00\xff"}
        out["Q"] = True  # upper-case keys are free too
        for key in ("m",):
            if type(out.get(key)) is list:
                out[key] = [_add_unknown_fields(i, salt + 1) for i in out[key]]
        return out
    return m


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_unknown_fields_are_ignored_unsigned(name: str) -> None:
    msg = EXAMPLES[name]
    raw = _add_unknown_fields(unpack(codec.encode(msg)))
    assert "zz_future_0" in raw
    assert codec.decode(pack(raw)) == msg


def _resign(m: object, ring: Keyring) -> object:
    """Add unknown fields inside and outside every signed payload and sign again."""
    if type(m) is not dict:
        return m
    if m.get("t") == "sig":
        inner = unpack(m["p"])
        inner = _add_unknown_fields(inner)
        if type(inner.get("m")) is list:
            inner["m"] = [_resign(i, ring) for i in inner["m"]]
        payload = pack(inner)
        spoken_by_r = ("claim", "resync_request", "scarce_request", "scarce_answer",
                       "checkpoint_ask")
        who = inner["r"] if inner["t"] in spoken_by_r else inner["s"]
        out = dict(m)  # keeps "v" at the top level
        out.update(p=payload, h=ring.sign(who, payload), future=[1])
        return out
    out = _add_unknown_fields(m)
    if type(out.get("m")) is list:
        out["m"] = [_resign(i, ring) for i in m["m"]]
    return out


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_unknown_fields_are_ignored_signed(name: str) -> None:
    msg = EXAMPLES[name]
    ring = Keyring(master=MASTER)
    raw = _resign(unpack(Encoder(ring).encode(msg)), ring)
    data = pack(raw)
    assert data != Encoder(ring).encode(msg)
    assert Decoder(ring).decode(data) == msg


# --------------------------------------------------------------------------
# generated messages

HSET = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)


@HSET
@given(messages)
def test_generated_roundtrip_unsigned(msg: object) -> None:
    assert codec.decode(codec.encode(msg)) == msg


@HSET
@given(messages, st.booleans())
def test_generated_roundtrip_signed(msg: object, master: bool) -> None:
    ring = Keyring(master=MASTER) if master else _explicit_keyring(msg)
    data = Encoder(ring).encode(msg)
    assert Decoder(ring).decode(data) == msg


@HSET
@given(messages)
def test_generated_unknown_fields_ignored(msg: object) -> None:
    assert codec.decode(pack(_add_unknown_fields(unpack(codec.encode(msg))))) == msg


@HSET
@given(messages)
def test_reencoding_is_stable(msg: object) -> None:
    """decode(encode(m)) encodes to the same bytes: no field is reshaped on the way."""
    data = codec.encode(msg)
    assert codec.encode(codec.decode(data)) == data
