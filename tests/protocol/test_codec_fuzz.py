"""Fuzzing the only door for untrusted bytes.

Whatever the bytes, :meth:`protocol.codec.Decoder.decode` returns a message or
raises a :class:`~protocol.errors.RemoteProtocolError` (the codec module
docstring); no other exception may escape, because the edge catches exactly
that family, logs, counts and drops (invariant 6).  What it does accept must be
a well-formed message: re-encodable, and stable through another round trip.
"""

from __future__ import annotations

import sys
from typing import Any, get_args

import msgpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from protocol_strategies import messages, pack, unpack

from protocol import codec, errors
from protocol.codec import Decoder, Encoder
from protocol.document import apply_ops, copy_document
from protocol.messages import (
    Delta,
    Message,
    Snapshot,
)
from protocol.signing import Keyring

MASTER = b"fuzz master"
RING = Keyring(master=MASTER)
DECODERS = {
    "plain": Decoder(),
    "signed": Decoder(Keyring(master=MASTER)),
    "optional": Decoder(Keyring(master=MASTER, required=False)),
    "small": Decoder(max_message_bytes=256, known_sources=frozenset({"a", "b", "host-1"})),
}
#: every type on the wire (the Message union), so a new one is fuzzed as soon as it exists
MESSAGE_TYPES = get_args(Message)
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def deep(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# random msgpack values, including the ones a JSON-minded peer never sends
leaves = (
    st.none() | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, 1, -1, 2**31, 2**40, 2**40 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
    | st.floats()  # nan and inf included
    | st.text(max_size=30).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
    | st.sampled_from(["", "v", "t", "sig", "delta", "snapshot", "heartbeat", "batch", "claim",
                       "claim_result", "resync_request", "resync_answer", "compute", "vcpus"])
    | st.binary(max_size=40)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
    | st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999))
)
msgpack_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4).filter(
        lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)), inner, max_size=4),
    max_leaves=8,
) | st.builds(deep, st.sampled_from([7, 8, 9, 100, 500, 900, 950, 990, 1000, 1010, 1020]))


def _paths(m: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths to every map value and list element of an unpacked message."""
    out = []
    if type(m) is dict:
        for k, v in m.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif type(m) is list:
        for i, v in enumerate(m):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _set(m: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        m = m[p]
    if value is _DELETE and type(m) is dict:
        del m[path[-1]]
    elif value is _DELETE:
        m.pop(path[-1])
    else:
        m[path[-1]] = value


_DELETE = object()


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


#: stack a service has left for decoding: the default limit (1000) minus a
#: transport's call depth.  Hypothesis raises the limit while it runs a test,
#: which would hide a decoder that recurses on attacker-chosen nesting.
DECODE_STACK = 900


def check_decode(data: bytes, decoder: Decoder) -> Any:
    """Decode; the only acceptable failure is a RemoteProtocolError."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + DECODE_STACK)
    try:
        msg = decoder.decode(data)
    except Exception as exc:  # noqa: BLE001 - the point is to see everything
        assert isinstance(exc, errors.RemoteProtocolError), (
            f"{type(exc).__name__} escaped the decoder: {exc!s:.200}")
        assert isinstance(exc.reason, str) and exc.reason
        assert str(exc)
        return None
    finally:
        sys.setrecursionlimit(limit)
    assert type(msg) in MESSAGE_TYPES
    # whatever passed is a message we can send on and read back identically
    again = codec.decode(codec.encode(msg))
    assert again == msg
    if type(msg) is Delta:
        # a document reached by an accepted delta can be shipped as a snapshot
        doc: dict = {}
        apply_ops(doc, msg.ops)
        snap = Snapshot(msg.source, msg.epoch, msg.seq, copy_document(doc))
        assert codec.decode(codec.encode(snap)).doc == doc
    return msg


@FUZZ
@given(st.binary(max_size=600), st.sampled_from(sorted(DECODERS)))
@example(b"\x81\xa1v" + b"\x91" * 1000 + b"\x90", "plain")
def test_random_bytes(data: bytes, which: str) -> None:
    check_decode(data, DECODERS[which])


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "t", "s", "e", "q", "o", "c", "d", "g", "m", "p", "h", "x"]),
                       msgpack_values, max_size=8),
       st.sampled_from(sorted(DECODERS)))
def test_random_maps(m: dict, which: str) -> None:
    m.setdefault("v", 1)
    try:
        data = pack(m)
    except (ValueError, OverflowError):  # too deep for msgpack itself
        return
    check_decode(data, DECODERS[which])


def _encoded(msg: Any, signed: bool) -> bytes:
    return Encoder(RING).encode(msg) if signed else codec.encode(msg)


@FUZZ
@given(messages, st.booleans(), st.lists(st.tuples(st.integers(0, 2**16), st.integers(1, 255)), min_size=1,
                                         max_size=4),
       st.sampled_from(sorted(DECODERS)))
def test_byte_flips(msg: Any, signed: bool, flips: list[tuple[int, int]], which: str) -> None:
    data = bytearray(_encoded(msg, signed))
    for index, xor in flips:
        data[index % len(data)] ^= xor
    check_decode(bytes(data), DECODERS[which])


@FUZZ
@given(messages, st.booleans(), st.integers(0, 2**16), st.sampled_from(sorted(DECODERS)))
def test_truncations(msg: Any, signed: bool, cut: int, which: str) -> None:
    data = _encoded(msg, signed)
    cut %= len(data)
    check_decode(data[:cut], DECODERS[which])
    # a strict prefix of one msgpack object is never a complete object
    try:
        DECODERS[which].decode(data[:cut])
    except errors.RemoteProtocolError:
        pass
    else:
        raise AssertionError(f"a {cut}-byte prefix of a {len(data)}-byte message decoded")


@FUZZ
@given(messages, st.booleans(), st.integers(0, 2**16), st.binary(min_size=1, max_size=16),
       st.sampled_from(sorted(DECODERS)))
def test_insertions(msg: Any, signed: bool, at: int, junk: bytes, which: str) -> None:
    data = _encoded(msg, signed)
    at %= len(data) + 1
    check_decode(data[:at] + junk + data[at:], DECODERS[which])


@FUZZ
@given(messages, st.data(), st.sampled_from(["plain", "small", "optional"]))
def test_field_substitutions(msg: Any, data: st.DataObject, which: str) -> None:
    """Replace, delete or add one field anywhere in an unsigned message."""
    m = unpack(codec.encode(msg))
    paths = _paths(m)
    path = data.draw(st.sampled_from(paths), label="path")
    action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
    if action == "replace":
        _set(m, path, data.draw(msgpack_values, label="value"))
    elif action == "delete":
        _set(m, path, _DELETE)
    else:
        target = m
        for p in path[:-1]:
            target = target[p]
        if type(target) is dict:
            target[data.draw(st.text(max_size=3), label="key")] = data.draw(msgpack_values, label="value")
        else:
            target.append(data.draw(msgpack_values, label="value"))
    try:
        encoded = pack(m)
    except (ValueError, OverflowError, UnicodeEncodeError):
        return
    check_decode(encoded, DECODERS[which])


def _resign_all(m: Any) -> Any:
    """Sign every 'sig' wrapper again after its payload was edited (a peer holding the keys).

    Signed items live only at the top, in a batch's or an answer's "m" list and
    in a payload "p", so only those are walked (a substituted value may be deep).
    """
    if type(m) is not dict:
        return m
    out = dict(m)
    if type(out.get("m")) is list:
        out["m"] = [_resign_all(i) for i in out["m"]]
    if out.get("t") == "sig" and type(out.get("p")) is dict:
        inner = _resign_all(out["p"])
        payload = pack(inner)
        who = inner.get("r") if inner.get("t") in ("claim", "resync_request") else inner.get("s")
        out["p"] = payload
        out["h"] = RING.sign(who, payload) if type(who) is str and who else b"\x00" * 32
    return out


def _open_all(m: Any) -> Any:
    """Unpack every signed payload so that its fields can be edited."""
    if type(m) is not dict:
        return m
    out = dict(m)
    if type(out.get("m")) is list:
        out["m"] = [_open_all(i) for i in out["m"]]
    if out.get("t") == "sig" and type(out.get("p")) is bytes:
        out["p"] = _open_all(unpack(out["p"]))
    return out


@FUZZ
@given(messages, st.data())
def test_field_substitutions_by_a_key_holder(msg: Any, data: st.DataObject) -> None:
    """A peer that holds valid keys but sends nonsense inside correctly signed payloads."""
    m = _open_all(unpack(Encoder(RING).encode(msg)))
    paths = [p for p in _paths(m) if p[-1] not in ("h",)]
    path = data.draw(st.sampled_from(paths), label="path")
    _set(m, path, data.draw(msgpack_values, label="value"))
    try:
        encoded = pack(_resign_all(m))
    except (ValueError, OverflowError, UnicodeEncodeError, KeyError):
        return
    check_decode(encoded, DECODERS["signed"])


@FUZZ
@given(messages)
def test_valid_messages_pass_every_decoder_or_fail_typed(msg: Any) -> None:
    """Sanity for the harness above: valid bytes decode (or fail typed, e.g. too big / unknown)."""
    assert check_decode(codec.encode(msg), DECODERS["plain"]) == msg
    assert check_decode(Encoder(RING).encode(msg), DECODERS["signed"]) == msg
    check_decode(codec.encode(msg), DECODERS["small"])
