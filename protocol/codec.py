"""msgpack codec with validation and optional HMAC signatures.

Wire form: every message is a msgpack map with short keys.  ``v`` (protocol
version) and ``t`` (type name) are always present at the top level; items
inside a batch or a resync answer / correction carry ``t`` but not ``v``.
Unknown keys are ignored (forward compatibility); unknown types are rejected.
The full field table is in docs/protocol.md.

A signed message (or batch item) is ``{"t": "sig", "p": <bin: packed inner
map>, "h": <bin: HMAC-SHA256(key of the speaker, p)>}`` (plus ``v`` at top
level).  The speaker is read from the inner map (the source for data items
and claim results, the scheduler for claims and resync requests), so one batch
can carry items of many sources, each signed with its own key.

:func:`decode` is the only door for untrusted bytes: whatever the input, it
returns a message or raises a :class:`~protocol.errors.RemoteProtocolError`.

The contract: docs/design.md §7; the bytes: docs/protocol.md.
"""

from __future__ import annotations

import reprlib
from typing import Any, NoReturn, TypeVar

import msgpack

from protocol import errors
from protocol.document import MAX_NAME_LEN, check_document, check_ops, check_value
from protocol.groups import MAX_GROUP_MEMBERS, ClaimGroup
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
    Message,
    ResyncAnswer,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
    Snapshot,
    speaker,
)
from protocol.resources import check_resources
from protocol.signing import MAC_SIZE, Keyring, Verifier

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_ITEMS = 100_000
MAX_CLAIM_IDS = 10_000
MAX_SEQ = 2**63 - 1
MAX_REASON = 1024
DIGEST_LEN = 16


# --------------------------------------------------------------------------
# encoding


def _item_map(msg: Message) -> dict[str, Any]:
    m: dict[str, Any]
    if isinstance(msg, Delta):
        m = {"t": "delta", "s": msg.source, "e": msg.epoch, "q": msg.seq, "o": msg.ops}
        if msg.claims:
            m["c"] = msg.claims
        return m
    if isinstance(msg, Heartbeat):
        return {"t": "heartbeat", "s": msg.source, "e": msg.epoch, "q": msg.seq, "g": msg.digest}
    if isinstance(msg, Fence):
        return {"t": "fence", "s": msg.source, "e": msg.epoch, "q": msg.seq}
    if isinstance(msg, Snapshot):
        return {"t": "snapshot", "s": msg.source, "e": msg.epoch, "q": msg.seq, "d": msg.doc,
                "c": msg.claims}
    if isinstance(msg, ResyncRequest):
        return {"t": "resync_request", "s": msg.source, "r": msg.requester, "e": msg.epoch,
                "q": msg.seq, "f": msg.full}
    if isinstance(msg, Claim):
        return {"t": "claim", "i": msg.claim_id, "r": msg.scheduler, "s": msg.source,
                "e": msg.epoch, "q": msg.seq, "x": msg.resources, "n": msg.instance,
                "b": msg.request, **({"g": _group_map(msg.group)} if msg.group else {})}
    if isinstance(msg, ScarceRequest):
        return {"t": "scarce_request", "i": msg.request_id, "r": msg.scheduler,
                "c": msg.coordinator, "b": msg.spec}
    if isinstance(msg, ScarceAnswer):
        return {"t": "scarce_answer", "i": msg.request_id, "r": msg.scheduler,
                "a": msg.requester, "p": msg.placed, "f": msg.failed, "n": msg.claims,
                "j": msg.rejected}
    if isinstance(msg, CheckpointAsk):
        return {"t": "checkpoint_ask", "r": msg.scheduler, "k": msg.token}
    raise errors.LocalProtocolError(f"cannot encode {type(msg).__name__} as a single item")


def _group_map(group: ClaimGroup) -> dict[str, Any]:
    return {"u": group.uuid, "p": group.policy, "k": group.max_per_host, "m": list(group.members)}


def _claim_group(value: Any) -> ClaimGroup | None:
    """A claim's server group (field 'g', optional), validated."""
    if value is None:
        return None
    if type(value) is not dict:
        raise errors.FieldError("claim: field 'g' (server group) must be a map")
    uuid, policy, limit = value.get("u"), value.get("p"), value.get("k", 1)
    members = value.get("m", [])
    if type(uuid) is not str or not uuid or len(uuid) > MAX_NAME_LEN:
        raise errors.FieldError(f"claim: server group uuid must be 1..{MAX_NAME_LEN} characters")
    if type(policy) is not str or len(policy) > MAX_NAME_LEN:
        raise errors.FieldError("claim: server group policy must be a short string")
    if type(limit) is not int or not 1 <= limit <= MAX_SEQ:
        raise errors.FieldError("claim: server group max_server_per_host must be a positive integer")
    if type(members) is not list or len(members) > MAX_GROUP_MEMBERS:
        raise errors.FieldError(f"claim: server group members must be a list of at most "
                                f"{MAX_GROUP_MEMBERS}")
    for m in members:
        if type(m) is not str or not m or len(m) > MAX_NAME_LEN:
            raise errors.FieldError("claim: a server group member must be a short non-empty string")
    return ClaimGroup(uuid, policy, limit, tuple(members))


class Encoder:
    """Turns messages into bytes, signing every item when given a keyring."""

    def __init__(self, keyring: Keyring | None = None) -> None:
        self.keyring = keyring

    def _wrap(self, msg: Message, origin: str = "") -> dict[str, Any]:
        t = type(msg)
        m: dict[str, Any]
        if isinstance(msg, Batch):
            # Signed, each item names the batch's origin inside its signed payload: the
            # origin (where resyncs go) is then covered like the rest (protocol §7).
            inner = msg.origin if self.keyring is not None else ""
            m = {"t": "batch", "m": [self._wrap(i, inner) for i in msg.items]}
            if msg.origin:
                m["o"] = msg.origin
        elif isinstance(msg, ResyncAnswer):
            m = {"t": "resync_answer", "s": msg.source, "r": msg.requester,
                 "m": [self._wrap(i) for i in msg.items]}
        elif isinstance(msg, ClaimResult):
            m = {"t": "claim_result", "i": msg.claim_id, "r": msg.scheduler, "s": msg.source,
                 "a": msg.accepted, "e": msg.epoch, "q": msg.seq, "w": msg.reason,
                 "m": [self._wrap(i) for i in msg.correction]}
        else:
            m = _item_map(msg)
            if origin:
                m["og"] = origin
        if self.keyring is None or t is Batch:
            return m
        payload = msgpack.packb(m, use_bin_type=True)
        name = speaker(msg)
        try:
            mac = self.keyring.sign(name, payload)
        except KeyError:
            raise errors.LocalProtocolError(f"no signing key for {name!r}") from None
        return {"t": "sig", "p": payload, "h": mac}

    def encode(self, msg: Message) -> bytes:
        m = self._wrap(msg)
        m["v"] = PROTOCOL_VERSION
        return msgpack.packb(m, use_bin_type=True)


_PLAIN = Encoder()

#: the message types whose speaker (the signer, messages.speaker) is field "r", not the
#: source "s": what a decoder reads before the message is built
_SPOKEN_BY_R_NAMES = ("claim", "resync_request", "scarce_request", "scarce_answer", "checkpoint_ask")


def encode(msg: Message) -> bytes:
    """Encode without signatures."""
    return _PLAIN.encode(msg)


# --------------------------------------------------------------------------
# decoding


def _ext_hook(code: int, data: bytes) -> NoReturn:
    raise errors.FieldError(f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, max_bytes: int) -> Any:
    if type(data) not in (bytes, bytearray, memoryview):
        raise errors.UndecodableError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise errors.OversizeError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_ext_hook,
                               timestamp=0)
    except errors.ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types; all mean "not our bytes"
        raise errors.UndecodableError(f"undecodable msgpack: {type(exc).__name__}: {exc}") from None


_T = TypeVar("_T")


def _get(m: dict[str, Any], key: str, typ: type[_T], what: str, t: str) -> _T:
    """``m[key]``, which must be exactly of type ``typ`` (bool is not an int here)."""
    try:
        value = m[key]
    except KeyError:
        raise errors.FieldError(f"{t}: missing field {key!r} ({what})") from None
    if type(value) is not typ:
        raise errors.FieldError(
            f"{t}: field {key!r} ({what}) must be {typ.__name__}, got {type(value).__name__}"
        )
    return value


def _name(m: dict, key: str, what: str, t: str) -> str:
    value = _get(m, key, str, what, t)
    if not value or len(value) > MAX_NAME_LEN:
        raise errors.ValueRangeError(f"{t}: {what} must be 1..{MAX_NAME_LEN} characters")
    return value


def _version(m: dict, t: str, allow_no_epoch: bool = False) -> tuple[int, int]:
    epoch = _get(m, "e", int, "epoch", t)
    seq = _get(m, "q", int, "seq", t)
    low = NO_EPOCH if allow_no_epoch else 0
    if not low <= epoch <= MAX_SEQ:
        raise errors.ValueRangeError(f"{t}: epoch {epoch} out of range")
    if not 0 <= seq <= MAX_SEQ:
        raise errors.ValueRangeError(f"{t}: seq {seq} out of range")
    return epoch, seq


def _claim_ids(m: dict, t: str) -> list[str]:
    ids = m.get("c")
    if ids is None:
        return []
    if type(ids) is not list or len(ids) > MAX_CLAIM_IDS:
        raise errors.FieldError(f"{t}: claim ids must be a list of at most {MAX_CLAIM_IDS}")
    for i in ids:
        if type(i) is not str or not i or len(i) > MAX_NAME_LEN:
            raise errors.FieldError(f"{t}: claim id {reprlib.repr(i)} must be a short non-empty string")
    return ids


def _list(m: dict, key: str, t: str) -> list:
    value = _get(m, key, list, "items", t)
    if len(value) > MAX_ITEMS:
        raise errors.ValueRangeError(f"{t}: {len(value)} items exceed {MAX_ITEMS}")
    return value


class Decoder:
    """Validating decoder.

    ``keyring``: verify signatures (and, if ``keyring.required``, insist on
    them); a :class:`~protocol.signing.Keyring`, or any other
    :class:`~protocol.signing.Verifier`.  ``known_sources``: if given, a data item
    or claim result naming a source outside it is rejected with
    :class:`~protocol.errors.UnknownSourceError`.
    """

    def __init__(
        self,
        keyring: Verifier | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        known_sources: set[str] | frozenset[str] | None = None,
    ) -> None:
        self.keyring = keyring
        self.max_message_bytes = max_message_bytes
        self.known_sources = known_sources
        self._parsers = {
            "delta": self._delta,
            "heartbeat": self._heartbeat,
            "snapshot": self._snapshot,
            "batch": self._batch,
            "resync_request": self._resync_request,
            "resync_answer": self._resync_answer,
            "claim": self._claim,
            "claim_result": self._claim_result,
            "scarce_request": self._scarce_request,
            "scarce_answer": self._scarce_answer,
            "fence": self._fence,
            "checkpoint_ask": self._checkpoint_ask,
        }

    # -- entry point -------------------------------------------------------

    def decode(self, data: bytes) -> Message:
        m = _unpack(data, self.max_message_bytes)
        if type(m) is not dict:
            raise errors.FieldError(f"message must be a map, got {type(m).__name__}")
        v = m.get("v")
        if v != PROTOCOL_VERSION or type(v) is not int:
            raise errors.VersionError(
                f"unsupported protocol version {reprlib.repr(v)} (this side speaks {PROTOCOL_VERSION})"
            )
        return self._item(m, top=True)

    # -- dispatch ----------------------------------------------------------

    def _item(self, m: Any, top: bool = False, allowed: frozenset[str] | None = None,
              origin: str | None = None) -> Any:
        if type(m) is not dict:
            raise errors.FieldError(f"item must be a map, got {type(m).__name__}")
        t = m.get("t")
        if t == "sig":
            m = self._unsign(m)
            t = m.get("t")
            if origin is not None and m.get("og", "") != origin:
                # the batch's origin is not the one its signed items name (protocol §7)
                raise errors.SignatureError(
                    f"batch origin {origin[:MAX_NAME_LEN]!r} is not covered by the signature of "
                    f"its {reprlib.repr(t)} item", sender=m.get("s") if type(m.get("s")) is str else None)
        elif self.keyring is not None and self.keyring.required and t != "batch":
            raise errors.SignatureError(
                f"unsigned {reprlib.repr(t)} message while signatures are required")
        if type(t) is not str:
            raise errors.FieldError(f"message type must be a string, got {type(t).__name__}")
        parser = self._parsers.get(t)
        if parser is None:
            raise errors.UnknownTypeError(f"unknown message type {t[:64]!r}")
        if allowed is not None and t not in allowed:
            raise errors.FieldError(f"a {t!r} cannot appear here (allowed: {sorted(allowed)})")
        return parser(m)

    def _unsign(self, m: dict) -> dict:
        payload = _get(m, "p", bytes, "signed payload", "sig")
        mac = _get(m, "h", bytes, "signature", "sig")
        if self.keyring is None:
            raise errors.SignatureError("signed message but this side has no keys to verify it")
        if len(mac) != MAC_SIZE:
            raise errors.SignatureError(f"signature of {len(mac)} bytes, expected {MAC_SIZE}")
        inner = _unpack(payload, self.max_message_bytes)
        if type(inner) is not dict:
            raise errors.FieldError("signed payload must be a map")
        t = inner.get("t")
        who_key = "r" if t in _SPOKEN_BY_R_NAMES else "s"
        who = inner.get(who_key)
        if type(who) is not str:
            raise errors.FieldError(f"signed {reprlib.repr(t)} names no speaker")
        ok = self.keyring.verify(who, payload, mac)
        if ok is None:
            raise errors.UnknownSourceError(f"no key for {who[:MAX_NAME_LEN]!r}", sender=who)
        if not ok:
            raise errors.SignatureError(f"bad signature on {reprlib.repr(t)} from {who!r}", sender=who)
        if t == "batch" or t == "sig":
            raise errors.FieldError(f"a {t!r} cannot be signed as a whole")
        return inner

    def _source(self, m: dict, t: str) -> str:
        source = _name(m, "s", "source", t)
        if self.known_sources is not None and source not in self.known_sources:
            raise errors.UnknownSourceError(f"{t}: unknown source {source!r}", sender=source)
        return source

    # -- per type ----------------------------------------------------------

    def _delta(self, m: dict) -> Delta:
        source = self._source(m, "delta")
        epoch, seq = _version(m, "delta")
        if seq == 0:
            raise errors.ValueRangeError("delta: seq 0 is only reachable by a snapshot")
        ops = check_ops(m.get("o"), f"delta {source}@{epoch}:{seq}")
        return Delta(source, epoch, seq, ops, _claim_ids(m, "delta"))

    def _heartbeat(self, m: dict) -> Heartbeat:
        source = self._source(m, "heartbeat")
        epoch, seq = _version(m, "heartbeat")
        digest = _get(m, "g", bytes, "digest", "heartbeat")
        if len(digest) != DIGEST_LEN:
            raise errors.ValueRangeError(f"heartbeat: digest of {len(digest)} bytes, expected 16")
        return Heartbeat(source, epoch, seq, digest)

    def _fence(self, m: dict) -> Fence:
        source = self._source(m, "fence")
        epoch, seq = _version(m, "fence")
        return Fence(source, epoch, seq)

    def _checkpoint_ask(self, m: dict) -> CheckpointAsk:
        t = "checkpoint_ask"
        return CheckpointAsk(_name(m, "r", "scheduler", t), _name(m, "k", "token", t))

    def _snapshot(self, m: dict) -> Snapshot:
        source = self._source(m, "snapshot")
        epoch, seq = _version(m, "snapshot")
        doc = check_document(m.get("d"), f"snapshot {source}")
        return Snapshot(source, epoch, seq, doc, _claim_ids(m, "snapshot"))

    _DATA = frozenset(["delta", "heartbeat", "snapshot"])
    _STATE = frozenset(["delta", "snapshot"])

    def _batch(self, m: dict) -> Batch:
        origin = m.get("o", "")
        if type(origin) is not str or len(origin) > MAX_NAME_LEN:
            raise errors.FieldError("batch: field 'o' (origin) must be a short string")
        # a signed item must name the same origin; unsigned items are checked by nothing
        # (they are accepted only when signatures are not required)
        check = origin if self.keyring is not None else None
        items = [self._item(i, allowed=self._DATA, origin=check) for i in _list(m, "m", "batch")]
        return Batch(items, origin)

    def _resync_request(self, m: dict) -> ResyncRequest:
        source = self._source(m, "resync_request")
        requester = _name(m, "r", "requester", "resync_request")
        epoch, seq = _version(m, "resync_request", allow_no_epoch=True)
        full = m.get("f", False)
        if type(full) is not bool:
            raise errors.FieldError("resync_request: field 'f' (full) must be bool")
        return ResyncRequest(source, requester, epoch, seq, full)

    def _state_items(self, m: dict, t: str, source: str) -> list[Snapshot | Delta]:
        items = [self._item(i, allowed=self._STATE) for i in _list(m, "m", t)]
        for item in items:
            if item.source != source:
                raise errors.FieldError(f"{t} of {source!r} carries an item of {item.source!r}")
        return items

    def _resync_answer(self, m: dict) -> ResyncAnswer:
        source = self._source(m, "resync_answer")
        requester = _name(m, "r", "requester", "resync_answer")
        return ResyncAnswer(source, requester, self._state_items(m, "resync_answer", source))

    def _claim(self, m: dict) -> Claim:
        t = "claim"
        claim_id = _name(m, "i", "claim id", t)
        scheduler = _name(m, "r", "scheduler", t)
        source = self._source(m, t)
        epoch, seq = _version(m, t, allow_no_epoch=True)
        resources = check_resources(m.get("x"), t)
        instance = m.get("n", "")
        if type(instance) is not str or len(instance) > MAX_NAME_LEN:
            raise errors.FieldError("claim: field 'n' (instance) must be a short string")
        request = m.get("b", {})
        if type(request) is not dict:
            raise errors.FieldError("claim: field 'b' (build request) must be a map")
        check_value(request, "claim.request")
        return Claim(claim_id, scheduler, source, epoch, seq, resources, instance, request,
                     _claim_group(m.get("g")))

    def _claim_result(self, m: dict) -> ClaimResult:
        t = "claim_result"
        claim_id = _name(m, "i", "claim id", t)
        scheduler = _name(m, "r", "scheduler", t)
        source = self._source(m, t)
        accepted = _get(m, "a", bool, "accepted", t)
        epoch, seq = _version(m, t)
        reason = m.get("w", "")
        if type(reason) is not str or len(reason) > MAX_REASON:
            raise errors.FieldError(f"claim_result: reason must be a string of <= {MAX_REASON}")
        correction = self._state_items(m, t, source) if "m" in m else []
        return ClaimResult(claim_id, scheduler, source, accepted, epoch, seq, reason, correction)


    def _scarce_request(self, m: dict) -> ScarceRequest:
        t = "scarce_request"
        spec = _get(m, "b", dict, "request spec", t)
        check_value(spec, "scarce_request.spec")
        return ScarceRequest(_name(m, "i", "request id", t), _name(m, "r", "scheduler", t),
                             _name(m, "c", "coordinator", t), spec)

    def _scarce_answer(self, m: dict) -> ScarceAnswer:
        t = "scarce_answer"
        placed = _get(m, "p", dict, "placed", t)
        failed = _get(m, "f", dict, "failed", t)
        for what, table, limit in (("placed", placed, MAX_NAME_LEN), ("failed", failed, MAX_REASON)):
            if len(table) > MAX_GROUP_MEMBERS:
                raise errors.FieldError(f"{t}: {what} lists more than {MAX_GROUP_MEMBERS} instances")
            for k, v in table.items():
                if (type(k) is not str or not k or len(k) > MAX_NAME_LEN or type(v) is not str
                        or len(v) > limit):
                    raise errors.FieldError(f"{t}: {what} must map instance names to short strings")
        counts = [_get(m, key, int, what, t) for key, what in (("n", "claims"), ("j", "rejected"))]
        if not all(0 <= c <= MAX_SEQ for c in counts):
            raise errors.ValueRangeError(f"{t}: claims and rejected must be 0..{MAX_SEQ}")
        return ScarceAnswer(_name(m, "i", "request id", t), _name(m, "r", "scheduler", t),
                            _name(m, "a", "requester", t), placed, failed, *counts)


_DEFAULT_DECODER = Decoder()


def decode(data: bytes) -> Message:
    """Decode and validate with default limits and no signatures."""
    return _DEFAULT_DECODER.decode(data)
