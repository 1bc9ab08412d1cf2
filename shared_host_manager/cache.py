"""The scheduler's host-state cache: a ReceiverMachine made safe for threads and I/O.

Role: everything arriving for this scheduler goes through here —
stream messages (:meth:`HostStateCache.ingest_stream`, with their offset),
control messages (:meth:`ingest_control`: resync answers and claim results) and
time (:meth:`tick`) — and every resync request the receiver asks for goes out
through the ``send`` callable, addressed to the reporter that serves the source
(learnt from the source's document, or from the batch that carried it when
the source is not yet held).

Consistency for the decision path: bytes are decoded outside the lock; only
the apply step (bounded: one batch) runs under :attr:`lock`, and a decision
runs entirely under the same lock, so it sees one consistent version of every
host and ingest never changes a view while a decision reads it.

Read-your-writes (design §2): a :class:`~protocol.messages.Fence` on the control plane
says a source's change at (epoch, seq) is on the stream and its sender's caller waits for
it to count (an API call that forced a service down).  It is held in :attr:`fences` until
the receiver applies that version; :meth:`await_fences`, called by a decision under the
lock, waits (the lock released meanwhile, so the stream goes on) until every fence held
is met or has waited ``fence_timeout``::

    Fence received --ingest_control--> held --applied (epoch, seq) or later--> met
                                            --fence_timeout passed----------> expired (logged)

Persistence (restart without resyncing everything)::

    cut():       under the lock, every held source's (epoch, seq, document) and how
                 long it has been silent, the stream offset applied so far (and each
                 cell stream's, design §4.6) and the origins and cells of the sources,
                 documents shared copy on write with the receiver (O(sources), nothing
                 packed), with the wall-clock time of the cut
    dump_state(): cut().pack(), outside the lock -> checksummed msgpack
    save(path):  dump_state() -> a temp file, flushed, then renamed over path
    load(path):  restore_state(): each saved source is fed back as a Snapshot
                 through the same receiver code (ReceiverMachine.restore), last heard
                 as long ago as it was silent at the cut plus the wall-clock time
                 since, so a host that died before the cut is not up again after it;
                 returns the offset to resume the deployment's stream after (each
                 cell's is in cell_offsets).  A checkpoint
                 (shared_host_manager.checkpoint) carries the same bytes and is
                 restored the same way

Bad input (docs/design.md §6, invariant 6): an undecodable or invalid message is dropped, logged
with what is known of its sender, and counted in :attr:`invalid` by reason;
the receiver is not touched.

Observation (docs/design.md §8): one :class:`CacheObserver` (the update log)
may watch the cache.  It sees every ingested message as received, with the
step's sends, under the lock, right after the receiver step, and it is the
receiver's :class:`~protocol.receiver.ReceiverObserver` too, so it also sees
the claims, cancellations and resync requests other code makes under the lock.
One call comes without the lock: :meth:`CacheObserver.sent` (a claim cast by the
thread that decided it, or by the manager's sender thread), so an observer keeps its
own lock for writing.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgpack

from protocol.codec import Decoder
from protocol.errors import ProtocolError
from protocol.hostdoc import endpoint_of
from protocol.messages import (
    Batch,
    CheckpointAsk,
    Claim,
    ClaimResult,
    Delta,
    Fence,
    Heartbeat,
    Message,
    ResyncAnswer,
    ScarceAnswer,
    ScarceRequest,
    Send,
    Snapshot,
)
from protocol.receiver import ReceiverMachine, ReceiverObserver, ViewCut

LOG = logging.getLogger(__name__)

#: format 2 wraps the state with a checksum: a torn or damaged file is a cold start, never a
#: wrong view (format 1, unchecked, is still read)
STATE_FORMAT = 2
_STREAM_TYPES = (Batch, Delta, Snapshot, Heartbeat)
_CONTROL_TYPES = (ResyncAnswer, ClaimResult, Fence)
#: scheduler to scheduler on the peer topic, not host state, so the receiver never sees them:
#: a request handed to the coordinator or to the owner of its hosts, and its answer (control
#: plane 1.4, design §5.4); a starting scheduler's ask for a checkpoint (1.5, §4.5)
_SERVICE_TYPES = (ScarceRequest, ScarceAnswer, CheckpointAsk)
#: on the peer topic: a live peer's claim, announced, or the host's rejection of it, forwarded
#: by that peer (design §5.2), and the messages for the scheduler service
_PEER_TYPES = (Claim, ClaimResult, *_SERVICE_TYPES)


@runtime_checkable
class IngestListener(Protocol):
    """A layer above told, under the cache's :attr:`~HostStateCache.lock`, that a receive or
    tick step ended (:meth:`HostStateCache.add_listener`): the request tracker drains the
    claim outcomes, the service wakes its catch-up waiters, the placement tap syncs its view.
    It must not raise (a listener's exception is logged, never stops ingest)."""

    def ingest_done(self) -> None: ...


@runtime_checkable
class MessageListener(Protocol):
    """A layer above told, under the lock, of every message the receiver took, stream and
    control, right after it took it (the placement tap notes which providers a delta
    changed).  A listener that is also one of these is told both."""

    def message_taken(self, msg: Message) -> None: ...


class CacheObserver(ReceiverObserver, Protocol):
    """What a :class:`HostStateCache` tells its observer, besides the receiver's transitions.

    The cache's contract, here where it is called: an observer (the update log's recorder)
    has these methods and the receiver's (:class:`~protocol.receiver.ReceiverObserver`,
    whose no-op defaults an explicit subclass inherits).  Called under the cache lock, after
    the receiver step, except :meth:`sent`.  Nothing here names a caller above the cache:
    what a host manager deciding outside the engine records reaches the observer through
    that host manager's own contract (``shared_host_manager.nova.decision_log``).
    """

    def cache_attached(self, cache: HostStateCache) -> None:
        """The cache took this observer (before it ingests anything, or with what it holds)."""

    def stream(self, body: bytes, offset: int | None, now: float, sends: Sequence[Send],
               cell: str | None = None, heard: float | None = None) -> None:
        """A stream message was applied; ``body`` as received, at ``offset`` of the deployment's
        stream or, with ``cell``, of that cell's; ``heard``: the receiver took it as heard
        then (a restart's backlog), None: now."""

    def control(self, body: bytes, now: float, sends: Sequence[Send] | None = None) -> None:
        """A control message (resync answer, claim result) was applied."""

    def dropped(self, body: bytes, plane: str, offset: int | None, now: float) -> None:
        """An invalid message was dropped before the receiver (``plane``: "stream" or "control")."""

    def tick(self, now: float, sends: Sequence[Send]) -> None:
        """The receiver's timers ran."""

    def restored(self, snapshot: Snapshot, now: float, last_heard: float | None) -> None:
        """:meth:`HostStateCache.load` fed a saved source back to the receiver, its source
        last heard at ``last_heard`` (the receiver's clock; None: not saved, now)."""

    def sent(self, to: str | None, message: Message, now: float) -> None:
        """A control message left this scheduler (a claim), without the lock."""

    def close(self) -> None:
        """The scheduler stops: nothing more will be observed."""


@dataclass(frozen=True)
class RestoredState:
    """What :meth:`HostStateCache.restore_state` restored (each cell stream's offset is in
    the cache's ``cell_offsets``)."""

    #: on the deployment's stream (None: nothing applied there; read it from its start)
    offset: int | None


class HostStateCache:
    def __init__(
        self,
        receiver: ReceiverMachine,
        send: Callable[[str, Message], None],
        *,
        decoder: Decoder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        recorder: CacheObserver | None = None,
        fence_timeout: float = 1.0,
    ) -> None:
        self.receiver = receiver
        self.lock = threading.RLock()
        #: notified under the lock whenever something was applied (await_fences waits on it)
        self._applied = threading.Condition(self.lock)
        #: source -> (epoch, seq, give up at): the fences not yet met (see the module docstring)
        self.fences: dict[str, tuple[int, int, float]] = {}
        self.fence_timeout = fence_timeout
        #: fences by outcome: "received", "met", "expired"; "waits": decisions that waited
        self.fence_stats: Counter[str] = Counter()
        #: peers' claims received while the lock was taken (see ingest_control)
        self._peer_inbox: collections.deque[tuple[bytes, Message]] = collections.deque()
        self._send = send
        self._decoder = decoder or Decoder()
        self.clock = clock
        #: the wall-clock time, in seconds: a saved state carries its cut's, so that a
        #: restore counts the time between (across a restart, or from another scheduler)
        self.wall_clock = wall_clock
        #: the offset applied on the deployment's stream, and on each cell's (design §4.6)
        self.offset: int | None = None
        self.cell_offsets: dict[str, int] = {}
        #: the source whose versions are noted per cell stream as they are taken (the
        #: scheduler's own entry: catch_up's marker, design §4.6), and those versions
        self.marker_source: str | None = None
        self.cell_marks: dict[str, tuple[int, int]] = {}
        self.origins: dict[str, str] = {}
        #: source -> the cell whose stream carries it (absent: the deployment's stream); the
        #: control plane reaches the source's reporter on that cell's broker, if it has one
        self.source_cells: dict[str, str] = {}
        self.invalid: Counter[str] = Counter()
        self.unroutable = 0
        self.messages = 0
        #: the live schedulers (this one included once its own entry came back), sorted, as
        #: the owning service last scanned them (shared_host_manager.membership); () alone
        self.peers: tuple[str, ...] = ()
        #: set by the scheduler service while it announces claims to its peers (design §5.2): a
        #: host manager that claims outside the engine (the nova drop-in, in placement) hands
        #: each claim it holds as pending to it, outside the lock
        self.claim_announcer: Callable[[Claim], None] | None = None
        #: control messages applied, by kind: "resync_answer", "claim_accepted", "claim_rejected"
        self.control_received: Counter[str] = Counter()
        #: told under :attr:`lock` after every receive and tick (:meth:`add_listener`)
        self._ingest_listeners: list[IngestListener] = []
        #: told under :attr:`lock` of every message the receiver took (:meth:`add_listener`)
        self._message_listeners: list[MessageListener] = []
        #: the observer (an update log), see :meth:`set_recorder`
        self.recorder: CacheObserver | None = None
        if recorder is not None:
            self.set_recorder(recorder)

    def add_listener(self, listener: IngestListener | MessageListener) -> None:
        """Tell ``listener`` of ingest from now on, through the interfaces it implements
        (:class:`IngestListener`, :class:`MessageListener`, or both)."""
        with self.lock:
            if isinstance(listener, IngestListener):
                self._ingest_listeners.append(listener)
            if isinstance(listener, MessageListener):
                self._message_listeners.append(listener)

    def set_recorder(self, recorder: CacheObserver) -> None:
        """Make ``recorder`` this cache's and its receiver's observer (at most one, ever)."""
        if self.recorder is not None:
            raise RuntimeError(f"the cache of {self.receiver.name!r} is already observed")
        with self.lock:
            self.receiver.set_observer(recorder)
            self.recorder = recorder
            recorder.cache_attached(self)

    # -- input -----------------------------------------------------------------

    def ingest_stream(self, body: bytes, offset: int | None = None, cell: str | None = None,
                      ) -> None:
        self._ingest_stream([(body, offset, None)], cell)

    def ingest_stream_batch(self, messages: list[tuple[bytes, int, float | None]],
                            cell: str | None = None) -> None:
        """Stream messages read together, ``(body, offset, published at)`` in stream
        order, applied under one acquisition of the lock; ``cell``: read from that cell's
        stream (None: the deployment's).

        A consumer with a backlog hands it over this way: taking the lock once
        per message made ingest queue behind every decision holding it, and
        fall further behind the busier the scheduler was.

        "Published at" is the publisher's wall-clock time for a message of the consumer's
        backlog (already in the stream when it started or resumed: what a restarted
        scheduler catches up on, or what a broker outage held back), None for one published
        since (``transport.base.OnBatch``).  A
        backlog message counts as heard when it was published, not now
        (``ReceiverMachine.receive``'s ``heard``; design §4.4), so that the last
        heartbeats of a compute that died while this scheduler was down do not make it
        eligible again; a live one counts as heard when applied, whatever the
        publisher's clock says."""
        self._ingest_stream(messages, cell)

    def _ingest_stream(self, messages: Sequence[tuple[bytes, int | None, float | None]],
                       cell: str | None = None) -> None:
        decoded = []
        backlog = False
        for body, offset, published in messages:  # outside the lock: decoding is most of it
            msg = self._decode(body, _STREAM_TYPES, f"stream offset {offset}")
            if type(msg) is Batch:
                if msg.origin:
                    origins = self.origins
                    for item in msg.items:
                        origins[item.source] = msg.origin
                source_cells = self.source_cells
                if cell is not None:
                    for item in msg.items:
                        source_cells[item.source] = cell
                elif source_cells:  # a source heard on the deployment's stream is in no cell
                    for item in msg.items:
                        source_cells.pop(item.source, None)
            backlog |= published is not None
            decoded.append((body, offset, published, msg))
        sends: list[Send] = []
        with self.lock:
            self.apply_peer_claims()
            receive = self.receiver.receive
            recorder = self.recorder
            # the receiver's clock at a publish: now less the wall-clock time since
            wall_minus_clock = self.wall_clock() - self.clock() if backlog else 0.0
            for body, offset, published, msg in decoded:
                now = self.clock()
                if msg is None:
                    if recorder is not None:
                        # RX_DROPPED's offset is the deployment stream's
                        recorder.dropped(body, "stream", offset if cell is None else None, now)
                else:
                    heard = None if published is None else min(now, published - wall_minus_clock)
                    out = receive(msg, now, heard)
                    for listener in self._message_listeners:
                        listener.message_taken(msg)
                    if recorder is not None:
                        recorder.stream(body, offset, now, out, cell, heard)
                    sends.extend(out)
                    self.messages += 1
                    if cell is not None and type(msg) is Snapshot \
                            and msg.source == self.marker_source:
                        self.cell_marks[cell] = (msg.epoch, msg.seq)
                if cell is None:
                    self.offset = offset
                elif offset is not None:
                    self.cell_offsets[cell] = offset
            alerts = self.receiver.drain_alerts()
            self._notify()
        for alert in alerts:
            LOG.error("host state divergence: %s", alert)
        self._dispatch(sends)

    def ingest_control(self, body: bytes) -> Message | None:
        """A claim result, resync answer or fence; returns it decoded (None: dropped)."""
        msg = self._decode(body, _CONTROL_TYPES, "control plane")
        if msg is None:
            if self.recorder is not None:
                with self.lock:
                    self.recorder.dropped(body, "control", None, self.clock())
            return None
        if type(msg) is Fence:
            with self.lock:
                self._hold_fence(msg)
            return msg
        with self.lock:
            self.apply_peer_claims()
            now = self.clock()
            sends = self.receiver.receive(msg, now)
            for listener in self._message_listeners:
                listener.message_taken(msg)
            if self.recorder is not None:
                self.recorder.control(body, now, sends)
            self.messages += 1
            if type(msg) is ClaimResult:
                self.control_received["claim_accepted" if msg.accepted else "claim_rejected"] += 1
            else:
                self.control_received["resync_answer"] += 1
            self._notify()
        self._dispatch(sends)
        return msg

    def ingest_peer_claim(self, body: bytes, hold: bool = True) -> Message | None:
        """A live peer's claim, announced to us, or the host's rejection of one, forwarded
        by that peer (the peer topic's server, design §5.2); returns it decoded (None:
        dropped).  A scarce request or answer (design §5.4) or a checkpoint ask (§4.5) is
        returned as decoded, for the scheduler service; ``hold`` False drops claims and
        rejections (not announcing).

        A claim counts only if it is in the view before our next decision: rather than wait
        for the lock behind a decision or a stream batch, it joins an inbox that whoever
        takes the lock next applies first, and is applied at once if the lock is free."""
        msg = self._decode(body, _PEER_TYPES, "peer topic")
        if msg is None:
            if self.recorder is not None:
                with self.lock:
                    self.recorder.dropped(body, "control", None, self.clock())
            return None
        if isinstance(msg, _SERVICE_TYPES):
            self.control_received[msg.TYPE] += 1
            return msg
        if not hold:
            self.control_received["peer_not_held"] += 1
            return msg
        if msg.scheduler == self.receiver.name:  # type: ignore[union-attr]
            # our own announcement or forwarded rejection, fanned out to us too
            self.control_received["peer_echo"] += 1
            return msg
        self._peer_inbox.append((body, msg))
        if self.lock.acquire(blocking=False):
            try:
                self.apply_peer_claims()
            finally:
                self.lock.release()
        return msg

    def apply_peer_claims(self) -> None:
        """Apply the peers' claims waiting in the inbox (under the lock; every step that
        takes the lock, and a decision before it reads the view, calls this first).
        Each is recorded as a control message received at the moment it is applied."""
        inbox = self._peer_inbox
        while inbox:
            body, msg = inbox.popleft()
            now = self.clock()
            sends = self.receiver.receive(msg, now)
            for listener in self._message_listeners:
                listener.message_taken(msg)
            if self.recorder is not None:
                self.recorder.control(body, now, sends)
            self.messages += 1
            self.control_received["peer_claim" if type(msg) is Claim else "peer_rejection"] += 1

    def tick(self) -> None:
        with self.lock:
            self.apply_peer_claims()
            now = self.clock()
            sends = self.receiver.tick(now)
            if self.recorder is not None:
                self.recorder.tick(now, sends)
            self._notify()
        self._dispatch(sends)

    def _hold_fence(self, fence: Fence) -> None:
        """Under the lock: hold ``fence`` (the newest per source) unless already met."""
        self.control_received["fence"] += 1
        self.fence_stats["received"] += 1
        if self._fence_met(fence.source, fence.epoch, fence.seq):
            self.fence_stats["met"] += 1
            return
        held = self.fences.get(fence.source)
        version = (fence.epoch, fence.seq)
        if held is None or version >= held[:2]:
            self.fences[fence.source] = (*version, self.clock() + self.fence_timeout)

    def _fence_met(self, source: str, epoch: int, seq: int) -> bool:
        view = self.receiver.sources.get(source)
        return (view is not None and view.doc is not None
                and (view.epoch > epoch or (view.epoch == epoch and view.seq >= seq)))

    def await_fences(self) -> None:
        """Under the lock (a decision, before it reads the view): return once every fence held
        is met or has waited ``fence_timeout``; the lock is released while waiting."""
        fences = self.fences
        waited = False
        while fences:
            now = self.clock()
            for source, (epoch, seq, until) in list(fences.items()):
                if self._fence_met(source, epoch, seq):
                    del fences[source]
                    self.fence_stats["met"] += 1
                elif now >= until:
                    del fences[source]
                    self.fence_stats["expired"] += 1
                    LOG.warning("deciding without %s at %d:%d: not applied within "
                                "fence_timeout (%.1f s) of its fence", source, epoch, seq,
                                self.fence_timeout)
            if not fences:
                break
            if not waited:
                waited = True
                self.fence_stats["waits"] += 1
            self._applied.wait(max(0.001, min(u for _, _, u in fences.values()) - now))

    def _notify(self) -> None:
        if self.fences:
            self._applied.notify_all()
        for listener in self._ingest_listeners:
            try:
                listener.ingest_done()
            except Exception:  # a listener's bug must not stop ingest
                LOG.exception("cache ingest listener failed")

    def resync_all(self, full: bool = False, *, stream: str | None | bool = True) -> int:
        """Ask every known source to resync; ``stream``: only those carried by that cell's
        stream (None: the deployment's), after that stream lost our offset.  A source whose
        cell was not noted yet is taken for the deployment's: should it be a cell's, its
        next delta or heartbeat shows the gap, and it is asked then."""
        with self.lock:
            now = self.clock()
            sends: list[Send] = []
            cell_of = self.source_cells.get
            for source in list(self.receiver.sources):
                if stream is True or cell_of(source) == stream:
                    sends.extend(self.receiver.request_resync(source, now, full=full))
        self._dispatch(sends)
        return len(sends)

    def ask_sources(self, sources: dict[str, str]) -> int:
        """Cold start without the stream's history: ask each source (-> its endpoint) for a snapshot."""
        self.origins.update(sources)
        with self.lock:
            now = self.clock()
            sends: list[Send] = []
            for source in sources:
                sends.extend(self.receiver.add_source_hint(source, now))
        self._dispatch(sends)
        return len(sends)

    def _decode(self, body: bytes, allowed: tuple[type, ...], where: str) -> Message | None:
        try:
            msg = self._decoder.decode(body)
        except ProtocolError as exc:
            self.invalid[exc.reason] += 1
            LOG.warning("dropped invalid message from %s (%s, sender %s): %s",
                        where, exc.reason, exc.sender or "unknown", exc)
            return None
        if not isinstance(msg, allowed):
            self.invalid["wrong_plane"] += 1
            LOG.warning("dropped %s received on the %s", type(msg).__name__, where)
            return None
        return msg

    # -- output ----------------------------------------------------------------

    def endpoint_of(self, source: str) -> str | None:
        view = self.receiver.sources.get(source)
        endpoint = endpoint_of(view.doc) if view is not None else None
        return endpoint if endpoint is not None else self.origins.get(source)

    def cell_of(self, source: str) -> str | None:
        """The cell whose stream carries ``source`` (None: the deployment's stream, or not
        heard yet)."""
        return self.source_cells.get(source)

    def _dispatch(self, sends: list[Send]) -> None:
        for send in sends:
            endpoint = self.endpoint_of(send.to) if send.to else None
            if endpoint is None:
                self.unroutable += 1
                LOG.debug("no endpoint known for %s; %s not sent", send.to,
                          type(send.message).__name__)
                continue
            try:
                self._send(endpoint, send.message)
            except Exception as exc:  # a lost request is retried by the receiver's timers
                LOG.warning("sending %s to %s failed: %s", type(send.message).__name__, endpoint, exc)

    # -- persistence -------------------------------------------------------------

    def save(self, path: str) -> None:
        """Write every held view, the offset applied and the known origins to ``path``.

        The state (:meth:`dump_state`) is written to a temporary file, flushed to disk, then
        renamed over ``path``: a crash leaves the old file or the new one, and a file
        damaged anyway (a torn write on a filesystem that reorders, a bad disk) fails
        its checksum and means a cold start, never a view ahead of its source (found by
        ``shm faults``: a view restored ahead of its source is never repaired, design §4.4).
        """
        data = self.dump_state()
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".cache-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def cut(self) -> StateCut:
        """Every held view ``(source, epoch, seq, document)``, the stream offsets applied and
        the known origins, taken at once under the lock in O(sources) without copying a
        document (the receiver copies a view's on its next change): one consistent cut,
        packed later, outside the lock (:meth:`StateCut.pack`)."""
        with self.lock:
            start = time.perf_counter()
            views = self.receiver.cut()
            return StateCut(self.offset, dict(self.cell_offsets), views, dict(self.origins),
                            dict(self.source_cells), self.clock(), self.wall_clock(),
                            time.perf_counter() - start)

    def dump_state(self) -> bytes:
        """:meth:`cut`, packed and checksummed: what :meth:`save` writes and a checkpoint
        carries (shared_host_manager.checkpoint)."""
        return self.cut().pack()

    def load(self, path: str) -> int | None:
        """Restore a saved cache; returns the stream offset it had applied (None: nothing)."""
        if not os.path.exists(path):
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:  # an unreadable cache file means a cold start, not a crash
            LOG.warning("ignoring unreadable cache state %s: %s", path, exc)
            return None
        restored = self.restore_state(data, path)
        return None if restored is None else restored.offset

    def restore_state(self, data: bytes, where: str,
                      keep: Callable[[str], bool] | None = None) -> RestoredState | None:
        """Restore what :meth:`dump_state` returned (``where``: its origin, for the log; only
        the sources ``keep`` accepts, if given); returns the offsets it had applied on the
        deployment's stream and on each cell's, None when ``data`` is damaged or not a state
        (nothing is restored then: a cold start)."""
        try:
            state = msgpack.unpackb(data, raw=False)
            if type(state) is not dict:
                raise ValueError("not a map")
            if state.get("format") == STATE_FORMAT:
                body = state.get("state")
                if type(body) is not bytes or state.get("check") != _checksum(body):
                    raise ValueError("checksum mismatch (damaged or partly written)")
                state = msgpack.unpackb(body, raw=False)
            elif state.get("format") != 1:
                raise ValueError(f"state format {state.get('format')!r}")
            silent = _silences(state.get("heard"), len(state["sources"]), self.wall_clock())
            snapshots = [(Snapshot(s, e, q, doc), quiet)
                         for (s, e, q, doc), quiet in zip(state["sources"], silent, strict=True)
                         if keep is None or keep(s)]
            offset = state["offset"]
            cell_offsets = state.get("cells") or {}
            if type(cell_offsets) is not dict or not all(
                    type(k) is str and type(v) is int for k, v in cell_offsets.items()):
                raise ValueError("cell offsets not a map of names to offsets")
            source_cells = state.get("source_cells") or {}
            if type(source_cells) is not dict or not all(
                    type(k) is str and type(v) is str for k, v in source_cells.items()):
                raise ValueError("source cells not a map of sources to cells")
        except Exception as exc:  # a damaged state means a cold start, not a crash
            LOG.warning("ignoring unreadable cache state %s: %s", where, exc)
            return None
        with self.lock:
            now = self.clock()
            for snap, quiet in snapshots:
                heard = None if quiet is None else now - quiet
                self.receiver.restore(snap, now, heard)
                if self.recorder is not None:
                    self.recorder.restored(snap, now, heard)
            self.origins.update(state.get("origins") or {})
            self.source_cells.update(source_cells)
            self.offset = offset
            self.cell_offsets = dict(cell_offsets)
        LOG.info("restored %d sources at stream offset %s%s from %s", len(snapshots), offset,
                 "".join(f", {c} at {o}" for c, o in sorted(cell_offsets.items())), where)
        return RestoredState(offset)


@dataclass(frozen=True, slots=True)
class StateCut:
    """What :meth:`HostStateCache.cut` took; :meth:`pack` makes the state's bytes."""

    offset: int | None
    cells: dict[str, int]
    views: ViewCut
    origins: dict[str, str]
    source_cells: dict[str, str]
    #: when the cut was taken: the receiver's clock (the views' ``heard`` are on it), and
    #: the wall clock's seconds, which the state carries
    taken: float = 0.0
    wall: float = 0.0
    #: seconds the cut held the lock (the views' list; the maps' copies take less)
    held_s: float = 0.0

    def pack(self) -> bytes:
        """The checksummed state, as one ``msgpack.packb`` of the whole map would make it,
        packed a view at a time so that the other threads run between views (a single
        call over 100 000 views holds the interpreter for seconds)."""
        packer = msgpack.Packer(use_bin_type=True)
        parts = [packer.pack_map_header(6),
                 packer.pack("offset"), packer.pack(self.offset),
                 packer.pack("cells"), packer.pack(self.cells),
                 packer.pack("sources"), packer.pack_array_header(len(self.views))]
        parts.extend(packer.pack(view) for view in self.views.views())
        taken = self.taken
        parts += [packer.pack("origins"), packer.pack(self.origins),
                  packer.pack("source_cells"), packer.pack(self.source_cells),
                  # [wall-clock time of the cut, seconds each source had been silent then]
                  packer.pack("heard"),
                  packer.pack([self.wall, [max(0.0, taken - heard) for heard in self.views.heard]])]
        body = b"".join(parts)
        return msgpack.packb({"format": STATE_FORMAT, "state": body, "check": _checksum(body)},
                             use_bin_type=True)


def _silences(heard: Any, count: int, wall_now: float) -> list[float | None]:
    """How long each of a state's ``count`` sources has been silent now, from its ``heard``
    entry (``[wall-clock time of the cut, [seconds silent then, ...]]``) and the wall clock
    now; every source None (heard now) for a state saved without one.  A wall clock behind
    the cut's (another scheduler's clock, or one set back) adds nothing."""
    if heard is None:
        return [None] * count
    if (type(heard) is not list or len(heard) != 2 or type(heard[0]) not in (int, float)
            or type(heard[1]) is not list or len(heard[1]) != count
            or not all(type(q) in (int, float) and q >= 0 for q in heard[1])):
        raise ValueError("heard: not [wall-clock time, a silence per source]")
    since = max(0.0, wall_now - heard[0])
    return [q + since for q in heard[1]]


def _checksum(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()
