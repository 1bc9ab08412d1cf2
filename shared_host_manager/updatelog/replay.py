"""Replaying update logs (see :mod:`shared_host_manager.updatelog.recorder` for the format).

Theory of operation
-------------------
A scheduler's log is replayed by feeding every recorded input, with its
recorded clock value, to a fresh :class:`~protocol.receiver.ReceiverMachine`
built with the recorded parameters — the same receiver code the cache runs,
through the same entry points (``receive``, ``tick``, ``add_claim``,
``request_resync``, ``add_source_hint``, ``forget``).  Bytes are decoded by
the protocol's :class:`~protocol.codec.Decoder`; signatures were checked when
the message was received (an invalid message is recorded as dropped and not
replayed), so the replay trusts them instead of needing the keys.  A new
session (a restarted scheduler) starts a new receiver, as the process did.

What is checked, at every record (docs/design.md §6, invariant 5)::

    every step      the resync requests the step sent and the claim outcomes it
                    produced equal the recorded ones ("effects")
    CHECKPOINT      every view's (version, document digest, down, pending claims, peer
                    claims held) equals the recorded one, and so does the combined hash
    DECISION_END    the views the decision was based on have the recorded version and digest
    --decisions     the decision, re-run on the replayed view with the recorded RNG
                    and subset state, picks the same hosts with the same weights
    HOST_MANAGER    (--decisions) a step of a decision made outside the engine (nova's
                    handlers in the drop-in), re-run by the :class:`HostManagerReplayer`
                    the caller gives (shared_host_manager.nova.replay.steps), which compares it

A reporter's log is replayed by feeding what it *published*, in order, to a
receiver: the result is the authoritative sequence of every source's versions
(its heartbeats' digests are checked on the way), which ``--diff`` can hold a
scheduler's log against.

Damage: :class:`LogReader` stops at the first record it cannot read (short
frame, implausible length, checksum mismatch, undecodable or malformed
record) and says at which byte offset of which file, and at which record;
everything before it is replayed.  Damage at the end of a session followed by
a file of a new session (a crash, then a restart) only ends that session.
Nothing in a log can make the replay raise: a record that cannot be applied
is reported like damage.

Observation (``--history``, ``--diff``): a :class:`Tracer` is the replayed
receiver's :class:`~protocol.receiver.ReceiverObserver` and only notes what
happened (versions applied, gaps, resync requests), so the state the replay
reaches is the one a plain receiver reaches (docs/design.md §8).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.codec import Decoder, encode
from protocol.document import DEL, DROP, SET, Document, Op, diff
from protocol.errors import ProtocolError
from protocol.messages import (
    Batch,
    CheckpointAsk,
    Claim,
    ClaimResult,
    DataItem,
    Delta,
    Heartbeat,
    Message,
    ResyncAnswer,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
    Send,
    Snapshot,
)
from protocol.receiver import ReceiverMachine, ReceiverObserver, SourceView
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, Delegated, NoValidHost
from shared_host_manager.updatelog import format as fmt
from shared_host_manager.updatelog.format import (
    CANCEL,
    CHECKPOINT,
    CLAIM,
    DECISION,
    DECISION_END,
    ENGINE,
    FORGET,
    HEADER,
    HINT,
    HOST_MANAGER,
    KIND_NAMES,
    MAX_RECORD_BYTES,
    NOTE,
    PUBLISHED,
    RECEIVER_PARAMS,
    RESTORE,
    RESYNC,
    RX_CELL_STREAM,
    RX_CONTROL,
    RX_DROPPED,
    RX_STREAM,
    TICK,
    TX,
    ViewStates,
    state_from_wire,
)
from shared_host_manager.updatelog.reader import BadRecord, Damage, LogReader, Record

# --------------------------------------------------------------------------
# reading




# --------------------------------------------------------------------------
# observation: versions, gaps and resyncs per source (for --history and --diff)


@dataclass(slots=True)
class Version:
    epoch: int
    seq: int
    how: str  # "delta" | "snapshot"
    plane: str  # "stream" | "resync" | "correction" | "restore" | "published"
    record: int
    now: float
    reordered: bool = False
    claims: list[str] = field(default_factory=list)
    ops: list[Op] | None = None
    detail: str = ""
    digest: bytes | None = None

    @property
    def version(self) -> tuple[int, int]:
        return self.epoch, self.seq


@dataclass(slots=True)
class Event:
    record: int
    now: float
    kind: str  # gap | resync_requested | resync_answered | claim_added | claim_outcome | claim_result |
    #            down | up | claim_received
    text: str
    data: dict[str, Any] = field(default_factory=dict)


class _Step:
    __slots__ = ("record", "now", "kind", "plane", "msg", "keys", "detail")

    def __init__(self, record: int, now: float, kind: int, plane: str, msg: Message | None,
                 detail: str) -> None:
        self.record = record
        self.now = now
        self.kind = kind
        self.plane = plane
        self.msg = msg
        self.detail = detail
        self.keys: set[tuple[str, int, int]] = set()
        if msg is not None:
            for item in _items(msg):
                if type(item) is Delta:
                    self.keys.add((item.source, item.epoch, item.seq))


def _items(msg: Message | None) -> Sequence[DataItem]:
    """The data items ``msg`` carries (itself for a data item)."""
    if isinstance(msg, (Batch, ResyncAnswer)):
        return msg.items
    if isinstance(msg, ClaimResult):
        return msg.correction
    if isinstance(msg, (Delta, Snapshot, Heartbeat)):
        return [msg]
    return []


class Tracer(ReceiverObserver):
    """Per source: every version reached (how and when) and the events around it."""

    def __init__(self, only: set[str] | None = None, keep_ops: bool = False) -> None:
        self.only = only
        self.keep_ops = keep_ops
        self.versions: dict[str, list[Version]] = {}
        self.events: dict[str, list[Event]] = {}
        self.stream_gaps: list[Event] = []
        self.step: _Step | None = None
        self._arrived: dict[tuple[str, int, int], tuple[str, int]] = {}
        self._touched: set[str] = set()
        self._down: dict[str, bool] = {}
        self._docs: dict[str, Any] = {}

    def wants(self, source: str) -> bool:
        return self.only is None or source in self.only

    def event(self, source: str, kind: str, text: str, **data: Any) -> None:
        if self.wants(source) and self.step is not None:
            self.events.setdefault(source, []).append(
                Event(self.step.record, self.step.now, kind, text, data))

    @property
    def current(self) -> _Step:
        """The step being replayed: the receiver tells its observer only inside one."""
        step = self.step
        if step is None:
            raise RuntimeError("a receiver transition outside a replayed step")
        return step

    # -- called around every replayed step ----------------------------------------

    def begin(self, step: _Step) -> None:
        self.step = step
        self._touched.clear()

    def end(self, receiver: ReceiverMachine) -> None:
        for source in self._touched:
            view = receiver.sources.get(source)
            entries = self.versions.get(source)
            if view is not None and entries and entries[-1].version == view.version:
                entries[-1].digest = view.digest()
        if self.only is not None:
            for source in self.only:
                view = receiver.sources.get(source)
                down = view.down if view is not None else False
                if down != self._down.get(source, False):
                    self.event(source, "down" if down else "up",
                               "marked down (no word for down_interval)" if down else "heard again")
                    self._down[source] = down

    def new_session(self) -> None:
        self._arrived.clear()
        self._down.clear()
        self._docs.clear()

    # -- the receiver's observer ---------------------------------------------------------

    def _add(self, source: str, entry: Version) -> None:
        entries = self.versions.setdefault(source, [])
        if entries and entry.version <= entries[-1].version:
            return  # re-established after a restart: not a new version
        entries.append(entry)
        self._touched.add(source)

    def delta_applied(self, view: SourceView, delta: Delta) -> None:
        source = delta.source
        if not self.wants(source):
            return
        step = self.current
        key = (source, delta.epoch, delta.seq)
        plane, reordered, record = step.plane, False, step.record
        if key not in step.keys:
            arrived = self._arrived.pop(key, None)
            reordered = True
            if arrived is not None:
                plane, record = arrived
        else:
            self._arrived.pop(key, None)
        self._add(source, Version(delta.epoch, delta.seq, "delta", plane, step.record, step.now,
                                  reordered, list(delta.claims),
                                  delta.ops if self.keep_ops else None,
                                  f"arrived at record {record}" if reordered else step.detail))

    def snapshot_applied(self, view: SourceView, snap: Snapshot, old_doc: Document | None) -> None:
        source = snap.source
        if not self.wants(source):
            return
        step = self.current
        ops = None
        if self.keep_ops and old_doc is not None and view.doc is not None:
            ops = diff(old_doc, view.doc)
        self._add(source, Version(snap.epoch, snap.seq, "snapshot", step.plane, step.record,
                                  step.now, False, list(snap.claims), ops, step.detail))

    def delta_buffered(self, view: SourceView, delta: Delta, new_gap: bool) -> None:
        if not self.wants(delta.source):
            return
        step = self.current
        self._arrived[(delta.source, delta.epoch, delta.seq)] = (step.plane, step.record)
        if new_gap:
            self.event(delta.source, "gap",
                       f"gap: delta {delta.seq} arrived while holding {view.seq}",
                       held=view.seq, arrived=delta.seq, epoch=delta.epoch)

    def resync_requested(self, view: SourceView, req: ResyncRequest) -> None:
        if not self.wants(view.source):
            return
        step = self.current
        if view.doc is None:
            reason = "source not held yet"
        elif view.want_full:
            reason = "digest divergence"
        elif view.buffer:
            reason = "gap not closed within reorder_timeout" if step.kind == TICK else "reorder buffer full"
        elif any(isinstance(i, Heartbeat) and i.source == view.source
                 and (i.epoch, i.seq) > (view.epoch, view.seq) for i in _items(step.msg)):
            hb = next(i for i in _items(step.msg) if isinstance(i, Heartbeat) and i.source == view.source)
            reason = f"heartbeat ahead (source at {hb.epoch}:{hb.seq})"
        elif step.kind == TICK:
            reason = "retry of an unanswered request"
        elif step.kind == RESYNC:
            reason = "asked by the cache (stream offset lost, or an operator)"
        elif step.kind == HINT:
            reason = "cold start: asked the known source"
        else:
            reason = "newer epoch seen"
        self.event(view.source, "resync_requested",
                   f"resync requested from {req.epoch}:{req.seq}{' (full)' if req.full else ''}: {reason}",
                   reason=reason, held=(view.epoch, view.seq), full=req.full)


class _TrustRecorded:
    """A keyring that accepts every signature: recorded messages were verified when received."""

    required = False

    def verify(self, name: str, payload: bytes, mac: bytes) -> bool:
        return True


@dataclass
class ReplayResult:
    paths: list[str]
    role: str | None = None
    name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    sessions: int = 0
    records: int = 0
    last_record: int | None = None
    last_now: float | None = None
    bytes: int = 0
    elapsed: float = 0.0
    damage: Damage | None = None
    damages: list[Damage] = field(default_factory=list)
    checkpoints: int = 0
    checkpoints_failed: int = 0
    digests_verified: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    effect_mismatches: list[dict[str, Any]] = field(default_factory=list)
    effects_checked: int = 0
    decisions: int = 0
    decisions_checked: int = 0
    decisions_skipped: int = 0
    decision_diffs: list[dict[str, Any]] = field(default_factory=list)
    decisions_note: str | None = None
    dropped: int = 0
    sent: int = 0
    notes: list[tuple[int, float, str]] = field(default_factory=list)
    #: stream offsets never received: (record index, first, last, cell or None for the
    #: deployment's stream), each stream at its own offsets
    stream_gaps: list[tuple[int, int, int, str | None]] = field(default_factory=list)
    divergences: int = 0
    stopped_early: bool = False
    receiver: ReceiverMachine | None = None
    tracer: Tracer | None = None

    @property
    def ok(self) -> bool:
        return not (self.mismatches or self.effect_mismatches or self.decision_diffs)

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed if self.elapsed > 0 else 0.0


MAX_REPORTED = 50


class HostManagerReplayer(Protocol):
    """Re-runs the HOST_MANAGER records of a host manager that decides outside the engine."""

    def step(self, receiver: ReceiverMachine, now: float, data: dict[str, Any]
             ) -> dict[str, Any] | None:
        """One record, on the replayed receiver at its clock value: for a step that decides,
        ``{"same": bool, "recorded": ..., "replayed": ..., "what": str}``; ``{"skipped": why}``
        for a step that cannot be re-run because an earlier one failed; None otherwise.
        May raise: the step is then reported as not re-runnable."""

    def close(self) -> None:
        """The replay ended: undo what the replayer changed in its process."""


class Replayer:
    """Applies records to a receiver and checks them; see the module docstring."""

    def __init__(self, paths: Sequence[str], *, tracer: Tracer | None = None, decisions: bool = False,
                 decision_options: Mapping[str, Any] | None = None,
                 host_manager: Callable[[], HostManagerReplayer] | None = None) -> None:
        self.result = ReplayResult(list(paths), tracer=tracer)
        self.tracer = tracer
        self.decisions = decisions
        self.decision_options = dict(decision_options or {})
        self.decoder = Decoder(_TrustRecorded(), max_message_bytes=MAX_RECORD_BYTES)
        self.receiver: ReceiverMachine | None = None
        self.session: str | None = None
        #: reading a part's base: "continue" (skip its restores), "start" (skip what precedes them)
        self.base: str | None = None
        self.states = ViewStates()
        #: the session's checkpoints list the peer claims held (format 2, see format.py)
        self.peers = True
        self.expected: dict[str, tuple] = {}
        self.expected_acc: bytes | None = None
        self.last_checkpoint: int | None = None
        self.window: list[Record] = []
        #: the last offset applied of each stream (None: the deployment's, or a cell's name)
        self.last_offsets: dict[str | None, int] = {}
        self.engine: DecisionEngine | None = None
        #: builds the replayer of HOST_MANAGER records on the first one (--decisions)
        self._host_manager_factory = host_manager
        self.host_manager: HostManagerReplayer | None = None
        #: decision id -> (DECISION record, what the replay decided, the recorded summary)
        self._pending_decisions: dict[int | None, tuple[int, dict[str, Any], Any]] = {}

    @property
    def held_receiver(self) -> ReceiverMachine:
        """The receiver of the session being replayed (a header must have started one)."""
        receiver = self.receiver
        if receiver is None:
            raise BadRecord("record before any header")
        return receiver

    # -- sessions ---------------------------------------------------------------------

    def header(self, header: dict[str, Any]) -> None:
        r = self.result
        role = header["role"]
        if r.role is not None and (role != r.role or header["name"] != r.name):
            raise BadRecord(f"log of {role} {header['name']!r} mixed into the log of {r.role} {r.name!r}")
        r.role, r.name = role, header["name"]
        # A part after a session's first holds a *base* (writer.py): restore records of every
        # view held, then a full checkpoint; records before it are already in it.  Replaying
        # on from the previous part, the base repeats what the receiver holds: its restore
        # records are skipped.  Starting at this part (older parts deleted), the records
        # before the base are skipped, its restore records build the views (its engine record
        # the engine), and the claims its checkpoint lists (pending and peers') are held
        # again (_restore_claims).
        has_base = bool(header.get("base")) and r.role != fmt.REPORTER
        if header["session"] == self.session:
            self.base = "continue" if has_base else None
            return
        self.base = None
        first = header.get("first_record") or 0
        if has_base:
            self.base = "start"
            r.notes.append((first, float(header.get("clock") or 0.0),
                            f"the log starts at part {header['part']} (record {first}) of a session: "
                            "older parts were deleted (retention); the views start from that part's "
                            "base and the claims it held (pending and peers'), timers from "
                            "before it are not reproduced"))
        self.session = header["session"]
        r.sessions += 1
        r.config = dict(header.get("config") or {})
        if role == fmt.REPORTER and self.receiver is not None:
            return  # the published stream continues: new epochs replace old ones
        params = {p: r.config[p] for p in RECEIVER_PARAMS if p in r.config}
        receiver = ReceiverMachine(r.name, **params)
        if self.tracer is not None:
            receiver.set_observer(self.tracer)
            self.tracer.new_session()
        self.receiver = r.receiver = receiver
        self.peers = (header.get("format") or fmt.FORMAT) >= fmt.PEER_CLAIMS_FORMAT
        self.states = ViewStates(self.peers)
        self.expected = {}
        self.expected_acc = None
        self.last_offsets = {}
        self.engine = None
        self.window = []

    # -- records ----------------------------------------------------------------------

    def _decode(self, rec: Record, body: bytes) -> Message | None:
        try:
            return self.decoder.decode(body)
        except ProtocolError as exc:
            self._mismatch(rec, "undecodable", f"recorded as applied but does not decode: {exc}")
            return None

    def _mismatch(self, rec: Record, what: str, detail: str, **data: Any) -> None:
        entry = {"record": rec.index, "now": rec.now, "kind": rec.kind_name, "what": what,
                 "detail": detail, **data}
        if what == "effects":
            if len(self.result.effect_mismatches) < MAX_REPORTED:
                self.result.effect_mismatches.append(entry)
        elif len(self.result.mismatches) < MAX_REPORTED:
            self.result.mismatches.append(entry)

    def step(self, rec: Record) -> None:
        kind = rec.kind
        if kind == HEADER:
            self.header(rec.fields[0])
            return
        receiver = self.receiver
        if receiver is None:
            raise BadRecord("record before any header")
        if self.base is not None:  # until the base's checkpoint, see header()
            if kind == CHECKPOINT:
                if self.base == "start":
                    self._restore_claims(rec)
                self.base = None
            elif kind == ENGINE:  # the base repeats the engine's configuration
                if self.base == "continue":
                    return
            elif (kind == RESTORE) == (self.base == "continue"):
                return
        r = self.result
        r.records += 1
        r.last_record, r.last_now = rec.index, rec.now
        now = rec.now
        f = rec.fields
        self.window.append(rec)
        if r.role == fmt.REPORTER:
            self._reporter_step(rec)
            return
        sends: list[Send] | None = None
        effects = None
        tracer = self.tracer
        if kind == RX_STREAM or kind == RX_CELL_STREAM:
            cell, f = (None, f) if kind == RX_STREAM else (f[0], f[1:])
            offset = f[0]
            if offset is not None:
                last = self.last_offsets.get(cell)
                if last is not None and offset > last + 1:
                    r.stream_gaps.append((rec.index, last + 1, offset - 1, cell))
                self.last_offsets[cell] = offset
            msg = self._decode(rec, f[1])
            if msg is None:
                return
            # a backlog message's publish time (format.py; absent from older logs: now)
            heard, effects = _heard_and_effects(f, 2)
            if tracer is not None:
                where = f"stream offset {offset}" if cell is None else f"cell {cell} stream offset {offset}"
                tracer.begin(_Step(rec.index, now, kind, "stream", msg, where))
            sends = receiver.receive(msg, now, heard)
        elif kind == RX_CONTROL or kind == RESTORE:
            msg = self._decode(rec, f[0])
            if msg is None:
                return
            # a restore's source last heard then (format.py; absent from older logs: now)
            heard, effects = _heard_and_effects(f, 1)
            if kind == RESTORE and not isinstance(msg, Snapshot):
                self._mismatch(rec, "restore", "a restore record holds no snapshot")
                return
            if tracer is not None:
                self._control_step(tracer, rec, msg)
            sends = receiver.receive(msg, now, heard)  # a restore is a receive heard then
        elif kind == TICK:
            effects = f[0] if f else None
            if tracer is not None:
                tracer.begin(_Step(rec.index, now, kind, "timer", None, "tick"))
            sends = receiver.tick(now)
        elif kind == CLAIM:
            claim = self._decode(rec, f[0])
            if not isinstance(claim, Claim):
                self._mismatch(rec, "claim", "a claim record holds no claim")
                return
            effects = f[1] if len(f) > 1 else None
            if tracer is not None:
                tracer.begin(_Step(rec.index, now, kind, "local", None, "claim added"))
                tracer.event(claim.source, "claim_added",
                             f"claim {claim.claim_id} added ({_resources(claim.resources)}, "
                             f"decided on {claim.epoch}:{claim.seq})", claim=claim.claim_id)
            try:
                receiver.add_claim(claim, now)
            except ProtocolError as exc:
                self._mismatch(rec, "claim", f"claim {claim.claim_id} could not be added: {exc}")
            sends = []
        elif kind == CANCEL:
            source, claim_id = f[0], f[1]
            effects = f[2] if len(f) > 2 else None
            if tracer is not None:
                tracer.begin(_Step(rec.index, now, kind, "local", None, f"claim {claim_id} cancelled"))
            receiver.cancel_claim(source, claim_id)
            sends = []
        elif kind in (RESYNC, HINT, FORGET):
            source = f[0]
            effects = f[2 if kind == RESYNC else 1] if len(f) > (2 if kind == RESYNC else 1) else None
            if tracer is not None:
                tracer.begin(_Step(rec.index, now, kind, "local", None, KIND_NAMES[kind]))
            if kind == RESYNC:
                sends = receiver.request_resync(source, now, full=f[1])
            elif kind == HINT:
                sends = receiver.add_source_hint(source, now)
            else:
                receiver.forget(source)
                sends = []
        elif kind == RX_DROPPED:
            r.dropped += 1
            return
        elif kind == TX:
            r.sent += 1
            return
        elif kind == CHECKPOINT:
            self._checkpoint(rec)
            return
        elif kind == NOTE:
            r.notes.append((rec.index, now, f[0]))
            return
        elif kind == ENGINE:
            if self.decisions:
                self._build_engine(f[0])
            return
        elif kind == DECISION:
            r.decisions += 1
            if self.decisions:
                self._decide(rec, f[0])
            return
        elif kind == DECISION_END:
            self._decision_end(rec, f[0])
            return
        elif kind == HOST_MANAGER:
            self._host_manager_step(rec, f[0])
            return
        else:  # PUBLISHED in a scheduler's log
            raise BadRecord(f"a {rec.kind_name} record in a scheduler's log")
        self._effects(rec, sends, effects)
        if tracer is not None:
            tracer.end(receiver)
            tracer.step = None

    def _control_step(self, tracer: Tracer, rec: Record, msg: Message) -> None:
        """Begin a traced step for a control message (and note what it says)."""
        if rec.kind == RESTORE:
            tracer.begin(_Step(rec.index, rec.now, rec.kind, "restore", msg, "restored after a restart"))
        elif isinstance(msg, ResyncAnswer):
            items = msg.items
            what = ("snapshot" if any(type(i) is Snapshot for i in items)
                    else f"{len(items)} delta{'s' if len(items) != 1 else ''}")
            tracer.begin(_Step(rec.index, rec.now, rec.kind, "resync", msg, f"resync answer ({what})"))
            tracer.event(msg.source, "resync_answered", f"resync answered with {what}")
        elif isinstance(msg, ClaimResult):
            verdict = "accepted" if msg.accepted else f"rejected: {msg.reason}"
            tracer.begin(_Step(rec.index, rec.now, rec.kind, "correction", msg,
                               f"correction of rejected claim {msg.claim_id} ({msg.reason})"))
            tracer.event(msg.source, "claim_result", f"claim {msg.claim_id} {verdict}",
                         claim=msg.claim_id, accepted=msg.accepted, reason=msg.reason)
        else:
            tracer.begin(_Step(rec.index, rec.now, rec.kind, "control", msg, "control message"))

    def _effects(self, rec: Record, sends: list[Send] | None, effects: Any) -> None:
        """Compare what the step produced with ``effects``, as recorded (a map, or None)."""
        receiver = self.held_receiver
        self.result.divergences += len(receiver.drain_alerts())
        outcomes = receiver.drain_outcomes()
        got_o = [[c, s, o.value] for c, s, o in outcomes]
        if self.tracer is not None:
            for c, s, o in outcomes:
                self.tracer.event(s, "claim_outcome", f"claim {c} {o.value}", claim=c, outcome=o.value)
        exp_s = (effects or {}).get("s") or []
        exp_o = (effects or {}).get("o") or []
        self.result.effects_checked += 1
        if not sends and not got_o and not exp_s and not exp_o:
            return
        got_s = [[s.to, encode(s.message)] for s in sends or ()]
        if got_s != exp_s or got_o != exp_o:
            self._mismatch(rec, "effects", _effects_text(exp_s, got_s, exp_o, got_o))

    def _reporter_step(self, rec: Record) -> None:
        kind = rec.kind
        r = self.result
        if kind == PUBLISHED:
            msg = self._decode(rec, rec.fields[0])
            if msg is None:
                return
            receiver = self.held_receiver
            tracer = self.tracer
            if tracer is not None:
                tracer.begin(_Step(rec.index, rec.now, kind, "published", msg, "published"))
            before = receiver.stats["divergences"]
            receiver.receive(msg, rec.now)
            receiver.drain_outcomes()
            if receiver.stats["divergences"] != before:
                for alert in receiver.drain_alerts():
                    self._mismatch(rec, "published", f"published heartbeat disagrees: {alert}")
            r.divergences = receiver.stats["divergences"]
            if tracer is not None:
                tracer.end(receiver)
                tracer.step = None
        elif kind in (RX_CONTROL, TX):
            if kind == TX:
                r.sent += 1
            if self.tracer is not None:
                msg = self._decode(rec, rec.fields[-1] if kind == RX_CONTROL else rec.fields[1])
                self._reporter_event(self.tracer, rec, msg)
        elif kind == RX_DROPPED:
            r.dropped += 1
        elif kind == NOTE:
            r.notes.append((rec.index, rec.now, rec.fields[0]))
        else:
            raise BadRecord(f"a {rec.kind_name} record in a reporter's log")

    def _reporter_event(self, tracer: Tracer, rec: Record, msg: Message | None) -> None:
        source = getattr(msg, "source", None)
        if source is None:
            return
        tracer.step = _Step(rec.index, rec.now, rec.kind, "control", None, "")
        if isinstance(msg, Claim):
            tracer.event(source, "claim_received", f"claim {msg.claim_id} from {msg.scheduler}",
                         claim=msg.claim_id)
        elif isinstance(msg, ResyncRequest):
            tracer.event(source, "resync_received",
                         f"resync request from {msg.requester} holding {msg.epoch}:{msg.seq}")
        elif isinstance(msg, ClaimResult):
            verdict = "accepted" if msg.accepted else f"rejected: {msg.reason}"
            tracer.event(source, "claim_result", f"claim {msg.claim_id} {verdict} (to {msg.scheduler})",
                         claim=msg.claim_id, accepted=msg.accepted, reason=msg.reason)
        elif isinstance(msg, ResyncAnswer):
            tracer.event(source, "resync_answered", f"resync answered to {msg.requester}")
        tracer.step = None

    # -- checkpoints ----------------------------------------------------------------------

    def _restore_claims(self, rec: Record) -> None:
        """The replay starts at a part's base: hold the claims its checkpoint lists -- the
        peer claims in the views' states, our own pending ones in its last field -- with
        their deadlines, as the scheduler held them, and remember the peers' rejections it
        lists (format.py, design §8)."""
        receiver = self.held_receiver
        held: list[tuple[str, bytes, float, bool, bool]] = []
        for change in rec.fields[2]:
            state = state_from_wire(change[1])
            if state is not None and len(state) > 5:
                held.extend((claim_id, body, deadline, True, False)
                            for claim_id, deadline, body in state[5])
        extra = rec.fields[3] if len(rec.fields) > 3 and isinstance(rec.fields[3], dict) else {}
        held.extend((claim_id, body, deadline, False, bool(accepted))
                    for _source, claim_id, deadline, accepted, body in extra.get("pending") or ())
        receiver.restore_peer_rejections(list(extra.get("peer_rejected") or ()))
        for claim_id, body, deadline, peer, accepted in held:
            what = f"{'peer' if peer else 'pending'} claim {claim_id}"
            claim = self._decode(rec, body)
            if not isinstance(claim, Claim) or claim.claim_id != claim_id:
                self._mismatch(rec, "checkpoint", f"{what} is not a claim of that id")
            elif not receiver.restore_claim(claim, deadline, peer=peer, accepted=accepted):
                self._mismatch(rec, "checkpoint", f"{what} names a view the base does not hold")

    def _checkpoint(self, rec: Record) -> None:
        """Verify a checkpoint: listed views in the recorded form, the others unchanged."""
        combined, count, changes = rec.fields[0], rec.fields[1], rec.fields[2]
        r = self.result
        r.checkpoints += 1
        sources = self.held_receiver.sources
        states = self.states
        bad: dict[str, str] = {}
        listed = set()
        for change in changes:
            source, state = change[0], state_from_wire(change[1])
            listed.add(source)
            view = sources.get(source)
            if state is None:
                self.expected.pop(source, None)
                if view is not None:
                    bad[source] = "forgotten when recorded"
                states.set(source, None if view is None else fmt.view_state(view, False, self.peers))
                continue
            self.expected[source] = state
            if view is None:
                bad[source] = "not held by the replay"
                states.set(source, None)
                continue
            actual = fmt.view_state(view, digest=state[2] is not None, peers=self.peers)
            if actual != state:
                bad[source] = "differs"
            states.set(source, actual)
        if len(states.states) != len(sources) or len(listed) < len(sources):
            held = states.states
            for source, view in sources.items():
                if source in listed:
                    continue
                if not fmt.same_base(held.get(source), fmt.view_base(view, self.peers)):
                    bad[source] = "changed in the replay only"
                    states.set(source, fmt.view_state(view, digest=False, peers=self.peers))
        if not bad and (states.combined != combined or len(sources) != count):
            bad = {s: "differs" for s in set(states.states) ^ set(self.expected)} or {"*": "combined hash"}
        if bad:
            details = []
            for source in sorted(bad)[:5]:
                details.append({"source": source, "why": bad[source],
                                "recorded": _state_text(self.expected.get(source)),
                                "replayed": _state_text(states.states.get(source)),
                                "records": self._records_touching(source)})
            self._mismatch(rec, "checkpoint",
                           f"{len(bad)} view(s) differ from the recorded checkpoint "
                           f"(last verified at record {self.last_checkpoint})",
                           verified_until=self.last_checkpoint, sources=details)
            r.checkpoints_failed += 1
            for source in bad:  # continue from the recorded state: report new differences only
                if source in self.expected:
                    states.set(source, self.expected[source])
        r.digests_verified += sum(1 for c in changes if c[1] is not None and c[1][2])
        self.last_checkpoint = rec.index
        self.window = []

    def _records_touching(self, source: str) -> list[int]:
        out = []
        for rec in self.window:
            if rec.kind in (RX_STREAM, RX_CELL_STREAM, RX_CONTROL, RESTORE):
                body = rec.fields[{RX_STREAM: 1, RX_CELL_STREAM: 2}.get(rec.kind, 0)]
                try:
                    msg = self.decoder.decode(body)
                except ProtocolError:
                    continue
                if any(getattr(i, "source", None) == source for i in _items(msg)) or \
                        getattr(msg, "source", None) == source:
                    out.append(rec.index)
            elif rec.kind in (RESYNC, HINT, FORGET, CANCEL) and rec.fields[0] == source:
                out.append(rec.index)
            elif rec.kind == TICK:
                continue
        return out[-10:]

    # -- decisions ----------------------------------------------------------------------

    def _build_engine(self, spec: dict[str, Any]) -> None:
        try:
            names = {f.name for f in dataclasses.fields(SchedulerConfig)}
            # the engine's options as recorded (plain msgpack data, lists for tuples)
            values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                      for k, v in (spec.get("config") or {}).items() if k in names}
            # logs written before requests were handed to owners decided without it
            values.setdefault("hand_to_owner", False)
            if values.get("decision_core") == "own":
                # logs written while the engine had its own ports of nova's filters and
                # weighers (held equal to nova's classes) re-run with nova's classes
                values["decision_core"] = "nova"
            config = SchedulerConfig(**values)
            if self.decision_options:
                config = dataclasses.replace(config, **_typed_options(config, self.decision_options))
            self.engine = DecisionEngine(self.held_receiver, config=config,
                                         rng=random.Random(0), path=spec.get("path") or "fast",
                                         live_schedulers=spec.get("live") or 1)
        except Exception as exc:  # noqa: BLE001 — report, never crash
            self.engine = None
            self.result.decisions_note = f"decision path not usable: {type(exc).__name__}: {exc}"
            return
        got = ([f.name for f in self.engine.filters], [w.name for w in self.engine.weighers])
        want = (spec.get("filters"), spec.get("weighers"))
        if got[1] == want[1]:
            # logs written before the weighers took nova's minval/maxval weighed without bounds
            recorded = spec.get("weigher_bounds") or [[None, None]] * len(self.engine.weighers)
            for w, (lo, hi) in zip(self.engine.weighers, recorded, strict=True):
                w.minval, w.maxval = lo, hi
        if got != want and not self.decision_options:
            self.result.decisions_note = (f"the engine loads filters/weighers {got}, the log recorded "
                                          f"{want}: differences may come from that")

    def _decide(self, rec: Record, data: dict[str, Any]) -> None:
        engine = self.engine
        if engine is None:
            if self.result.decisions_note is None:
                self.result.decisions_note = "no engine configuration recorded before the first decision"
            return
        if data.get("spec") is None or data.get("rng") is None:
            self._pending_decisions[data.get("id")] = (
                rec.index, {"skipped": "spec or RNG state not recorded"}, data.get("summary"))
            return
        try:
            spec = fmt.spec_from_wire(data["spec"])
            engine.rng.setstate(fmt.rng_from_wire(data["rng"]))
            engine.subset.rate, engine.subset.observed = data["subset"]
            if "scarce" in data:  # logs written before scarce requests were remembered lack it
                engine.scarce_memory = data["scarce"]
            if engine.peers != (data.get("peers") or []):
                # host ownership among the peers the scheduler knew then (membership, design §2)
                engine.set_peers(data.get("peers") or [])
            try:
                # logs written before scarce requests were handed over lack "delegable"
                rows = engine.select_destinations(spec, rec.now, return_alternates=data.get("alts", True),
                                                  live_schedulers=data.get("live"), path=data.get("path"),
                                                  dry_run=True, delegable=data.get("delegable", False)).rows
                got: dict[str, Any] = {"rows": [[row[0].instance_uuid, [[s.source, s.weight] for s in row]]
                                                for row in rows]}
            except (NoValidHost, Delegated) as exc:
                got = {"error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # noqa: BLE001
            got = {"failed": f"{type(exc).__name__}: {exc}"}
        self._pending_decisions[data.get("id")] = (rec.index, got, data.get("summary"))

    def _decision_end(self, rec: Record, data: dict[str, Any]) -> None:
        rows = data.get("rows")
        # the views the decision was based on must be the replayed ones
        for _uuid, hosts in rows or ():
            for source, _w, _cid, epoch, seq, dig in hosts:
                view = self.held_receiver.sources.get(source)
                held = None if view is None else (view.epoch, view.seq, view.digest())
                if epoch is not None and held != (epoch, seq, dig):
                    self._mismatch(rec, "decision_view",
                                   f"decision {data.get('id')}: view of {source} is "
                                   f"{_state_text(held and (*held, False, ()))}, recorded "
                                   f"{_state_text((epoch, seq, dig, False, ()))}")
        pending = self._pending_decisions.pop(data.get("id"), None)
        if pending is None:
            return
        begin, got, summary = pending
        r = self.result
        if "skipped" in got:
            r.decisions_skipped += 1
            return
        r.decisions_checked += 1
        recorded: dict[str, Any]
        if rows is None:
            recorded = {"error": data.get("error") or "error"}
        else:
            recorded = {"rows": [[uuid, [[h[0], h[1]] for h in hosts]] for uuid, hosts in rows]}
        if _decision_key(recorded) != _decision_key(got) and len(r.decision_diffs) < MAX_REPORTED:
            r.decision_diffs.append({"record": begin, "end_record": rec.index, "id": data.get("id"),
                                     "request": summary, "recorded": recorded, "replayed": got,
                                     "what": _decision_text(recorded, got)})


    def _host_manager_step(self, rec: Record, data: dict[str, Any]) -> None:
        r = self.result
        first = data.get("step") == "hosts"  # a request's first step: one decision
        if first:
            r.decisions += 1
        if not self.decisions:
            return
        replayer = self.host_manager
        if replayer is None:
            factory, self._host_manager_factory = self._host_manager_factory, None
            if factory is None:
                if r.decisions_note is None:
                    r.decisions_note = ("the log holds a host manager's decisions (nova's); this "
                                        "replay cannot re-run them")
                return
            try:
                replayer = self.host_manager = factory()
            except Exception as exc:  # noqa: BLE001 — report, never crash
                r.decisions_note = f"nova's decisions cannot be re-run here: {type(exc).__name__}: {exc}"
                return
        try:
            check = replayer.step(self.held_receiver, rec.now, data)
        except Exception as exc:  # noqa: BLE001
            if data.get("step") == "config":  # nothing to compare: its decisions are skipped
                r.decisions_note = r.decisions_note or f"{type(exc).__name__}: {exc}"
                return
            if first:
                r.decisions_skipped += 1
            check = {"same": False, "recorded": {"step": data.get("step")},
                     "replayed": {"failed": f"{type(exc).__name__}: {exc}"},
                     "what": f"{data.get('step')} step not re-run: {type(exc).__name__}: {exc}"}
        else:
            if first and check is not None and "skipped" in check:
                r.decisions_skipped += 1
            elif first:
                r.decisions_checked += 1
        if check is not None and "skipped" in check:
            return
        if check is not None and not check["same"] and len(r.decision_diffs) < MAX_REPORTED:
            r.decision_diffs.append({"record": rec.index, "end_record": rec.index,
                                     "id": data.get("id"), "step": data.get("step"),
                                     "request": check.get("request"), "recorded": check["recorded"],
                                     "replayed": check["replayed"], "what": check["what"]})

    def close(self) -> None:
        if self.host_manager is not None:
            self.host_manager.close()


def _heard_and_effects(fields: list[Any], at: int) -> tuple[float | None, Any]:
    """A record's optional heard time at ``fields[at]`` (format.RECORD_OPTIONAL: a number,
    absent from older logs) and the effects after it (None: none)."""
    heard = fields[at] if len(fields) > at and type(fields[at]) in (int, float) else None
    rest = fields[at + 1:] if heard is not None else fields[at:]
    return heard, rest[0] if rest else None


def _decision_key(d: dict[str, Any]) -> Any:
    if "rows" in d:
        return ("rows", [[u, [(s, w) for s, w in hosts]] for u, hosts in d["rows"]])
    if "failed" in d:
        return ("failed", d["failed"])
    return ("error", str(d.get("error", "")).split(":", 1)[0])


def _decision_text(recorded: dict[str, Any], got: dict[str, Any]) -> str:
    def short(d: dict[str, Any]) -> str:
        if "rows" not in d:
            return str(d.get("error") or f"replay failed: {d.get('failed')}")[:200]
        return "; ".join(f"{u}: {' > '.join(s for s, _ in hosts)}" for u, hosts in d["rows"])
    return f"recorded {short(recorded)} | replayed {short(got)}"


def _typed_options(config: SchedulerConfig, options: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in options.items():
        current = getattr(config, key)  # AttributeError names an unknown option
        if not isinstance(value, str):
            out[key] = value
        elif isinstance(current, bool):
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int):
            out[key] = int(value)
        elif isinstance(current, float):
            out[key] = float(value)
        elif isinstance(current, tuple):
            out[key] = tuple(v.strip() for v in value.split(",") if v.strip())
        else:
            out[key] = value
    return out


def _resources(resources: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))


def _state_text(state: tuple | None) -> str:
    if state is None:
        return "absent"
    epoch, seq, dig, down, pending = state[:5]
    text = f"{epoch}:{seq} digest {dig.hex() if dig else 'no document' if dig == b'' else 'not taken'}"
    if down:
        text += " down"
    if pending:
        text += f" pending {list(pending)}"
    if len(state) > 5:
        text += f" peer claims {[f'{cid} until {deadline:.3f}' for cid, deadline, _ in state[5]]}"
    return text


def _effects_text(exp_s: list[Any], got_s: list[Any], exp_o: list[Any], got_o: list[Any]) -> str:
    parts = []
    if exp_s != got_s:
        parts.append(f"resync requests: recorded {len(exp_s)} {_sends_text(exp_s)}, "
                     f"replayed {len(got_s)} {_sends_text(got_s)}")
    if exp_o != got_o:
        parts.append(f"claim outcomes: recorded {exp_o}, replayed {got_o}")
    return "; ".join(parts)


def _sends_text(sends: list[Any]) -> str:
    out = []
    for to, body in sends[:3]:
        try:
            msg = Decoder(_TrustRecorded()).decode(body)
        except Exception:  # noqa: BLE001
            out.append(str(to))
            continue
        if isinstance(msg, (Batch, ResyncAnswer, ScarceRequest, ScarceAnswer,
                            CheckpointAsk)):  # no version
            out.append(str(to))
        else:
            out.append(f"{to}@{msg.epoch}:{msg.seq}{'/full' if getattr(msg, 'full', False) else ''}")
    return "[" + ", ".join(out) + ("..." if len(sends) > 3 else "") + "]"


def replay(
    paths: Sequence[str],
    *,
    at: int | None = None,
    until: float | None = None,
    until_offset: int | None = None,
    until_wall: float | None = None,
    tracer: Tracer | None = None,
    decisions: bool = False,
    decision_options: Mapping[str, Any] | None = None,
    host_manager: Callable[[], HostManagerReplayer] | None = None,
) -> ReplayResult:
    """Replay the log made of ``paths`` (parts in order), up to record ``at`` / clock ``until``
    / before the first message past offset ``until_offset`` of the deployment's stream (a cell
    stream's offsets are its own and do not cut) / wall-clock time
    ``until_wall`` (seconds since the epoch, through each session header's clock and wall)."""
    reader = LogReader(paths)
    rp = Replayer(paths, tracer=tracer, decisions=decisions, decision_options=decision_options,
                  host_manager=host_manager)
    r = rp.result
    t0 = time.perf_counter()
    until_clock = until
    for rec in reader:
        if rec.kind == HEADER and until_wall is not None:
            header = rec.fields[0]
            if isinstance(header.get("clock"), (int, float)) and isinstance(header.get("wall"), (int, float)):
                limit = header["clock"] + (until_wall - header["wall"])
                until_clock = limit if until is None else min(until, limit)
        if rec.kind != HEADER and (
                (at is not None and rec.index > at)
                or (until_clock is not None and rec.now is not None and rec.now > until_clock)
                or (until_offset is not None and rec.kind == RX_STREAM
                    and isinstance(rec.fields[0], int) and rec.fields[0] > until_offset)):
            r.stopped_early = True
            break
        try:
            rp.step(rec)
        except Exception as exc:  # noqa: BLE001 — a record that cannot be replayed is damage
            reason = str(exc) if isinstance(exc, BadRecord) else f"cannot replay: {type(exc).__name__}: {exc}"
            reader.damages.append(Damage(rec.path, rec.offset, max(rec.index, 0), reason))
            break
    rp.close()
    r.elapsed = time.perf_counter() - t0
    r.bytes = reader.bytes
    r.damages = list(reader.damages)
    r.damage = next((d for d in reader.damages if not d.resumed), None)
    r.receiver = rp.receiver
    return r


def gap_text(gap: tuple[int, int, int, str | None]) -> str:
    """One entry of ``stream_gaps`` as shown: ``5`` or ``5..7``, after ``cell NAME `` for a
    cell's stream."""
    _, first, last, cell = gap
    offsets = str(first) if first == last else f"{first}..{last}"
    return offsets if cell is None else f"cell {cell} {offsets}"


def last_stream_offset(paths: Sequence[str]) -> int | None:
    """The offset of the last message of the deployment's stream a scheduler's log recorded
    (None: none; a cell stream's offsets are its own)."""
    last = None
    for rec in LogReader(paths):
        if rec.kind == RX_STREAM and isinstance(rec.fields[0], int):
            last = rec.fields[0]
    return last


# --------------------------------------------------------------------------
# comparing two logs


# --------------------------------------------------------------------------
# state and history formatting (shared by the CLI and tests)


def op_text(op: list[Any], width: int = 60) -> str:
    code = op[0]
    if code == SET:
        value = repr(op[3])
        if len(value) > width:
            value = value[:width - 3] + "..."
        return f"SET {op[1]}.{op[2]}={value}"
    if code == DEL:
        return f"DEL {op[1]}.{op[2]}"
    if code == DROP:
        return f"DROP {op[1]}"
    return repr(op)


def view_json(view: SourceView | None) -> dict[str, Any]:
    """A view as JSON-able data (bytes as hex)."""
    if view is None:
        return {"held": False}
    digest = view.digest()  # None exactly when no document is held
    return {
        "held": view.doc is not None,
        "source": view.source,
        "status": view.status.value,
        "epoch": view.epoch,
        "seq": view.seq,
        "digest": digest.hex() if digest is not None else None,
        "down": view.down,
        "last_heard": view.last_heard,
        "buffered": sorted(view.buffer),
        "resync_pending": view.resync_sent_at is not None,
        "pending_claims": {cid: {"resources": dict(p.claim.resources), "accepted": p.accepted,
                                 "deadline": p.deadline, "instance": p.claim.instance,
                                 "based_on": [p.claim.epoch, p.claim.seq]}
                           for cid, p in view.pending.items()},
        "document": _jsonable(view.doc),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return value


def history(tracer: Tracer, source: str) -> list[dict[str, Any]]:
    """Versions and events of ``source``, in record order."""
    rows: list[dict[str, Any]] = []
    for v in tracer.versions.get(source, []):
        rows.append({"record": v.record, "now": v.now, "type": "version", "version": [v.epoch, v.seq],
                     "how": v.how, "plane": v.plane, "reordered": v.reordered, "detail": v.detail,
                     "digest": v.digest.hex() if v.digest else None, "claims": list(v.claims),
                     "ops": [op_text(op) for op in v.ops] if v.ops is not None else None})
    for e in tracer.events.get(source, []):
        rows.append({"record": e.record, "now": e.now, "type": "event", "event": e.kind, "text": e.text})
    rows.sort(key=lambda r: (r["record"], r["type"] == "version"))
    return rows


__all__ = ["ReplayResult", "Replayer", "Tracer", "Version", "gap_text", "history",
           "last_stream_offset", "op_text", "replay", "view_json"]
