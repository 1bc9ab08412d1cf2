"""Namespaced host-state documents: canonical form, digest, diff and apply.

A *document* is what one source owns: ``{namespace: {key: value}}`` where
values are JSON-like (None, bool, int, float, str, list, dict with str keys).
Namespaces group what one consumer needs (``compute``, ``service``,
``instances``, ``aggregates``, ``numa``, ``pci``, ``metrics``, or any
namespace another project registers); filters read only the ones they know.

Life cycle: a source builds its document, changes it only through *ops*
(:data:`SET`, :data:`DEL`, :data:`DROP`), and every receiver applies the same
ops in the same order, so both hold equal documents.  Equality is checked
with :func:`digest` over the :func:`canonical` encoding, which is independent
of insertion order.  An empty namespace does not exist: applying an op that
empties one removes it, so a document reached by deltas and the same document
shipped as a snapshot always have the same canonical bytes.

Values are treated as immutable once inside a document: callers replace a
value, they never mutate it in place (the source API copies what it is given).

The contract: docs/design.md §2 (documents, canonical form, digest).
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

import msgpack

from protocol import hashing
from protocol.errors import FieldError, ValueRangeError
from protocol.resources import check_namespace_entry

Document = dict[str, dict[str, Any]]
Op = list[Any]  # [SET, ns, key, value] | [DEL, ns, key] | [DROP, ns]

SET = 0
DEL = 1
DROP = 2

MAX_NAME_LEN = 256
MAX_STR_LEN = 65536
MAX_DEPTH = 8
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
DIGEST_SIZE = 16

_SCALARS = (type(None), bool, int, float, str)


def _sorted(value: Any) -> Any:
    if type(value) is dict:
        return {k: _sorted(value[k]) for k in sorted(value)}
    if type(value) is list:
        return [_sorted(v) for v in value]
    return value


def canonical(doc: Document) -> bytes:
    """Order-independent msgpack bytes of ``doc`` (sorted keys, no empty namespaces)."""
    return msgpack.packb(
        {ns: _sorted(doc[ns]) for ns in sorted(doc) if doc[ns]},
        use_bin_type=True,
    )


def digest(doc: Document) -> bytes:
    """16-byte BLAKE2b digest of the canonical encoding."""
    return hashing.blake2b((canonical(doc),), DIGEST_SIZE)


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


class CanonicalCache:
    """Per-namespace canonical bytes of one document, for cheap repeated digests.

    The canonical encoding of a map is its header followed by each key's and
    value's encoding, so ``canonical(doc)`` is the header plus, per non-empty
    namespace in sorted order, ``packb(ns) + packb(sorted entries)``.  Caching
    those parts and re-encoding only the namespaces an op touched gives the
    same bytes (and digest) as :func:`digest` at a fraction of the cost:
    heartbeats mostly follow changes of ``compute`` or ``metrics``, while the
    large ``instances`` namespace changes rarely.

    Life cycle: owned by whoever owns the document; :meth:`invalidate` with
    every batch of ops applied to it, :meth:`clear` when it is replaced.
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: dict[str, bytes] = {}

    def invalidate(self, ops: list[Op]) -> None:
        parts = self._parts
        for op in ops:
            parts.pop(op[1], None)

    def clear(self) -> None:
        self._parts.clear()

    def digest(self, doc: Document) -> bytes:
        parts = self._parts
        names = sorted(ns for ns, entries in doc.items() if entries)
        if len(parts) > len(names):
            for ns in [ns for ns in parts if ns not in doc or not doc[ns]]:
                del parts[ns]
        chunks = [_map_header(len(names))]
        for ns in names:
            part = parts.get(ns)
            if part is None:
                part = parts[ns] = (msgpack.packb(ns, use_bin_type=True)
                                    + msgpack.packb(_sorted(doc[ns]), use_bin_type=True))
            chunks.append(part)
        return hashing.blake2b(chunks, DIGEST_SIZE)


def copy_document(doc: Document) -> Document:
    """A copy whose namespace dicts can be changed without touching ``doc``.

    Values are shared: they are immutable by contract.
    """
    return {ns: dict(entries) for ns, entries in doc.items()}


def same_value(a: Any, b: Any) -> bool:
    """Equality as the canonical encoding sees it: ``0``, ``0.0`` and ``False`` differ,
    at any depth (Python's ``==`` says they are equal)."""
    t = type(a)
    if t is not type(b):
        return False
    if t is list:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if t is dict:
        return a.keys() == b.keys() and all(same_value(v, b[k]) for k, v in a.items())
    return a == b


def diff(old: Document, new: Document) -> list[Op]:
    """The ops that turn ``old`` into ``new`` (key granularity)."""
    ops: list[Op] = []
    for ns, new_entries in new.items():
        old_entries = old.get(ns)
        if not old_entries:
            ops.extend([SET, ns, k, v] for k, v in new_entries.items())
            continue
        for k, v in new_entries.items():
            if k not in old_entries or not same_value(old_entries[k], v):
                ops.append([SET, ns, k, v])
        ops.extend([DEL, ns, k] for k in old_entries if k not in new_entries)
    ops.extend([DROP, ns] for ns in old if ns not in new and old[ns])
    return ops


def apply_ops(doc: Document, ops: list[Op]) -> None:
    """Apply validated ops to ``doc`` in place.

    ``DEL`` of a missing key and ``DROP`` of a missing namespace are no-ops, so
    a source may emit them without tracking what receivers hold.
    """
    for op in ops:
        code = op[0]
        ns = op[1]
        if code == SET:
            entries = doc.get(ns)
            if entries is None:
                doc[ns] = {op[2]: op[3]}
            else:
                entries[op[2]] = op[3]
        elif code == DEL:
            entries = doc.get(ns)
            if entries is not None:
                entries.pop(op[2], None)
                if not entries:
                    del doc[ns]
        else:
            doc.pop(ns, None)


def merge_ops(pending: dict[tuple[str, str | None], Op], ops: list[Op]) -> None:
    """Coalesce ``ops`` into ``pending`` so that only the last write per key survives.

    ``pending`` maps (ns, key) -> op, with key None for a namespace drop; a
    drop erases every pending op of that namespace before it.  Iterating the
    dict afterwards yields ops whose application gives the same document as
    applying every op in sequence.
    """
    for op in ops:
        if op[0] == DROP:
            for k in [k for k in pending if k[0] == op[1]]:
                del pending[k]
            pending[(op[1], None)] = op
        else:
            slot = (op[1], op[2])
            pending.pop(slot, None)  # re-insert so the op moves after any earlier drop
            pending[slot] = op


# --------------------------------------------------------------------------
# validation of untrusted values


def check_name(value: Any, what: str) -> str:
    if type(value) is not str:
        raise FieldError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_NAME_LEN:
        raise ValueRangeError(f"{what} must be 1..{MAX_NAME_LEN} characters, got {len(value)}")
    return value


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """Raise unless ``value`` is JSON-like within the protocol's limits."""
    t = type(value)
    if t is str:
        if len(value) > MAX_STR_LEN:
            raise ValueRangeError(f"{where}: string of {len(value)} characters exceeds {MAX_STR_LEN}")
    elif t is int:
        if not MIN_INT <= value <= MAX_INT:
            raise ValueRangeError(f"{where}: integer {value} outside int64")
    elif t is float:
        if not math.isfinite(value):
            raise ValueRangeError(f"{where}: non-finite float {value}")
    elif t is bool or value is None:
        pass
    elif depth >= MAX_DEPTH:
        raise ValueRangeError(f"{where}: nested deeper than {MAX_DEPTH}")
    elif t is list:
        for i, v in enumerate(value):
            check_value(v, f"{where}[{i}]", depth + 1)
    elif t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise FieldError(f"{where}: map key {k!r} is not a string")
            check_value(v, f"{where}.{k}", depth + 1)
    else:
        raise FieldError(f"{where}: {t.__name__} is not a JSON-like value")


def check_ops(ops: Any, where: str) -> list[Op]:
    """Validate a list of ops from the wire; resource namespaces get range checks."""

    if type(ops) is not list:
        raise FieldError(f"{where}: ops must be a list, got {type(ops).__name__}")
    for i, op in enumerate(ops):
        if type(op) is not list or not op:
            raise FieldError(f"{where}: op {i} must be a non-empty list")
        code = op[0]
        n = len(op)
        if code == SET and type(code) is int and n == 4:
            ns = op[1]
            key = op[2]
            if type(ns) is not str or type(key) is not str:
                raise FieldError(f"{where}: op {i} namespace and key must be strings")
            if not ns or len(ns) > MAX_NAME_LEN or not key or len(key) > MAX_NAME_LEN:
                raise ValueRangeError(f"{where}: op {i} namespace/key length out of range")
            value = op[3]
            vt = type(value)
            # scalars are checked inline; check_value (same rules as a snapshot's) raises
            if vt is int:
                if not MIN_INT <= value <= MAX_INT:
                    check_value(value, f"{where}: op {i} {ns}.{key}")
            elif vt is float:
                if not math.isfinite(value):
                    check_value(value, f"{where}: op {i} {ns}.{key}")
            elif vt is str:
                if len(value) > MAX_STR_LEN:
                    check_value(value, f"{where}: op {i} {ns}.{key}")
            elif vt is not bool and value is not None:
                check_value(value, f"{where}: op {i} {ns}.{key}")
            check_namespace_entry(ns, key, value, f"{where}: op {i}")
        elif code == DEL and type(code) is int and n == 3:
            check_name(op[1], f"{where}: op {i} namespace")
            check_name(op[2], f"{where}: op {i} key")
        elif code == DROP and type(code) is int and n == 2:
            check_name(op[1], f"{where}: op {i} namespace")
        else:
            raise FieldError(f"{where}: op {i} has unknown code {reprlib.repr(code)} or wrong arity {n}")
    return ops


def check_document(doc: Any, where: str) -> Document:
    """Validate a whole document from the wire (a snapshot), dropping empty namespaces."""

    if type(doc) is not dict:
        raise FieldError(f"{where}: document must be a map, got {type(doc).__name__}")
    for ns in [ns for ns, entries in doc.items() if type(entries) is dict and not entries]:
        del doc[ns]
    for ns, entries in doc.items():
        check_name(ns, f"{where}: namespace")
        if type(entries) is not dict:
            raise FieldError(f"{where}: namespace {ns} must be a map")
        for key, value in entries.items():
            check_name(key, f"{where}: key in {ns}")
            check_value(value, f"{where}: {ns}.{key}")
            check_namespace_entry(ns, key, value, where)
    return doc
