"""What each source's request row is, kept across requests: the drop-in's incremental host table.

Role
----
``SharedHostManager.get_host_states_by_uuids`` turns every requested compute
node into one request row (:class:`~shared_host_manager.nova.core.vector.HostRows`).
What a row is made of (the template of the source's version, its store slot and
aggregates, the API side's service record for its host, or that nova would skip
it) changes only when the source's view changes or when something every host
depends on changes (the API side's state, the aggregates, the default cell).
Derived per host per request, that was most of a request's time at 10 000
hosts (design §5.6).  This table keeps each source's *entry* between requests,
so a request derives again only the sources that changed since the previous
one: the receiver's change feed names them (document, liveness, pending
claims), and a new :attr:`key` drops every entry.

Only *clean* entries are kept: no pending claims (ours or the peers') and no
instance hints from nova's fanout on the host.  Those are per request (pending
claims are copied under the lock; hints retire with time), so such hosts are
derived every request, as every host was before.

Life cycle (all under the cache lock)::

    RowEntries()                         empty, no feed
    begin(receiver, key, hinted_hosts)   at the start of a request: a new
        |                                receiver or key -> a new feed, no entries;
        |                                else drop the drained sources' entries and
        |                                those of the hosts with live hints
    held.get(source) -> entry | None     None: derive it (the manager's _entry)
    keep(source, host, entry)            a clean entry derived this request

An entry is :data:`SKIP` (nova would not list the source: silent, no document,
not a compute node, deleted) or ``(record, api_service, view)``, where record
is :meth:`~shared_host_manager.nova.core.vector.HostRows.record`'s tuple.  A row
that cannot be kept carries a fourth item, its live instance hints.
"""

from __future__ import annotations

from typing import Any, Final

from protocol.receiver import ChangeFeed, ReceiverMachine

#: the entry of a source nova would not list
SKIP: Final = ("skip",)


class RowEntries:
    """The kept entries of one manager's sources (see the module docstring)."""

    def __init__(self) -> None:
        #: source -> entry, for the sources unchanged since their entry was derived
        self.held: dict[str, tuple[Any, ...]] = {}
        #: host -> its sources with a held entry (to drop them when the host gets hints)
        self._by_host: dict[str, set[str]] = {}
        self._receiver: ReceiverMachine | None = None
        self._feed: ChangeFeed | None = None
        self.key: tuple[Any, ...] | None = None
        #: entries kept (each one derived because it was new or its source changed), whole-table drops
        self.stats = {"kept": 0, "dropped_all": 0}

    def begin(self, receiver: ReceiverMachine, key: tuple[Any, ...],
              hinted_hosts: Any) -> None:
        """Bring the table up to the receiver's present state (see the life cycle)."""
        if receiver is not self._receiver or self._feed is None:
            self._receiver = receiver
            self._feed = receiver.change_feed()
            self._clear(key)
            return
        changed = self._feed.drain()
        if key != self.key:
            self._clear(key)
            return
        held = self.held
        if changed:
            for source in changed:
                held.pop(source, None)
        if hinted_hosts:
            by_host = self._by_host
            for host in hinted_hosts:
                for source in by_host.pop(host, ()):
                    held.pop(source, None)

    def keep(self, source: str, host: str | None, entry: tuple[Any, ...]) -> None:
        """Hold a clean entry derived in this request, until its source changes."""
        self.stats["kept"] += 1
        self.held[source] = entry
        if host is not None:
            self._by_host.setdefault(host, set()).add(source)

    def _clear(self, key: tuple[Any, ...]) -> None:
        self.key = key
        if self.held:
            self.stats["dropped_all"] += 1
        self.held = {}
        self._by_host = {}


__all__ = ["SKIP", "RowEntries"]
