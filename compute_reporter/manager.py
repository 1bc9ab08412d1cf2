"""The reporter's core: the source machines of every host it serves, and its endpoints.

:class:`ReporterManager` has no threads and no transport.  It is fed

* tracker changes (it is the :class:`~compute_reporter.tracker.TrackerSink`),
* decoded control messages (:meth:`claim`, :meth:`resync_request` – the
  endpoints, as in a nova ``manager.py``),
* time (:meth:`poll`),

and returns what to send: data-plane items to publish (batched by
:meth:`poll`) and control messages addressed to schedulers.  The threaded
service (:mod:`compute_reporter.service`) and the simulator drive the same
object, so what a simulation shows is what a deployment does.

Thread-safety: every public method takes one lock; callers may use it from a
tracker thread, a control-plane thread and a loop thread at once.

The contract: docs/design.md §2 (single writer), §3 and §5.3.
"""

from __future__ import annotations

import heapq
import threading
from typing import Any, TypedDict

from protocol.batching import batches
from protocol.codec import Decoder
from protocol.document import SET, Document, Op
from protocol.errors import ProtocolError
from protocol.hostdoc import ENDPOINT, INSTANCES, SERVICE, STOPPED
from protocol.messages import Batch, Claim, Message, ResyncRequest, Send
from protocol.source import SourceMachine


class ReporterParams(TypedDict):
    """A reporter's settings: :class:`ReporterManager`'s keyword arguments."""

    coalesce_window: float
    heartbeat_interval: float
    ring_size: int
    max_batch_items: int


class ReporterManager:
    def __init__(
        self,
        name: str,
        documents: dict[str, Document],
        epochs: dict[str, int],
        *,
        coalesce_window: float = 0.05,
        heartbeat_interval: float = 10.0,
        ring_size: int = 256,
        max_batch_items: int = 500,
    ) -> None:
        self.name = name
        self.max_batch_items = max_batch_items
        self._lock = threading.Lock()
        self.machines: dict[str, SourceMachine] = {}
        for i, (source, doc) in enumerate(documents.items()):
            doc = {ns: dict(entries) for ns, entries in doc.items()}
            # Schedulers learn where to send claims for this source from its document.
            doc.setdefault(SERVICE, {})[ENDPOINT] = name
            self.machines[source] = SourceMachine(
                source, epochs[source], doc, coalesce_window=coalesce_window,
                heartbeat_interval=heartbeat_interval, ring_size=ring_size,
                heartbeat_phase=(i + 1) / len(documents))
        # timers: at most one live entry per source (its earliest deadline, in
        # _scheduled); entries that no longer match it are stale and dropped when popped
        self._heap: list[tuple[float, str]] = [(float("-inf"), s) for s in self.machines]
        heapq.heapify(self._heap)
        self._scheduled: dict[str, float] = dict.fromkeys(self.machines, float("-inf"))
        self._data: list[Any] = []  # data-plane items waiting for the next poll
        self._control: list[Send] = []
        self.stats = {"claims": 0, "resync_requests": 0, "unknown_source": 0, "changes": 0}
        #: what was wrong with the last control message handle_bytes() dropped
        self.last_error = ""

    # -- TrackerSink -------------------------------------------------------------

    def change(self, source: str, ops: list[Op], now: float) -> None:
        with self._lock:
            machine = self.machines[source]
            machine.change(ops, now)
            self.stats["changes"] += 1
            self._schedule(machine)

    def release(self, source: str, instance: str, now: float) -> bool:
        """An instance left the host. Published at once, not coalesced: freed capacity
        that schedulers cannot see yet turns into needless NoValidHost answers."""
        with self._lock:
            machine = self.machines[source]
            done = machine.release(instance, now)
            if done:
                self._route(machine.flush())
            self._schedule(machine)
            return done

    def claims_included(self, source: str, claim_ids: list[str], now: float) -> None:
        """Claims the host's own arbiter applied (nova's resource tracker): listed in
        the next delta so schedulers retire them as included."""
        with self._lock:
            machine = self.machines[source]
            machine.include_claims(claim_ids, now)
            self._schedule(machine)

    def instances(self, source: str) -> list[str]:
        with self._lock:
            return list(self.machines[source].document.get(INSTANCES, {}))

    def set_service(self, source: str, now: float, **fields: Any) -> None:
        """Change the service namespace (disable/enable, forced_down)."""
        self.change(source, [[SET, SERVICE, k, v] for k, v in fields.items()], now)

    def versions(self) -> dict[str, tuple[int, int, bytes | None]]:
        """Each source's published ``(epoch, seq, digest)``; the digest is None while the
        source has changes not yet published (what ``shm status --verify`` compares)."""
        with self._lock:
            return {source: (m.epoch, m.seq, None if m.has_pending else m.published_digest())
                    for source, m in self.machines.items()}

    def ring_deltas(self) -> int:
        """Deltas the hosts' rings keep to answer resyncs, summed: grows to hosts x
        min(ring_size, 256) and stays there (docs/design.md §4.3)."""
        with self._lock:
            return sum(m.ring_length for m in self.machines.values())

    def machine_stats(self) -> dict[str, int]:
        """The source machines' counters, summed (deltas, heartbeats, claims, resyncs answered)."""
        with self._lock:
            total: dict[str, int] = {}
            for machine in self.machines.values():
                for key, value in machine.stats.items():
                    total[key] = total.get(key, 0) + value
            return total

    # -- endpoints -----------------------------------------------------------------

    def handle(self, msg: Message, now: float) -> None:
        """Dispatch one decoded control message (a claim or a resync request)."""
        with self._lock:
            machine = self.machines.get(getattr(msg, "source", ""))
            if machine is None:
                self.stats["unknown_source"] += 1
                return
            if isinstance(msg, Claim):
                self.stats["claims"] += 1
            elif isinstance(msg, ResyncRequest):
                self.stats["resync_requests"] += 1
            self._route(machine.handle(msg, now))
            self._schedule(machine)

    def handle_bytes(self, body: bytes, decoder: Decoder, now: float) -> str | None:
        """Decode, validate and handle one control message as received (design §6,
        invariant 6); returns why it was dropped (a protocol error's reason, or
        ``wrong_plane``), None when it was handled.  Never raises for bad input."""
        try:
            msg = decoder.decode(body)
        except ProtocolError as exc:
            self.last_error = str(exc)
            return exc.reason
        if not isinstance(msg, (Claim, ResyncRequest)):
            self.last_error = f"unexpected {type(msg).__name__} on the reporter's control plane"
            return "wrong_plane"
        self.handle(msg, now)
        return None

    # -- time ------------------------------------------------------------------------

    def poll(self, now: float) -> tuple[list[Batch], list[Send]]:
        """Everything due by ``now``: batches to publish and control messages to cast."""
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                deadline, source = heapq.heappop(heap)
                if self._scheduled.get(source) != deadline:
                    continue  # superseded by an earlier deadline, already handled
                del self._scheduled[source]
                machine = self.machines[source]
                due = machine.next_deadline()
                if due is not None and due <= now:
                    self._route(machine.poll(now))
                self._schedule(machine)
            items, self._data = self._data, []
            control, self._control = self._control, []
        out = batches(items, self.max_batch_items)
        for b in out:
            b.origin = self.name
        return out, control

    def take_control(self) -> list[Send]:
        """The control messages due now (claim results, resync answers), taken out of what
        :meth:`poll` returns: the control thread casts them at once (the loop thread may be
        busy with a publish the stream does not take)."""
        with self._lock:
            control, self._control = self._control, []
        return control

    def next_deadline(self) -> float | None:
        with self._lock:
            if self._data or self._control:
                return float("-inf")
            return self._heap[0][0] if self._heap else None

    def goodbye(self, now: float) -> tuple[list[Batch], list[Send]]:
        """Every source's last version: ``service.stopped`` set, published now with what was
        still pending, so every scheduler drops the hosts at once (design §4.2)."""
        with self._lock:
            for machine in self.machines.values():
                machine.change([[SET, SERVICE, STOPPED, True]], now)
                self._route(machine.flush())
        return self.poll(now)

    def flush_all(self, now: float) -> tuple[list[Batch], list[Send]]:
        """Publish every pending change now (clean shutdown)."""
        with self._lock:
            for machine in self.machines.values():
                self._route(machine.flush())
        return self.poll(now)

    # -- helpers -----------------------------------------------------------------------

    def _route(self, sends: list[Send]) -> None:
        for send in sends:
            if send.to is None:
                self._data.append(send.message)
            else:
                self._control.append(send)

    def _schedule(self, machine: SourceMachine) -> None:
        deadline = machine.next_deadline()
        if deadline is None:
            return
        current = self._scheduled.get(machine.source)
        if current is None or deadline < current:
            self._scheduled[machine.source] = deadline
            heapq.heappush(self._heap, (deadline, machine.source))
