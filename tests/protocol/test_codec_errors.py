"""Each kind of invalid input raises the right RemoteProtocolError subclass.

Invariant 6 (docs/design.md §6): an invalid message is dropped with a *typed* error
that names the problem, so the edge can log it with its sender and count it
by ``error.reason``.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgpack
import pytest
from protocol_strategies import pack, unpack

from protocol import codec, errors
from protocol.codec import Decoder, Encoder
from protocol.document import DEL, DROP, MAX_DEPTH, MAX_NAME_LEN, MAX_STR_LEN, SET
from protocol.messages import (
    Batch,
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    ResyncAnswer,
    ResyncRequest,
    Snapshot,
)
from protocol.resources import MAX_AMOUNT
from protocol.signing import Keyring, derive_key

A = "host-a"
B = "host-b"
SCHED = "sched-1"
MASTER = b"test master"
EPOCH = 1_700_000_000_000_000_000

DOC = {"compute": {"vcpus": 8, "vcpus_used": 2, "memory_mb": 4096, "cpu_allocation_ratio": 2.0},
       "metrics": {"load": 0.5}}
SNAP = Snapshot(A, EPOCH, 3, DOC, ["c-1"])
DELTA = Delta(A, EPOCH, 4, [[SET, "compute", "vcpus_used", 3]], ["c-2"])
HB = Heartbeat(A, EPOCH, 4, bytes(range(16)))
REQ = ResyncRequest(A, SCHED, EPOCH, 2)
ANSWER = ResyncAnswer(A, SCHED, [DELTA])
CLAIM = Claim("c-3", SCHED, A, EPOCH, 4, {"vcpus": 1, "memory_mb": 512}, "inst-3", {"x": 1})
RESULT = ClaimResult("c-3", SCHED, A, False, EPOCH, 4, "no room", [DELTA])
ALL = [SNAP, DELTA, HB, Batch([SNAP, DELTA, HB]), REQ, ANSWER, CLAIM, RESULT]


def raw(msg: Any) -> dict[str, Any]:
    return unpack(codec.encode(msg))


def with_fields(msg: Any, **changes: Any) -> bytes:
    """``msg`` encoded, with top-level fields replaced (a value of ``...`` removes the field)."""
    m = raw(msg)
    for k, v in changes.items():
        if v is ...:
            m.pop(k, None)
        else:
            m[k] = v
    return pack(m)


def expect(exc: type[errors.RemoteProtocolError], data: bytes, match: str,
           decoder: Decoder | None = None) -> errors.RemoteProtocolError:
    with pytest.raises(exc, match=match) as info:
        (decoder or codec._DEFAULT_DECODER).decode(data)
    err = info.value
    assert isinstance(err, errors.RemoteProtocolError)
    assert err.reason == exc.reason
    return err


def test_valid_baseline_decodes() -> None:
    """The fixtures are valid, so every failure below is due to the one change made."""
    for msg in ALL:
        assert codec.decode(codec.encode(msg)) == msg


# --------------------------------------------------------------------------
# undecodable bytes


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x82\xa1v", b"\x82\xa1v\x01\xa1t", b"\xa2\xff\xfe",
    b"\xdf\xff\xff\xff\xff", b"\x81\xa1v\x01\xc4", pack({"v": 1}) + b"\x00",
], ids=repr)
def test_undecodable_bytes(data: bytes) -> None:
    expect(errors.UndecodableError, data, "undecodable msgpack")


def test_not_bytes_at_all() -> None:
    expect(errors.UndecodableError, "a str", "expected bytes, got str")  # type: ignore[arg-type]
    expect(errors.UndecodableError, None, "expected bytes, got NoneType")  # type: ignore[arg-type]


def test_non_string_map_key() -> None:
    expect(errors.UndecodableError, b"\x81\x01\x01", "undecodable")


def test_msgpack_extension_types_are_refused() -> None:
    data = msgpack.packb({"v": 1, "t": "heartbeat", "s": A, "e": 1, "q": 1,
                          "g": msgpack.ExtType(5, b"0123456789abcdef")})
    expect(errors.FieldError, data, "extension type 5")


def test_msgpack_timestamp_is_not_a_value() -> None:
    ts = msgpack.Timestamp(1, 0)
    data = msgpack.packb({"v": 1, "t": "delta", "s": A, "e": 1, "q": 1,
                          "o": [[SET, "metrics", "t", ts]]}, datetime=False)
    expect(errors.FieldError, data, "Timestamp is not a JSON-like value")


@pytest.mark.parametrize("top", [[1, 2], "x", 1, None, b"bin"], ids=repr)
def test_top_level_must_be_a_map(top: Any) -> None:
    expect(errors.FieldError, pack(top), "message must be a map")


# --------------------------------------------------------------------------
# protocol version and type


@pytest.mark.parametrize("v", [2, 0, -1, ..., "1", 1.0, True, None, [1]], ids=repr)
def test_wrong_protocol_version(v: Any) -> None:
    expect(errors.VersionError, with_fields(DELTA, v=v), "unsupported protocol version")


def test_unknown_message_type() -> None:
    expect(errors.UnknownTypeError, with_fields(DELTA, t="gossip"), "unknown message type 'gossip'")
    batch = raw(Batch([DELTA]))
    batch["m"][0]["t"] = "gossip"
    expect(errors.UnknownTypeError, pack(batch), "unknown message type 'gossip'")


@pytest.mark.parametrize("t", [..., 5, None, ["delta"]], ids=repr)
def test_message_type_must_be_a_string(t: Any) -> None:
    expect(errors.FieldError, with_fields(DELTA, t=t), "message type must be a string")


def test_control_message_cannot_ride_in_a_batch() -> None:
    batch = raw(Batch([]))
    batch["m"] = [raw(CLAIM), raw(HB)]
    expect(errors.FieldError, pack(batch), "'claim' cannot appear here")
    batch["m"] = [raw(Batch([HB]))]
    expect(errors.FieldError, pack(batch), "'batch' cannot appear here")
    answer = raw(ANSWER)
    answer["m"] = [raw(HB)]
    expect(errors.FieldError, pack(answer), "'heartbeat' cannot appear here")


# --------------------------------------------------------------------------
# field types


@pytest.mark.parametrize(("msg", "field", "value", "match"), [
    (DELTA, "s", 7, r"field 's' \(source\) must be str, got int"),
    (DELTA, "s", ..., r"missing field 's'"),
    (DELTA, "e", "1", r"field 'e' \(epoch\) must be int, got str"),
    (DELTA, "e", True, r"field 'e' \(epoch\) must be int, got bool"),
    (DELTA, "q", 4.0, r"field 'q' \(seq\) must be int, got float"),
    (DELTA, "o", {"0": 1}, "ops must be a list, got dict"),
    (DELTA, "o", ..., "ops must be a list, got NoneType"),
    (DELTA, "o", [[9, "compute", "x", 1]], "unknown code 9"),
    (DELTA, "o", [[SET, "compute", "x"]], "wrong arity 3"),
    (DELTA, "o", [[DROP]], "wrong arity 1"),
    (DELTA, "o", [[True, "metrics"]], "unknown code True"),
    (DELTA, "o", [[]], "op 0 must be a non-empty list"),
    (DELTA, "o", ["set"], "op 0 must be a non-empty list"),
    (DELTA, "o", [[SET, 1, "x", 1]], "namespace and key must be strings"),
    (DELTA, "o", [[DEL, "metrics", 5]], "key must be a string, got int"),
    (DELTA, "o", [[SET, "metrics", "x", b"raw"]], "bytes is not a JSON-like value"),
    (DELTA, "o", [[SET, "metrics", "x", {"k": {"a": b""}}]], "bytes is not a JSON-like value"),
    (DELTA, "c", "c-1", "claim ids must be a list"),
    (DELTA, "c", [1], "claim id 1 must be a short non-empty string"),
    (DELTA, "c", [""], "must be a short non-empty string"),
    (HB, "g", "0123456789abcdef", r"field 'g' \(digest\) must be bytes, got str"),
    (SNAP, "d", [], "document must be a map, got list"),
    (SNAP, "d", {"compute": [1]}, "namespace compute must be a map"),
    (SNAP, "d", {"compute": {"vcpus": "8"}}, "compute.vcpus must be an integer, got str"),
    (SNAP, "d", {"compute": {"vcpus_used": 1.5}}, "compute.vcpus_used must be an integer, got float"),
    (SNAP, "d", {"compute": {"cpu_allocation_ratio": "2"}}, "compute.cpu_allocation_ratio must be a number"),
    (SNAP, "d", {"compute": {"cpu_allocation_ratio": True}}, "compute.cpu_allocation_ratio must be a number"),
    (REQ, "f", 1, r"field 'f' \(full\) must be bool"),
    (REQ, "r", ..., r"missing field 'r' \(requester\)"),
    (ANSWER, "m", {}, r"field 'm' \(items\) must be list, got dict"),
    (CLAIM, "x", [1], "resources must be a map"),
    (CLAIM, "x", {"vcpus": 1.0}, "resource vcpus must be an integer, got float"),
    (CLAIM, "x", {"vcpus": True}, "resource vcpus must be an integer, got bool"),
    (CLAIM, "x", {"": 1}, "resource class must be a non-empty string"),
    (CLAIM, "n", 12, r"field 'n' \(instance\) must be a short string"),
    (CLAIM, "b", [], r"field 'b' \(build request\) must be a map"),
    (CLAIM, "b", {"x": b"\x00"}, "claim.request.x: bytes is not a JSON-like value"),
    (CLAIM, "i", ..., r"missing field 'i' \(claim id\)"),
    (RESULT, "a", 0, r"field 'a' \(accepted\) must be bool, got int"),
    (RESULT, "w", 7, "reason must be a string"),
    (RESULT, "m", "x", r"field 'm' \(items\) must be list, got str"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_wrong_field_types(msg: Any, field: str, value: Any, match: str) -> None:
    expect(errors.FieldError, with_fields(msg, **{field: value}), match)


def test_answer_item_of_another_source() -> None:
    expect(errors.FieldError, codec.encode(ResyncAnswer(A, SCHED, [Delta(B, 1, 1, [])])),
           "resync_answer of 'host-a' carries an item of 'host-b'")
    result = ClaimResult("c", SCHED, A, False, 1, 1, "", [Snapshot(B, 1, 1, {})])
    expect(errors.FieldError, codec.encode(result),
           "claim_result of 'host-a' carries an item of 'host-b'")


# --------------------------------------------------------------------------
# value ranges


@pytest.mark.parametrize(("msg", "field", "value", "match"), [
    (DELTA, "e", -1, "epoch -1 out of range"),
    (DELTA, "e", 2**63, "epoch 9223372036854775808 out of range"),
    (DELTA, "q", -1, "seq -1 out of range"),
    (DELTA, "q", 2**64 - 1, "seq 18446744073709551615 out of range"),
    (DELTA, "q", 0, "seq 0 is only reachable by a snapshot"),
    (SNAP, "e", -1, "epoch -1 out of range"),
    (HB, "q", -5, "seq -5 out of range"),
    (RESULT, "e", -1, "epoch -1 out of range"),
    (REQ, "e", -2, "epoch -2 out of range"),
    (CLAIM, "e", -2, "epoch -2 out of range"),
    (CLAIM, "q", -1, "seq -1 out of range"),
    (HB, "g", b"\x00" * 15, "digest of 15 bytes, expected 16"),
    (HB, "g", b"\x00" * 32, "digest of 32 bytes, expected 16"),
    (DELTA, "s", "", "source must be 1..256 characters"),
    (DELTA, "s", "h" * (MAX_NAME_LEN + 1), "source must be 1..256 characters"),
    (REQ, "r", "", "requester must be 1..256 characters"),
    (CLAIM, "i", "", "claim id must be 1..256 characters"),
    (CLAIM, "r", "s" * 300, "scheduler must be 1..256 characters"),
    # claim resources
    (CLAIM, "x", {"vcpus": -1}, "resource vcpus=-1 is negative or absurd"),
    (CLAIM, "x", {"memory_mb": MAX_AMOUNT + 1}, "resource memory_mb=1099511627777 is negative or absurd"),
    (CLAIM, "x", {"disk_gb": 2**64 - 1}, "is negative or absurd"),
    # the compute namespace inventory, in a snapshot ...
    (SNAP, "d", {"compute": {"vcpus": -8}}, r"compute.vcpus=-8 is negative or absurd"),
    (SNAP, "d", {"compute": {"memory_mb": 2**50}}, r"compute.memory_mb=\d+ is negative or absurd"),
    (SNAP, "d", {"compute": {"vcpus_used": -1}}, r"compute.vcpus_used=-1 is negative or absurd"),
    (SNAP, "d", {"compute": {"reserved_disk_gb": -3}}, r"compute.reserved_disk_gb=-3 is negative"),
    (SNAP, "d", {"compute": {"num_instances": -1}}, r"compute.num_instances=-1 is negative"),
    (SNAP, "d", {"compute": {"cpu_allocation_ratio": 0.0}}, r"cpu_allocation_ratio=0.0 outside \(0, 1000\]"),
    (SNAP, "d", {"compute": {"ram_allocation_ratio": -1.5}}, r"ram_allocation_ratio=-1.5 outside"),
    (SNAP, "d", {"compute": {"disk_allocation_ratio": 1e6}}, r"disk_allocation_ratio=1000000.0 outside"),
    (SNAP, "d", {"compute": {"VGPU_allocation_ratio": float("nan")}},
     r"VGPU_allocation_ratio: non-finite float nan"),
    (SNAP, "d", {"compute": {"cpu_allocation_ratio": float("inf")}},
     r"cpu_allocation_ratio: non-finite float inf"),
    # ... and in a delta
    (DELTA, "o", [[SET, "compute", "vcpus", -1]], r"op 0: compute.vcpus=-1 is negative or absurd"),
    (DELTA, "o", [[SET, "compute", "disk_gb_used", 2**41]], r"compute.disk_gb_used=\d+ is negative"),
    (DELTA, "o", [[SET, "compute", "ram_allocation_ratio", 0]], r"ram_allocation_ratio=0 outside"),
    (DELTA, "o", [[SET, "compute", "cpu_allocation_ratio", 5000]], r"cpu_allocation_ratio=5000 outside"),
    (DELTA, "o", [[SET, "compute", "cpu_allocation_ratio", float("nan")]],
     r"cpu_allocation_ratio: non-finite float nan"),
    (DELTA, "o", [[SET, "compute", "x_allocation_ratio", float("inf")]],
     r"x_allocation_ratio: non-finite float inf"),
    # names, strings, nesting, numbers of generic values
    (DELTA, "o", [[SET, "", "k", 1]], "namespace/key length out of range"),
    (DELTA, "o", [[SET, "metrics", "k" * 257, 1]], "namespace/key length out of range"),
    (DELTA, "o", [[DEL, "metrics", ""]], "key must be 1..256 characters"),
    (DELTA, "o", [[DROP, "n" * 257]], "namespace must be 1..256 characters"),
    (DELTA, "o", [[SET, "metrics", "k", "x" * (MAX_STR_LEN + 1)]], "string of 65537 characters exceeds"),
    (DELTA, "o", [[SET, "metrics", "k", ["x" * (MAX_STR_LEN + 1)]]], "string of 65537 characters exceeds"),
    (SNAP, "d", {"metrics": {"k": "x" * (MAX_STR_LEN + 1)}}, "string of 65537 characters exceeds"),
    (SNAP, "d", {"metrics": {"": 1}}, "key in metrics must be 1..256 characters"),
    (SNAP, "d", {"metrics": {"k": 2**64 - 1}}, "integer 18446744073709551615 outside int64"),
    (SNAP, "d", {"metrics": {"k": float("inf")}}, "non-finite float inf"),
    (SNAP, "d", {"metrics": {"k": [float("nan")]}}, "non-finite float nan"),
    (RESULT, "w", "r" * 1025, "reason must be a string of <= 1024"),
    (CLAIM, "n", "i" * 257, r"field 'n' \(instance\) must be a short string"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_out_of_range_values(msg: Any, field: str, value: Any, match: str) -> None:
    exc = errors.FieldError if field in ("w", "n") else errors.ValueRangeError
    expect(exc, with_fields(msg, **{field: value}), match)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_limit() -> None:
    too_deep = nested(MAX_DEPTH + 1)
    expect(errors.ValueRangeError, with_fields(DELTA, o=[[SET, "metrics", "k", too_deep]]),
           f"nested deeper than {MAX_DEPTH}")
    expect(errors.ValueRangeError, with_fields(SNAP, d={"metrics": {"k": too_deep}}),
           f"nested deeper than {MAX_DEPTH}")
    expect(errors.ValueRangeError, with_fields(CLAIM, b={"k": too_deep}), f"nested deeper than {MAX_DEPTH}")


@pytest.mark.parametrize(("value", "match"), [
    (2**64 - 1, "integer 18446744073709551615 outside int64"),
    (2**63, "outside int64"),
    (float("inf"), "non-finite float inf"),
    (float("-inf"), "non-finite float -inf"),
    (float("nan"), "non-finite float nan"),
], ids=repr)
def test_out_of_range_scalar_in_a_delta(value: Any, match: str) -> None:
    """Regression: scalars in delta ops skipped the int64 / finiteness checks a
    snapshot applies, so a delta could install a value whose snapshot is
    undecodable (and a NaN, which is never equal to itself, in the digest)."""
    expect(errors.ValueRangeError, with_fields(DELTA, o=[[SET, "metrics", "k", value]]), match)


def test_too_many_claim_ids() -> None:
    expect(errors.FieldError, with_fields(DELTA, c=[f"c{i}" for i in range(codec.MAX_CLAIM_IDS + 1)]),
           "claim ids must be a list of at most")


# --------------------------------------------------------------------------
# size


def test_oversized_message() -> None:
    big = Snapshot(A, EPOCH, 1, {"metrics": {f"k{i}": "x" * 100 for i in range(100)}})
    data = codec.encode(big)
    decoder = Decoder(max_message_bytes=len(data) - 1)
    err = expect(errors.OversizeError, data,
                 f"message of {len(data)} bytes exceeds the limit of {len(data) - 1}", decoder)
    assert err.reason == "oversize"
    assert Decoder(max_message_bytes=len(data)).decode(data) == big


def test_oversize_is_checked_before_parsing() -> None:
    expect(errors.OversizeError, b"\xc1" * 101, "exceeds the limit of 100", Decoder(max_message_bytes=100))


def test_oversized_signed_payload() -> None:
    ring = Keyring(master=MASTER)
    data = Encoder(ring).encode(Snapshot(A, EPOCH, 1, {"metrics": {"k": "x" * 5000}}))
    # the outer limit catches it first; the inner payload obeys the same limit
    expect(errors.OversizeError, data, "exceeds the limit", Decoder(ring, max_message_bytes=4000))


# --------------------------------------------------------------------------
# unknown sources


@pytest.mark.parametrize("msg", [SNAP, DELTA, HB, REQ, ANSWER, CLAIM, RESULT], ids=lambda m: type(m).__name__)
def test_unknown_source_with_known_sources(msg: Any) -> None:
    decoder = Decoder(known_sources=frozenset({B}))
    err = expect(errors.UnknownSourceError, codec.encode(msg), "unknown source 'host-a'", decoder)
    assert err.sender == A
    assert Decoder(known_sources={A}).decode(codec.encode(msg)) == msg


def test_unknown_source_inside_a_batch() -> None:
    decoder = Decoder(known_sources={A})
    batch = Batch([DELTA, Heartbeat(B, 1, 1, bytes(16))])
    err = expect(errors.UnknownSourceError, codec.encode(batch), "heartbeat: unknown source 'host-b'",
                 decoder)
    assert err.sender == B


def test_signed_by_a_name_the_keyring_has_no_key_for() -> None:
    verifier = Keyring({A: b"key-a"})  # explicit keys only, no master
    data = Encoder(Keyring({B: b"key-b"})).encode(Delta(B, 1, 1, []))
    err = expect(errors.UnknownSourceError, data, "no key for 'host-b'", Decoder(verifier))
    assert err.sender == B
    claim = Claim("c", "rogue-scheduler", A, 1, 1, {})
    data = Encoder(Keyring({"rogue-scheduler": b"k"})).encode(claim)
    expect(errors.UnknownSourceError, data, "no key for 'rogue-scheduler'", Decoder(verifier))


# --------------------------------------------------------------------------
# signatures


def _signed_raw(msg: Any, ring: Keyring) -> dict[str, Any]:
    return unpack(Encoder(ring).encode(msg))


@pytest.mark.parametrize("msg", ALL, ids=lambda m: type(m).__name__)
def test_bad_hmac(msg: Any) -> None:
    ring = Keyring(master=MASTER)
    m = _signed_raw(msg, ring)
    target = m["m"][0] if m["t"] == "batch" else m
    target["h"] = bytes([target["h"][0] ^ 1]) + target["h"][1:]
    err = expect(errors.SignatureError, pack(m), "bad signature on", Decoder(ring))
    assert err.sender in (A, SCHED)


def test_payload_changed_after_signing() -> None:
    ring = Keyring(master=MASTER)
    m = _signed_raw(CLAIM, ring)
    inner = unpack(m["p"])
    inner["x"] = {"vcpus": 64}
    m["p"] = pack(inner)
    expect(errors.SignatureError, pack(m), "bad signature on 'claim' from 'sched-1'", Decoder(ring))


@pytest.mark.parametrize(("mac", "match"), [
    (b"", "signature of 0 bytes, expected 32"),
    (b"\x00" * 31, "signature of 31 bytes"),
    (b"\x00" * 64, "signature of 64 bytes"),
], ids=repr)
def test_mac_of_wrong_length(mac: bytes, match: str) -> None:
    ring = Keyring(master=MASTER)
    m = _signed_raw(DELTA, ring)
    m["h"] = mac
    expect(errors.SignatureError, pack(m), match, Decoder(ring))


def test_signature_wrapper_field_types() -> None:
    ring = Keyring(master=MASTER)
    m = _signed_raw(DELTA, ring)
    expect(errors.FieldError, pack({**m, "p": "text"}), r"field 'p' \(signed payload\) must be bytes",
           Decoder(ring))
    expect(errors.FieldError, pack({k: v for k, v in m.items() if k != "h"}), r"missing field 'h'",
           Decoder(ring))
    payload = pack({"t": "delta", "s": 5})
    expect(errors.FieldError, pack({**m, "p": payload, "h": ring.sign(A, payload)}), "names no speaker",
           Decoder(ring))
    payload = pack([1, 2])
    expect(errors.FieldError, pack({**m, "p": payload}), "signed payload must be a map", Decoder(ring))
    expect(errors.UndecodableError, pack({**m, "p": b"\xc1"}), "undecodable", Decoder(ring))


def test_a_batch_cannot_be_signed_as_a_whole() -> None:
    ring = Keyring(master=MASTER)
    inner = {"t": "batch", "s": A, "m": []}
    payload = pack(inner)
    data = pack({"v": 1, "t": "sig", "p": payload, "h": ring.sign(A, payload)})
    expect(errors.FieldError, data, "a 'batch' cannot be signed as a whole", Decoder(ring))


def _forge(inner: dict[str, Any], key: bytes) -> dict[str, Any]:
    payload = pack(inner)
    return {"t": "sig", "p": payload, "h": hmac.new(key, payload, "sha256").digest()}


def test_forged_source_signed_with_another_hosts_key() -> None:
    """Host A holds only its derived key and tries to speak for host B."""
    key_a = derive_key(MASTER, A)
    host_a = Keyring({A: key_a})
    verifier = Decoder(Keyring(master=MASTER))
    # A cannot even sign for B with its own keyring ...
    with pytest.raises(errors.LocalProtocolError):
        Encoder(host_a).encode(Delta(B, 1, 1, []))
    # ... so it signs B's name with its own key
    forged = Delta(B, 1, 1, [[SET, "compute", "vcpus_used", 0]])
    data = pack({**_forge({k: v for k, v in raw(forged).items() if k != "v"}, key_a), "v": 1})
    err = expect(errors.SignatureError, data, "bad signature on 'delta' from 'host-b'", verifier)
    assert err.sender == B
    # the same inside a batch next to A's honest item
    batch = unpack(Encoder(host_a).encode(Batch([DELTA])))
    batch["m"].append(_forge({k: v for k, v in raw(forged).items() if k != "v"}, key_a))
    expect(errors.SignatureError, pack(batch), "from 'host-b'", verifier)
    # and as a claim result (only the source may answer for its claims)
    result = {k: v for k, v in raw(ClaimResult("c", SCHED, B, True, 1, 1)).items() if k != "v"}
    expect(errors.SignatureError, pack({**_forge(result, key_a), "v": 1}), "'claim_result' from 'host-b'",
           verifier)
    # A's honest messages pass
    assert verifier.decode(Encoder(host_a).encode(DELTA)) == DELTA


def test_scheduler_cannot_claim_for_another_scheduler() -> None:
    key = derive_key(MASTER, "sched-2")
    claim = {k: v for k, v in raw(CLAIM).items() if k != "v"}  # scheduler field says sched-1
    expect(errors.SignatureError, pack({**_forge(claim, key), "v": 1}), "'claim' from 'sched-1'",
           Decoder(Keyring(master=MASTER)))


def test_forged_item_inside_a_signed_answer() -> None:
    key_a = derive_key(MASTER, A)
    ring_a = Keyring({A: key_a})
    answer = _signed_raw(ANSWER, ring_a)
    inner = unpack(answer["p"])
    inner["m"].append(_forge({k: v for k, v in raw(Delta(B, 1, 1, [])).items() if k != "v"}, key_a))
    payload = pack(inner)
    answer["p"], answer["h"] = payload, ring_a.sign(A, payload)
    expect(errors.SignatureError, pack(answer), "from 'host-b'", Decoder(Keyring(master=MASTER)))


@pytest.mark.parametrize("msg", [m for m in ALL if type(m) is not Batch], ids=lambda m: type(m).__name__)
def test_unsigned_message_when_signatures_required(msg: Any) -> None:
    expect(errors.SignatureError, codec.encode(msg), "unsigned .* while signatures are required",
           Decoder(Keyring(master=MASTER)))


def test_unsigned_items_in_a_batch_when_signatures_required() -> None:
    ring = Keyring(master=MASTER)
    batch = unpack(Encoder(ring).encode(Batch([DELTA])))
    batch["m"].append({k: v for k, v in raw(HB).items() if k != "v"})
    expect(errors.SignatureError, pack(batch), "unsigned 'heartbeat' message", Decoder(ring))


def test_unsigned_correction_inside_a_signed_result() -> None:
    ring = Keyring(master=MASTER)
    result = _signed_raw(RESULT, ring)
    inner = unpack(result["p"])
    inner["m"] = [{k: v for k, v in raw(DELTA).items() if k != "v"}]
    payload = pack(inner)
    result["p"], result["h"] = payload, ring.sign(A, payload)
    expect(errors.SignatureError, pack(result), "unsigned 'delta'", Decoder(ring))


def test_signed_message_without_keys_to_verify() -> None:
    expect(errors.SignatureError, Encoder(Keyring(master=MASTER)).encode(DELTA), "no keys to verify it")


# --------------------------------------------------------------------------
# the error objects themselves


def test_error_family() -> None:
    remote = [errors.UndecodableError, errors.VersionError, errors.UnknownTypeError, errors.FieldError,
              errors.ValueRangeError, errors.OversizeError, errors.UnknownSourceError, errors.SignatureError]
    assert len({e.reason for e in remote}) == len(remote)
    for e in remote:
        assert issubclass(e, errors.RemoteProtocolError)
        assert not issubclass(e, errors.LocalProtocolError)
    assert issubclass(errors.LocalProtocolError, errors.ProtocolError)


def test_decoding_never_mutates_the_callers_bytes() -> None:
    data = bytearray(codec.encode(SNAP))
    before = bytes(data)
    assert codec.decode(data) == SNAP
    assert bytes(data) == before
    assert codec.decode(memoryview(before)) == SNAP



# --------------------------------------------------------------------------
# regression: hostile nesting in fields that end up in an error message


DEEP = 1020  # msgpack itself refuses 1024 levels; Python's repr gives up near 1000


@pytest.mark.parametrize(("build", "exc", "match"), [
    (lambda d: {"v": d, "t": "delta"}, errors.VersionError, "unsupported protocol version"),
    (lambda d: {**raw(DELTA), "o": [[d, "metrics"]]}, errors.FieldError, "has unknown code"),
    (lambda d: {**raw(DELTA), "c": [d]}, errors.FieldError, "must be a short non-empty string"),
    (lambda d: {"v": 1, "t": d}, errors.FieldError, "message type must be a string"),
], ids=["version", "op-code", "claim-id", "type"])
def test_deeply_nested_values_do_not_blow_the_stack(build: Any, exc: type, match: str) -> None:
    """Regression: error messages used repr() of attacker-chosen values, and the
    repr of a list nested ~1000 deep raised RecursionError out of decode()."""
    expect(exc, pack(build(nested(DEEP))), match)


def test_deeply_nested_type_under_required_signatures() -> None:
    ring = Keyring(master=MASTER)
    expect(errors.SignatureError, pack({"v": 1, "t": nested(DEEP)}), "while signatures are required",
           Decoder(ring))
    payload = pack({"t": nested(DEEP), "s": 5})
    expect(errors.FieldError, pack({"v": 1, "t": "sig", "p": payload, "h": bytes(32)}), "names no speaker",
           Decoder(ring))
    payload = pack({"t": nested(DEEP), "s": A})
    expect(errors.SignatureError, pack({"v": 1, "t": "sig", "p": payload, "h": bytes(32)}), "bad signature",
           Decoder(ring))


def test_delta_and_snapshot_share_the_nesting_limit() -> None:
    """Regression: a delta accepted values one level deeper than a snapshot did, so a
    document reached by deltas could not be shipped as a snapshot (resync impossible)."""
    deepest = nested(MAX_DEPTH)
    assert codec.decode(with_fields(DELTA, o=[[SET, "metrics", "k", deepest]])).ops[0][3] == deepest
    assert codec.decode(with_fields(SNAP, d={"metrics": {"k": deepest}})).doc["metrics"]["k"] == deepest
