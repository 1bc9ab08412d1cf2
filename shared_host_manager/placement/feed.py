"""The placement feed's decisions: what to list, what to read, what to publish, what is dirty.

Role: the sans-IO core of the placement feed (docs/design.md §11).  The
runner (:mod:`.feed_service`) asks placement's database
(:mod:`.database`) and the reporter that publishes; this class only decides,
fed the database's answers and the clock:

* :meth:`FeedMachine.wants_listing` -- given the database's cheap
  fingerprint, whether to list every provider's mark:
  when the fingerprint moved, when a provider is dirty, or when
  ``full_check_interval`` passed since the last listing (a backstop: no
  change is trusted to move the fingerprint forever);
* :meth:`plan` -- given a listing, the providers to read (new ones, and those
  whose listed mark -- generation, ``created_at``, row id, allocation count and sum --
  is not the one confirmed, plus
  the dirty ones; at most ``max_reads``, the rest stay dirty for the next
  poll) and the providers to delete (held, and gone from the listing);
* :meth:`changes` -- given what was read, the document's changes
  (uuid -> provider dict, or None: deleted), applied to :attr:`document`;
* :meth:`published` -- whether the broker confirmed the publish of those
  changes: confirmed, their generations are :attr:`confirmed`; not confirmed,
  they stay dirty and are read and published again at the next poll;
* :meth:`marker` -- the poll marker that may go out with a poll's changes:
  the wall-clock time the poll began, when nothing is left dirty (every
  write the database committed before that time is then in the document;
  a read deferred past ``max_reads`` withholds it).  A scheduler's view
  answers a request from memory once it holds a marker later than the
  request's arrival at nova's API (read-your-writes, design §11).

Losing a publish therefore delays a provider's change by at most one poll
interval plus the publish timeout per failed attempt; losing a message on the
stream after the broker confirmed it is the protocol's to repair (the
receiver's gap or heartbeat check, a resync, a snapshot of :attr:`document`).

Life cycle::

    FeedMachine() --start(providers, fingerprint, now)--> document = every provider, all dirty
    each poll: wants_listing(fp, now)? --> plan(listing, fp, now) --> (read, delete)
               changes(asked, read, deleted) --> publish them with marker(started)
               --> published(changes, ok)

Nothing here does I/O or reads a clock; not thread-safe (one runner thread).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FeedStats:
    polls: int = 0
    listings: int = 0
    reads: int = 0
    published: int = 0
    deleted: int = 0
    unconfirmed: int = 0
    deferred: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class FeedMachine:
    """What the feed does next; see the module docstring."""

    #: seconds after which a listing is made even though the fingerprint did not move
    full_check_interval: float = 10.0
    #: providers read per poll at most (the rest stay dirty)
    max_reads: int = 2000
    #: uuid -> provider dict: the source's ``placement`` namespace, as handed to the reporter
    document: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: uuid -> the listing's mark (generation, created_at, id, ...) whose read the broker confirmed
    confirmed: dict[str, Any] = field(default_factory=dict)
    #: uuid -> the mark listed when the provider was last asked to be read
    listed: dict[str, Any] = field(default_factory=dict)
    #: providers to read and publish again (an unconfirmed publish, a deferred read)
    dirty: set[str] = field(default_factory=set)
    stats: FeedStats = field(default_factory=FeedStats)
    _fingerprint: Any = None
    _listed_at: float | None = None

    def start(self, providers: Mapping[str, dict[str, Any]], fingerprint: Any, now: float) -> None:
        """The first document: every provider read at start, dirty until its publish is confirmed."""
        self.document = dict(providers)
        self.confirmed = {}
        self.dirty = set(providers)
        self._fingerprint = fingerprint
        self._listed_at = now

    def marker(self, started: float) -> float | None:
        """The poll marker of a poll begun at wall-clock ``started``, asked once its plan is made
        (or once no listing was wanted): ``started`` when no provider is left dirty, else None
        (a deferred read: the document does not hold every write before ``started``)."""
        return None if self.dirty else started

    def wants_listing(self, fingerprint: Any, now: float) -> bool:
        self.stats.polls += 1
        return (fingerprint != self._fingerprint or bool(self.dirty) or self._listed_at is None
                or now - self._listed_at >= self.full_check_interval)

    def plan(self, listing: Mapping[str, Any], fingerprint: Any,
             now: float) -> tuple[list[str], list[str]]:
        """(providers to read, providers to delete), given every provider's listed mark."""
        self.stats.listings += 1
        self._fingerprint = fingerprint
        self._listed_at = now
        confirmed = self.confirmed
        stale = [u for u, m in listing.items() if confirmed.get(u) != m and u not in self.dirty]
        # dirty ones first (they waited), then the changed ones, both in a stable order
        wanted = sorted(self.dirty) + sorted(stale)
        read, rest = wanted[:self.max_reads], wanted[self.max_reads:]
        for u in read:
            self.listed[u] = listing.get(u)
        self.dirty = set(rest)
        self.stats.deferred += len(rest)
        deleted = sorted(u for u in set(self.document) | set(confirmed) if u not in listing)
        return read, deleted

    def changes(self, asked: Iterable[str], read: Mapping[str, dict[str, Any]],
                deleted: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """The document's changes: what was read, what was asked and is gone, what was deleted."""
        out: dict[str, dict[str, Any] | None] = {}
        for uuid in asked:
            # asked and not read: gone since the listing (or a deletion published again)
            out[uuid] = read.get(uuid)
        for uuid in deleted:
            if uuid not in read:
                out[uuid] = None
        self.stats.reads += len(read)
        for uuid, provider in out.items():
            if provider is None:
                self.document.pop(uuid, None)
            else:
                self.document[uuid] = provider
        return out

    def published(self, changes: Mapping[str, dict[str, Any] | None], ok: bool) -> None:
        """The broker confirmed these changes (``ok``), or not: then they stay dirty."""
        if not ok:
            self.stats.unconfirmed += len(changes)
            for uuid in changes:
                self.confirmed.pop(uuid, None)
                # a deletion not confirmed is published again while the listing lacks it
                self.dirty.add(uuid)
            return
        for uuid, provider in changes.items():
            self.dirty.discard(uuid)
            if provider is None:
                self.confirmed.pop(uuid, None)
                self.listed.pop(uuid, None)
                self.stats.deleted += 1
            else:
                # the mark listed before the read: a read newer than it is read once more
                self.confirmed[uuid] = self.listed.pop(uuid, None)
                self.stats.published += 1


__all__ = ["FeedMachine", "FeedStats"]
