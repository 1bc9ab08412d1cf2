"""The receiver-side state machine: a scheduler's view of every source.

Theory of operation
-------------------
We do not have guaranteed delivery: messages are lost, duplicated, delayed
and reordered, sources restart, and schedulers start late.  The machine keeps,
per source, the document at the newest version it could reach *in order*, and
repairs everything else by asking that one source to resync.

Per-source life cycle (docs/design.md §4.1): a view is UNKNOWN (none yet),
SYNCING (no document; a resync request out), ACTIVE (in order; eligible),
BEHIND (ACTIVE, behind: a gap buffered or a resync out, its document still
served) or DOWN (silent for ``down_interval`` or said goodbye; not eligible),
and forget() removes a view from any state.  :mod:`protocol.source_state`
draws the life cycle and holds its transitions as a table; this machine only
reads what a step did to a view as one of that module's events and moves the
view through the table (:meth:`ReceiverMachine._move`), never by hand.

Rules for a delta of the held epoch: seq = held+1 applies (then any buffered
successors); seq <= held is a duplicate (dropped, counted); seq > held+1 is a
gap: the delta waits in a reorder buffer, and if the gap does not close within
``reorder_timeout`` (or the buffer overflows) the source is asked to resync
from the held version.  An older epoch is dropped; a newer one is established
only by a snapshot (or a resync answer), never by a delta.  Resync requests
are rate-limited per source with exponential backoff.

Pending-claim ledger (per source)::

    add_claim() --> PENDING --(delta or snapshot lists it)-----> retired: "included"
                          |---(claim result: rejected)-------> retired: "rejected"
                          |---(source's epoch changes)-------> retired: "epoch_changed"
                          |---(deadline passes, no word)-----> retired: "expired" (counted);
                          |    (a claim whose instance the source's document lists under
                          |     ``builds`` -- received, not counted yet -- is kept: its
                          |     deadline restarts)
                          |---(the source stops listing the
                          |    build without counting it)----> retired: "dropped"
                          +---(cancel_claim(): build given up)-> retired: "cancelled"

(A replay that starts at an update log's checkpoint puts back the claims held there,
ours and peers', with ``restore_claim()``, their deadlines as they were, and the peers'
rejections remembered there with ``restore_peer_rejections()``.)

A claim is retired exactly once, in the same step that makes its consumption
part of the document, so the usable view (document minus this scheduler's own
pending claims) never subtracts a claim twice nor forgets it early.

Peer claims (docs/design.md §5.2): a live peer casts every claim it sends to
its host to this scheduler too, so that a decision taken here in the few
milliseconds before the host's delta arrives already sees it::

    a peer's Claim --> HELD (deducted like our own, but never an outcome)
                         |---(delta or snapshot lists it)-------> gone (now in the document)
                         |---(the host's rejection, forwarded)--> gone (its correction is
                         |                                         the peer's, not applied)
                         |---(peer_claim_ttl passes, at a tick)-> gone (the verdict or the
                         |                                         delta was lost)
                         +---(source's epoch changes, forget())-> gone

    restore_claim(claim, deadline, peer=True) --> HELD (a replay starting at an update
                                                  log's checkpoint holds what was held there)

A peer claim that arrives after the host already included it (its instance is
in the document) or rejected it (the last ``PEER_REJECTIONS_KEPT`` rejections
are remembered), on another epoch, or for a source without a document, is
ignored: it would count twice or against a past.  It is advice: losing it
costs at most the rejection it would have avoided; a rejected one whose verdict
is lost holds its resources here for at most ``peer_claim_ttl``.

Rules: the clock is an argument; nothing here does I/O; every step returns
the :class:`~protocol.messages.Send` instructions (resync requests) it needs.
The edge drains :meth:`ReceiverMachine.drain_changed` (sources whose view
changed, for incremental indexes) and :meth:`drain_outcomes` (claim outcomes).
A second incremental reader takes its own :meth:`ReceiverMachine.change_feed`:
every feed sees every change once, whoever else drains.

Input: :meth:`ReceiverMachine.receive` dispatches by the message's type through
``_RECEIVE``, a table beside the class (every data item, bare, batched, in a
resync answer or in a claim's correction, then goes through the same rules).
A saved view (a state file, a checkpoint) comes back through
:meth:`ReceiverMachine.restore`: a snapshot, with when its source was last heard.

Planted bugs: the four rules a plausible regression would break (a duplicate
dropped, a delta past a gap held back, pending claims retired on a new epoch,
a rejection's correction applied) are asked of a :class:`ReceiverPolicy`, only
where a rule applies, never on the in-order path.  The default keeps them all;
the fault simulator's own tests inject one that breaks some
(``simulator/faults/planted.py``) and require the simulation to find each.

Observation: whoever must see the steps as they happen (an update log, the
replay's tracer) registers a :class:`ReceiverObserver` with
:meth:`ReceiverMachine.set_observer`; the machine calls it from inside the
step, after the state changed.  Nothing outside this file replaces a method of
the machine or reads its private state (docs/design.md §8).

The contract: docs/design.md §4 (receiving) and §5.2 (the ledger).
"""

from __future__ import annotations

import enum
import heapq
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from protocol.document import CanonicalCache, Document, Op, apply_ops, copy_document
from protocol.errors import LocalProtocolError
from protocol.hostdoc import BUILDS, INSTANCES, said_goodbye
from protocol.messages import (
    NO_EPOCH,
    Batch,
    Claim,
    ClaimResult,
    DataItem,
    Delta,
    Heartbeat,
    Message,
    ResyncAnswer,
    ResyncRequest,
    Send,
    Snapshot,
)
from protocol.source_state import TRANSITIONS, Event, SourceState


class Status(enum.Enum):
    """What readers of a view need of its life cycle: SYNCING (no document), ACTIVE
    (eligible: the states ACTIVE and BEHIND) or DOWN (protocol.source_state)."""

    SYNCING = "syncing"
    ACTIVE = "active"
    DOWN = "down"


# the states the steps compare against, bound once (a module global is cheaper to load
# than an enum member on the per-item path)
_ACTIVE = SourceState.ACTIVE
_DOWN = SourceState.DOWN


class ReceiverPolicy:
    """How a receiver applies the four rules a plausible regression would break (design
    §4.2 and §5.2): the one seam through which the fault simulator's own tests plant bugs.

    This class keeps every rule, and a deployment never passes another.  The tests of
    ``shm faults`` inject a subclass that breaks some (``simulator/faults/planted.py``)
    and require the simulation to find each, so that a regression of the same shape
    would be found too.  The machine asks only where the rule applies: on a duplicate,
    a delta past a gap, an epoch change and a rejection's correction, never on the
    in-order path.
    """

    __slots__ = ()

    def drop_duplicate(self, view: SourceView, delta: Delta) -> bool:
        """A delta at or below the held seq: True drops it (counted); False applies it again."""
        return True

    def hold_past_gap(self, view: SourceView, delta: Delta) -> bool:
        """A delta past a gap: True keeps it in the reorder buffer; False applies it at once."""
        return True

    def retire_on_new_epoch(self, view: SourceView) -> bool:
        """A snapshot of another epoch: True retires the pending claims; False keeps them."""
        return True

    def apply_correction(self, result: ClaimResult) -> bool:
        """A claim result of ours carrying a correction: True applies it; False ignores it."""
        return True


#: the policy of every receiver not given one: every rule kept
KEEP_RULES = ReceiverPolicy()


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"  # informational: the arbiter said yes; still pending until included
    INCLUDED = "included"
    REJECTED = "rejected"
    EPOCH_CHANGED = "epoch_changed"
    EXPIRED = "expired"
    DROPPED = "dropped"  # the source ended the build it listed without counting the instance
    CANCELLED = "cancelled"  # given up by this scheduler (cancel_claim): the build will not happen


#: the receiver's counter (``stats``) of each outcome that retires a claim
OUTCOME_STATS: dict[Outcome, str] = {
    o: f"claims_{'epoch_retired' if o is Outcome.EPOCH_CHANGED else o.value}"
    for o in Outcome if o is not Outcome.ACCEPTED}


@dataclass(slots=True)
class PendingClaim:
    claim: Claim
    deadline: float
    accepted: bool = False


@dataclass(frozen=True, slots=True)
class ViewCut:
    """What :meth:`ReceiverMachine.cut` took: the held views, column by column (lists
    rather than a tuple a view, so that taking it allocates nothing the garbage collector
    tracks: at 100 000 views, a tuple each set off full collections of the whole heap)."""

    sources: list[str]
    epochs: list[int]
    seqs: list[int]
    docs: list[Document]
    #: when each view's source was last heard (``SourceView.last_heard``, the receiver's clock)
    heard: list[float]

    def __len__(self) -> int:
        return len(self.sources)

    def views(self) -> Iterator[tuple[str, int, int, Document]]:
        """``(source, epoch, seq, document)`` a view at a time."""
        return zip(self.sources, self.epochs, self.seqs, self.docs, strict=True)


@dataclass(slots=True)
class SourceView:
    """What one scheduler holds of one source."""

    source: str
    epoch: int = NO_EPOCH
    seq: int = 0
    doc: Document | None = None
    last_heard: float = 0.0
    #: where the view is in its life cycle; moved only by ReceiverMachine._move
    state: SourceState = SourceState.UNKNOWN
    buffer: dict[int, Delta] = field(default_factory=dict)
    gap_since: float | None = None
    resync_sent_at: float | None = None
    resync_attempts: int = 0
    want_full: bool = False
    pending: dict[str, PendingClaim] = field(default_factory=dict)
    pending_usage: dict[str, int] = field(default_factory=dict)
    #: the claims live peers announced on this source and its delta has not listed yet
    peer: dict[str, PendingClaim] = field(default_factory=dict)
    peer_usage: dict[str, int] = field(default_factory=dict)
    _digest: bytes | None = None
    _canonical: CanonicalCache = field(default_factory=CanonicalCache)
    #: ``doc`` is also held by a cut (:meth:`ReceiverMachine.cut`): the next delta copies it
    #: before changing it, so the cut stays as it was taken
    _doc_in_cut: bool = False

    @property
    def status(self) -> Status:
        if self.doc is None:
            return Status.SYNCING
        return Status.DOWN if self.state is _DOWN else Status.ACTIVE

    @property
    def down(self) -> bool:
        """Not eligible: silent for ``down_interval``, or its held version said goodbye."""
        return self.state is _DOWN

    @down.setter
    def down(self, value: bool) -> None:
        """Stage a silent source (tests that build a cloud with some hosts down): the view
        moves as ``tick`` would move it, through the table, without the counters.  Only the
        receiver brings a view back up, by what it hears."""
        if not value:
            raise LocalProtocolError(f"{self.source}: a view comes up only when its source is heard")
        if self.state is not _DOWN:
            self.state = TRANSITIONS[self.state, Event.SILENT]

    @property
    def version(self) -> tuple[int, int]:
        return self.epoch, self.seq

    def digest(self) -> bytes | None:
        if self.doc is None:
            return None
        if self._digest is None:
            self._digest = self._canonical.digest(self.doc)
        return self._digest

    @property
    def known_digest(self) -> bytes | None:
        """The digest if already computed (for a heartbeat check), else None; never computes."""
        return self._digest


class ChangeFeed:
    """One reader's sources whose view changed since it last drained (see
    :meth:`ReceiverMachine.change_feed`)."""

    __slots__ = ("__weakref__", "_pending", "_receiver")

    def __init__(self, receiver: ReceiverMachine) -> None:
        self._receiver = receiver
        self._pending: set[str] = set()

    def drain(self) -> set[str]:
        """The sources whose document, liveness or pending claims changed since the last drain."""
        self._receiver._distribute()
        out, self._pending = self._pending, set()
        return out


class ReceiverObserver(Protocol):
    """What a :class:`ReceiverMachine` tells the one observer it may have.

    A Protocol with no-op defaults: an observer that subclasses it explicitly overrides
    what it watches (the bodies ``return None`` so that a type checker does not take
    them for abstract); anything with every method is an observer too.

    Calls are synchronous, made inside the step after its state change, under
    whatever lock the caller holds.  An observer must not call back into the
    machine, and should not raise: an exception propagates out of the step.

    Transitions, from any step (``receive``, ``tick`` or an entry point):
    """

    def delta_applied(self, view: SourceView, delta: Delta) -> None:
        """``delta`` was applied in order (also when it came out of the reorder buffer)."""
        return None

    def snapshot_applied(self, view: SourceView, snapshot: Snapshot, previous: Document | None) -> None:
        """``snapshot`` replaced the document (``previous``: the one it replaced, None if new)."""
        return None

    def delta_buffered(self, view: SourceView, delta: Delta, new_gap: bool) -> None:
        """``delta`` is ahead of the held version and waits in the reorder buffer."""
        return None

    def resync_requested(self, view: SourceView, request: ResyncRequest) -> None:
        """A resync request for ``view`` is being sent (it is also among the step's sends)."""
        return None

    def claim_resolved(self, claim_id: str, source: str, outcome: Outcome) -> None:
        """A pending claim was retired with ``outcome``, or (ACCEPTED) the arbiter said yes."""
        return None

    def source_moved(self, view: SourceView, event: Event, previous: SourceState) -> None:
        """``view`` went from ``previous`` to ``view.state`` through the table on ``event``
        (also when it stays: the table's self-loops)."""
        return None

    # The entry points a scheduler calls besides receive/tick, after they ran:

    def claim_added(self, claim: Claim, now: float) -> None:
        """:meth:`ReceiverMachine.add_claim` registered ``claim`` as pending."""
        return None

    def claim_cancelled(self, source: str, claim_id: str, cancelled: bool) -> None:
        """:meth:`ReceiverMachine.cancel_claim` ran (``cancelled``: it was pending)."""
        return None

    def resync_asked(self, source: str, now: float, full: bool, sends: list[Send]) -> None:
        """:meth:`ReceiverMachine.request_resync` ran and produced ``sends``."""
        return None

    def source_hinted(self, source: str, now: float, sends: list[Send]) -> None:
        """:meth:`ReceiverMachine.add_source_hint` ran and produced ``sends``."""
        return None

    def source_forgotten(self, source: str) -> None:
        """:meth:`ReceiverMachine.forget` dropped ``source`` (its pending claims expired)."""
        return None


STAT_KEYS = (
    "applied", "duplicates", "stale", "gaps", "buffered", "buffer_overflows", "snapshots",
    "resyncs_requested", "heartbeat_resyncs", "divergences", "epochs_changed", "went_down",
    "came_up", "goodbyes", "claims_added", "claims_included", "claims_rejected", "claims_expired",
    "claims_epoch_retired", "claims_cancelled", "claim_results_late", "claim_results_foreign",
    "peer_claims", "peer_claims_included", "peer_claims_rejected", "peer_claims_expired",
    "peer_claims_ignored", "claims_kept_building", "claims_dropped",
)


#: how many rejections of peers' claims a receiver remembers (see ReceiverMachine._peer_claim)
PEER_REJECTIONS_KEPT = 4096


class ReceiverParams(TypedDict, total=False):
    """The tunables of a :class:`ReceiverMachine` (its keyword arguments), for callers that
    pass them through."""

    reorder_window: int
    reorder_timeout: float
    resync_timeout: float
    resync_backoff_max: float
    down_interval: float
    claim_deadline: float
    peer_claim_ttl: float


class ReceiverMachine:
    """One scheduler's view of all sources; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        reorder_window: int = 64,
        reorder_timeout: float = 0.2,
        resync_timeout: float = 2.0,
        resync_backoff_max: float = 10.0,
        down_interval: float = 30.0,
        claim_deadline: float = 30.0,
        peer_claim_ttl: float = 1.0,
        policy: ReceiverPolicy = KEEP_RULES,
    ) -> None:
        self.name = name
        #: how the rules a regression would break are applied (ReceiverPolicy): all kept,
        #: unless the fault simulator's own tests plant bugs
        self.policy = policy
        self.reorder_window = reorder_window
        self.reorder_timeout = reorder_timeout
        self.resync_timeout = resync_timeout
        self.resync_backoff_max = resync_backoff_max
        self.down_interval = down_interval
        self.claim_deadline = claim_deadline
        #: seconds a peer's announced claim is deducted at most (its host's delta normally
        #: retires it within tens of milliseconds; a rejected or lost one lingers this long)
        self.peer_claim_ttl = peer_claim_ttl
        #: ids of the peer claims whose rejection we heard, oldest first: an announcement
        #: overtaken by its verdict must not be held
        self._peer_rejected: dict[str, None] = {}
        self.sources: dict[str, SourceView] = {}
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        #: the views tick must chase (a gap or a resync outstanding): every SYNCING and
        #: BEHIND view, and a DOWN one that went down so or became so since
        self._troubled: set[str] = set()
        self._deadlines: list[tuple[float, str, str]] = []
        #: sources marked changed and not yet handed to the feeds (see _distribute)
        self._changed: set[str] = set()
        self._feeds: list[weakref.ref[ChangeFeed]] = []
        #: drain_changed's feed (the engine's index reads it)
        self._default_feed = self.change_feed()
        self._outcomes: list[tuple[str, str, Outcome]] = []
        self._alerts: list[str] = []
        self._next_down_scan = 0.0
        self._observer: ReceiverObserver | None = None

    def set_observer(self, observer: ReceiverObserver | None) -> None:
        """Give the machine its observer (None: none); see :class:`ReceiverObserver`."""
        if observer is not None and self._observer is not None and observer is not self._observer:
            raise LocalProtocolError(f"receiver {self.name!r} already has an observer")
        self._observer = observer

    @property
    def observer(self) -> ReceiverObserver | None:
        return self._observer

    # -- reading ---------------------------------------------------------------

    def view(self, source: str) -> SourceView | None:
        return self.sources.get(source)

    def cut(self) -> ViewCut:
        """Every held view's source, epoch, seq and document as of now, in O(sources): the
        documents are shared with the views, not copied, and a view's next delta copies its
        document before changing it (copy on write), so the cut can be read, packed or
        saved after this step, by another thread, while the machine goes on."""
        cut = ViewCut([], [], [], [], [])
        for v in self.sources.values():
            if v.doc is not None:
                v._doc_in_cut = True
                cut.sources.append(v.source)
                cut.epochs.append(v.epoch)
                cut.seqs.append(v.seq)
                cut.docs.append(v.doc)
                cut.heard.append(v.last_heard)
        return cut

    def drain_changed(self) -> set[str]:
        """Sources whose document, liveness or pending claims changed since last drained."""
        return self._default_feed.drain()

    def change_feed(self) -> ChangeFeed:
        """A new reader of what :meth:`drain_changed` reports, from now on, independent of
        every other reader; held weakly (a dropped feed stops costing anything)."""
        self._distribute()
        feed = ChangeFeed(self)
        self._feeds.append(weakref.ref(feed))
        return feed

    def _distribute(self) -> None:
        """Hand the marked sources to every live feed (the steps only mark: one set add)."""
        changed = self._changed
        if not changed:
            return
        self._changed = set()
        live = []
        for ref in self._feeds:
            feed = ref()
            if feed is not None:
                feed._pending |= changed
                live.append(ref)
        self._feeds = live

    def drain_outcomes(self) -> list[tuple[str, str, Outcome]]:
        """(claim_id, source, outcome) for every claim event since last drained."""
        out, self._outcomes = self._outcomes, []
        return out

    def drain_alerts(self) -> list[str]:
        """Problems an operator must see (digest divergences), for the edge to log."""
        out, self._alerts = self._alerts, []
        return out

    def pending_claims(self) -> int:
        return sum(len(v.pending) for v in self.sources.values())

    # -- input -------------------------------------------------------------------

    def receive(self, msg: Message, now: float, heard: float | None = None) -> list[Send]:
        """Take one message in; returns the resync requests it calls for.

        ``heard``: when the message was sent, on this clock, where that is known to be
        earlier than now (a message a restarted scheduler reads from the stream's backlog,
        design §4.4): its source counts as heard then, not now, so that a backlog of a
        source dead since does not make it eligible again (None, or later than now: now)."""
        out: list[Send] = []
        # by exact type, as the codec builds them (_RECEIVE, below the class)
        handler = _RECEIVE.get(type(msg))
        if handler is None:
            raise LocalProtocolError(f"a receiver does not handle {type(msg).__name__}")
        handler(self, msg, now, now if heard is None or heard > now else heard, out)
        return out

    def restore(self, snapshot: Snapshot, now: float, last_heard: float | None = None
                ) -> list[Send]:
        """A saved view fed back (a state file, a checkpoint): taken in as the snapshot it
        is, heard when its source was last heard, ``last_heard`` (this clock; None: now),
        as :meth:`receive` takes a message of a restart's backlog: a source silent for
        ``down_interval`` by then is DOWN at once, and one silent for less goes DOWN when
        the rest of that interval passes without word, as if this scheduler had never
        stopped.  A view held before the call keeps its own ``last_heard`` if later."""
        return self.receive(snapshot, now, last_heard)

    def _batch(self, batch: Batch, now: float, heard: float, out: list[Send]) -> None:
        for item in batch.items:
            self._data(item, now, heard, out)

    def _resync_answer(self, answer: ResyncAnswer, now: float, heard: float,
                       out: list[Send]) -> None:
        for item in answer.items:
            self._data(item, now, heard, out)
        view = self.sources.get(answer.source)
        if view is not None:
            self._heard(view, now, heard)
            view.resync_sent_at = None  # answered: a further need may ask again at once
            self._settle(view, now, out)

    def _move(self, view: SourceView, event: Event) -> None:
        """The one way a view's state changes: through protocol.source_state.TRANSITIONS."""
        previous = view.state
        nxt = TRANSITIONS.get((previous, event))
        if nxt is None:
            raise LocalProtocolError(
                f"view of {view.source}: no transition for event {event.value!r} in state "
                f"{previous.value!r} (protocol.source_state.TRANSITIONS)")
        view.state = nxt
        if self._observer is not None:
            self._observer.source_moved(view, event, previous)

    def _view(self, source: str, now: float, heard: float | None = None) -> SourceView:
        """The view of ``source``, made if there is none: first heard at ``heard`` (None:
        now)."""
        view = self.sources.get(source)
        if view is None:
            view = self.sources[source] = SourceView(
                source, last_heard=now if heard is None else heard)
            self._move(view, Event.FIRST_WORD)
        return view

    def _alive(self, view: SourceView, now: float) -> bool:
        """Heard within ``down_interval`` (tick moves a view that is not DOWN)."""
        return view.last_heard >= now - self.down_interval

    def _went_silent(self, view: SourceView) -> None:
        """Not heard for ``down_interval``: DOWN, not eligible."""
        self._move(view, Event.SILENT)
        self.stats["went_down"] += 1
        self._changed.add(view.source)

    def _heard(self, view: SourceView, now: float, heard: float) -> None:
        """Any message from a source is proof of life (a delta as much as a heartbeat)
        as of when it was sent, unless the document it holds is the source's goodbye
        (design §4.2): a message sent ``down_interval`` ago does not bring a view up."""
        if heard > view.last_heard:
            view.last_heard = heard
        if view.state is _DOWN and not said_goodbye(view.doc) and self._alive(view, now):
            self._came_up(view)

    def _came_up(self, view: SourceView) -> None:
        """A DOWN view is up again: where to is read from what it holds (source_state)."""
        if view.doc is None:
            self._move(view, Event.UP_NO_DOCUMENT)
        elif view.source in self._troubled:
            self._move(view, Event.UP_BEHIND)
        else:
            self._move(view, Event.UP)
        self.stats["came_up"] += 1
        self._changed.add(view.source)

    def _data(self, item: DataItem, now: float, heard: float, out: list[Send]) -> None:
        view = self._view(item.source, now, heard)
        self._heard(view, now, heard)
        if type(item) is Delta:
            self._delta(view, item, now, out)
            self._goodbye(view, now)
        elif type(item) is Snapshot:
            self._snapshot(view, item, now, out)
            self._goodbye(view, now)
        else:
            self._heartbeat(view, item, now, out)
        if view.state is not _DOWN and not self._alive(view, now):
            # heard only as of long ago (a restart's backlog, a restored view): DOWN now,
            # not at the next look for silent views
            self._went_silent(view)

    def _goodbye(self, view: SourceView, now: float) -> None:
        """A source that stopped cleanly says so in its last version (``service.stopped``):
        its view goes DOWN at once instead of after ``down_interval``; a later version
        without it (the source's next epoch) brings it up, if heard within that interval
        (design §4.2)."""
        gone = said_goodbye(view.doc)
        if gone and view.state is not _DOWN:
            self._move(view, Event.GOODBYE)
            self.stats["goodbyes"] += 1
            self._changed.add(view.source)
        elif not gone and view.state is _DOWN and view.doc is not None and self._alive(view, now):
            self._came_up(view)

    def _delta(self, view: SourceView, delta: Delta, now: float, out: list[Send]) -> None:
        if view.doc is None or delta.epoch > view.epoch:
            # Only a snapshot can establish a source or a new epoch; the one we ask
            # for is cut after this delta was sent, so dropping it loses nothing.
            self._resync(view, now, out)
            return
        if delta.epoch < view.epoch:
            self.stats["stale"] += 1
            return
        if delta.seq != view.seq + 1:
            # off the in-order path: the policy is asked whether the rule holds
            if delta.seq <= view.seq:
                if self.policy.drop_duplicate(view, delta):
                    self.stats["duplicates"] += 1
                    return
                self._apply(view, delta)
                return
            if self.policy.hold_past_gap(view, delta):
                self._hold_past_gap(view, delta, now, out)
                return
        self._apply(view, delta)
        if view.state is not _ACTIVE:
            # an ACTIVE view has nothing buffered and nothing outstanding: nothing to settle
            self._drain_buffer(view)
            self._settle(view, now, out)

    def _hold_past_gap(self, view: SourceView, delta: Delta, now: float, out: list[Send]) -> None:
        """Keep a delta past a gap in the reorder buffer until the gap closes (or times out)."""
        if delta.seq in view.buffer:
            self.stats["duplicates"] += 1
            return
        new_gap = view.gap_since is None
        if new_gap:
            view.gap_since = now
            self.stats["gaps"] += 1
        if len(view.buffer) >= self.reorder_window:
            self.stats["buffer_overflows"] += 1
            view.buffer.clear()
            self._resync(view, now, out)
            return
        view.buffer[delta.seq] = delta
        self.stats["buffered"] += 1
        self._troubled.add(view.source)
        self._move(view, Event.GAP)
        if self._observer is not None:
            self._observer.delta_buffered(view, delta, new_gap)

    def _apply(self, view: SourceView, delta: Delta) -> None:
        """Apply the next delta to the view's document (held: the caller checked)."""
        doc = view.doc
        assert doc is not None
        if view._doc_in_cut:
            view.doc = doc = copy_document(doc)
            view._doc_in_cut = False
        building = _builds_before(view, doc, delta.ops)
        apply_ops(doc, delta.ops)
        view.seq = delta.seq
        view._digest = None
        view._canonical.invalidate(delta.ops)
        self.stats["applied"] += 1
        self._changed.add(view.source)
        if self._observer is not None:
            self._observer.delta_applied(view, delta)
        if delta.claims and view.pending:
            for claim_id in delta.claims:
                if claim_id in view.pending:
                    self._retire(view, claim_id, Outcome.INCLUDED)
        if building:
            self._drop_ended_builds(view, building)
        if delta.claims and view.peer:
            for claim_id in delta.claims:
                if claim_id in view.peer:
                    self._drop_peer(view, claim_id, "peer_claims_included")

    def _drain_buffer(self, view: SourceView) -> None:
        buffer = view.buffer
        if not buffer:
            return
        while True:
            nxt = buffer.pop(view.seq + 1, None)
            if nxt is None:
                break
            self._apply(view, nxt)
        for seq in [s for s in buffer if s <= view.seq]:
            del buffer[seq]

    def _snapshot(self, view: SourceView, snap: Snapshot, now: float, out: list[Send]) -> None:
        if view.doc is not None:
            if snap.epoch < view.epoch:
                self.stats["stale"] += 1
                return
            if snap.epoch == view.epoch and (
                snap.seq < view.seq or (snap.seq == view.seq and not view.want_full)
            ):
                self.stats["duplicates"] += 1
                return
        if snap.epoch != view.epoch:
            if view.doc is not None:
                self.stats["epochs_changed"] += 1
            # A claim the new epoch's document still carries was applied before the
            # restart: it is included, not lost (retiring it as epoch_changed would make
            # the tracker place the instance a second time).
            listed = set(snap.claims)
            if view.pending and self.policy.retire_on_new_epoch(view):
                for claim_id in list(view.pending):
                    self._retire(view, claim_id,
                                 Outcome.INCLUDED if claim_id in listed else Outcome.EPOCH_CHANGED)
            for claim_id in list(view.peer):
                self._drop_peer(view, claim_id, "peer_claims_included" if claim_id in listed
                                else "peer_claims_expired")
            view.buffer.clear()
        previous = view.doc
        building = _builds_before(view, previous, None)
        view.doc = copy_document(snap.doc)
        view._doc_in_cut = False
        view.epoch = snap.epoch
        view.seq = snap.seq
        view._digest = None
        view._canonical.clear()
        view.want_full = False
        self.stats["snapshots"] += 1
        self._changed.add(view.source)
        if self._observer is not None:
            self._observer.snapshot_applied(view, snap, previous)
        if view.pending:
            for claim_id in snap.claims:
                if claim_id in view.pending:
                    self._retire(view, claim_id, Outcome.INCLUDED)
        if building:
            self._drop_ended_builds(view, building)
        if view.peer:
            for claim_id in snap.claims:
                if claim_id in view.peer:
                    self._drop_peer(view, claim_id, "peer_claims_included")
        self._drain_buffer(view)
        self._settle(view, now, out)

    def _heartbeat(self, view: SourceView, hb: Heartbeat, now: float, out: list[Send]) -> None:
        if view.doc is None or hb.epoch > view.epoch:
            self._resync(view, now, out)
        elif hb.epoch < view.epoch:
            self.stats["stale"] += 1
        elif hb.seq > view.seq:
            if view.resync_sent_at is None:
                self.stats["heartbeat_resyncs"] += 1
            self._resync(view, now, out)
        elif hb.seq == view.seq and (held := view.digest()) != hb.digest:
            self.stats["divergences"] += 1
            self._alerts.append(
                f"view of {view.source} diverged at version {view.epoch}:{view.seq} "
                f"(digest {held.hex() if held else None} != source's {hb.digest.hex()}); full resync")
            view.want_full = True
            self._resync(view, now, out)

    # -- resync ----------------------------------------------------------------

    def _resync(self, view: SourceView, now: float, out: list[Send]) -> None:
        self._troubled.add(view.source)
        self._move(view, Event.RESYNC)
        if view.resync_sent_at is not None and now < self._retry_at(view.resync_sent_at,
                                                                    view.resync_attempts):
            return
        view.resync_sent_at = now
        view.resync_attempts += 1
        self.stats["resyncs_requested"] += 1
        held = view.doc is not None
        request = ResyncRequest(view.source, self.name, view.epoch if held else NO_EPOCH,
                                view.seq if held else 0, view.want_full or not held)
        out.append(Send(view.source, request))
        if self._observer is not None:
            self._observer.resync_requested(view, request)

    def _retry_at(self, sent_at: float, attempts: int) -> float:
        """When a resync request sent at ``sent_at`` (the ``attempts``-th) may be repeated."""
        wait: float = min(self.resync_timeout * 2 ** max(attempts - 1, 0), self.resync_backoff_max)
        return sent_at + wait

    def _settle(self, view: SourceView, now: float, out: list[Send]) -> None:
        """Forget a source's trouble once it is in order again."""
        if view.buffer:
            if view.gap_since is None:
                view.gap_since = now
            return
        view.gap_since = None
        if view.doc is not None and not view.want_full and view.state is not _ACTIVE:
            # (an ACTIVE view has no resync state to forget; a SYNCING one may hold a
            # document here without ever having asked: a snapshot came unasked)
            view.resync_sent_at = None
            view.resync_attempts = 0
            self._troubled.discard(view.source)
            self._move(view, Event.IN_ORDER)

    # -- claims ----------------------------------------------------------------

    def add_claim(self, claim: Claim, now: float) -> None:
        """Deduct a claim this scheduler decided, until the source resolves it."""
        view = self.sources.get(claim.source)
        if view is None or view.doc is None:
            raise LocalProtocolError(f"claim on {claim.source!r}, which this view does not hold")
        if claim.claim_id in view.pending:
            raise LocalProtocolError(f"claim {claim.claim_id} is already pending")
        self._hold(view.pending, view.pending_usage, claim, now + self.claim_deadline)
        self.stats["claims_added"] += 1
        self._changed.add(claim.source)
        if self._observer is not None:
            self._observer.claim_added(claim, now)

    def cancel_claim(self, source: str, claim_id: str) -> bool:
        """Stop deducting a pending claim whose build this scheduler gave up.

        For a caller that abandons a decision after recording its claim (nova
        removing the placement allocations of a multi-create it could not place
        entirely): without this the claim would hold its resources in the view
        until its deadline.  Should the arbiter accept the claim anyway, the
        host's next delta carries the consumption; until then this view counts
        that host emptier than it is, which costs at most a rejected claim,
        never an overcommit.  Returns False when the claim is not pending.
        """
        view = self.sources.get(source)
        cancelled = False
        if view is not None and claim_id in view.pending:
            self._retire(view, claim_id, Outcome.CANCELLED)
            cancelled = True
        if self._observer is not None:
            self._observer.claim_cancelled(source, claim_id, cancelled)
        return cancelled

    def _retire(self, view: SourceView, claim_id: str, outcome: Outcome) -> None:
        pending = view.pending.pop(claim_id)
        _release(view.pending_usage, pending.claim.resources)
        self.stats[OUTCOME_STATS[outcome]] += 1
        self._outcomes.append((claim_id, view.source, outcome))
        self._changed.add(view.source)
        if self._observer is not None:
            self._observer.claim_resolved(claim_id, view.source, outcome)

    def _peer_claim(self, claim: Claim, now: float, heard: float, out: list[Send]) -> None:
        """A live peer's claim, announced to us: deduct it until its host lists it (module
        docstring).  Not our ledger: it never yields an outcome, and our tracker never sees it."""
        view = self.sources.get(claim.source)
        if (claim.scheduler == self.name or view is None or view.doc is None
                or claim.epoch != view.epoch or claim.claim_id in view.pending
                or claim.claim_id in self._peer_rejected
                or (claim.instance and claim.instance in (view.doc.get(INSTANCES) or {}))):
            # ours (echoed back), a source or epoch we do not hold, already rejected or
            # already included
            self.stats["peer_claims_ignored"] += 1
            return
        if claim.claim_id in view.peer:
            self.stats["duplicates"] += 1
            return
        self._hold(view.peer, view.peer_usage, claim, now + self.peer_claim_ttl)
        self.stats["peer_claims"] += 1
        self._changed.add(claim.source)

    def restore_claim(self, claim: Claim, deadline: float, *, peer: bool = False,
                      accepted: bool = False) -> bool:
        """Hold a claim until ``deadline`` as this scheduler held it at an update log's
        checkpoint -- ours (pending, ``accepted`` as it was) or, with ``peer``, a peer's --
        for a replay that starts there (design §8), so that it holds what the scheduler held
        instead of only the claims made or announced after it.  The claim was checked when
        it was made or arrived; only a view that holds its source at its epoch takes it,
        once (False otherwise).  Not an observed step: a live scheduler never calls it."""
        view = self.sources.get(claim.source)
        if view is None or view.doc is None or claim.epoch != view.epoch:
            return False
        ledger = view.peer if peer else view.pending
        if claim.claim_id in ledger:
            return False
        self._hold(ledger, view.peer_usage if peer else view.pending_usage, claim, deadline)
        if peer:
            self.stats["peer_claims"] += 1
        else:
            ledger[claim.claim_id].accepted = accepted
            self.stats["claims_added"] += 1
        self._changed.add(claim.source)
        return True

    def peer_rejections(self) -> list[str]:
        """The ids of the peer claims whose rejection this receiver remembers, oldest first
        (an update log's part base lists them, design §8)."""
        return list(self._peer_rejected)

    def restore_peer_rejections(self, claim_ids: list[str]) -> None:
        """Remember these rejections of peer claims, as :meth:`peer_rejections` listed them
        at an update log's checkpoint, for a replay that starts there (design §8)."""
        rejected = self._peer_rejected
        for claim_id in claim_ids:
            rejected[claim_id] = None
        while len(rejected) > PEER_REJECTIONS_KEPT:
            del rejected[next(iter(rejected))]

    def _hold(self, ledger: dict[str, PendingClaim], usage: dict[str, int], claim: Claim,
              deadline: float) -> None:
        """Put a claim in one of a view's ledgers (ours or the peers') until ``deadline``."""
        ledger[claim.claim_id] = PendingClaim(claim, deadline)
        for resource, amount in claim.resources.items():
            usage[resource] = usage.get(resource, 0) + amount
        heapq.heappush(self._deadlines, (deadline, claim.claim_id, claim.source))

    def _drop_peer(self, view: SourceView, claim_id: str, counter: str) -> None:
        held = view.peer.pop(claim_id)
        _release(view.peer_usage, held.claim.resources)
        self.stats[counter] += 1
        self._changed.add(view.source)

    def _claim_result(self, result: ClaimResult, now: float, heard: float,
                      out: list[Send]) -> None:
        if result.scheduler != self.name:
            # an answer to another scheduler's claim: none of it is ours to apply, not even
            # its correction (design §7.4); but the host's rejection of a peer claim we hold
            # (forwarded by that peer, design §5.2) ends it
            view = self.sources.get(result.source)
            if result.accepted or view is None:
                self.stats["claim_results_foreign"] += 1
                return
            rejected = self._peer_rejected
            rejected[result.claim_id] = None
            while len(rejected) > PEER_REJECTIONS_KEPT:
                del rejected[next(iter(rejected))]
            if result.claim_id in view.peer:
                self._drop_peer(view, result.claim_id, "peer_claims_rejected")
            else:  # not held (yet): remembered, so that a late announcement is ignored
                self.stats["claim_results_foreign"] += 1
            return
        view = self.sources.get(result.source)
        if view is None:
            return
        self._heard(view, now, heard)
        if result.correction and self.policy.apply_correction(result):
            for item in result.correction:
                self._data(item, now, heard, out)
        pending = view.pending.get(result.claim_id)
        if pending is None:
            # An acceptance usually arrives after the delta that listed the claim
            # retired it; only a rejection for an already-retired claim is late.
            if not result.accepted:
                self.stats["claim_results_late"] += 1
            return
        if result.accepted:
            if not pending.accepted:
                pending.accepted = True
                self._outcomes.append((result.claim_id, view.source, Outcome.ACCEPTED))
                if self._observer is not None:
                    self._observer.claim_resolved(result.claim_id, view.source, Outcome.ACCEPTED)
                # The arbiter answered: the delta listing the claim (or a snapshot after
                # a gap) will retire it. The deadline restarts only as a safety net.
                pending.deadline = now + self.claim_deadline
                heapq.heappush(self._deadlines, (pending.deadline, result.claim_id, view.source))
        else:
            self._retire(view, result.claim_id, Outcome.REJECTED)

    # -- time ------------------------------------------------------------------

    def tick(self, now: float) -> list[Send]:
        """Expire claims, mark silent sources down, and chase gaps and unanswered resyncs."""
        out: list[Send] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, claim_id, source = heapq.heappop(deadlines)
            view = self.sources.get(source)
            if view is None:
                continue
            pending = view.pending.get(claim_id)
            if pending is not None and pending.deadline <= now:
                if self._building(view, pending.claim):
                    # the host has the build and has not counted it yet (queued behind its
                    # build slots): the wall clock says nothing about it, the host's next
                    # word does -- it lists the instance, or drops the build
                    pending.deadline = now + self.claim_deadline
                    heapq.heappush(deadlines, (pending.deadline, claim_id, source))
                    self.stats["claims_kept_building"] += 1
                    continue
                self._retire(view, claim_id, Outcome.EXPIRED)
                continue
            held = view.peer.get(claim_id)
            if held is not None and held.deadline <= now:
                self._drop_peer(view, claim_id, "peer_claims_expired")
        for source in list(self._troubled):
            view = self.sources[source]
            if view.buffer and view.gap_since is not None and view.gap_since + self.reorder_timeout <= now:
                self._resync(view, now, out)
            elif view.resync_sent_at is not None or view.doc is None or view.want_full:
                self._resync(view, now, out)
        if now >= self._next_down_scan:
            self._next_down_scan = now + min(1.0, self.down_interval / 4)
            limit = now - self.down_interval
            for view in self.sources.values():
                if view.state is not _DOWN and view.last_heard < limit:
                    self._went_silent(view)
        return out

    def _drop_ended_builds(self, view: SourceView, building: frozenset[str]) -> None:
        """Retire, as dropped, the pending claims of the instances ``building`` held (the
        source's ``builds`` before the step) that the step's document neither lists among its
        builds nor counts: the source ended those builds without them (a compute that refused
        the build, whose alternate nova's conductor tries), so nothing of them will come."""
        doc = view.doc
        assert doc is not None
        listed = doc.get(BUILDS) or {}
        counted = doc.get(INSTANCES) or {}
        ended = {i for i in building if i not in listed and i not in counted}
        if ended:
            for claim_id in [c for c, p in view.pending.items() if p.claim.instance in ended]:
                self._retire(view, claim_id, Outcome.DROPPED)

    @staticmethod
    def _building(view: SourceView, claim: Claim) -> bool:
        """The source's document lists the claim's instance among the builds it received
        and has not finished (protocol.hostdoc BUILDS)."""
        return bool(claim.instance) and view.doc is not None \
            and claim.instance in (view.doc.get(BUILDS) or {})

    def next_deadline(self) -> float:
        """Clock value by which :meth:`tick` should run again."""
        nxt = self._next_down_scan
        if self._deadlines:
            nxt = min(nxt, self._deadlines[0][0])
        if self._troubled:
            # an unanswered request is repeated only after its backoff, even for a
            # timed-out gap (else this deadline stays in the past and the edge spins)
            nxt = min(nxt, min(
                self._retry_at(v.resync_sent_at, v.resync_attempts) if v.resync_sent_at is not None
                else (v.gap_since + self.reorder_timeout) if v.buffer and v.gap_since is not None
                else self.resync_timeout
                for v in (self.sources[s] for s in self._troubled)))
        return nxt

    def request_resync(self, source: str, now: float, *, full: bool = False) -> list[Send]:
        """Ask ``source`` for what this view misses (e.g. the stream lost our offset)."""
        out: list[Send] = []
        view = self._view(source, now)
        if full:
            view.want_full = True
        self._resync(view, now, out)
        if self._observer is not None:
            self._observer.resync_asked(source, now, full, out)
        return out

    def add_source_hint(self, source: str, now: float) -> list[Send]:
        """Ask a source we know of (e.g. from configuration) for its state on cold start."""
        out: list[Send] = []
        view = self._view(source, now)
        if view.doc is None:
            self._resync(view, now, out)
        if self._observer is not None:
            self._observer.source_hinted(source, now, out)
        return out

    def forget(self, source: str) -> None:
        """Drop a source entirely (an operator removed it); its pending claims expire now."""
        view = self.sources.get(source)
        if view is None:
            return
        for claim_id in list(view.pending):
            self._retire(view, claim_id, Outcome.EXPIRED)
        self._move(view, Event.FORGET)
        del self.sources[source]
        self._troubled.discard(source)
        self._changed.add(source)
        if self._observer is not None:
            self._observer.source_forgotten(source)


#: receive's dispatch, by the message's exact type (the codec builds no subclasses); each
#: handler takes the message of the type it is listed under
_RECEIVE: dict[type, Callable[[ReceiverMachine, Any, float, float, list[Send]], None]] = {
    Batch: ReceiverMachine._batch,
    Delta: ReceiverMachine._data,
    Snapshot: ReceiverMachine._data,
    Heartbeat: ReceiverMachine._data,
    ResyncAnswer: ReceiverMachine._resync_answer,
    ClaimResult: ReceiverMachine._claim_result,
    Claim: ReceiverMachine._peer_claim,
}


__all__ = ["KEEP_RULES", "OUTCOME_STATS", "ChangeFeed", "Event", "Outcome", "PendingClaim", "ReceiverMachine",
           "ReceiverObserver", "ReceiverParams", "ReceiverPolicy", "ResyncRequest", "SourceState",
           "SourceView", "Status"]


def _builds_before(view: SourceView, doc: Document | None, ops: list[Op] | None
                   ) -> frozenset[str]:
    """The instances ``doc`` lists among its builds, where a step that may change them
    (``ops`` touching ``builds``, or a whole document: None) meets pending claims; else none."""
    if not view.pending or doc is None or BUILDS not in doc:
        return frozenset()
    if ops is not None and not any(op[1] == BUILDS for op in ops):
        return frozenset()
    return frozenset(doc[BUILDS])


def _release(usage: dict[str, int], resources: Mapping[str, int]) -> None:
    """Take a claim's resources out of a ledger's usage (a resource at 0 leaves the map)."""
    for resource, amount in resources.items():
        left = usage.get(resource, 0) - amount
        if left:
            usage[resource] = left
        else:
            usage.pop(resource, None)
