"""The source-side state machine: one compute node (or any other source) as the
single writer of its document.

Theory of operation
-------------------
The machine owns the authoritative document and its version (epoch, seq).
Callers feed it three kinds of input and collect :class:`~protocol.messages.Send`
instructions:

* local changes – :meth:`SourceMachine.change` / :meth:`update_namespace` /
  :meth:`replace_document`, applied at once to the document and merged into
  one *pending delta* (last write per key wins);
* control messages – :meth:`handle_claim` (the arbiter) and
  :meth:`handle_resync`;
* time – :meth:`poll` with the current clock.

Life cycle of a change::

    change() --> pending delta --(window elapsed | claim | heartbeat due | resync)--> Delta(seq+1)
                                                                                        |
                                                                  ring buffer <---------+
                                                    (answers resyncs until it falls off; then a snapshot)

The first :meth:`poll` of a machine announces it with a :class:`Snapshot`, so a
restart (a new epoch) is established at every scheduler without being asked.

Claims: :meth:`handle_claim` accepts a claim iff it fits the authoritative
document *now* (:func:`protocol.resources.check_fit`) and keeps its server
group's policy on this host (:func:`protocol.groups.group_conflict`), applies its consumption,
and publishes at once a delta that lists the claim id.  Otherwise it answers
the claiming scheduler with a rejection and a correction (the deltas it
missed since the version it decided on, or a snapshot).  Answers are
remembered by claim id, so a claim received twice is answered the same and
applied once.  That memory does not survive a restart, so a claim decided on
another epoch is rejected (with a snapshot as correction): every receiver
retires such a claim as ``epoch_changed`` anyway, and accepting it could apply
a duplicate a second time, or consume resources for a claim its scheduler
already gave up on.

Rules: the clock is an argument, never read; nothing here does I/O; the
machine never emits seq N+1 before seq N.

The contract: docs/design.md §3 (versions) and §5.3 (arbitration).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import islice
from typing import Any

from protocol.document import (
    DEL,
    DROP,
    SET,
    CanonicalCache,
    Document,
    Op,
    copy_document,
    diff,
    merge_ops,
    same_value,
)
from protocol.errors import LocalProtocolError
from protocol.groups import GROUP_KEY, group_conflict
from protocol.hostdoc import COMPUTE, INSTANCES, SERVICE
from protocol.messages import (
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    Message,
    ResyncAnswer,
    ResyncRequest,
    Send,
    Snapshot,
)
from protocol.resources import check_fit


def next_epoch(previous: int | None, wall_ns: int) -> int:
    """An epoch newer than ``previous``: the wall clock in ns, or previous+1 if the clock is behind.

    The caller persists the returned value so that the next restart is newer
    still even if the wall clock went backwards.
    """
    return wall_ns if previous is None or wall_ns > previous else previous + 1


class SourceMachine:
    """Single writer of one source's document; see the module docstring."""

    def __init__(
        self,
        source: str,
        epoch: int,
        doc: Document | None = None,
        *,
        coalesce_window: float = 0.05,
        heartbeat_interval: float = 10.0,
        ring_size: int = 256,
        max_resync_deltas: int = 256,
        claim_memory: int = 4096,
        heartbeat_phase: float = 1.0,
    ) -> None:
        if epoch < 0:
            raise LocalProtocolError(f"epoch must be >= 0, got {epoch}")
        self.source = source
        self.epoch = epoch
        self.seq = 0
        self.coalesce_window = coalesce_window
        self.heartbeat_interval = heartbeat_interval
        #: fraction of an interval between the announcement and the first heartbeat;
        #: a reporter serving many hosts spreads them so heartbeats do not come in bursts
        self.heartbeat_phase = heartbeat_phase
        self.max_resync_deltas = max_resync_deltas
        self._doc: Document = copy_document(doc or {})
        for ns in [ns for ns, entries in self._doc.items() if not entries]:
            del self._doc[ns]
        self._pending: dict[tuple[str, str | None], Op] = {}
        self._pending_claims: list[str] = []
        self._pending_since: float | None = None
        # A resync answer carries at most max_resync_deltas deltas, so a delta older than
        # that is never sent again: the ring keeps no more (the reporter's memory bound,
        # docs/design.md §4.3).
        self._ring: deque[Delta] = deque(maxlen=min(ring_size, max_resync_deltas))
        self._results: OrderedDict[str, ClaimResult] = OrderedDict()
        self._claim_memory = claim_memory
        #: accepted claims still worth listing in a snapshot (newest last); a restarted
        #: source rebuilt from its last document lists the claims of the instances it
        #: still holds, so schedulers see those claims as included, not lost
        self._included: OrderedDict[str, int] = OrderedDict(
            (record["claim"], 0) for record in self._doc.get(INSTANCES, {}).values()
            if type(record) is dict and type(record.get("claim")) is str)
        self._announced = False
        self._last_heartbeat: float | None = None
        self._digest: bytes | None = None
        self._canonical = CanonicalCache()
        #: optional observer of every effective change (ops as applied), for an edge
        #: that mirrors the document elsewhere (nova's resource tracker writes its
        #: database on every change) or measures when each version began
        self.on_change: Callable[[SourceMachine, list[Op]], None] | None = None
        self.stats = {"deltas": 0, "heartbeats": 0, "snapshots": 0, "claims_accepted": 0,
                      "claims_rejected": 0, "claims_duplicate": 0, "resyncs_answered": 0}

    # -- reading -----------------------------------------------------------

    @property
    def document(self) -> Document:
        """The authoritative document (read-only by contract)."""
        return self._doc

    @property
    def version(self) -> tuple[int, int]:
        """The last *published* version."""
        return self.epoch, self.seq

    @property
    def ring_length(self) -> int:
        """Deltas kept to answer resyncs (at most ``min(ring_size, max_resync_deltas)``)."""
        return len(self._ring)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending or self._pending_claims)

    def published_digest(self) -> bytes:
        """Digest of the document at the published version (flushes nothing)."""
        if self.has_pending:
            raise LocalProtocolError("the document has unpublished changes; poll() first")
        if self._digest is None:
            self._digest = self._canonical.digest(self._doc)
        return self._digest

    def snapshot(self) -> Snapshot:
        if self.has_pending:
            raise LocalProtocolError("snapshot with unpublished changes; flush first")
        self.stats["snapshots"] += 1
        return Snapshot(self.source, self.epoch, self.seq, copy_document(self._doc),
                        list(self._included))

    def next_deadline(self) -> float | None:
        """The clock value at which :meth:`poll` has something to do."""
        if not self._announced:
            return float("-inf")
        hb = (self._last_heartbeat or 0.0) + self.heartbeat_interval
        if self._pending_since is not None:
            return min(hb, self._pending_since + self.coalesce_window)
        return hb

    # -- local changes ------------------------------------------------------

    def change(self, ops: list[Op], now: float) -> None:
        """Apply ops to the document now; they are published with the next delta.

        Ops that change nothing (a SET to the equal value, a DEL of a missing
        key) are skipped, so a resource tracker may report its full state often.
        """
        doc = self._doc
        effective: list[Op] = []
        for op in ops:
            code, ns = op[0], op[1]
            entries = doc.get(ns)
            if code == SET:
                key, value = op[2], op[3]
                if entries is not None and key in entries and same_value(entries[key], value):
                    continue
                if entries is None:
                    doc[ns] = {key: value}
                else:
                    entries[key] = value
            elif code == DEL:
                if entries is None or op[2] not in entries:
                    continue
                del entries[op[2]]
                if not entries:
                    del doc[ns]
            elif code == DROP:
                if entries is None:
                    continue
                del doc[ns]
            else:
                raise LocalProtocolError(f"unknown op code {code!r}")
            effective.append(op)
        if effective:
            merge_ops(self._pending, effective)
            self._digest = None
            self._canonical.invalidate(effective)
            if self._pending_since is None:
                self._pending_since = now
            if self.on_change is not None:
                self.on_change(self, effective)

    def update_namespace(self, ns: str, entries: dict[str, Any], now: float) -> None:
        """Make namespace ``ns`` equal to ``entries`` (diffed into ops)."""
        self.change(diff({ns: self._doc.get(ns, {})}, {ns: dict(entries)}), now)

    def replace_document(self, doc: Document, now: float) -> None:
        self.change(diff(self._doc, doc), now)

    def include_claims(self, claim_ids: list[str], now: float) -> None:
        """List claims in the next delta: their consumption is already in the document.

        For an edge whose own arbiter applied them (nova's resource tracker
        claims under its lock, then reports the usage), so that schedulers
        retire those pending claims as included rather than letting them expire.
        """
        for claim_id in claim_ids:
            self._pending_claims.append(claim_id)
            self._included[claim_id] = self.seq + 1
        while len(self._included) > self._claim_memory:
            self._included.popitem(last=False)
        if claim_ids and self._pending_since is None:
            self._pending_since = now

    def release(self, instance: str, now: float) -> bool:
        """Give back what an instance consumed (it was deleted); False if unknown."""
        record = self._doc.get(INSTANCES, {}).get(instance)
        if record is None:
            return False
        ops: list[Op] = [[DEL, INSTANCES, instance]]
        compute = self._doc.get(COMPUTE, {})
        for resource, amount in (record.get("resources") or {}).items():
            key = f"{resource}_used"
            ops.append([SET, COMPUTE, key, max(0, compute.get(key, 0) - amount)])
        if "num_instances" in compute:
            ops.append([SET, COMPUTE, "num_instances", max(0, compute["num_instances"] - 1)])
        self.change(ops, now)
        return True

    # -- time ----------------------------------------------------------------

    def poll(self, now: float) -> list[Send]:
        out: list[Send] = []
        if not self._announced:
            self._announce(out)
            self._last_heartbeat = now - (1.0 - self.heartbeat_phase) * self.heartbeat_interval
            return out
        # the same sums as next_deadline(): a deadline it reports as due must be acted
        # on here, or a caller looping until nothing is due would spin (float rounding)
        if self._pending_since is not None and self._pending_since + self.coalesce_window <= now:
            self._flush(out)
        if (self._last_heartbeat or 0.0) + self.heartbeat_interval <= now:
            self._flush(out)
            out.append(Send(None, Heartbeat(self.source, self.epoch, self.seq,
                                            self.published_digest())))
            self.stats["heartbeats"] += 1
            self._last_heartbeat = now
        return out

    def flush(self) -> list[Send]:
        """Publish the pending delta now, whatever the window says."""
        out: list[Send] = []
        self._flush(out)
        return out

    def _announce(self, out: list[Send]) -> None:
        """Publish the first snapshot of this epoch.

        Changes made before it get a version of their own that only this
        snapshot carries: publishing them as a delta would reach receivers
        before the snapshot that establishes the source and only cause resyncs,
        and folding them into version 0 would give one version two documents.
        """
        if self._pending or self._pending_claims:
            self.seq += 1
        self._pending = {}
        self._pending_claims = []
        self._pending_since = None
        self._announced = True
        out.append(Send(None, self.snapshot()))

    def _flush(self, out: list[Send]) -> None:
        if not self._announced:
            self._announce(out)
            return
        if not self._pending and not self._pending_claims:
            return
        self.seq += 1
        delta = Delta(self.source, self.epoch, self.seq, list(self._pending.values()),
                      self._pending_claims)
        self._pending = {}
        self._pending_claims = []
        self._pending_since = None
        self._ring.append(delta)
        self.stats["deltas"] += 1
        out.append(Send(None, delta))

    # -- control messages ----------------------------------------------------

    def handle(self, msg: Message, now: float) -> list[Send]:
        if isinstance(msg, Claim):
            return self.handle_claim(msg, now)
        if isinstance(msg, ResyncRequest):
            return self.handle_resync(msg, now)
        raise LocalProtocolError(f"a source does not handle {type(msg).__name__}")

    def catch_up(self, epoch: int, seq: int) -> list[Snapshot | Delta]:
        """What a holder of (epoch, seq) needs to reach the published version."""
        if epoch == self.epoch and seq <= self.seq:
            if seq == self.seq:
                return []
            missing = self.seq - seq
            if self._ring and missing <= self.max_resync_deltas:
                start = seq + 1 - self._ring[0].seq
                if start >= 0:
                    return list(islice(self._ring, start, None))
        return [self.snapshot()]

    def handle_resync(self, req: ResyncRequest, now: float) -> list[Send]:
        if req.source != self.source:
            return []
        out: list[Send] = []
        self._flush(out)
        items: list[Snapshot | Delta] = [self.snapshot()] if req.full else self.catch_up(req.epoch, req.seq)
        out.append(Send(req.requester, ResyncAnswer(self.source, req.requester, items)))
        self.stats["resyncs_answered"] += 1
        return out

    def handle_claim(self, claim: Claim, now: float) -> list[Send]:
        out: list[Send] = []
        previous = self._results.get(claim.claim_id)
        if previous is not None:
            self.stats["claims_duplicate"] += 1
            result = previous
            if not previous.accepted:
                self._flush(out)
                result = ClaimResult(
                    previous.claim_id, previous.scheduler, previous.source, False,
                    self.epoch, self.seq, previous.reason, self.catch_up(claim.epoch, claim.seq))
            out.append(Send(claim.scheduler, result))
            return out

        reason = self._judge(claim)
        if reason is None:
            self._accept(claim, now)
            result = ClaimResult(claim.claim_id, claim.scheduler, self.source, True,
                                 self.epoch, self.seq + 1)
            # Recorded before the flush: if that flush is the announcement, the
            # snapshot must list the claim it includes.
            self._included[claim.claim_id] = self.seq + 1
            self._flush(out)
            while len(self._included) > self._claim_memory:
                self._included.popitem(last=False)
            self.stats["claims_accepted"] += 1
            self._remember(result)
        else:
            self._flush(out)
            self._remember(ClaimResult(claim.claim_id, claim.scheduler, self.source, False,
                                       self.epoch, self.seq, reason))
            result = ClaimResult(claim.claim_id, claim.scheduler, self.source, False,
                                 self.epoch, self.seq, reason,
                                 self.catch_up(claim.epoch, claim.seq))
            self.stats["claims_rejected"] += 1
        out.append(Send(claim.scheduler, result))
        return out

    def _judge(self, claim: Claim) -> str | None:
        if claim.source != self.source:
            return f"claim for {claim.source!r} sent to {self.source!r}"
        if claim.epoch != self.epoch:
            # Decided on another epoch: this process may already have answered it
            # before a restart (and a receiver retires it as epoch_changed anyway).
            return f"claim based on epoch {claim.epoch}, source is at epoch {self.epoch}"
        service = self._doc.get(SERVICE, {})
        if service.get("disabled"):
            return "compute service is disabled"
        if service.get("forced_down"):
            return "compute service is forced down"
        instances = self._doc.get(INSTANCES, {})
        if claim.instance and claim.instance in instances:
            return f"instance {claim.instance} is already on this host"
        return (check_fit(self._doc.get(COMPUTE, {}), claim.resources)
                or group_conflict(instances, claim.group, claim.instance))

    def _accept(self, claim: Claim, now: float) -> None:
        compute = self._doc.get(COMPUTE, {})
        ops: list[Op] = []
        for resource, amount in claim.resources.items():
            if amount:
                key = f"{resource}_used"
                ops.append([SET, COMPUTE, key, compute.get(key, 0) + amount])
        if claim.instance:
            ops.append([SET, COMPUTE, "num_instances", compute.get("num_instances", 0) + 1])
            record: dict[str, Any] = {"claim": claim.claim_id, "resources": dict(claim.resources)}
            if claim.group is not None:
                # members placed by other schedulers count against the policy (protocol.groups)
                record[GROUP_KEY] = claim.group.uuid
            ops.append([SET, INSTANCES, claim.instance, record])
        self.change(ops, now)
        self._pending_claims.append(claim.claim_id)

    def _remember(self, result: ClaimResult) -> None:
        self._results[result.claim_id] = result
        while len(self._results) > self._claim_memory:
            self._results.popitem(last=False)
