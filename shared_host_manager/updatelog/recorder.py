"""Recording an update log: every input of a scheduler's cache (or a reporter's output).

Theory of operation
-------------------
Invariant 5 (docs/design.md §6) says that replaying a scheduler's update log
through the cache reproduces its state digest at every point.  The receiver
(:class:`~protocol.receiver.ReceiverMachine`) is deterministic given its
inputs and the clock values it is handed, so the log records exactly those
inputs, in the order they were applied, plus what each step produced and
periodic digests of the resulting state, so a replay can prove it arrived at
the same place::

    stream bytes ---+                                  +--> RX_STREAM  (now, offset, bytes as received;
                    |                                  |    RX_CELL_STREAM: now, cell, offset, bytes)
    control bytes --+--> HostStateCache --> receiver --+--> RX_CONTROL (now, bytes as received)
    clock ----------+                                  +--> TICK       (now)
    decisions ---------> receiver.add_claim / ... -----+--> CLAIM, CANCEL, RESYNC, HINT, FORGET (now, args)
                                                       +--> effects of the step: resync requests sent,
                                                       |    claim outcomes (compared on replay)
                                    every checkpoint_interval --> CHECKPOINT (digest of every view)

The records and their fields are :mod:`shared_host_manager.updatelog.format`.

How it watches: through the explicit observer interfaces of the parties,
never by replacing their methods.  A :class:`Recorder` is at once

* the cache's :class:`~shared_host_manager.cache.CacheObserver` (messages as
  received, ticks, restores, claims sent) and, through it, the receiver's
  :class:`~protocol.receiver.ReceiverObserver` (claims added and cancelled,
  resyncs asked, hints, forgotten sources, every claim outcome: the effects),
  called under the cache lock right after the step;
* the engine's :class:`~shared_host_manager.decision.engine.DecisionObserver`
  (a DECISION record before a decision, DECISION_END after);
* the witness of decisions made outside the engine (``host_manager_step``: nova's
  handlers in the drop-in, a HOST_MANAGER record per step), for the drop-in's
  decision log, which finds it as the cache's observer and calls it through a
  contract of its own (:class:`shared_host_manager.nova.decision_log.StepObserver`);
* a reporter's :class:`~compute_reporter.service.ReporterObserver` (what it
  handled, published and cast), as the :class:`~compute_reporter.recorder.ReporterRecorder`
  it extends: the reporter's recorder, with the machinery every recorder shares
  (header, buffered writer, disabling itself on a failure), lives below the
  reporter so that ``shm reporter`` imports nothing of this package.

Life cycle::

    Recorder(directory)              detached: records nothing
      --cache_attached / reporter_attached-->  header written, recording
      --(a write fails)-->           disabled: logged once, never breaks the party
      --close()-->                   last checkpoint, buffer written, closed

Two rules make it cheap enough to leave on (< 10 % of ingest, see
:mod:`simulator.bench_updatelog`): message bytes are recorded as received,
never re-encoded, and records go to a memory buffer that is written out in
large chunks (at ``buffer_bytes``, at checkpoints, at close) with no fsync.
A crash can lose the unwritten tail; the reader replays up to where the file
ends and says so.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any, TypedDict

import msgpack
from oslo_config import cfg

from compute_reporter.recorder import RecordedReporter, ReporterRecorder
from compute_reporter.service import ReporterService
from protocol import codec
from protocol.messages import Claim, Send, Snapshot
from protocol.receiver import Outcome, ReceiverMachine, SourceView
from shared_host_manager.cache import CacheObserver, HostStateCache
from shared_host_manager.decision.engine import DecisionEngine, DecisionObserver, Selection
from shared_host_manager.decision.request import RequestSpec, plain_data
from shared_host_manager.service import SchedulerService
from shared_host_manager.updatelog.format import (
    CANCEL,
    CHECKPOINT,
    CLAIM,
    DECISION,
    DECISION_END,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAX_FILE_BYTES,
    ENGINE,
    FORGET,
    FORMAT,
    HINT,
    HOST_MANAGER,
    RECEIVER_PARAMS,
    RESTORE,
    RESYNC,
    RX_CELL_STREAM,
    RX_CONTROL,
    RX_STREAM,
    SCHEDULER,
    TICK,
    ViewStates,
    pending_claims,
    rng_to_wire,
    spec_to_wire,
)
from transport.updatelog.opts import check_conf, recorder_params

LOG = logging.getLogger(__name__)


class Effects(TypedDict, total=False):
    """What a recorded step produced (the last field of its record, compared on replay)."""

    #: the step's sends: [to, encoded message]
    s: list[list[str | bytes | None]]
    #: claim outcomes: [claim id, source, outcome]
    o: list[list[str]]


class Recorder(ReporterRecorder, CacheObserver, DecisionObserver):
    """Records one party (a scheduler's cache and engine, or a reporter) into an update log.

    Built detached; the party it is given to tells it :meth:`cache_attached`
    or :meth:`reporter_attached`, which names the party, writes the header and
    starts recording.  Every hook is cheap and never raises.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        digest_budget: float | None = None,
        max_total_bytes: int | None = None,
        max_age: float | None = None,
    ) -> None:
        super().__init__(directory, max_file_bytes=max_file_bytes, buffer_bytes=buffer_bytes,
                         max_total_bytes=max_total_bytes, max_age=max_age)
        self.checkpoint_interval = checkpoint_interval
        #: seconds of document digests per checkpoint (the rest wait for the next one),
        #: which bounds how long a checkpoint holds the cache lock; default: 0.5 % of
        #: the interval, at least 2 ms
        self.digest_budget = (max(0.002, checkpoint_interval * 0.005) if digest_budget is None
                              else digest_budget)
        self._cache: HostStateCache | None = None
        self._receiver: ReceiverMachine | None = None
        self._states = ViewStates()
        self._next_checkpoint = float("-inf")
        #: claim outcomes of the step being recorded (told by the receiver, written with the step)
        self._outcomes: list[list[str]] = []
        self._decisions = itertools.count(1)
        #: the engine's configuration as recorded (repeated in every part's base)
        self._engine: dict[str, Any] | None = None
        self.checkpoints = 0

    # -- life cycle --------------------------------------------------------------

    @property
    def receiver(self) -> ReceiverMachine | None:
        """The receiver of the recorded cache (None for a reporter, or detached)."""
        return self._receiver

    def cache_attached(self, cache: HostStateCache) -> None:
        """Start recording a :class:`~shared_host_manager.cache.HostStateCache` (under its lock)."""
        receiver = cache.receiver
        config = {p: getattr(receiver, p) for p in RECEIVER_PARAMS}
        config["checkpoint_interval"] = self.checkpoint_interval
        # the header names the format of the checkpoints this module writes (ViewStates)
        self._start(SCHEDULER, receiver.name, config, cache.clock, FORMAT)
        self._cache = cache
        self._receiver = receiver
        if receiver.sources:
            # Attached late: what the receiver already holds is recorded as restored
            # snapshots (timers and pending claims from before are not reproducible).
            now = cache.clock()
            self.note(now, f"attached to a running cache holding {len(receiver.sources)} sources")
            for view in list(receiver.sources.values()):
                if view.doc is not None:
                    self._append(_restore_record(view, now, receiver.down_interval))

    def close(self) -> None:
        """Write a last checkpoint (scheduler) and everything buffered; idempotent."""
        if not self.closed and self.enabled and self._cache is not None:
            try:
                with self._cache.lock:
                    self._checkpoint(self._clock())
            except Exception as exc:  # noqa: BLE001 — never let the log break a shutdown
                self._failed(exc)
        super().close()

    # -- internals -----------------------------------------------------------------

    def _effects(self, sends: Sequence[Send] | None) -> Effects | None:
        """What the step being recorded produced: resync requests and claim outcomes."""
        effects: Effects | None = None
        if sends:
            effects = {"s": [[s.to, codec.encode(s.message)] for s in sends]}
        if self._outcomes:
            if effects is None:
                effects = {}
            effects["o"], self._outcomes = self._outcomes, []
        return effects

    def _step(self, record: list[Any], sends: Sequence[Send] | None, now: float) -> None:
        effects = self._effects(sends)
        if effects is not None:
            record.append(effects)
        self._append(record)
        if now >= self._next_checkpoint:
            self._checkpoint(now)
        writer = self._writer
        if writer is not None and writer.rotated and self._receiver is not None:
            # a part was opened (by this step's flush, or since the last step): its base is
            # the state after this step's record (replay.Replayer.header says how it is read)
            self._base(now)

    def _record_step(self, record: list[Any], sends: Sequence[Send] | None, now: float) -> None:
        if self.enabled:
            try:
                self._step(record, sends, now)
            except Exception as exc:  # noqa: BLE001 — recording must never break the caller
                self._failed(exc)

    def _base(self, now: float) -> None:
        """A new part began: every held view as restore records, and the engine's
        configuration (under the cache lock, which every _step caller holds), then a full
        checkpoint, so the part replays without the parts before it."""
        receiver = self._receiver
        assert receiver is not None
        records: list[list[Any]] = [
            _restore_record(v, now, receiver.down_interval)
            for v in list(receiver.sources.values()) if v.doc is not None]
        if self._engine is not None:  # so that --decisions re-runs the part's decisions too
            records.append([ENGINE, now, self._engine])
        with self._lock:
            writer = self._writer
            if not self.enabled or writer is None:
                return
            try:
                writer.append_base(records)
            except Exception as exc:  # noqa: BLE001
                self._failed_locked(exc)
                return
        # a full checkpoint right after the base: one replayed from this part on compares every
        # view at once (checkpoints otherwise list only what changed since the previous one),
        # and holds the claims pending then, which it lists whole
        self._states = ViewStates()
        self._checkpoint(now, base=True)

    def _checkpoint(self, now: float, base: bool = False) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        changes = self._states.scan(receiver.sources, self.digest_budget)
        self._next_checkpoint = now + self.checkpoint_interval
        self.checkpoints += 1
        record = [CHECKPOINT, now, self._states.combined, len(receiver.sources), changes]
        if base:
            record.append({"pending": pending_claims(receiver.sources),
                           "peer_rejected": receiver.peer_rejections()})
        self._append(record)
        self.flush()

    # -- the receiver's observer (under the cache lock) -------------------------------------

    def claim_resolved(self, claim_id: str, source: str, outcome: Outcome) -> None:
        if self.enabled:
            self._outcomes.append([claim_id, source, outcome.value])

    def claim_added(self, claim: Claim, now: float) -> None:
        self._record_step([CLAIM, now, codec.encode(claim)], None, now)

    def claim_cancelled(self, source: str, claim_id: str, cancelled: bool) -> None:
        now = self._clock()
        self._record_step([CANCEL, now, source, claim_id], None, now)

    def resync_asked(self, source: str, now: float, full: bool, sends: list[Send]) -> None:
        self._record_step([RESYNC, now, source, full], sends, now)

    def source_hinted(self, source: str, now: float, sends: list[Send]) -> None:
        self._record_step([HINT, now, source], sends, now)

    def source_forgotten(self, source: str) -> None:
        now = self._clock()
        self._record_step([FORGET, now, source], None, now)

    # -- the cache's observer (under the cache lock) -----------------------------------------

    def stream(self, body: bytes, offset: int | None, now: float, sends: Sequence[Send],
               cell: str | None = None, heard: float | None = None) -> None:
        """A stream message was applied (the bytes as received); ``cell``: read from that
        cell's stream, at its own offsets; ``heard``: its source heard then, not now (a
        restart's backlog)."""
        record: list[Any] = ([RX_STREAM, now, offset, body] if cell is None
                             else [RX_CELL_STREAM, now, cell, offset, body])
        if heard is not None:
            record.append(heard)
        self._record_step(record, sends, now)

    def control(self, body: bytes, now: float, sends: Sequence[Send] | None = None) -> None:
        """A control message was applied (scheduler) or handled (reporter)."""
        if self._receiver is not None:
            self._record_step([RX_CONTROL, now, body], sends, now)
        else:
            super().control(body, now, sends)

    # dropped and sent (drops and claims cast, without the step's effects) are recorded as
    # for a reporter: ReporterRecorder's

    def tick(self, now: float, sends: Sequence[Send]) -> None:
        self._record_step([TICK, now], sends, now)

    def restored(self, snapshot: Snapshot, now: float, last_heard: float | None) -> None:
        """``cache.load`` fed a saved source back to the receiver (last heard then)."""
        record = [RESTORE, now, codec.encode(snapshot)]
        if last_heard is not None:
            record.append(last_heard)
        self._record_step(record, None, now)

    # -- the drop-in's decision log (nova/decision_log.py: its StepObserver) -------------------

    def host_manager_step(self, now: float, step: dict[str, Any]) -> None:
        """A step of a decision made outside the engine, plain data (a HOST_MANAGER record)."""
        if self.enabled:
            self._guard(self._append, [HOST_MANAGER, now, step])

    # -- the engine's observer (under the cache lock) -----------------------------------------

    def engine_attached(self, engine: DecisionEngine) -> None:
        """Record the decisions of a :class:`~shared_host_manager.decision.engine.DecisionEngine`
        from now on; writes its configuration once (and again in every part's base)."""
        if self._receiver is None:
            raise RuntimeError("attach the cache before the engine")
        config = plain_data(engine.config)
        config.pop("__type__", None)
        self._engine = {
            "config": config,
            "filters": [f.name for f in engine.filters],
            "weighers": [w.name for w in engine.weighers],
            # nova's clamp and normalisation bounds, so a replay weighs as this engine did
            "weigher_bounds": [[w.minval, w.maxval] for w in engine.weighers],
            "path": engine.path, "live": engine.live_schedulers,
        }
        self._append([ENGINE, self._clock(), self._engine])

    def decision_started(self, engine: DecisionEngine, spec: RequestSpec, now: float, *,
                         return_alternates: bool, live_schedulers: int | None,
                         path: str | None, delegable: bool = True) -> int | None:
        """A DECISION record: request spec, RNG and subset state, before the engine runs."""
        if not self.enabled:
            return None
        did = next(self._decisions)
        self._guard(self._decision_begin, did, engine, spec, now, return_alternates,
                    live_schedulers, path, delegable)
        return did

    def decision_finished(self, token: object, rows: list[list[Selection]], now: float) -> None:
        """A DECISION_END record: hosts, weights, claims and the view versions they were based on."""
        if isinstance(token, int):  # our decision id (None: not recording)
            self._guard(self._decision_end, token, rows, now)

    def decision_failed(self, token: object, error: Exception, now: float) -> None:
        if isinstance(token, int):
            self._guard(self._append, [DECISION_END, now, {
                "id": token, "rows": None, "error": f"{type(error).__name__}: {error}"}])

    def _decision_begin(self, did: int, engine: DecisionEngine, spec: RequestSpec, now: float,
                        alts: bool, live: int | None, path: str | None, delegable: bool) -> None:
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
            "scarce": engine.scarce_memory,
            "live": engine.live_schedulers if live is None else live,
            "peers": engine.peers,
            "path": path or engine.path, "alts": alts, "delegable": delegable,
        }])

    def _decision_end(self, did: int, rows: list[list[Selection]], now: float) -> None:
        if self._receiver is None:  # engine_attached insists on a cache first
            raise RuntimeError("a decision recorded without the scheduler's cache")
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


def _restore_record(view: SourceView, now: float, down_interval: float) -> list[Any]:
    """A held view as the restore record a part's base (or a late attach) begins with, its
    source last heard when it was: restored DOWN if it is DOWN, and ACTIVE if it is, even
    silent past ``down_interval`` already (the receiver's next look for silent views marks
    it, in the replay as it did here)."""
    assert view.doc is not None
    heard = view.last_heard if view.down else max(view.last_heard, now - down_interval)
    return [RESTORE, now, codec.encode(Snapshot(view.source, view.epoch, view.seq, view.doc)),
            heard]


def _spec_summary(spec: RequestSpec) -> dict[str, Any]:
    try:
        return {"request_id": spec.request_id, "resources": dict(spec.resources),
                "instances": list(spec.instance_uuids) or spec.num_instances,
                "project_id": spec.project_id}
    except Exception:  # noqa: BLE001
        return {"repr": repr(spec)[:200]}


# --------------------------------------------------------------------------
# configuration and the simulator's hook


def from_conf(conf: cfg.ConfigOpts) -> Recorder | None:
    """A detached recorder if ``[update_log] enabled``, else None (see
    :mod:`transport.updatelog.opts`, whose :func:`check_conf` is re-exported here)."""
    params = recorder_params(conf)
    return None if params is None else Recorder(**params)


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
        self.max_file_bytes = max_file_bytes
        self.checkpoint_interval = checkpoint_interval
        self.buffer_bytes = buffer_bytes
        self.recorders: list[Recorder] = []

    def recorder(self) -> Recorder:
        """A new detached recorder; the party it is given to attaches it."""
        rec = Recorder(self.directory, max_file_bytes=self.max_file_bytes,
                       checkpoint_interval=self.checkpoint_interval, buffer_bytes=self.buffer_bytes)
        self.recorders.append(rec)
        return rec

    def attach(self, party: SchedulerService | HostStateCache | ReporterService | DecisionEngine
               ) -> Recorder:
        """Record an already built (not yet started) SchedulerService, HostStateCache,
        ReporterService or DecisionEngine (the engine after its scheduler's cache)."""
        if isinstance(party, (SchedulerService, HostStateCache)):
            rec = self.recorder()
            party.set_recorder(rec)
            return rec
        if isinstance(party, ReporterService):
            rec = self.recorder()
            party.recorder = rec  # told by start(), once the manager exists
            return rec
        if isinstance(party, DecisionEngine):
            for rec in self.recorders:
                if rec.receiver is not None and rec.receiver is party.receiver:
                    party.set_observer(rec)
                    return rec
        raise TypeError(f"cannot record a {type(party).__name__} (attach its scheduler's cache first)")

    def close(self) -> None:
        for rec in self.recorders:
            rec.close()

    def logs(self) -> dict[tuple[str, str], str]:
        return {(r.role, r.name): r.path for r in self.recorders
                if r.role is not None and r.name is not None and r.path}


def record_run(directory: str, **params: Any) -> RunRecording:
    """The simulator's hook: recorders for every party of a run, writing into ``directory``."""
    return RunRecording(directory, **params)


__all__ = ["RecordedReporter", "Recorder", "RunRecording", "check_conf", "from_conf", "record_run"]
