"""The placement feed as a running service: placement's database in, one source on the stream out.

Role: the single writer of placement's state on the stream (docs/design.md
§11).  :class:`PlacementFeed` is a resource tracker
(:class:`compute_reporter.tracker.ResourceTracker`) of one source, served by
an ordinary :class:`compute_reporter.service.ReporterService`: the reporter
publishes the source's snapshots, deltas and heartbeats, answers the
schedulers' resyncs, and says goodbye at a clean stop, as for every source.
The tracker's thread polls placement's database (:mod:`.database`) and hands
the changes to the reporter; what to read and what to publish is decided by
:class:`~.feed.FeedMachine` (sans-IO).

The source's document::

    placement:      {provider uuid: provider dict (shared_host_manager.placement.state) + created_at, id}
    placement_meta: {"traits": [...], "resource_classes": [...],
                     "allocation_ratio_storage": "double" | "single"}
    placement_poll: {"started": <wall-clock seconds>}   (the poll marker, FeedMachine.marker)
    service:        {"endpoint": <reporter name>}      (the reporter's, for resyncs)

Confirmation: after handing a poll's changes to the reporter, the feed calls
:attr:`PlacementFeed.confirm` -- the reporter's ``publish_now`` with
``publish_timeout`` -- and tells the machine whether the broker confirmed;
unconfirmed providers are read and published again at the next poll.  A test
(or anything else) may give its own ``confirm``: it is the explicit seam.  A
``confirm`` that raises counts as unconfirmed (logged, ``confirm_errors``).

Life cycle::

    PlacementFeed(db, ...)  no connection yet
    ReporterService.start():   hosts() -> every provider read (the first document),
                               document(), then start(sink): the poll thread
    poll thread:               confirm the first document; then every poll_interval:
                               fingerprint -> listing? -> read -> sink.change -> confirm
                               (every complete poll publishes its marker, changes or not)
    ReporterService.stop():    stop(): the poll thread ends; the reporter's goodbye follows

``poll_interval=None``: no poll thread; whoever owns the feed calls
:meth:`PlacementFeed.poll_once` itself, in its own thread (nova's functional
tests: before each decision, on the thread that reads placement's database
anyway -- an in-memory SQLite shared through one connection is read by no
other thread).  ``start`` then confirms the first document at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from oslo_config import cfg

from compute_reporter import service as reporter_service
from compute_reporter.service import ReporterService
from protocol.document import DEL, SET, Document, Op
from protocol.hostdoc import PLACEMENT, PLACEMENT_META, PLACEMENT_POLL, POLL_STARTED
from shared_host_manager.conf import placement_feed as feed_conf
from shared_host_manager.placement.database import PlacementDatabase
from shared_host_manager.placement.feed import FeedMachine
from shared_host_manager.placement.state import Provider

LOG = logging.getLogger(__name__)


class PlacementFeed:
    """The tracker of the placement feed's one source (see the module docstring)."""

    def __init__(self, database: PlacementDatabase, *, source_name: str = "placement",
                 poll_interval: float | None = 0.2, full_check_interval: float = 10.0,
                 max_reads: int = 2000, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 confirm: Callable[[], bool] | None = None) -> None:
        self.db = database
        self.source = source_name
        self.poll_interval = poll_interval
        self.clock = clock
        #: the poll markers' clock (compared with the requests' arrival at nova's API)
        self.wall_clock = wall_clock
        self.machine = FeedMachine(full_check_interval=full_check_interval, max_reads=max_reads)
        #: True once the broker confirmed what was handed to the reporter (see the module docstring)
        self.confirm: Callable[[], bool] = confirm or (lambda: True)
        self.meta: dict[str, Any] = {}
        #: the marker of the first document (the wall-clock time its reads began)
        self._first_marker: float | None = None
        self._sink: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded = False
        #: "errors": polls that failed (the database unreachable ...), "polls_with_changes"
        self.errors = 0
        self.polls_with_changes = 0
        #: calls of ``confirm`` that raised (taken as unconfirmed)
        self.confirm_errors = 0
        self.last_poll_ok: float | None = None
        #: providers holding more than placement's claims allow: uuid -> (name, {rc: (used,
        #: capacity)}); replaced, never changed in place (the metrics thread reads it)
        self.over_capacity: dict[str, tuple[str, dict[str, tuple[int, float]]]] = {}

    # -- ResourceTracker -----------------------------------------------------------------

    def hosts(self) -> list[str]:
        if not self._loaded:
            self.load()
        return [self.source]

    def document(self, source: str) -> Document:
        doc: Document = {PLACEMENT_META: dict(self.meta)}
        if self.machine.document:
            doc[PLACEMENT] = dict(self.machine.document)
        if self._first_marker is not None:
            doc[PLACEMENT_POLL] = {POLL_STARTED: self._first_marker}
        return doc

    def start(self, sink: Any) -> None:
        self._sink = sink
        self._stop.clear()
        if self.poll_interval is None:  # polled by its owner (poll_once): no thread
            self._confirm_first()
            return
        self._thread = threading.Thread(target=self._run, name=f"placement-feed-{self.source}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sink = None

    # -- polling ---------------------------------------------------------------------

    def load(self) -> None:
        """Every provider and the names, read at once: the source's first document."""
        self._first_marker = self.wall_clock()
        fingerprint = self.db.fingerprint()
        providers = self.db.read_all()
        self.meta = self._read_meta()
        self.machine.start(providers, fingerprint, self.clock())
        self._check_capacity(providers)
        self._loaded = True
        LOG.info("placement feed: %d resource providers read from placement's database",
                 len(providers))

    def _read_meta(self) -> dict[str, Any]:
        traits, rcs = self.db.names()
        return {"traits": traits, "resource_classes": rcs,
                "allocation_ratio_storage": self.db.allocation_ratio_storage}

    def _confirm_first(self) -> None:
        """The first document went out with the reporter's start: its confirm."""
        first = dict.fromkeys(self.machine.dirty)
        self.machine.published({u: self.machine.document.get(u) for u in first}, self._confirmed())

    def _run(self) -> None:
        interval = self.poll_interval
        assert interval is not None  # no thread without one (start)
        self._confirm_first()
        while not self._stop.wait(interval):
            try:
                self.poll_once()
            except Exception as exc:  # the loop outlives a database restart
                self.errors += 1
                LOG.warning("placement feed: poll failed (%s); trying again in %.1f s",
                            " ".join(str(exc).split())[:300], interval)

    def poll_once(self) -> dict[str, dict[str, Any] | None]:
        """One look at the database; the changes handed to the reporter (and confirmed or not),
        with the poll's marker (published alone when nothing changed)."""
        started = self.wall_clock()
        now = self.clock()
        fingerprint = self.db.fingerprint()
        changes: dict[str, dict[str, Any] | None] = {}
        ops: list[Op] = []
        if self.machine.wants_listing(fingerprint, now):
            listing = self.db.listing()
            to_read, deleted = self.machine.plan(listing, fingerprint, now)
            read = self.db.read(to_read)
            changes = self.machine.changes(to_read, read, deleted)
            self._check_capacity(changes)
            ops = [[SET, PLACEMENT, u, p] if p is not None else [DEL, PLACEMENT, u]
                   for u, p in changes.items()]
            meta = self._read_meta()
            if meta != self.meta:
                ops += [[SET, PLACEMENT_META, k, v] for k, v in meta.items()
                        if self.meta.get(k) != v]
                self.meta = meta
        # a marker alone unconfirmed leaves nothing dirty: the next poll's supersedes it
        marker = self.machine.marker(started)
        if marker is not None:
            ops.append([SET, PLACEMENT_POLL, POLL_STARTED, marker])
        if ops:
            sink = self._sink
            if sink is None:
                self.machine.published(changes, False)
                return changes
            sink.change(self.source, ops)
            if len(ops) > (marker is not None):
                self.polls_with_changes += 1
            self.machine.published(changes, self._confirmed())
        self.last_poll_ok = now
        return changes

    def _check_capacity(self, providers: Mapping[str, Mapping[str, Any] | None]) -> None:
        """:attr:`over_capacity` for ``providers`` (uuid -> provider dict, None: deleted), and a
        warning for each one that goes over or whose excess changes.  The feed is the one
        process that sees placement's usages beside its inventories: a provider over capacity
        is an inventory lowered under its allocations, or a claim placement should have
        refused, which nothing else reports."""
        storage = self.db.allocation_ratio_storage
        over = dict(self.over_capacity)
        for uuid, doc in providers.items():
            was = over.pop(uuid, None)
            try:
                now = Provider.from_dict(doc).over_capacity(storage) if doc is not None else {}
            except (KeyError, TypeError, ValueError) as exc:  # the check never stops a publish
                LOG.warning("placement feed: resource provider %s: capacity not checked (%s)",
                            uuid, exc)
                now = {}
            if now:
                name = str(doc.get("name", uuid)) if doc is not None else uuid
                over[uuid] = (name, now)
                if was is None or was[1] != now:
                    LOG.warning(
                        "placement feed: resource provider %s (%s) holds more than its capacity: "
                        "%s. Either its inventory was lowered under its allocations, or placement "
                        "accepted a claim beyond capacity: placement.conf's [placement] "
                        "allocation_conflict_retry_count = 1 avoids that", name, uuid,
                        ", ".join(f"{rc} {used} of {cap:.15g}" for rc, (used, cap) in sorted(now.items())))
            elif was is not None:
                LOG.info("placement feed: resource provider %s (%s) is within its capacity again",
                         was[0], uuid)
        self.over_capacity = over

    def _confirmed(self) -> bool:
        """``confirm()``, an exception taken as "not confirmed": the providers stay dirty and are
        read and published again at the next poll, as after a timeout."""
        try:
            return bool(self.confirm())
        except Exception as exc:
            self.confirm_errors += 1
            LOG.warning("placement feed: confirming a publish failed (%s); published again at the "
                        "next poll", " ".join(str(exc).split())[:300])
            return False

    def figures(self) -> dict[str, Any]:
        return {"providers": len(self.machine.document), "dirty": len(self.machine.dirty),
                "errors": self.errors, "polls_with_changes": self.polls_with_changes,
                "confirm_errors": self.confirm_errors,
                "over_capacity": len(self.over_capacity),
                # seconds since the last poll that reached the database (None: none yet)
                "last_poll_age": None if self.last_poll_ok is None
                else max(0.0, self.clock() - self.last_poll_ok),
                **self.machine.stats.as_dict()}


# -- built from a configuration file -------------------------------------------------

def register_opts(conf: cfg.ConfigOpts) -> None:
    """[placement_feed] and every group a reporter reads."""
    feed_conf.register_opts(conf)
    reporter_service.register_service_opts(conf)


def feed_from_conf(conf: cfg.ConfigOpts, database: PlacementDatabase | None = None
                   ) -> tuple[ReporterService, PlacementFeed]:
    """The reporter publishing the feed, and the feed, configured by ``conf``
    (registered with :func:`register_opts`); nothing started."""
    group = conf.placement_feed
    if database is None:
        if not group.connection:
            raise cfg.RequiredOptError("connection", cfg.OptGroup(feed_conf.GROUP))
        database = PlacementDatabase(group.connection)
    feed = PlacementFeed(database, source_name=group.source_name, poll_interval=group.poll_interval,
                         full_check_interval=group.full_check_interval, max_reads=group.max_reads)
    conf.set_override("heartbeat_interval", group.heartbeat_interval, group="reporter")
    reporter = reporter_service.service_from_conf(conf, feed)
    timeout = group.publish_timeout
    feed.confirm = lambda: reporter.publish_now(timeout)
    return reporter, feed


__all__ = ["PlacementFeed", "feed_from_conf", "register_opts"]
