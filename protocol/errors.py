"""The one error family of the protocol.

Everything that can go wrong while decoding or validating a message raises a
subclass of :class:`ProtocolError`; nothing else escapes :func:`protocol.codec.decode`.
Each error's message names the problem (and, where known, the message type and
the sender) so an operator reading a log line can tell who broke the protocol.

Errors raised because *this* side misused the API (a caller bug, not a peer's
bad message) are :class:`LocalProtocolError`; everything a peer can cause is a
:class:`RemoteProtocolError`.  As in h11, the split tells you whom to blame.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every protocol error."""

    #: short machine-readable reason, used as the counter key for dropped input
    reason = "invalid"

    def __init__(self, message: str, *, sender: str | None = None) -> None:
        super().__init__(message)
        self.sender = sender


class LocalProtocolError(ProtocolError):
    """This side tried to build or send something the protocol forbids."""

    reason = "local"


class RemoteProtocolError(ProtocolError):
    """A peer sent something invalid; the message must be dropped and counted."""


class UndecodableError(RemoteProtocolError):
    reason = "undecodable"


class VersionError(RemoteProtocolError):
    reason = "version"


class UnknownTypeError(RemoteProtocolError):
    reason = "unknown_type"


class FieldError(RemoteProtocolError):
    """A field is missing or has the wrong type."""

    reason = "field"


class ValueRangeError(RemoteProtocolError):
    """A value has the right type but is out of range (negative, absurd, too long)."""

    reason = "range"


class OversizeError(RemoteProtocolError):
    reason = "oversize"


class UnknownSourceError(RemoteProtocolError):
    reason = "unknown_source"


class SignatureError(RemoteProtocolError):
    reason = "signature"
