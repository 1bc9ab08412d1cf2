"""Per-speaker HMAC keys.

A compute node may only speak for its own source and a scheduler only for its
own claims and resync requests, so every speaker has its own key.  Keys come
from an explicit table (``name -> secret``) and/or are derived from a master
secret as ``HMAC-SHA256(master, name)``: a scheduler given the master can
verify every compute node, while each compute node is given only its derived
key and so cannot forge another host.

Life cycle: built once from configuration, read-only afterwards (thread-safe).

The contract: docs/design.md §7.4.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Protocol

from protocol.hashing import hmac_sha256

MAC_SIZE = 32


def derive_key(master: bytes, name: str) -> bytes:
    return hmac_sha256(master, name.encode())


class Verifier(Protocol):
    """What a :class:`~protocol.codec.Decoder` needs of its keys (a :class:`Keyring` is one)."""

    #: unsigned messages are invalid
    required: bool

    def verify(self, name: str, payload: bytes, mac: bytes) -> bool | None:
        """True/False for a good/bad MAC; None when ``name`` has no key."""
        ...


class Keyring:
    """Keys by speaker name; ``required`` makes unsigned messages invalid."""

    def __init__(
        self,
        keys: Mapping[str, bytes] | None = None,
        master: bytes | None = None,
        *,
        required: bool = True,
    ) -> None:
        self._keys = dict(keys or {})
        self._master = master
        self.required = required

    def key_for(self, name: str) -> bytes | None:
        key = self._keys.get(name)
        if key is None and self._master is not None:
            # Derived on every use, not cached: names come from the wire, and a
            # cache keyed by them would let a forger grow our memory.
            key = derive_key(self._master, name)
        return key

    def sign(self, name: str, payload: bytes) -> bytes:
        key = self.key_for(name)
        if key is None:
            raise KeyError(f"no signing key for {name!r}")
        return hmac_sha256(key, payload)

    def verify(self, name: str, payload: bytes, mac: bytes) -> bool | None:
        """True/False for a good/bad MAC; None when ``name`` has no key."""
        key = self.key_for(name)
        if key is None:
            return None
        return hmac.compare_digest(hmac_sha256(key, payload), mac)
