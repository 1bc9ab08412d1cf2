"""Scheduler membership from the stream: each scheduler is a source, so every one knows its live peers.

Why: host ownership among schedulers (each claims first the hosts it owns by
rendezvous hashing, design §5.4) needs the list of live peers, and schedulers
never talk to each other.  So each one publishes, on the stream every scheduler
already reads, a tiny document of its own (design §2): source id
``scheduler/<name>``, namespace ``scheduler`` (``protocol.hostdoc.SCHEDULER``)
with its name, start time, state, heartbeat interval and load.  Receivers hold
it like any other source; it has no ``compute`` namespace, so it is never a
host (``protocol.hostdoc.is_host``).

Life cycle of one scheduler's entry (:class:`MembershipPublisher`)::

    start ---> "running", published at once, then every ``interval`` seconds
               (the document carries the publication count, so each one is a
               new version and a complete snapshot: a peer that missed some
               needs no resync, the next one repairs it)
    leave() -> "leaving", published at once: peers hand its share over now
    (crash) -> nothing more: peers drop it ``LIVENESS`` intervals after they
               last heard of it

The versioning is a :class:`~protocol.source.SourceMachine`'s (an epoch per
start, one seq per publication); every publication is its snapshot, so no
resync request is ever needed for a scheduler source (a resync request still
sent for one goes nowhere and is repaired by the next publication).

Reading (:func:`live_peers`): the names of the scheduler sources whose view is
up, whose state is "running" and which were heard within ``LIVENESS``
intervals of their own, by the reader's clock; the caller scans the receiver
now and then (the service's timer), not per decision.  Pure, apart from the
clock values passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.document import SET
from protocol.hostdoc import SCHEDULER, namespace
from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine
from protocol.source import SourceMachine

#: prefix of a scheduler's source id
SOURCE_PREFIX = "scheduler/"
RUNNING = "running"
LEAVING = "leaving"
#: a peer silent for this many of its publication intervals is gone
LIVENESS = 1.5


def source_id(name: str) -> str:
    return f"{SOURCE_PREFIX}{name}"


class MembershipPublisher:
    """One scheduler's own entry on the stream; see the module docstring."""

    def __init__(self, name: str, epoch: int, started_at: float, *, interval: float = 2.0) -> None:
        if interval <= 0:
            raise ValueError(f"the membership interval must be positive, got {interval}")
        self.name = name
        self.interval = interval
        self.machine = SourceMachine(source_id(name), epoch, heartbeat_interval=interval)
        self._started_at = started_at
        self._state = RUNNING
        self._count = 0
        self._next: float | None = None

    def due(self, now: float) -> bool:
        return self._next is None or now >= self._next

    def publish(self, now: float, load: Mapping[str, Any] | None = None) -> Snapshot:
        """The next publication (state, interval, load), as a snapshot to put on the stream."""
        self._count += 1
        entries: dict[str, Any] = {"name": self.name, "started_at": self._started_at,
                                   "state": self._state, "interval": self.interval,
                                   "published": self._count}
        if load:
            entries["load"] = dict(load)
        self.machine.change([[SET, SCHEDULER, k, v] for k, v in entries.items()], now)
        self.machine.flush()
        self._next = now + self.interval
        return self.machine.snapshot()

    def leave(self, now: float, load: Mapping[str, Any] | None = None) -> Snapshot:
        """The last publication: this scheduler stops; peers take its hosts over at once."""
        self._state = LEAVING
        return self.publish(now, load)


def live_peers(receiver: ReceiverMachine, now: float) -> list[str]:
    """Names of the schedulers heard recently and running, as this receiver holds them."""
    out = []
    for source, view in receiver.sources.items():
        if not source.startswith(SOURCE_PREFIX) or view.doc is None or view.down:
            continue
        entry = namespace(view.doc, SCHEDULER)
        interval = entry.get("interval")
        name = entry.get("name")
        if entry.get("state") != RUNNING or type(name) is not str:
            continue
        if not isinstance(interval, (int, float)) or interval <= 0:
            continue
        if now - view.last_heard <= LIVENESS * interval:
            out.append(name)
    return sorted(out)


__all__ = ["LEAVING", "LIVENESS", "RUNNING", "SOURCE_PREFIX", "MembershipPublisher", "live_peers",
           "source_id"]
