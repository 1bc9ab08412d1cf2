"""The placement feed's source, followed in a scheduler's cache: its changed providers into a PlacementView.

Role: the scheduler side's glue (docs/design.md §11).  The scheduler's
:class:`~shared_host_manager.cache.HostStateCache` holds the placement feed's
source like any other; this tap hands what changed in that source's
``placement`` namespace to a :class:`~.view.PlacementView`, per provider, so
a delta of three providers costs three applies, not a pass over ten
thousand:

* :meth:`PlacementTap.note` sees every message the receiver took (the cache's
  ``MessageListener``, under the cache's lock) and remembers, per
  ``(epoch, seq)`` of the feed's deltas, the provider keys they set or
  delete;
* :meth:`note` also hands a peer's announced claim that carries its
  allocation request (``ANNOUNCED_ALLOCATIONS``; an intent, or placement's
  acceptance with ``ANNOUNCED_ACCEPTED``) to the view, and a host's rejection
  of a claim, so the view deducts what a peer is claiming in placement
  (design §11);
* :meth:`sync` (the cache's ``IngestListener``, after each ingest step)
  finds the feed's source (the one whose document has ``placement_meta``),
  then: when the source's document is another object than last time (a
  snapshot) or a delta's keys were not noted, compares the whole namespace by
  value identity (document values are never changed in place); otherwise it
  looks up only the noted keys of the deltas applied since.  It also passes
  the source's liveness (last heard, down) to the view, and, after the
  changes, the feed's poll marker (``placement_poll``: read-your-writes).

Life cycle: ``PlacementTap(view, receiver)`` -> ``attach(cache)`` -> called
by the cache under its lock until the process ends.
"""

from __future__ import annotations

import logging
from typing import Any

from protocol.document import DEL, SET
from protocol.hostdoc import PLACEMENT, PLACEMENT_META, PLACEMENT_POLL, POLL_STARTED
from protocol.messages import (
    ANNOUNCED_ACCEPTED,
    ANNOUNCED_ALLOCATIONS,
    Batch,
    Claim,
    ClaimResult,
    Delta,
    ResyncAnswer,
)
from protocol.receiver import ReceiverMachine
from shared_host_manager.placement.view import PlacementView

LOG = logging.getLogger(__name__)

#: a delta that touched the meta namespace or dropped a namespace: look at everything
_ALL = None


class PlacementTap:
    """Feeds a PlacementView from the placement feed's source (see the module docstring)."""

    def __init__(self, view: PlacementView, receiver: ReceiverMachine) -> None:
        self.view = view
        self.receiver = receiver
        #: the feed's source once found (the first whose document has ``placement_meta``)
        self.source: str | None = None
        self._feed = receiver.change_feed()
        self._doc: Any = None
        self._epoch = -1
        self._seq = 0
        #: (epoch, seq) -> provider keys the delta set or deleted (None: look at everything)
        self._noted: dict[tuple[int, int], set[str] | None] = {}
        #: uuid -> the document's value last handed to the view (compared by identity)
        self._held: dict[str, Any] = {}
        self._meta: Any = None
        self.full_syncs = 0
        self.incremental_syncs = 0

    def attach(self, cache: Any) -> None:
        cache.add_listener(self)

    def message_taken(self, msg: Any) -> None:
        """The cache's MessageListener (under its lock): :meth:`note`."""
        self.note(msg)

    def ingest_done(self) -> None:
        """The cache's IngestListener (under its lock): :meth:`sync`."""
        self.sync()

    # -- under the cache's lock ----------------------------------------------------------

    def note(self, msg: Any) -> None:
        t = type(msg)
        if t is Claim:
            allocations = msg.request.get(ANNOUNCED_ALLOCATIONS)
            if allocations:
                self.view.note_peer_claim(msg.claim_id, allocations,
                                          accepted=msg.request.get(ANNOUNCED_ACCEPTED) is True)
            return
        if t is ClaimResult:
            if not msg.accepted:
                self.view.drop_peer_claim(msg.claim_id)
            return
        source = self.source
        if source is None:
            return
        if t is Delta:
            items: Any = (msg,)
        elif t is Batch or t is ResyncAnswer:
            items = msg.items
        else:
            return
        for item in items:
            if type(item) is Delta and item.source == source:
                keys: set[str] | None = set()
                for op in item.ops:
                    if op[1] == PLACEMENT and (op[0] == SET or op[0] == DEL):
                        keys.add(op[2])  # type: ignore[union-attr]
                    elif op[1] == PLACEMENT or op[1] == PLACEMENT_META:
                        keys = _ALL
                        break
                self._noted[(item.epoch, item.seq)] = keys

    def sync(self) -> None:
        changed = self._feed.drain()
        if self.source is None:
            for name in changed:
                sv = self.receiver.view(name)
                if sv is not None and sv.doc is not None and PLACEMENT_META in sv.doc:
                    self.source = name
                    LOG.info("placement feed found: source %s", name)
                    break
            if self.source is None:
                return
        sv = self.receiver.view(self.source)
        if sv is None or sv.doc is None:
            return
        if sv.down:
            self.view.source_down()
        else:
            self.view.heard(sv.last_heard)
        doc = sv.doc
        if doc is self._doc and sv.epoch == self._epoch and sv.seq == self._seq:
            return
        keys: set[str] | None = set()
        if doc is not self._doc or sv.epoch != self._epoch or sv.seq < self._seq:
            keys = _ALL
        else:
            for seq in range(self._seq + 1, sv.seq + 1):
                got = self._noted.pop((sv.epoch, seq), _ALL)
                if got is _ALL:
                    keys = _ALL
                    break
                assert keys is not None
                keys |= got
        self._doc, self._epoch, self._seq = doc, sv.epoch, sv.seq
        for key in [k for k in self._noted if k[0] != sv.epoch or k[1] <= sv.seq]:
            del self._noted[key]
        ns = doc.get(PLACEMENT) or {}
        changes: dict[str, Any] = {}
        if keys is _ALL:
            self.full_syncs += 1
            held = self._held
            changes = {u: p for u, p in ns.items() if held.get(u) is not p}
            changes.update((u, None) for u in held if u not in ns)
            self._held = dict(ns)
            meta = doc.get(PLACEMENT_META)
            if meta and meta != self._meta:
                # the namespace is changed in place by deltas: compare a copy's contents
                self._meta = dict(meta)
                self.view.set_known_names(
                    traits=meta.get("traits"), resource_classes=meta.get("resource_classes"),
                    allocation_ratio_storage=meta.get("allocation_ratio_storage"))
            self.view.apply_providers(changes, sv.last_heard)
        else:
            self.incremental_syncs += 1
            assert keys is not None
            for u in keys:
                p = ns.get(u)
                if self._held.get(u) is not p:
                    changes[u] = p
                    if p is None:
                        self._held.pop(u, None)
                    else:
                        self._held[u] = p
            if changes:
                self.view.apply_providers(changes, sv.last_heard)
        marker = (doc.get(PLACEMENT_POLL) or {}).get(POLL_STARTED)
        if marker is not None:
            self.view.polled(float(marker))


__all__ = ["PlacementTap"]
