"""The update log's files: framing, record kinds and their shapes, what every party writes.

Role: the part of the update-log format that a reporter's log needs as much as a
scheduler's, kept below both (a reporter process imports nothing of the
scheduler package).  The writer (:mod:`.writer`), the reader (:mod:`.reader`)
and, through :mod:`shared_host_manager.updatelog.format` (which re-exports
everything here and adds the scheduler's checkpoint states and the wire forms of
request specs and RNG states), the recorders and the replay all take it from
here, so they cannot disagree on it.  No state, no I/O but path names.
docs/update-log.md is the reader's guide.

Files
-----
A log is a set of files ``<directory>/<role>-<name>.ulog.0001``, ``.0002``,
... (rotated when a file reaches ``max_file_bytes``; a restarted process
appends new files after the existing ones).  Each file is::

    MAGIC (8 bytes: b"SHMULOG1")
    record*                                 # the first one is the HEADER
    record = u32le length | u32le CRC32(payload) | payload (msgpack array, first element: kind)

The HEADER (kind 0) is a map: ``format``, ``role`` ("scheduler" or
"reporter"), ``name``, ``session`` (one id per process run: a new session is
a fresh receiver), ``part``, ``first_record`` (index of the file's first
record in the whole log), ``config`` (the receiver's parameters, or the
reporter's), ``clock`` and ``wall`` at session start.  Records are numbered
from 0 across files; headers are not numbered.

Records
-------
Fields after the kind (shapes checked by the reader: :data:`RECORD_SHAPES`, and the optional
fields before the effects: :data:`RECORD_OPTIONAL`).
``effects`` is present only when the step produced something: ``{"s": [[to,
encoded ResyncRequest], ...], "o": [[claim_id, source, outcome], ...]}``.

=============  ==  ====================================================================
RX_STREAM       1  now, stream offset, message bytes[, heard][, effects]  (heard, format 5:
                   when the message was published, on the receiver's clock, for a message of
                   the backlog a restarted scheduler catches up on; without it, at ``now``)
RX_CONTROL      2  now, message bytes[, effects]      (resync answers, claim results;
                   on a reporter: claims and resync requests it handled)
RX_DROPPED      3  now, plane ("stream"/"control"), offset, bytes (first 64 KiB): invalid, not applied
TICK            4  now[, effects]                     (receiver.tick)
CLAIM           5  now, encoded Claim[, effects]      (receiver.add_claim)
RESYNC          6  now, source, full[, effects]       (receiver.request_resync)
HINT            7  now, source[, effects]             (receiver.add_source_hint)
FORGET          8  now, source[, effects]             (receiver.forget)
RESTORE         9  now, encoded Snapshot[, last heard][, effects]  (cache.load after a
                   restart, and a part's base; last heard, format 4: when the source was
                   last heard, on the receiver's clock; without it, at ``now``)
TX             10  now, to, encoded message           (claims sent; a reporter's control casts)
CANCEL         11  now, source, claim id[, effects]   (receiver.cancel_claim)
CHECKPOINT     12  now, combined hash (8 bytes), number of views, changed views
                   [[source, [epoch, seq, digest, down, [pending claim ids]
                              (, [[peer claim id, deadline, encoded Claim], ...])] | None], ...]
                   (digest: 16 bytes, b"" = no document yet, None = not digested this time;
                   the peer claims held, format 2, only when the view holds some)
                   [, {"pending": [[source, claim id, deadline, accepted, encoded Claim], ...],
                       "peer_rejected": [claim id, ...]}]
                   (format 2, a part's base only: this scheduler's own pending claims whole,
                   and the rejections of peer claims it remembers, oldest first)
DECISION       13  now, {id, spec, rng, subset, live, peers, path, alts, delegable} (before it runs)
DECISION_END   14  now, {id, rows | None, error}                    (after; rows: per instance
                   [uuid, [[source, weight, claim_id, epoch, seq, digest], ...]])
ENGINE         15  now, {config, filters, weighers, path, live}     (the decision engine attached;
                   repeated in every part's base)
NOTE           16  now, text
HOST_MANAGER   17  now, {step, id, ...}                 (a step of a decision made by a host
                   manager outside the engine: nova's handlers in the drop-in; see
                   shared_host_manager/nova/decision_log.py for the steps)
PUBLISHED      20  now, message bytes                  (a reporter's batch, as published)
RX_CELL_STREAM 21  now, cell, stream offset, message bytes[, heard][, effects]  (format 3: a
                   message of that cell's stream, design §4.6; RX_STREAM is the deployment's
                   stream)
=============  ==  ====================================================================
"""

from __future__ import annotations

import glob
import os
import re
import struct

from protocol import hashing

#: the format this code writes: 2 lists the peer claims held in checkpoints, 3 records the
#: cell streams' messages with their cell and offset (RX_CELL_STREAM), 4 a restored view's
#: last heard (RESTORE), 5 a backlog message's publish time (RX_STREAM, RX_CELL_STREAM)
FORMAT = 5


#: the formats this code reads (1: checkpoints without peer claims)
READABLE_FORMATS = (1, 2, 3, 4, 5)


#: the first format whose checkpoints list the peer claims held
PEER_CLAIMS_FORMAT = 2


MAGIC = b"SHMULOG1"


FRAME = struct.Struct("<II")


#: a record larger than this is treated as damage (a flipped length field)
MAX_RECORD_BYTES = 1 << 30


SUFFIX = ".ulog"


DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024


DEFAULT_CHECKPOINT_INTERVAL = 5.0


DEFAULT_BUFFER_BYTES = 256 * 1024


DROPPED_BODY_LIMIT = 64 * 1024


HEADER = 0


RX_STREAM = 1


RX_CONTROL = 2


RX_DROPPED = 3


TICK = 4


CLAIM = 5


RESYNC = 6


HINT = 7


FORGET = 8


RESTORE = 9


TX = 10


CANCEL = 11


CHECKPOINT = 12


DECISION = 13


DECISION_END = 14


ENGINE = 15


NOTE = 16


HOST_MANAGER = 17


PUBLISHED = 20


RX_CELL_STREAM = 21


KIND_NAMES = {
    HEADER: "header", RX_STREAM: "rx_stream", RX_CONTROL: "rx_control", RX_DROPPED: "rx_dropped",
    TICK: "tick", CLAIM: "claim", RESYNC: "resync", HINT: "hint", FORGET: "forget",
    RESTORE: "restore", TX: "tx", CANCEL: "cancel", CHECKPOINT: "checkpoint", DECISION: "decision",
    DECISION_END: "decision_end", ENGINE: "engine", NOTE: "note", HOST_MANAGER: "host_manager",
    PUBLISHED: "published", RX_CELL_STREAM: "rx_cell_stream",
}


SCHEDULER = "scheduler"


REPORTER = "reporter"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name)[:120] or "unnamed"


def log_base(directory: str, role: str, name: str) -> str:
    """The path every file of a log starts with (add ``.0001`` ... for the parts)."""
    return os.path.join(directory, f"{role}-{_safe(name)}{SUFFIX}")


def part_paths(base: str) -> list[str]:
    """The existing parts of the log at ``base``, in order."""
    paths = [p for p in glob.glob(glob.escape(base) + ".*") if re.fullmatch(r"\d{4,}", p[len(base) + 1:])]
    return sorted(paths, key=lambda p: int(p[len(base) + 1:]))


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), hashing.crc32(payload)) + payload


# field types of RECORD_SHAPES
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))

#: kind -> types of the fields after (kind, now); trailing extras (effects) are allowed
RECORD_SHAPES: dict[int, tuple[tuple[type, ...], ...]] = {
    RX_STREAM: (OPT_INT, (bytes,)),
    RX_CELL_STREAM: ((str,), OPT_INT, (bytes,)),
    RX_CONTROL: ((bytes,),),
    RX_DROPPED: ((str,), OPT_INT, (bytes,)),
    TICK: (),
    CLAIM: ((bytes,),),
    RESYNC: ((str,), (bool,)),
    HINT: ((str,),),
    FORGET: ((str,),),
    CANCEL: ((str,), (str,)),
    RESTORE: ((bytes,),),
    TX: (OPT_STR, (bytes,)),
    CHECKPOINT: ((bytes,), (int,), (list,)),
    DECISION: ((dict,),),
    DECISION_END: ((dict,),),
    ENGINE: ((dict,),),
    NOTE: ((str,),),
    HOST_MANAGER: ((dict,),),
    PUBLISHED: ((bytes,),),
}

#: kind -> types of the optional fields that may follow its shape's, before the effects (a
#: field absent from older logs; the effects, a map, are told apart by their type)
RECORD_OPTIONAL: dict[int, tuple[tuple[type, ...], ...]] = {
    RX_STREAM: ((int, float),),
    RX_CELL_STREAM: ((int, float),),
    RESTORE: ((int, float),),
}
