"""The scheduler-side cache as a running service: stream consumer, control server, timers.

Life cycle::

    SchedulerService(...) --start()--> running --stop()--> stopped
      start(): restore the local snapshot (if state_dir has one; else ask the
               peers for a checkpoint and restore the one taken in answer, or
               the newest, shared_host_manager.checkpoint), start the
               control server (resync answers and claim results come back here),
               start reading the stream after the restored offset — or from its
               retained start on a cold start — and start the timer thread.
      running: stream thread  --> cache.ingest_stream  (deltas, snapshots, heartbeats)
               control thread --> cache.ingest_control (resync answers, claim results,
                                  fences)
               peer thread    --> the peer topic: peers' claims and forwarded
                                  rejections --> cache.ingest_peer_claim;
                                  a peer's scarce request, or the answer to ours,
                                  --> the decider's PeerRequestHandler (design §5.4);
                                  a starting peer's checkpoint ask --> checkpoints
               timer thread   --> cache.tick every tick_interval (gaps, resync
                                  retries, claim deadlines, down detection),
                                  cache.save every snapshot_interval, this
                                  scheduler's own entry on the stream every
                                  membership_interval and the live peers
                                  (shared_host_manager.membership)
               checkpoints    --> the whole view on the checkpoint stream every
                                  checkpoint_interval and when asked, by the
                                  coordinator
               decisions      --> under cache.lock, from any thread; catch_up()
                                  (before a NoValidHost, or an affinity group's
                                  member no view holds) puts this scheduler's
                                  entry on the stream and waits for it to come
                                  back
               claims         --> cast to the reporter of the host; with
                                  ``announce_claims``, then one fanout cast to
                                  the peers, or a cast to the only one (design
                                  §5.2: they deduct it until the host's delta
                                  lists it)
               announcer      --> the host's rejection of a claim, forwarded to
                                  the peers off the control server's thread
      stop():  publish "leaving" (peers take this scheduler's hosts over), stop
               the stream consumer, the control server and the timers, write a
               last snapshot, close the client.

Cells (design §4.6): given ``cell_planes`` (cell -> the data plane of its stream), the
service reads each cell's stream too, each with a consumer of its own, from the offset
the cache applied there (restored with the rest), or from its retained start.  A cell
whose broker is down stops only its own consumer: its hosts go down after
``down_interval`` and rejoin from the cell's offset when the consumer reconnects.
catch_up() puts its marker on every connected cell's stream as well and waits for
each to come back.  Given ``cell_control_planes`` (cell -> the control plane on the cell's
broker), the cell's computes are reached there, as cells v2 has them talk only to their
cell's broker: a resync request or claim for a source the cell's stream carries goes out on
it, and a control server on it takes their answers, claim results and fences; a source no
cell stream has carried yet is reached on ``control_plane``.

Cold start has two modes: read the stream from its retained start (the
default: every announcement snapshot and delta still retained), or, given
``known_sources`` (source -> reporter endpoint), read only new messages and ask
every known source for a snapshot.

If the stream no longer holds the offset we resume from (retention dropped it),
the consumer reports a retention gap and every held source is asked to resync.

Observation: :meth:`SchedulerService.figures`, :meth:`versions` and
:meth:`stream_stats` are the read interface of the metrics endpoint
(``shared_host_manager.metrics``); whoever decides with this cache reports
each decision's latency with :meth:`record_decision`.  A state directory that
cannot be written is an error at start (one line, ``OperatorError``); a save
that fails later is logged once, counted, and makes ``/healthz`` unhealthy
until a save succeeds again.

The contract: docs/design.md §4.4 (starting and restarting).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol, Unpack

from oslo_config import cfg

from protocol.codec import Decoder, Encoder
from protocol.messages import (
    CheckpointAsk,
    Claim,
    ClaimResult,
    Message,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
)
from protocol.receiver import ReceiverMachine, ReceiverParams
from shared_host_manager.cache import CacheObserver, HostStateCache
from shared_host_manager.cell_markers import CellMarkers
from shared_host_manager.checkpoint import Checkpointer, checkpoint_plane
from shared_host_manager.conf import cache as cache_conf
from shared_host_manager.membership import MembershipPublisher, live_peers
from shared_host_manager.membership import source_id as membership_source_id
from shared_host_manager.placement.tap import PlacementTap
from shared_host_manager.placement.view import PlacementView
from transport import factory, signing_opts
from transport import opts as transport_opts
from transport.base import (
    ControlClient,
    ControlPlane,
    ControlServer,
    DataPlane,
    OffsetSpec,
    StreamConsumer,
    StreamConsumerStats,
    StreamPublisher,
)
from transport.metrics import Histogram
from transport.rpcapi import ReporterAPI, SchedulerAPI, peer_topic
from transport.startup import check_state_dir

LOG = logging.getLogger(__name__)


class PeerRequestHandler(Protocol):
    """The decider above the service: a request a peer handed to this scheduler, or the
    answer to one this scheduler handed over (design §5.4), on the peer topic's thread."""

    def peer_request(self, msg: ScarceRequest | ScarceAnswer) -> None: ...


class SchedulerService:
    # the transport objects, built by start() from the planes
    _client: ControlClient
    _server: ControlServer
    _consumer: StreamConsumer
    _publisher: StreamPublisher
    #: each cell's stream consumer (design §4.6)
    _cell_consumers: dict[str, StreamConsumer]
    reporter_api: ReporterAPI

    def __init__(
        self,
        name: str,
        data_plane: DataPlane,
        control_plane: ControlPlane,
        *,
        reporter_topic: str,
        scheduler_topic: str,
        encoder: Encoder | None = None,
        decoder: Decoder | None = None,
        state_dir: str | None = None,
        snapshot_interval: float = 30.0,
        tick_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        known_sources: Mapping[str, str] | None = None,
        recorder: CacheObserver | None = None,
        membership_interval: float | None = None,
        announce_claims: bool = True,
        fence_timeout: float = 1.0,
        placement_max_staleness: float = 5.0,
        checkpoint_interval: float = 0.0,
        checkpoint_ask: bool = True,
        cell_planes: Mapping[str, DataPlane] | None = None,
        cell_control_planes: Mapping[str, ControlPlane] | None = None,
        **receiver_params: Unpack[ReceiverParams],
    ) -> None:
        self.name = name
        self._data_plane = data_plane
        self._control_plane = control_plane
        #: cell -> the data plane of the cell's stream, read besides ``data_plane``'s
        self.cell_planes = dict(cell_planes or {})
        self._cell_consumers = {}
        #: cell -> the control plane on the cell's broker, where its computes are reached
        self.cell_control_planes = dict(cell_control_planes or {})
        self._cell_apis: dict[str, ReporterAPI] = {}
        self._cell_clients: list[ControlClient] = []
        self._cell_servers: list[ControlServer] = []
        #: catch_up's markers on the cell streams, each from a thread of its own
        self._markers: CellMarkers | None = None
        self._reporter_topic = reporter_topic
        self._scheduler_topic = scheduler_topic
        self._encoder = encoder or Encoder()
        self.receiver = ReceiverMachine(name, **receiver_params)
        self.cache = HostStateCache(self.receiver, self._send, decoder=decoder, clock=clock,
                                    recorder=recorder, fence_timeout=fence_timeout)
        #: placement's providers from the placement feed's source (design §11), applied per
        #: changed provider as the cache ingests; the nova drop-in answers allocation
        #: candidates from it
        self.placement_view = PlacementView(clock=clock, max_staleness=placement_max_staleness,
                                            peer_claim_ttl=self.receiver.peer_claim_ttl)
        PlacementTap(self.placement_view, self.receiver).attach(self.cache)
        #: optional update log (shared_host_manager.updatelog.recorder.Recorder), closed by stop()
        self.recorder = recorder
        self._state_path = os.path.join(state_dir, f"cache-{name}.msgpack") if state_dir else None
        self.snapshot_interval = snapshot_interval
        self.tick_interval = tick_interval
        self.clock = clock
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.retention_gaps = 0
        self.resumed_from: int | None = None
        self.running = False
        self._known_sources = dict(known_sources or {})
        self.started_at: float | None = None
        #: decision latency (seconds) and decisions by outcome, reported by the decider
        self.decision_seconds = Histogram()
        self.decisions: Counter[str] = Counter()
        self.save_failures = 0
        self.last_save_error: str | None = None
        self.last_saved_at: float | None = None
        #: seconds between this scheduler's publications of its own entry (None: it does not
        #: publish one, and peers do not count it); see shared_host_manager.membership
        self.membership_interval = membership_interval
        self.membership: MembershipPublisher | None = None
        self._next_peer_scan = 0.0
        #: cast every claim to the live peers too (they deduct it until its host lists it)
        self.announce_claims = announce_claims
        self.claims_announced = 0
        self._peer_server: ControlServer | None = None
        #: the data plane's own carrier of the peer topic, if it has one (else the control
        #: plane carries it)
        self._peer_plane: ControlPlane | None = None
        #: the decider's handler of requests handed over by a peer and of the answers to ours
        #: (design §5.4), called on the peer topic's thread (set_peer_handler); None: dropped
        self._peer_handler: PeerRequestHandler | None = None
        self._announcements: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        #: one publication of our own entry at a time (the timer's and catch_up's)
        self._membership_lock = threading.Lock()
        #: catch_up's waiters, woken after every ingest (under the cache lock)
        self._caught_up = threading.Condition(self.cache.lock)
        self._catching_up = 0
        self.cache.add_listener(self)
        self._announcer: threading.Thread | None = None
        #: seconds between checkpoints of the whole view (0: none, and none used at start)
        self.checkpoint_interval = checkpoint_interval
        #: ask the peers for a checkpoint at a start without a state file (False: restore the
        #: newest periodic one, as a scheduler before control plane 1.5 does)
        self.checkpoint_ask = checkpoint_ask
        self.checkpoints: Checkpointer | None = None

    @property
    def peers(self) -> tuple[str, ...]:
        """The live schedulers, this one included once its own entry came back from the
        stream, sorted; refreshed by the timer thread (kept on the cache, which the nova
        drop-in reads)."""
        return self.cache.peers

    def set_recorder(self, recorder: CacheObserver) -> None:
        """Observe this scheduler's cache (before :meth:`start`); see :class:`CacheObserver`."""
        self.cache.set_recorder(recorder)
        self.recorder = recorder

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        if self._state_path:
            check_state_dir(os.path.dirname(self._state_path), "[cache] state_dir")
        self._client = self._control_plane.control_client()
        self.reporter_api = ReporterAPI(self._client, self._encoder, self._reporter_topic)
        self.peer_api = SchedulerAPI(self._client, self._encoder, peer_topic(self._scheduler_topic))
        # the peer topic: announced claims and forwarded rejections (design §5.2), requests
        # handed over and their answers (§5.4; peers known from membership or given to the
        # decider), a newcomer's checkpoint ask (§4.5).  The data plane's broker carries it
        # where it can (RabbitMQ: kombu alone, transport.kombu_peers); each cast through
        # oslo.messaging's listener cost a scheduler several times its handling
        make_peer_plane = getattr(self._data_plane, "peer_plane", None)
        self._peer_plane = make_peer_plane() if make_peer_plane is not None else None
        if self._peer_plane is not None:
            self.peer_api = SchedulerAPI(self._peer_plane.control_client(), self._encoder,
                                         peer_topic(self._scheduler_topic))
        offset = self.cache.load(self._state_path) if self._state_path else None
        if self.checkpoint_interval > 0:
            self.checkpoints = self._checkpointer()
            if offset is None and self.checkpoints is not None:
                offset = self.checkpoints.restore(
                    ask=self._ask_checkpoint if self.checkpoint_ask else None)
        self.resumed_from = offset
        self._server = self._control_plane.control_server(
            self._scheduler_topic, self.name, self._on_control)
        self._server.start()
        for cell, cell_plane in self.cell_control_planes.items():
            client = cell_plane.control_client()
            self._cell_clients.append(client)
            self._cell_apis[cell] = ReporterAPI(client, self._encoder, self._reporter_topic)
            server = cell_plane.control_server(self._scheduler_topic, self.name, self._on_control)
            server.start()
            self._cell_servers.append(server)
        plane = self._peer_plane or self._control_plane
        # a server of its own: an announcement must not queue behind claim results
        self._peer_server = plane.control_server(
            peer_topic(self._scheduler_topic), self.name, self._on_peer)
        self._peer_server.start()
        if self.announce_claims and self.membership_interval is not None:
            self._announcer = threading.Thread(target=self._announce, daemon=True,
                                               name=f"scheduler-{self.name}-announcer")
            self._announcer.start()
            self.cache.claim_announcer = self.announce
        self._consumer = self._data_plane.stream_consumer(on_retention_gap=self._on_retention_gap)
        if offset is None and self._known_sources:
            self._consumer.start(self.cache.ingest_stream, "next", on_batch=self.cache.ingest_stream_batch)
            self.cache.ask_sources(self._known_sources)
        else:
            self._consumer.start(self.cache.ingest_stream, "first" if offset is None else offset + 1,
                                 on_batch=self.cache.ingest_stream_batch)
        self._start_cells(offset is None and bool(self._known_sources))
        if self.membership_interval is not None:
            self._publisher = self._data_plane.stream_publisher()
            if self.cell_planes:
                self._markers = CellMarkers(self.name, {
                    cell: plane.stream_publisher() for cell, plane in self.cell_planes.items()})
                self._markers.start()
            self.cache.marker_source = membership_source_id(self.name)
            self.membership = MembershipPublisher(self.name, time.time_ns(), time.time(),
                                                  interval=self.membership_interval)
            self._publish_membership()
        self._stop.clear()
        self._timer = threading.Thread(target=self._timers, name=f"scheduler-{self.name}-timers",
                                       daemon=True)
        self._timer.start()
        if self.checkpoints is not None:
            self.checkpoints.start()
        self.running = True
        self.started_at = time.time()
        LOG.info("scheduler cache %s started (%s)", self.name,
                 "cold start" if offset is None else f"resuming after stream offset {offset}")

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        if self.membership is not None:
            self._publish_membership(leaving=True)
            self._publisher.close()
            if self._markers is not None:
                self._markers.stop()
                self._markers = None
        self._consumer.stop()
        for consumer in self._cell_consumers.values():
            consumer.stop()
        self._server.stop()
        for server in self._cell_servers:
            server.stop()
        self._cell_servers = []
        if self._peer_server is not None:
            self._peer_server.stop()
        self.cache.claim_announcer = None
        if self._announcer is not None:
            self._announcements.put(None)
            self._announcer.join(timeout=10)
            self._announcer = None
        if self._peer_plane is not None:
            self._peer_plane.close()
            self._peer_plane = None
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=10)
        if self.checkpoints is not None:
            self.checkpoints.stop()
        if self._state_path:
            self._save()
        if self.recorder is not None:
            self.recorder.close()
        self._client.close()
        for client in self._cell_clients:
            client.close()
        self._cell_clients, self._cell_apis = [], {}
        LOG.info("scheduler cache %s stopped", self.name)

    def _start_cells(self, only_new: bool) -> None:
        """Start each cell stream's consumer after the offset the cache applied there (a
        restored state or checkpoint), else at its retained start (``only_new``: at its
        end, the known sources being asked for snapshots)."""
        for cell, plane in self.cell_planes.items():
            consumer = plane.stream_consumer(
                on_retention_gap=functools.partial(self._on_retention_gap, cell=cell))
            applied = self.cache.cell_offsets.get(cell)
            start: OffsetSpec = applied + 1 if applied is not None else "next" if only_new \
                else "first"
            consumer.start(functools.partial(self.cache.ingest_stream, cell=cell), start,
                           on_batch=functools.partial(self.cache.ingest_stream_batch, cell=cell))
            self._cell_consumers[cell] = consumer

    # -- edges -------------------------------------------------------------------

    def _reporters(self, source: str) -> ReporterAPI:
        """Where the reporter of ``source`` is reached: its cell's broker, if the scheduler
        has a control plane there, else the deployment's control plane."""
        if self._cell_apis:
            cell = self.cache.cell_of(source)
            if cell is not None and cell in self._cell_apis:
                return self._cell_apis[cell]
        return self.reporter_api

    def _send(self, endpoint: str, message: Message) -> None:
        if isinstance(message, ResyncRequest):
            self._reporters(message.source).resync(endpoint, message)
        elif isinstance(message, Claim):
            self._reporters(message.source).claim(endpoint, message)
        else:
            raise TypeError(f"a scheduler does not send {type(message).__name__}")

    def send_claim(self, claim: Claim) -> bool:
        """Cast a claim (with its build request) to the reporter of its source; with
        ``announce_claims``, then announce it to the peers: one fanout cast from this
        thread, at once (a hop to the announcer thread measured later, and more claims
        rejected, in-process), at most once like every cast: a peer that misses it decides
        as it would without (design §5.2)."""
        endpoint = self.cache.endpoint_of(claim.source)
        if endpoint is None:
            return False
        self._reporters(claim.source).claim(endpoint, claim)
        if self.recorder is not None:
            self.recorder.sent(endpoint, claim, self.clock())
        self.announce(claim)
        return True

    def send_to_peer(self, scheduler: str, message: ScarceRequest | ScarceAnswer) -> None:
        """Cast a scarce request or its answer to the scheduler named, on the peer topic
        (control plane 1.4: kombu alone over RabbitMQ, design §7.2)."""
        self.peer_api.hand(scheduler, message)

    def announce(self, claim: Claim) -> None:
        """With ``announce_claims`` and live peers: one fanout cast of ``claim`` to them (a
        cast to the only one, see :func:`_one_recipient`), from this thread (advice, at most
        once; never raises).  The engine's claims are announced by :meth:`send_claim`; the
        nova drop-in's, which placement arbitrates, through ``cache.claim_announcer``: the
        host it is about to claim (its intent), then the claim placement accepted."""
        if self._announcer is None:
            return
        others = self._other_peers()
        if not others:
            return
        try:
            self.peer_api.announce(claim, _one_recipient(others))
            self.claims_announced += 1
        except Exception as exc:  # advice only: the claim itself is on its way
            LOG.debug("scheduler %s could not announce claim %s: %s", self.name,
                      claim.claim_id, exc)

    def _other_peers(self) -> list[str]:
        return [p for p in self.peers if p != self.name]

    def set_peer_handler(self, handler: PeerRequestHandler | None) -> None:
        """Who decides what peers hand over to this scheduler and takes the answers to what it
        handed over (the decider: :class:`~shared_host_manager.decision.manager.SchedulerManager`);
        None: both are dropped."""
        self._peer_handler = handler

    def _on_peer(self, body: bytes) -> None:
        """The peer topic's handler: a peer's claim or forwarded rejection goes to the cache
        (held only while this scheduler announces its own); a scarce request handed to us,
        or the answer to ours, to the decider (design §5.4)."""
        msg = self.cache.ingest_peer_claim(body, hold=self.announce_claims)
        if type(msg) is ScarceRequest or type(msg) is ScarceAnswer:
            handler = self._peer_handler
            if handler is not None:
                handler.peer_request(msg)
        elif type(msg) is CheckpointAsk and msg.scheduler != self.name:
            if self.checkpoints is not None:
                self.checkpoints.asked(msg.token)

    def _on_control(self, body: bytes) -> None:
        """The control server's handler: the cache ingests; the host's rejection of a claim
        we announced goes on to the peers, as received (signed by the host), so that they
        stop deducting it at once rather than at peer_claim_ttl (design §5.2)."""
        msg = self.cache.ingest_control(body)
        if (type(msg) is ClaimResult and not msg.accepted and self._announcer is not None
                and msg.scheduler == self.name):
            self._announcements.put(body)

    def _announce(self) -> None:
        """The announcer thread: forwarded rejections to the peers, in order, one fanout
        publish each (alone, nobody listens: nothing is sent)."""
        while (item := self._announcements.get()) is not None:
            others = self._other_peers()
            if not others:
                continue
            try:
                self.peer_api.forward(item, _one_recipient(others))
            except Exception as exc:  # advice only: peers drop it at its ttl
                LOG.debug("scheduler %s could not forward a rejection: %s", self.name, exc)

    def _on_retention_gap(self, requested: int, first: int, cell: str | None = None) -> None:
        self.retention_gaps += 1
        # only the sources that stream carries: the others lost nothing
        n = self.cache.resync_all(stream=cell)
        LOG.warning("%sstream offset %d is gone (oldest retained %d): asked %d sources to "
                    "resync", f"cell {cell}: " if cell else "", requested, first, n)

    def _timers(self) -> None:
        next_save = self.clock() + self.snapshot_interval
        while not self._stop.wait(self.tick_interval):
            try:
                self.cache.tick()
                self._membership_tick()
                if self._state_path and self.clock() >= next_save:
                    next_save = self.clock() + self.snapshot_interval
                    self._save()
            except Exception:  # timers must outlive any single failure
                LOG.exception("scheduler timer iteration failed")

    def _membership_tick(self) -> None:
        now = self.clock()
        if self.membership is not None and self.running and self.membership.due(now):
            self._publish_membership()
        if now >= self._next_peer_scan:
            # a scan of every view: a few times per publication interval, not per decision
            self._next_peer_scan = now + min(0.5, (self.membership_interval or 2.0) / 4)
            with self.cache.lock:
                self.cache.peers = tuple(live_peers(self.receiver, now))

    def _publish_membership(self, leaving: bool = False, cells: tuple[str, ...] = (),
                            ) -> tuple[int, int] | None:
        """Put this scheduler's own entry on the stream (design §2; a failure is retried at
        the next interval: peers drop a silent scheduler, they do not fail), and hand it to
        the streams of ``cells`` (catch_up's marker, published by their own threads); its
        version once stored on the deployment's stream, None if it could not be."""
        membership = self.membership
        assert membership is not None
        now = self.clock()
        with self.cache.lock:
            load = {"pending_claims": self.receiver.pending_claims(),
                    "decisions": sum(self.decisions.values())}
        with self._membership_lock:  # versions reach the stream in the order they are made
            snapshot = membership.leave(now, load) if leaving else membership.publish(now, load)
            body = self._encoder.encode(snapshot)
            try:
                self._publisher.publish(body)
            except Exception as exc:
                if self.running or leaving:  # (a timer tick racing stop() finds it closed)
                    LOG.warning("scheduler %s could not publish its membership entry: %s",
                                self.name, exc)
                return None
            if cells and self._markers is not None:
                self._markers.put(body, cells)
        return snapshot.epoch, snapshot.seq

    def catch_up(self, settle: float = 0.0, timeout: float = 1.0) -> bool:
        """Wait until this cache holds what the sources had changed by now (design §5.4):
        ``settle`` seconds for those changes to reach the stream (a reporter publishes a
        change within its coalescing window; 0: only what is on the stream already), then
        put our own entry on the stream and wait, at most ``timeout`` seconds, until it
        comes back: one stream, one order, so everything stored before it has been
        applied.  With cells, the same entry goes on every cell stream whose consumer is
        connected, and each must come back too (a cell whose publish hangs makes catch_up
        wait out its ``timeout``, nothing more: shared_host_manager.cell_markers).  False at
        once without an entry to put (membership off), when stopped, or when it fails."""
        if self.membership is None or not self.running:
            return False
        if settle > 0 and self._stop.wait(settle):
            return False
        deadline = time.monotonic() + timeout
        cells = self._connected_cells()
        version = self._publish_membership(cells=cells)
        if version is None:
            return False
        view = self.receiver.sources.get  # read under the lock, by wait_for
        own = membership_source_id(self.name)
        marks = self.cache.cell_marks

        def back() -> bool:
            held = view(own)
            return held is not None and held.version >= version and all(
                marks.get(cell, (-1, -1)) >= version for cell in cells)

        with self._caught_up:
            self._catching_up += 1
            try:
                return self._caught_up.wait_for(back, max(0.0, deadline - time.monotonic()))
            finally:
                self._catching_up -= 1

    def _connected_cells(self) -> tuple[str, ...]:
        """The cells whose stream consumer is connected (or cannot tell: in-process)."""
        out = []
        for cell, consumer in self._cell_consumers.items():
            stats = getattr(consumer, "stats", None)
            if not callable(stats) or stats().connected:
                out.append(cell)
        return tuple(out)

    def ingest_done(self) -> None:
        """The cache's IngestListener, under its lock: wake :meth:`catch_up`'s waiters."""
        if self._catching_up:
            self._caught_up.notify_all()

    def _ask_checkpoint(self, token: str) -> None:
        """Fan this newcomer's checkpoint ask out to the peers (design §4.5)."""
        self.peer_api.ask_checkpoint(CheckpointAsk(self.name, token))

    def _checkpointer(self) -> Checkpointer | None:
        plane = checkpoint_plane(self._data_plane)
        if plane is None:
            LOG.warning("checkpoints off: the data plane %s has no checkpoint stream",
                        type(self._data_plane).__name__)
            return None
        return Checkpointer(self.name, self.cache, plane, interval=self.checkpoint_interval,
                            peers=lambda: self.peers, keyring=self._encoder.keyring)

    def _save(self) -> None:
        """Write the local snapshot; a failure is logged once (and again on recovery)."""
        assert self._state_path is not None
        try:
            self.cache.save(self._state_path)
        except OSError as exc:
            self.save_failures += 1
            error = f"{exc.strerror or exc} ({exc.filename or self._state_path})"
            if self.last_save_error is None:
                LOG.error("cannot save the cache state to %s: %s; a restart will be a cold start "
                          "until this is fixed ([cache] state_dir)", self._state_path, error)
            self.last_save_error = error
            return
        if self.last_save_error is not None:
            LOG.info("cache state saved to %s again", self._state_path)
        self.last_save_error = None
        self.last_saved_at = time.time()

    # -- observation (the metrics endpoint's read interface) ---------------------------

    def record_decision(self, seconds: float, outcome: str) -> None:
        """A decision made with this cache took ``seconds``; ``outcome``: "scheduled",
        "no_valid_host" or "error"."""
        self.decision_seconds.observe(seconds)
        self.decisions[outcome] += 1

    def stream_stats(self) -> StreamConsumerStats | None:
        """The stream consumer's figures (None before start, or for a backend without them)."""
        return _consumer_stats(getattr(self, "_consumer", None))

    def cell_stream_stats(self) -> dict[str, StreamConsumerStats | None]:
        """Each cell stream consumer's figures, in the configured order (design §4.6)."""
        return {cell: _consumer_stats(c) for cell, c in self._cell_consumers.items()}

    def figures(self) -> dict[str, Any]:
        """Counters and source counts, read at once under the cache lock."""
        cache = self.cache
        with cache.lock:
            states: Counter[str] = Counter(v.status.value for v in self.receiver.sources.values())
            return {
                "sources": {"held": sum(1 for v in self.receiver.sources.values() if v.doc is not None),
                            "active": states["active"], "down": states["down"],
                            "syncing": states["syncing"]},
                "receiver": dict(self.receiver.stats),
                "invalid": dict(cache.invalid),
                "control": dict(cache.control_received),
                "messages": cache.messages,
                "unroutable": cache.unroutable,
                "offset": cache.offset,
                "cell_offsets": dict(cache.cell_offsets),
                "retention_gaps": self.retention_gaps,
                "decisions": dict(self.decisions),
                "peers": list(self.peers),
                "claims_announced": self.claims_announced,
                "save_failures": self.save_failures,
                "last_save_error": self.last_save_error,
                "last_saved_at": self.last_saved_at,
                "checkpoints": self._checkpoint_figures(),
            }

    def _checkpoint_figures(self) -> dict[str, Any] | None:
        """What this scheduler's checkpoints did (None: checkpoints off)."""
        cp = self.checkpoints
        if cp is None:
            return None
        restored = cp.restored
        return {"published": cp.published, "answered": cp.answered, "asks": cp.asks,
                "publish_failures": cp.publish_failures,
                "restored_from": None if restored is None else {
                    "scheduler": restored.scheduler, "taken_ns": restored.taken_ns,
                    "answered_ask": cp.asked_token in restored.answers}}

    def versions(self) -> dict[str, tuple[int, int, bytes | None, str]]:
        """Each held source's ``(epoch, seq, digest, status)`` (digests computed as needed)."""
        with self.cache.lock:
            return {s: (v.epoch, v.seq, v.digest(), v.status.value)
                    for s, v in self.receiver.sources.items()}


# -- built from a configuration file -------------------------------------------------

def _consumer_stats(consumer: object) -> StreamConsumerStats | None:
    stats = getattr(consumer, "stats", None)
    return stats() if callable(stats) else None


def _one_recipient(others: list[str]) -> str | None:
    """The peer to cast to directly when it is the only one, else None (one fanout).

    A fanout reaches every scheduler on the peer topic, the sender too, which decodes
    its own echo only to drop it: with one peer, that echo is half of what each
    announcement costs the schedulers (over RabbitMQ, an oslo.messaging delivery), while
    a direct cast is the same one publish.  With two peers or more, one fanout publish
    is cheaper than a cast to each."""
    return others[0] if len(others) == 1 else None


def register_service_opts(conf: cfg.ConfigOpts) -> None:
    """Every option group a scheduler's cache reads: [cache], [signing], [data_plane], [control_plane]."""
    cache_conf.register_opts(conf)
    signing_opts.register_opts(conf)
    transport_opts.register_opts(conf)


def service_from_conf(conf: cfg.ConfigOpts, *, recorder: CacheObserver | None = None
                      ) -> SchedulerService:
    """A SchedulerService configured by ``conf`` (registered with :func:`register_service_opts`)."""
    group = conf.cache
    keyring = signing_opts.keyring_from_conf(conf)
    data_plane, control_plane = factory.from_conf(conf)
    topics = factory.topics(conf)
    return SchedulerService(
        group.name, data_plane, control_plane,
        reporter_topic=topics.reporter, scheduler_topic=topics.scheduler,
        encoder=Encoder(keyring),
        decoder=Decoder(keyring, max_message_bytes=group.max_message_bytes),
        state_dir=group.state_dir, snapshot_interval=group.snapshot_interval,
        tick_interval=group.tick_interval, reorder_window=group.reorder_window,
        reorder_timeout=group.reorder_timeout, resync_timeout=group.resync_timeout,
        resync_backoff_max=group.resync_backoff_max, down_interval=group.down_interval,
        claim_deadline=group.claim_deadline, recorder=recorder,
        membership_interval=group.membership_interval or None,
        announce_claims=group.announce_claims, peer_claim_ttl=group.peer_claim_ttl,
        fence_timeout=group.fence_timeout, placement_max_staleness=group.placement_max_staleness,
        checkpoint_interval=group.checkpoint_interval,
        cell_planes=factory.build_cell_planes(conf),
        cell_control_planes=factory.build_cell_control_planes(conf))
