"""The life cycle of one source's view in a receiver, as data.

Theory of operation
-------------------
A scheduler's :class:`~protocol.receiver.ReceiverMachine` holds one view per
source.  Each view is in exactly one of five states, and moves only through
:data:`TRANSITIONS`, a table from (state, event) to the next state.  The
receiver does the classifying: it reads what a step did to a view (a snapshot
installed, a delta buffered past a gap, nothing heard for ``down_interval``...)
as one :class:`Event`, and asks the table where that leaves the view.  A pair
missing from the table is a bug of the receiver, raised as a
:class:`~protocol.errors.LocalProtocolError` naming the state and the event.

Two rules keep this honest:

1. Every change of a view's state goes through the table; the figure and the
   list below are the table drawn, and ``tests/protocol/test_source_state.py``
   checks that they, docs/design.md §4.1 and docs/protocol.md §12 agree, and
   that every (state, event) pair the receiver can reach is in the table.
2. The state says where a view is; the view's data says how far: the held
   version, the reorder buffer, the resync back-off, the pending claims.  The
   one irregularity is DOWN, which keeps that data as it was (a silent source
   still has its resync chased), so coming back up is read as one of three
   events by what the view then holds: ``up`` (a document, nothing missing),
   ``up_behind`` (a document, a gap or resync outstanding) or
   ``up_no_document``.

Per-source life cycle (docs/design.md §4.1)::

               first_word                  in_order                      gap, resync
    UNKNOWN ------------> SYNCING ------------------------> ACTIVE -------------------> BEHIND
    (no view)            (no document;                     (in order;  <-------------- (ACTIVE, behind:
                          a resync out,                     eligible)     in_order      a gap buffered
                          with back-off)                                                or a resync out;
                                                                                        document served)
                           |    ^                            |   ^                       |   ^
                    silent |    | up_no_document     silent, |   | up            silent, |   | up_behind
                           |    |                    goodbye |   |               goodbye |   |
                           v    |                            v   |                       v   |
                          DOWN (no word for down_interval, or the held version said goodbye: not eligible;
                               its document, if any, kept; a resync still chased)

    forget (forget(), from any state) -> UNKNOWN: the view is dropped, its pending claims expire
    stays: SYNCING on resync; BEHIND on gap, resync; DOWN on gap, resync, in_order

The events, as the receiver reads them:

* ``first_word`` -- any item of an unknown source, a hint or ``request_resync()``: the
  view is made (a snapshot of an unknown source then passes straight through SYNCING);
* ``in_order`` -- a view that is not ACTIVE holds a document with nothing buffered and
  no full resync wanted: a snapshot installed (bare, batched, in a resync answer or a
  claim's correction, asked for or not), a gap closed, or a resync answered;
* ``gap`` -- a delta past a gap waits in the reorder buffer;
* ``resync`` -- a resync is needed: a delta or heartbeat of a newer epoch or for a source
  without a document, a gap open past ``reorder_timeout``, a buffer overflow, a heartbeat
  ahead, a digest mismatch, ``request_resync()`` or a hint (the request itself is
  rate-limited with back-off);
* ``silent`` -- nothing heard for ``down_interval`` (checked by ``tick``, and at once for a
  view heard only as of that long ago: a restart's backlog, a restored view);
* ``goodbye`` -- the held version says the source stopped (``service.stopped``, §4.2);
* ``up``, ``up_behind``, ``up_no_document`` -- a DOWN view heard again (any item, resync
  answer or claim result) or given a version that no longer says goodbye;
* ``forget`` -- an operator's ``forget()``.

Transitions (the table, one line per entry)::

    UNKNOWN --first_word--> SYNCING
    SYNCING --resync--> SYNCING
    SYNCING --in_order--> ACTIVE
    SYNCING --silent--> DOWN
    SYNCING --forget--> UNKNOWN
    ACTIVE --gap--> BEHIND
    ACTIVE --resync--> BEHIND
    ACTIVE --silent--> DOWN
    ACTIVE --goodbye--> DOWN
    ACTIVE --forget--> UNKNOWN
    BEHIND --gap--> BEHIND
    BEHIND --resync--> BEHIND
    BEHIND --in_order--> ACTIVE
    BEHIND --silent--> DOWN
    BEHIND --goodbye--> DOWN
    BEHIND --forget--> UNKNOWN
    DOWN --gap--> DOWN
    DOWN --resync--> DOWN
    DOWN --in_order--> DOWN
    DOWN --up--> ACTIVE
    DOWN --up_behind--> BEHIND
    DOWN --up_no_document--> SYNCING
    DOWN --forget--> UNKNOWN

Readers see the coarse :class:`~protocol.receiver.Status` (``SourceView.status``):
SYNCING without a document, DOWN, and ACTIVE for both ACTIVE and BEHIND (a view
behind serves a true past version of its source).

Nothing here does I/O or reads a clock; the module is data and names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class SourceState(enum.StrEnum):
    """Where one source's view is in its life cycle (the module docstring draws it).

    A str enum: the transition table is looked up by (state, event) on every change,
    and str hashing is done in C where a plain Enum's is a Python call.
    """

    UNKNOWN = "unknown"
    SYNCING = "syncing"
    ACTIVE = "active"
    BEHIND = "behind"
    DOWN = "down"


class Event(enum.StrEnum):
    """What a receiver step did to a view, as the table reads it (module docstring)."""

    FIRST_WORD = "first_word"
    IN_ORDER = "in_order"
    GAP = "gap"
    RESYNC = "resync"
    SILENT = "silent"
    GOODBYE = "goodbye"
    UP = "up"
    UP_BEHIND = "up_behind"
    UP_NO_DOCUMENT = "up_no_document"
    FORGET = "forget"


_S, _E = SourceState, Event

#: (state, event) -> next state; the only way a view's state changes
TRANSITIONS: Mapping[tuple[SourceState, Event], SourceState] = {
    (_S.UNKNOWN, _E.FIRST_WORD): _S.SYNCING,
    (_S.SYNCING, _E.RESYNC): _S.SYNCING,
    (_S.SYNCING, _E.IN_ORDER): _S.ACTIVE,
    (_S.SYNCING, _E.SILENT): _S.DOWN,
    (_S.SYNCING, _E.FORGET): _S.UNKNOWN,
    (_S.ACTIVE, _E.GAP): _S.BEHIND,
    (_S.ACTIVE, _E.RESYNC): _S.BEHIND,
    (_S.ACTIVE, _E.SILENT): _S.DOWN,
    (_S.ACTIVE, _E.GOODBYE): _S.DOWN,
    (_S.ACTIVE, _E.FORGET): _S.UNKNOWN,
    (_S.BEHIND, _E.GAP): _S.BEHIND,
    (_S.BEHIND, _E.RESYNC): _S.BEHIND,
    (_S.BEHIND, _E.IN_ORDER): _S.ACTIVE,
    (_S.BEHIND, _E.SILENT): _S.DOWN,
    (_S.BEHIND, _E.GOODBYE): _S.DOWN,
    (_S.BEHIND, _E.FORGET): _S.UNKNOWN,
    # DOWN keeps the view's data as it was: a gap, a resync or its answer change the data,
    # not the state; being heard again leaves by what the view then holds
    (_S.DOWN, _E.GAP): _S.DOWN,
    (_S.DOWN, _E.RESYNC): _S.DOWN,
    (_S.DOWN, _E.IN_ORDER): _S.DOWN,
    (_S.DOWN, _E.UP): _S.ACTIVE,
    (_S.DOWN, _E.UP_BEHIND): _S.BEHIND,
    (_S.DOWN, _E.UP_NO_DOCUMENT): _S.SYNCING,
    (_S.DOWN, _E.FORGET): _S.UNKNOWN,
}


__all__ = ["TRANSITIONS", "Event", "SourceState"]
