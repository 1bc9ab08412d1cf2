"""A deterministic, thread-free run for the update-log tests: sources, schedulers, one fake clock.

:class:`MiniRun` wires :class:`~protocol.source.SourceMachine` instances (one
"reporter" named ``r0``) to :class:`~shared_host_manager.cache.HostStateCache`
instances through byte queues: published batches go to a stream list every
scheduler reads at its own offset (with optional drops), control messages
(resync requests, claims, answers) are delivered on the next :meth:`pump`.
Every scheduler and the reporter record an update log.
"""

from __future__ import annotations

import random
import types
from typing import Any

from protocol import codec
from protocol.batching import batches
from protocol.document import SET
from protocol.messages import Claim, ClaimResult, Delta
from protocol.receiver import ReceiverMachine
from protocol.source import SourceMachine
from shared_host_manager.cache import HostStateCache
from shared_host_manager.updatelog.recorder import Recorder
from simulator.synthetic_hosts import host_doc

REPORTER = "r0"
RECEIVER_PARAMS = dict(reorder_timeout=0.1, resync_timeout=0.5, down_interval=3.0, claim_deadline=5.0)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class MiniRun:
    def __init__(self, directory: str, *, sources: int = 8, schedulers: tuple[str, ...] = ("s0", "s1"),
                 seed: int = 0, checkpoint_interval: float = 0.25, max_file_bytes: int = 1 << 30,
                 record_reporter: bool = True, **recorder_params: Any) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.directory = directory
        self.sources: dict[str, SourceMachine] = {}
        for i in range(sources):
            doc = host_doc(f"h{i}", memory_mb=8192 + 1024 * i, vcpus=8, cpu_ratio=1.0)
            doc["service"]["endpoint"] = REPORTER
            self.sources[f"cn{i:02d}"] = SourceMachine(f"cn{i:02d}", 1000 + i, doc, coalesce_window=0.0,
                                                      heartbeat_interval=0.5)
        self.stream: list[bytes] = []
        self.read: dict[str, int] = {}
        self.drop: dict[str, set[int]] = {}
        #: name -> source ("" for any): drop the next stream message carrying a delta (of that source)
        self.drop_delta: dict[str, str] = {}
        #: name -> deltas that were in the messages dropped for it
        self.dropped: dict[str, list[Delta]] = {}
        #: name -> f(offset, body) -> body: what that scheduler receives instead
        self.rewrite: dict = {}
        #: name -> the cell whose stream that scheduler takes the stream for (design §4.6)
        self.cell: dict[str, str] = {}
        self.inbox: dict[str, list[bytes]] = {}
        self.reporter_inbox: list[bytes] = []
        self.caches: dict[str, HostStateCache] = {}
        self.recorders: dict[str, Recorder] = {}
        params = dict(checkpoint_interval=checkpoint_interval, max_file_bytes=max_file_bytes,
                      **recorder_params)
        for name in schedulers:
            rec = Recorder(directory, **params)
            self.recorders[name] = rec
            self.caches[name] = HostStateCache(ReceiverMachine(name, **RECEIVER_PARAMS), self._to_reporter,
                                               clock=self.clock, recorder=rec)
            self.read[name] = 0
            self.drop[name] = set()
            self.inbox[name] = []
        self.reporter_recorder = None
        if record_reporter:
            self.reporter_recorder = Recorder(directory, **params)
            self.reporter_recorder.reporter_attached(types.SimpleNamespace(
                name=REPORTER, manager=types.SimpleNamespace(machines=self.sources), clock=self.clock,
                params={"coalesce_window": 0.0, "heartbeat_interval": 0.5}))
        self._data: list = []
        self.claims = 0
        #: ids of the claims announced to the peers (their rejections are forwarded too)
        self.announced: set[str] = set()

    # -- the reporter side -----------------------------------------------------------

    def _to_reporter(self, endpoint: str, message) -> None:
        self.reporter_inbox.append(codec.encode(message))

    def _route(self, sends) -> None:
        for send in sends:
            if send.to is None:
                self._data.append(send.message)
            else:
                body = codec.encode(send.message)
                self.inbox[send.to].append(body)
                if self.reporter_recorder is not None:
                    self.reporter_recorder.sent(send.to, send.message, self.clock())

    def publish(self) -> None:
        now = self.clock()
        for body in self.reporter_inbox:
            msg = codec.decode(body)
            if self.reporter_recorder is not None:
                self.reporter_recorder.control(body, now)
            self._route(self.sources[msg.source].handle(msg, now))
        self.reporter_inbox = []
        for sm in self.sources.values():
            self._route(sm.poll(now))
        for batch in batches(self._data, 50):
            batch.origin = REPORTER
            body = codec.encode(batch)
            self.stream.append(body)
            if self.reporter_recorder is not None:
                self.reporter_recorder.published(body, now)
        self._data = []

    def change(self, k: int = 3) -> None:
        now = self.clock()
        for _ in range(k):
            sm = self.sources[self.rng.choice(sorted(self.sources))]
            sm.change([[SET, "compute", "num_io_ops", self.rng.randrange(8)],
                       [SET, "metrics", "cpu.percent", self.rng.randrange(100)]], now)

    # -- the scheduler side -----------------------------------------------------------

    def deliver(self) -> None:
        for name, cache in self.caches.items():
            while self.read[name] < len(self.stream):
                offset = self.read[name]
                self.read[name] += 1
                body = self.stream[offset]
                if name in self.drop_delta:
                    deltas = [i for i in codec.decode(body).items if type(i) is Delta
                              and self.drop_delta[name] in ("", i.source)]
                    if deltas:
                        del self.drop_delta[name]
                        self.dropped.setdefault(name, []).extend(
                            i for i in codec.decode(body).items if type(i) is Delta)
                        continue
                if name in self.rewrite:
                    body = self.rewrite[name](offset, body)
                if offset not in self.drop[name]:
                    cache.ingest_stream(body, offset, cell=self.cell.get(name))
            inbox, self.inbox[name] = self.inbox[name], []
            for body in inbox:
                msg = cache.ingest_control(body)
                if (type(msg) is ClaimResult and not msg.accepted
                        and msg.claim_id in self.announced):
                    self._to_peers(name, body)  # the host's rejection, forwarded as received

    def claim(self, name: str, source: str, resources: dict[str, int], *, announce: bool = False,
              lost: bool = False) -> Claim:
        """``name`` claims on ``source``; ``announce``: cast to the other schedulers too (their
        peer topic, design §5.2); ``lost``: the claim never reaches the host."""
        cache = self.caches[name]
        with cache.lock:
            view = cache.receiver.sources[source]
            self.claims += 1
            claim = Claim(f"{name}-c{self.claims}", name, source, view.epoch, view.seq, resources,
                          f"vm-{self.claims}")
            cache.receiver.add_claim(claim, self.clock())
        if not lost:
            self._to_reporter(REPORTER, claim)
        if announce:
            self.announced.add(claim.claim_id)
            self._to_peers(name, codec.encode(claim))
        return claim

    def _to_peers(self, name: str, body: bytes) -> None:
        """What ``name`` casts on its peer topic reaches every other scheduler at once."""
        for peer, other in self.caches.items():
            if peer != name:
                other.ingest_peer_claim(body)

    def pump(self, dt: float = 0.05) -> None:
        self.clock.t += dt
        self.publish()
        self.deliver()
        for cache in self.caches.values():
            cache.tick()
        self.publish()
        self.deliver()

    def run(self, steps: int, changes: int = 3) -> None:
        for _ in range(steps):
            self.change(changes)
            self.pump()

    def settle(self, steps: int = 30) -> None:
        for _ in range(steps):
            self.pump()

    def close(self) -> None:
        for rec in self.recorders.values():
            rec.close()
        if self.reporter_recorder is not None:
            self.reporter_recorder.close()

    def log(self, name: str) -> str:
        return self.recorders[name].path if name in self.recorders else self.reporter_recorder.path

    def converged(self) -> bool:
        for sm in self.sources.values():
            for cache in self.caches.values():
                view = cache.receiver.sources.get(sm.source)
                if view is None or view.version != sm.version or view.digest() != sm.published_digest():
                    return False
        return True
