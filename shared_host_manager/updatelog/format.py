"""The update-log format: the files, frames and record kinds every party writes, and the
scheduler's checkpoint states.

One place owns the format, so the writer, the reader, the recorder and the
replay cannot disagree on it.  What a reporter's log needs as much as a
scheduler's (files, frames, record kinds and their shapes) is
:mod:`transport.updatelog.format`, below the reporter, which imports nothing of
this package; it is re-exported here, so the scheduler side names the whole
format from one module.  This module adds the checkpoints' view states
(:class:`ViewStates`) and the wire forms of request specs and RNG states.
docs/update-log.md is the reader's guide; the files, frames and every record
kind are described once, in :mod:`transport.updatelog.format`.

Checkpoints
-----------
A checkpoint lists only the views that changed since the previous one, and
the XOR of an 8-byte BLAKE2b hash of every view's state (:class:`ViewStates`).
Version, liveness, pending claims and held peer claims of every view are
checked at every checkpoint; document digests (~60 us each on a realistic
host) are taken within a time budget and a view left out is digested at a
later checkpoint, which bounds how long a checkpoint holds the cache lock.

The peer claims a view holds (docs/design.md §5.2) are listed whole -- the
claim as encoded, and the deadline its ``peer_claim_ttl`` gave it -- so that a
replay starting at a part's base (older parts deleted) holds them as the
scheduler did, instead of only those announced after it.  For the same reason
the checkpoint of a part's base lists this scheduler's own pending claims whole
(:func:`pending_claims`; other checkpoints list only their ids), and the rejections of
peer claims the receiver remembers (a late announcement of one is not held).  Format 2 added them;
a format 1 log (without them) is still read, and its checkpoints are compared
without peer claims (:data:`READABLE_FORMATS`, ``ViewStates(peers=False)``).

Request specs and RNG states travel as plain msgpack data
(:func:`spec_to_wire`, :func:`rng_to_wire`) so ``--decisions`` can re-run a
decision exactly.
"""

from __future__ import annotations

import array
import random
import time
from collections.abc import Mapping
from hashlib import blake2b
from typing import Any

import msgpack

from protocol import codec
from protocol.receiver import SourceView

# re-exported: the update log's record shapes include the request spec's
from shared_host_manager.decision.request import spec_from_wire as spec_from_wire
from shared_host_manager.decision.request import spec_to_wire as spec_to_wire

# re-exported (__all__): the files, frames and record kinds every party writes (see the docstring)
from transport.updatelog.format import (
    CANCEL,
    CHECKPOINT,
    CLAIM,
    DECISION,
    DECISION_END,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAX_FILE_BYTES,
    DROPPED_BODY_LIMIT,
    ENGINE,
    FORGET,
    FORMAT,
    FRAME,
    HEADER,
    HINT,
    HOST_MANAGER,
    KIND_NAMES,
    MAGIC,
    MAX_RECORD_BYTES,
    NOTE,
    OPT_INT,
    OPT_NUM,
    OPT_STR,
    PEER_CLAIMS_FORMAT,
    PUBLISHED,
    READABLE_FORMATS,
    RECORD_SHAPES,
    REPORTER,
    RESTORE,
    RESYNC,
    RX_CELL_STREAM,
    RX_CONTROL,
    RX_DROPPED,
    RX_STREAM,
    SCHEDULER,
    SUFFIX,
    TICK,
    TX,
    frame,
    log_base,
    part_paths,
)

#: receiver parameters copied into a scheduler log's header (replay builds its receiver from them)
RECEIVER_PARAMS = ("reorder_window", "reorder_timeout", "resync_timeout", "resync_backoff_max",
                   "down_interval", "claim_deadline", "peer_claim_ttl")


#: digest field of a view that holds no document yet (None means "not digested at this checkpoint")
NO_DOCUMENT = b""


def view_base(view: SourceView, peers: bool = True) -> tuple:
    """What every checkpoint compares of every view: version, liveness, pending claims, and
    (``peers``) the peer claims held, by id and deadline, when there are some."""
    pending = view.pending
    base = (view.epoch, view.seq, view.down, tuple(sorted(pending)) if pending else ())
    if peers and view.peer:
        return (*base, tuple(sorted((cid, held.deadline) for cid, held in view.peer.items())))
    return base


def peer_claims_state(view: SourceView) -> tuple:
    """The peer claims ``view`` holds as a checkpoint lists them: (id, deadline, encoded claim)."""
    return tuple((cid, held.deadline, codec.encode(held.claim))
                 for cid, held in sorted(view.peer.items()))


def pending_claims(sources: Mapping[str, SourceView]) -> list[list[Any]]:
    """This scheduler's own pending claims, whole, as a part's base checkpoint lists them:
    [source, claim id, deadline, accepted, encoded Claim], in source and id order."""
    return [[source, cid, held.deadline, held.accepted, codec.encode(held.claim)]
            for source, view in sorted(sources.items()) if view.pending
            for cid, held in sorted(view.pending.items())]


def same_base(state: tuple | None, base: tuple) -> bool:
    """Whether a checkpointed ``state`` has the version, liveness and claims of ``base``
    (:func:`view_base`); the document digest is not compared."""
    if state is None or state[:2] != base[:2] or state[3:5] != base[2:4]:
        return False
    if len(state) == 5 or len(base) == 4:
        return len(state) == 5 and len(base) == 4
    return tuple((cid, deadline) for cid, deadline, _ in state[5]) == base[4]


def view_state(view: SourceView, digest: bool = True, peers: bool = True) -> tuple:
    """(epoch, seq, document digest | None | NO_DOCUMENT, down, pending claim ids
    [, peer claims held: see :func:`peer_claims_state`, when ``peers`` and there are some])."""
    if view.doc is None:
        dig: bytes | None = NO_DOCUMENT
    else:
        dig = view.digest() if digest else None
    return _state(view, view_base(view, peers), dig)


def _state(view: SourceView, base: tuple, dig: bytes | None) -> tuple:
    """A view's checkpoint state from its :func:`view_base` and its document digest."""
    state = (base[0], base[1], dig, base[2], base[3])
    return (*state, peer_claims_state(view)) if len(base) > 4 else state


class ViewStates:
    """Every view's checkpointed state and the XOR of their hashes, kept incrementally.

    :meth:`scan` compares the views with the states of the previous scan and
    returns what changed (``None`` for a forgotten source).  Versions,
    liveness and pending claims are compared for every view; document digests
    cost ~60 us each, so they are computed within ``budget`` seconds per scan:
    a digest the receiver already holds (computed for a heartbeat) is free, a
    changed view past the budget is recorded without one (``None``) and
    digested at a later scan.  The replay verifies digests where recorded.
    """

    __slots__ = ("states", "hashes", "acc", "peers", "_pack")

    def __init__(self, peers: bool = True) -> None:
        #: states list the peer claims held (format 2; False to compare a format 1 log)
        self.peers = peers
        self.states: dict[str, tuple] = {}
        self.hashes: dict[str, int] = {}
        self.acc = 0
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def scan(self, sources: Mapping[str, SourceView], budget: float = float("inf")) -> list[list[Any]]:
        changes: list[list[Any]] = []
        states = self.states
        deadline = time.perf_counter() + budget if budget != float("inf") else None
        spent = False
        peers = self.peers
        for source, view in sources.items():
            base = view_base(view, peers)
            old = states.get(source)
            if old is not None and same_base(old, base):
                recorded = old[2]
                if recorded is not None and (recorded == NO_DOCUMENT or view.known_digest == recorded):
                    continue  # unchanged and digested
                if spent:
                    continue
                # not digested yet, or the document was replaced at the same version
                # (a full resync after a divergence drops the cached digest)
            if view.doc is None:
                dig: bytes | None = NO_DOCUMENT
            else:
                dig = view.known_digest  # computed for a heartbeat check: free
                if dig is None and not spent:
                    dig = view.digest()
                    spent = deadline is not None and time.perf_counter() > deadline
            state = _state(view, base, dig)
            if state != old:
                self.set(source, state)
                changes.append([source, state])
        if len(states) != len(sources):
            for source in [s for s in states if s not in sources]:
                self.set(source, None)
                changes.append([source, None])
        return changes

    def set(self, source: str, state: tuple | None) -> None:
        old = self.hashes.pop(source, None)
        if old is not None:
            self.acc ^= old
            del self.states[source]
        if state is not None:
            h = int.from_bytes(blake2b(self._pack((source, state)), digest_size=8).digest(), "little")
            self.states[source] = state
            self.hashes[source] = h
            self.acc ^= h

    @property
    def combined(self) -> bytes:
        return self.acc.to_bytes(8, "little")


def state_from_wire(state: list | None) -> tuple | None:
    if state is None:
        return None
    epoch, seq, dig, down, pending = state[:5]
    if len(state) > 5:  # format 2: the peer claims held
        return (epoch, seq, dig, down, tuple(pending),
                tuple((cid, deadline, claim) for cid, deadline, claim in state[5]))
    return (epoch, seq, dig, down, tuple(pending))




def rng_to_wire(rng: random.Random) -> list[Any] | None:
    """A Mersenne Twister state in 2.5 KB (None if the generator has no state to save)."""
    try:
        version, internal, gauss = rng.getstate()
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        return None
    words = array.array("I", internal)
    return [version, words.tobytes(), gauss]


def rng_from_wire(data: list[Any]) -> tuple:
    version, words, gauss = data
    internal = array.array("I")
    internal.frombytes(words)
    return (version, tuple(internal), gauss)


__all__ = [
    "CANCEL", "CHECKPOINT", "CLAIM", "DECISION", "DECISION_END", "DEFAULT_BUFFER_BYTES",
    "DEFAULT_CHECKPOINT_INTERVAL", "DEFAULT_MAX_FILE_BYTES", "DROPPED_BODY_LIMIT", "ENGINE",
    "FORGET", "FORMAT", "FRAME", "HEADER", "HINT", "HOST_MANAGER", "KIND_NAMES", "MAGIC",
    "MAX_RECORD_BYTES", "NOTE", "NO_DOCUMENT", "OPT_INT", "OPT_NUM", "OPT_STR",
    "PEER_CLAIMS_FORMAT", "PUBLISHED", "READABLE_FORMATS", "RECEIVER_PARAMS", "RECORD_SHAPES",
    "REPORTER", "RESTORE", "RESYNC", "RX_CELL_STREAM", "RX_CONTROL", "RX_DROPPED", "RX_STREAM",
    "SCHEDULER",
    "SUFFIX", "TICK", "TX", "ViewStates", "frame", "log_base", "part_paths", "peer_claims_state",
    "pending_claims", "rng_from_wire", "rng_to_wire", "same_base", "spec_from_wire",
    "spec_to_wire", "state_from_wire", "view_base", "view_state"
]
