"""Update logs: every input of a scheduler's host-state cache (or a reporter's output), for ``shm replay``.

Theory of operation
-------------------
Invariant 5 says that replaying a scheduler's update log through the cache
reproduces its state digest at every point.  The receiver
(:class:`~protocol.receiver.ReceiverMachine`) is deterministic given its
inputs and the clock values it is handed, so the log records exactly those
inputs, in the order they were applied (every hook runs under the cache lock,
right after the receiver step it records), plus what the step produced and
periodic digests of the resulting state, so a replay can prove it arrived at
the same place::

    stream bytes ---+                                  +--> RX_STREAM  (now, offset, bytes as received)
    control bytes --+--> HostStateCache --> receiver --+--> RX_CONTROL (now, bytes as received)
    clock ----------+        (hooks)                   +--> TICK       (now)
    decisions ---------> receiver.add_claim / ... -----+--> CLAIM, CANCEL, RESYNC, HINT, FORGET (now, args)
                                                       +--> effects of the step: resync requests sent,
                                                       |    claim outcomes (compared on replay)
                                    every checkpoint_interval --> CHECKPOINT (digest of every view)

Two rules make it cheap enough to leave on (< 10 % of ingest, see
:mod:`simulator.bench_updatelog`): message bytes are recorded as received,
never re-encoded, and records go to a memory buffer that is written out in
large chunks (at ``buffer_bytes``, at checkpoints, at close) with no fsync.
A crash can lose the unwritten tail; the reader replays up to where the file
ends and says so.

File format
-----------
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

Records (fields after the kind; ``effects`` is present only when the step
produced something: ``{"s": [[to, encoded ResyncRequest], ...], "o":
[[claim_id, source, outcome], ...]}``):

=============  ==  ====================================================================
RX_STREAM       1  now, stream offset, message bytes[, effects]
RX_CONTROL      2  now, message bytes[, effects]      (resync answers, claim results;
                   on a reporter: claims and resync requests it handled)
RX_DROPPED      3  now, plane ("stream"/"control"), offset, bytes (first 64 KiB): invalid, not applied
TICK            4  now[, effects]                     (receiver.tick)
CLAIM           5  now, encoded Claim[, effects]      (receiver.add_claim)
RESYNC          6  now, source, full[, effects]       (receiver.request_resync)
HINT            7  now, source[, effects]             (receiver.add_source_hint)
FORGET          8  now, source[, effects]             (receiver.forget)
RESTORE         9  now, encoded Snapshot[, effects]   (cache.load after a restart)
TX             10  now, to, encoded message           (claims sent; a reporter's control casts)
CANCEL         11  now, source, claim id[, effects]   (receiver.cancel_claim)
CHECKPOINT     12  now, combined hash (8 bytes), number of views, changed views
                   [[source, [epoch, seq, digest, down, [pending claim ids]] | None], ...]
                   (digest: 16 bytes, b"" = no document yet, None = not digested this time)
DECISION       13  now, {id, spec, rng, subset, live, path, alts}   (before the decision runs)
DECISION_END   14  now, {id, rows | None, error}                    (after; rows: per instance
                   [uuid, [[source, weight, claim_id, epoch, seq, digest], ...]])
ENGINE         15  now, {config, filters, weighers, path, live}     (the decision engine attached)
NOTE           16  now, text
PUBLISHED      20  now, message bytes                  (a reporter's batch, as published)
=============  ==  ====================================================================

A checkpoint lists only the views that changed since the previous one, and
the XOR of an 8-byte BLAKE2b hash of every view's state.  Version, liveness
and pending claims of every view are checked at every checkpoint; document
digests (~60 us each on a realistic host) are taken within a time budget
(``digest_budget``, default 0.5 % of the interval), free when the receiver
already computed one for a heartbeat, and a view left out is digested at a
later checkpoint.  That bounds both the CPU a checkpoint costs and how long it
holds the cache lock (~2 us per changed view plus the budget).

Hooks
-----
:meth:`Recorder.attach_cache` (called by ``HostStateCache(recorder=...)``)
writes the header and wraps the receiver's other entry points (``add_claim``,
``request_resync``, ``add_source_hint``, ``forget``) on that receiver
instance, so a claim registered by the decision engine, the request tracker
or a test is recorded whoever calls it (callers hold the cache lock, as they
must anyway).  :meth:`Recorder.attach_engine` records the engine's
configuration and wraps ``select_destinations``.  On a reporter,
:meth:`Recorder.attach_reporter` (called by ``ReporterService.start``)
writes the header; the service records what it publishes and handles.

A recording failure (disk full, ...) is logged once and turns recording off;
it never breaks ingest.
"""

from __future__ import annotations

import array
import dataclasses
import glob
import itertools
import logging
import os
import random
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

import msgpack

from protocol import codec, hashing
from protocol.messages import PROTOCOL_VERSION, Message, Send, Snapshot

LOG = logging.getLogger(__name__)

FORMAT = 1
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
PUBLISHED = 20

KIND_NAMES = {
    HEADER: "header", RX_STREAM: "rx_stream", RX_CONTROL: "rx_control", RX_DROPPED: "rx_dropped",
    TICK: "tick", CLAIM: "claim", RESYNC: "resync", HINT: "hint", FORGET: "forget",
    RESTORE: "restore", TX: "tx", CANCEL: "cancel", CHECKPOINT: "checkpoint", DECISION: "decision",
    DECISION_END: "decision_end", ENGINE: "engine", NOTE: "note", PUBLISHED: "published",
}

SCHEDULER = "scheduler"
REPORTER = "reporter"

#: receiver parameters copied into a scheduler log's header (replay builds its receiver from them)
RECEIVER_PARAMS = ("reorder_window", "reorder_timeout", "resync_timeout", "resync_backoff_max",
                   "down_interval", "claim_deadline")


# --------------------------------------------------------------------------
# view states: what a checkpoint records (shared with the replayer)

#: digest field of a view that holds no document yet (None means "not digested at this checkpoint")
NO_DOCUMENT = b""


def view_base(view: Any) -> tuple:
    """What every checkpoint records of every view: version, liveness, pending claims."""
    pending = view.pending
    return (view.epoch, view.seq, view.down, tuple(sorted(pending)) if pending else ())


def view_state(view: Any, digest: bool = True) -> tuple:
    """(epoch, seq, document digest | None | NO_DOCUMENT, down, pending claim ids)."""
    epoch, seq, down, pending = view_base(view)
    if view.doc is None:
        dig: bytes | None = NO_DOCUMENT
    else:
        dig = view.digest() if digest else None
    return (epoch, seq, dig, down, pending)


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

    __slots__ = ("states", "hashes", "acc", "_pack")

    def __init__(self) -> None:
        self.states: dict[str, tuple] = {}
        self.hashes: dict[str, int] = {}
        self.acc = 0
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def scan(self, sources: Mapping[str, Any], budget: float = float("inf")) -> list[list[Any]]:
        changes: list[list[Any]] = []
        states = self.states
        deadline = time.perf_counter() + budget if budget != float("inf") else None
        spent = False
        for source, view in sources.items():
            base = view_base(view)
            old = states.get(source)
            if old is not None and old[:2] == base[:2] and old[3:] == base[2:]:
                recorded = old[2]
                if recorded is not None and (recorded == NO_DOCUMENT or view._digest == recorded):
                    continue  # unchanged and digested
                if spent:
                    continue
                # not digested yet, or the document was replaced at the same version
                # (a full resync after a divergence drops the cached digest)
            if view.doc is None:
                dig: bytes | None = NO_DOCUMENT
            else:
                dig = view._digest  # computed for a heartbeat check: free
                if dig is None and not spent:
                    dig = view.digest()
                    spent = deadline is not None and time.perf_counter() > deadline
            state = (base[0], base[1], dig, base[2], base[3])
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
    epoch, seq, dig, down, pending = state
    return (epoch, seq, dig, down, tuple(pending))


# --------------------------------------------------------------------------
# request specs and RNG states in a log


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__type__": type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = _plain(getattr(value, f.name))
        return out
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def spec_to_wire(spec: Any) -> dict[str, Any]:
    """A RequestSpec as plain msgpack-able data (dataclasses tagged with their type name)."""
    return _plain(spec)


def spec_from_wire(data: Mapping[str, Any]) -> Any:
    """Rebuild a RequestSpec recorded by :func:`spec_to_wire` (unknown fields are ignored)."""
    from shared_host_manager import request  # local: only replay needs the decision path

    types = {"Flavor": request.Flavor, "InstanceGroup": request.InstanceGroup,
             "RequestSpec": request.RequestSpec}

    def build(value: Any) -> Any:
        if isinstance(value, dict):
            cls = types.get(value.get("__type__", ""))
            if cls is None:
                return {k: build(v) for k, v in value.items()}
            kwargs = {}
            for f in dataclasses.fields(cls):
                if f.name in value:
                    v = build(value[f.name])
                    default = f.default if f.default is not dataclasses.MISSING else None
                    if isinstance(v, list) and isinstance(default, tuple):
                        v = tuple(v)
                    kwargs[f.name] = v
            return cls(**kwargs)
        if isinstance(value, list):
            return [build(v) for v in value]
        return value

    return build(dict(data, __type__="RequestSpec"))


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


# --------------------------------------------------------------------------
# the writer


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


class LogWriter:
    """Append-only, buffered, rotating writer of one log (not thread-safe: the recorder locks)."""

    def __init__(self, base: str, header: dict[str, Any], *, max_file_bytes: int,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        self.base = base
        self.header = dict(header)
        self.max_file_bytes = max_file_bytes
        self.buffer_bytes = buffer_bytes
        self._packer = msgpack.Packer(use_bin_type=True)
        self._buf = bytearray()
        self._file: Any = None
        self._size = 0
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        self.part, self.records = self._continue_after_existing()
        self.files: list[str] = []
        self._open()

    def _continue_after_existing(self) -> tuple[int, int]:
        parts = part_paths(self.base)
        if not parts:
            return 0, 0
        from shared_host_manager.replay import LogReader  # local: replay imports this module

        last = parts[-1]
        reader = LogReader([last])
        count = sum(1 for rec in reader if rec.index >= 0)  # headers are not numbered
        first = reader.headers[0].get("first_record", 0) if reader.headers else 0
        return int(last[len(self.base) + 1:]), int(first or 0) + count

    def _open(self) -> None:
        while True:
            self.part += 1
            path = f"{self.base}.{self.part:04d}"
            try:
                self._file = open(path, "xb", buffering=0)  # noqa: SIM115 — closed in close()
                break
            except FileExistsError:
                continue
        self.files.append(path)
        header = dict(self.header, part=self.part, first_record=self.records)
        head = MAGIC + frame(msgpack.packb([HEADER, header], use_bin_type=True))
        self._file.write(head)
        self._size = len(head)

    def append(self, record: list[Any]) -> None:
        payload = self._packer.pack(record)
        buf = self._buf
        buf += FRAME.pack(len(payload), hashing.crc32(payload))
        buf += payload
        self.records += 1
        if len(buf) >= self.buffer_bytes:
            self.flush()

    def flush(self) -> None:
        buf = self._buf
        if buf and self._file is not None:
            self._file.write(buf)
            self._size += len(buf)
            buf.clear()
            if self._size >= self.max_file_bytes:
                self._file.close()
                self._open()

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None


# --------------------------------------------------------------------------
# the recorder


class Recorder:
    """Records one party (a scheduler's cache or a reporter) into an update log.

    Built detached; :meth:`attach_cache` or :meth:`attach_reporter` names the
    party, writes the header and starts recording.  Every hook is cheap and
    never raises.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        digest_budget: float | None = None,
    ) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self.checkpoint_interval = checkpoint_interval
        #: seconds of document digests per checkpoint (the rest wait for the next one),
        #: which bounds how long a checkpoint holds the cache lock; default: 0.5 % of
        #: the interval, at least 2 ms
        self.digest_budget = (max(0.002, checkpoint_interval * 0.005) if digest_budget is None
                              else digest_budget)
        self.buffer_bytes = buffer_bytes
        self.role: str | None = None
        self.name: str | None = None
        self.session = uuid.uuid4().hex[:16]
        self._lock = threading.Lock()
        self._writer: LogWriter | None = None
        self._cache: Any = None
        self._receiver: Any = None
        self._clock: Callable[[], float] = time.monotonic
        self._states = ViewStates()
        self._next_checkpoint = float("-inf")
        self._olist: list | None = None
        self._oseen = 0
        self._decisions = itertools.count(1)
        self.enabled = False
        self.closed = False
        self.errors = 0
        self.checkpoints = 0

    # -- life cycle --------------------------------------------------------------

    @property
    def path(self) -> str | None:
        """The log's base path (parts are ``path.0001``, ...)."""
        return self._writer.base if self._writer is not None else None

    @property
    def files(self) -> list[str]:
        return list(self._writer.files) if self._writer is not None else []

    @property
    def records(self) -> int:
        return self._writer.records if self._writer is not None else 0

    def _start(self, role: str, name: str, config: dict[str, Any], clock: Callable[[], float]) -> None:
        if self._writer is not None:
            raise RuntimeError(f"recorder already attached to {self.role} {self.name!r}")
        self.role, self.name, self._clock = role, name, clock
        header = {
            "format": FORMAT, "role": role, "name": name, "session": self.session,
            "config": config, "clock": clock(), "wall": time.time(),
            "protocol_version": PROTOCOL_VERSION, "host": socket.gethostname(), "pid": os.getpid(),
        }
        self._writer = LogWriter(log_base(self.directory, role, name), header,
                                 max_file_bytes=self.max_file_bytes, buffer_bytes=self.buffer_bytes)
        self.enabled = True

    def attach_cache(self, cache: Any) -> None:
        """Record a :class:`~shared_host_manager.cache.HostStateCache` (before it ingests anything)."""
        if getattr(cache, "recorder", None) is not None:
            raise RuntimeError(f"the cache of {cache.receiver.name!r} is already recorded")
        receiver = cache.receiver
        config = {p: getattr(receiver, p) for p in RECEIVER_PARAMS}
        config["checkpoint_interval"] = self.checkpoint_interval
        self._start(SCHEDULER, receiver.name, config, cache.clock)
        self._cache = cache
        self._receiver = receiver
        self._olist = receiver._outcomes  # peeked, never drained: see _effects
        self._oseen = len(self._olist)
        cache.recorder = self
        self._wrap_receiver(receiver)
        if receiver.sources:
            # Attached late: what the receiver already holds is recorded as restored
            # snapshots (timers and pending claims from before are not reproducible).
            now = cache.clock()
            self.note(now, f"attached to a running cache holding {len(receiver.sources)} sources")
            for view in list(receiver.sources.values()):
                if view.doc is not None:
                    self._append([RESTORE, now, codec.encode(
                        Snapshot(view.source, view.epoch, view.seq, view.doc))])

    def attach_reporter(self, service: Any) -> None:
        """Record a :class:`~compute_reporter.service.ReporterService` (from its ``start()``)."""
        manager = service.manager
        config = dict(getattr(service, "_params", {}))
        config["sources"] = {s: m.epoch for s, m in manager.machines.items()}
        self._start(REPORTER, service.name, config, service.clock)

    def close(self) -> None:
        """Write a last checkpoint (scheduler) and everything buffered; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._writer is None:
            return
        try:
            if self.enabled and self._cache is not None:
                with self._cache.lock:
                    self._checkpoint(self._clock())
        except Exception as exc:  # noqa: BLE001 — never let the log break a shutdown
            self._failed(exc)
        with self._lock:
            self.enabled = False
            try:
                self._writer.close()
            except OSError as exc:
                LOG.warning("update log %s: close failed: %s", self._writer.base, exc)

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None and self.enabled:
                try:
                    self._writer.flush()
                except OSError as exc:
                    self._failed_locked(exc)

    # -- internals -----------------------------------------------------------------

    def _append(self, record: list[Any]) -> None:
        with self._lock:
            if not self.enabled:
                return
            try:
                self._writer.append(record)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001
                self._failed_locked(exc)

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failed_locked(exc)

    def _failed_locked(self, exc: BaseException) -> None:
        self.errors += 1
        if self.enabled:
            self.enabled = False
            LOG.error("update log of %s %s failed, recording stopped: %s", self.role, self.name, exc)

    def _effects(self, sends: Sequence[Send] | None) -> dict[str, Any] | None:
        """What the step just recorded produced: resync requests and new claim outcomes.

        Outcomes are peeked from the receiver's list (the request tracker drains
        it; we only remember how much of the current list we have seen).
        """
        effects = None
        if sends:
            effects = {"s": [[s.to, codec.encode(s.message)] for s in sends]}
        receiver = self._receiver
        if receiver is not None:
            lst = receiver._outcomes
            if lst is not self._olist:
                self._olist = lst
                self._oseen = 0
            n = len(lst)
            if n > self._oseen:
                new = [[c, s, o.value] for c, s, o in lst[self._oseen:n]]
                self._oseen = n
                if effects is None:
                    effects = {}
                effects["o"] = new
        return effects

    def _step(self, record: list[Any], sends: Sequence[Send] | None, now: float) -> None:
        effects = self._effects(sends)
        if effects is not None:
            record.append(effects)
        self._append(record)
        if now >= self._next_checkpoint:
            self._checkpoint(now)

    def _checkpoint(self, now: float) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        changes = self._states.scan(receiver.sources, self.digest_budget)
        self._next_checkpoint = now + self.checkpoint_interval
        self.checkpoints += 1
        self._append([CHECKPOINT, now, self._states.combined, len(receiver.sources), changes])
        self.flush()

    def _wrap_receiver(self, receiver: Any) -> None:
        add_claim = receiver.add_claim
        cancel_claim = receiver.cancel_claim
        request_resync = receiver.request_resync
        add_source_hint = receiver.add_source_hint
        forget = receiver.forget

        def recorded_add_claim(claim: Any, now: float) -> None:
            add_claim(claim, now)
            if self.enabled:
                self._guard(self._step, [CLAIM, now, codec.encode(claim)], None, now)

        def recorded_cancel_claim(source: str, claim_id: str) -> bool:
            cancelled = cancel_claim(source, claim_id)
            if self.enabled:
                now = self._clock()
                self._guard(self._step, [CANCEL, now, source, claim_id], None, now)
            return cancelled

        def recorded_request_resync(source: str, now: float, *, full: bool = False) -> list[Send]:
            out = request_resync(source, now, full=full)
            if self.enabled:
                self._guard(self._step, [RESYNC, now, source, full], out, now)
            return out

        def recorded_add_source_hint(source: str, now: float) -> list[Send]:
            out = add_source_hint(source, now)
            if self.enabled:
                self._guard(self._step, [HINT, now, source], out, now)
            return out

        def recorded_forget(source: str) -> None:
            forget(source)
            if self.enabled:
                now = self._clock()
                self._guard(self._step, [FORGET, now, source], None, now)

        receiver.add_claim = recorded_add_claim
        receiver.cancel_claim = recorded_cancel_claim
        receiver.request_resync = recorded_request_resync
        receiver.add_source_hint = recorded_add_source_hint
        receiver.forget = recorded_forget

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 — recording must never break the caller
            self._failed(exc)

    # -- hooks: scheduler cache (called under the cache lock) ---------------------------

    def stream(self, body: bytes, offset: int | None, now: float, sends: Sequence[Send]) -> None:
        """A stream message was applied (the bytes as received)."""
        if self.enabled:
            try:
                self._step([RX_STREAM, now, offset, body], sends, now)
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

    def control(self, body: bytes, now: float, sends: Sequence[Send] | None = None) -> None:
        """A control message was applied (scheduler) or handled (reporter)."""
        if self.enabled:
            try:
                if self._receiver is not None:
                    self._step([RX_CONTROL, now, body], sends, now)
                else:
                    self._append([RX_CONTROL, now, body])
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

    def dropped(self, body: Any, plane: str, offset: int | None, now: float) -> None:
        """An invalid message was dropped before the receiver (recorded, never replayed)."""
        if self.enabled:
            try:
                data = bytes(body[:DROPPED_BODY_LIMIT]) if isinstance(
                    body, (bytes, bytearray, memoryview)) else repr(body)[:1024].encode()
                self._append([RX_DROPPED, now, plane, offset, data])
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

    def tick(self, now: float, sends: Sequence[Send]) -> None:
        if self.enabled:
            try:
                self._step([TICK, now], sends, now)
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

    def restored(self, snapshot: Snapshot, now: float) -> None:
        """``cache.load`` fed a saved source back to the receiver."""
        if self.enabled:
            self._guard(self._step, [RESTORE, now, codec.encode(snapshot)], None, now)

    # -- hooks: both roles ---------------------------------------------------------------

    def sent(self, to: str | None, message: Message, now: float) -> None:
        """A control message went out (a claim; a reporter's claim result or resync answer)."""
        if self.enabled:
            self._guard(lambda: self._append([TX, now, to, codec.encode(message)]))

    def published(self, body: bytes, now: float) -> None:
        """A reporter published ``body`` on the stream."""
        if self.enabled:
            self._guard(self._append, [PUBLISHED, now, body])

    def note(self, now: float, text: str) -> None:
        if self.enabled:
            self._guard(self._append, [NOTE, now, text])

    # -- decisions ------------------------------------------------------------------------

    def attach_engine(self, engine: Any) -> None:
        """Record the decisions of a :class:`~shared_host_manager.scheduler.DecisionEngine`.

        Writes the engine's configuration once, then wraps ``select_destinations``
        on the instance: a DECISION record (request spec, RNG and subset state)
        before it runs, a DECISION_END record (hosts, weights, claims, the view
        versions they were based on) after.  The claims it registers are
        recorded by the receiver hooks in between.
        """
        if self._receiver is None:
            raise RuntimeError("attach the cache before the engine")
        config = _plain(engine.config)
        config.pop("__type__", None)
        self._append([ENGINE, self._clock(), {
            "config": config,
            "filters": [type(f).__name__ for f in engine.filters],
            "weighers": [type(w).__name__ for w in engine.weighers],
            "path": engine.path, "live": engine.live_schedulers,
        }])
        select = engine.select_destinations
        recorder = self

        def select_destinations(spec: Any, now: float, *, return_alternates: bool = True,
                                live_schedulers: int | None = None, path: str | None = None) -> Any:
            did = None
            if recorder.enabled:
                did = next(recorder._decisions)
                recorder._guard(recorder._decision_begin, did, engine, spec, now, return_alternates,
                                live_schedulers, path)
            try:
                rows = select(spec, now, return_alternates=return_alternates,
                              live_schedulers=live_schedulers, path=path)
            except Exception as exc:
                if did is not None:
                    recorder._guard(recorder._append, [DECISION_END, now, {
                        "id": did, "rows": None, "error": f"{type(exc).__name__}: {exc}"}])
                raise
            if did is not None:
                recorder._guard(recorder._decision_end, did, rows, now)
            return rows

        engine.select_destinations = select_destinations

    def _decision_begin(self, did: int, engine: Any, spec: Any, now: float, alts: bool,
                        live: int | None, path: str | None) -> None:
        try:
            wire = spec_to_wire(spec)
            msgpack.packb(wire, use_bin_type=True)
        except Exception as exc:  # noqa: BLE001 — an exotic spec is summarised, not replayable
            wire = None
            LOG.debug("decision %d: request spec not recordable: %s", did, exc)
        self._append([DECISION, now, {
            "id": did, "spec": wire, "summary": _spec_summary(spec),
            "rng": rng_to_wire(engine.rng),
            "subset": [engine.subset.rate, engine.subset.observed],
            "live": engine.live_schedulers if live is None else live,
            "path": path or engine.path, "alts": alts,
        }])

    def _decision_end(self, did: int, rows: Any, now: float) -> None:
        sources = self._receiver.sources
        out = []
        for row in rows:
            hosts = []
            for sel in row:
                view = sources.get(sel.source)
                if view is None:
                    hosts.append([sel.source, sel.weight, sel.claim_id, None, None, None])
                else:
                    hosts.append([sel.source, sel.weight, sel.claim_id, view.epoch, view.seq,
                                  view.digest()])
            out.append([row[0].instance_uuid if row else None, hosts])
        self._append([DECISION_END, now, {"id": did, "rows": out, "error": None}])


def _spec_summary(spec: Any) -> dict[str, Any]:
    try:
        return {"request_id": spec.request_id, "resources": dict(spec.resources),
                "instances": list(spec.instance_uuids) or spec.num_instances,
                "project_id": spec.project_id}
    except Exception:  # noqa: BLE001
        return {"repr": repr(spec)[:200]}


# --------------------------------------------------------------------------
# configuration and the simulator's hook


def from_conf(conf: Any) -> Recorder | None:
    """A detached recorder if ``[update_log] enabled``, else None (see conf/updatelog.py)."""
    group = conf.update_log
    if not group.enabled:
        return None
    if not group.directory:
        raise ValueError("[update_log] enabled = true needs [update_log] directory")
    return Recorder(group.directory, max_file_bytes=group.max_file_bytes,
                    checkpoint_interval=group.checkpoint_interval)


class RunRecording:
    """Recorders for every party of one in-process run (``shm sim --record DIR``).

    Usage::

        rec = RunRecording(directory)
        sched = SchedulerService(..., recorder=rec.recorder())   # or rec.attach(sched) before start
        reporter = ReporterService(..., recorder=rec.recorder())
        ... run ...
        rec.close()            # after the services stopped (stop() closes their recorder too)
        rec.logs()             # {(role, name): base path} for `shm replay`
    """

    def __init__(self, directory: str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._params = dict(max_file_bytes=max_file_bytes, checkpoint_interval=checkpoint_interval,
                            buffer_bytes=buffer_bytes)
        self.recorders: list[Recorder] = []

    def recorder(self) -> Recorder:
        """A new detached recorder; the party it is given to attaches it."""
        rec = Recorder(self.directory, **self._params)
        self.recorders.append(rec)
        return rec

    def attach(self, party: Any) -> Recorder:
        """Record an already built (not yet started) SchedulerService, HostStateCache,
        ReporterService or DecisionEngine (the engine after its scheduler's cache)."""
        from compute_reporter.service import ReporterService
        from shared_host_manager.cache import HostStateCache
        from shared_host_manager.service import SchedulerService

        if isinstance(party, SchedulerService):
            rec = self.recorder()
            party.recorder = rec
            rec.attach_cache(party.cache)
            return rec
        if isinstance(party, HostStateCache):
            rec = self.recorder()
            rec.attach_cache(party)
            return rec
        if isinstance(party, ReporterService):
            rec = self.recorder()
            party.recorder = rec  # attached by start(), once the manager exists
            return rec
        for rec in self.recorders:
            if rec._receiver is not None and rec._receiver is getattr(party, "receiver", None):
                rec.attach_engine(party)
                return rec
        raise TypeError(f"cannot record a {type(party).__name__} (attach its scheduler's cache first)")

    def close(self) -> None:
        for rec in self.recorders:
            rec.close()

    def logs(self) -> dict[tuple[str, str], str]:
        return {(r.role, r.name): r.path for r in self.recorders if r.path}  # type: ignore[misc]


def record_run(directory: str, **params: Any) -> RunRecording:
    """The simulator's hook: recorders for every party of a run, writing into ``directory``."""
    return RunRecording(directory, **params)


__all__ = [
    "FORMAT", "MAGIC", "NO_DOCUMENT", "Recorder", "RunRecording", "ViewStates", "from_conf", "log_base",
    "part_paths", "record_run", "spec_from_wire", "spec_to_wire", "view_base", "view_state",
]
