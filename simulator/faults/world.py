"""One seeded fault schedule: the whole system in virtual time, checked after every step.

Life cycle of a :class:`FaultWorld` (one schedule)::

    FaultWorld(seed, k)      the schedule's profile (which faults, how often, how many
                             parties, signing on or off) is drawn from Random(f"{seed}:{k}");
                             every later draw comes from the same generator, so a
                             schedule is reproduced exactly by its (seed, k)
      run()
        fault phase          every STEP of virtual time: the schedule's actions (tracker
                             changes, releases, bursts of requests, crashes and restarts,
                             partitions, retention loss, control-plane loss, garbage),
                             then control deliveries, reporter polls and publishes,
                             stream reads and scheduler ticks; invariants after the step
        faults stop          partitions heal, crashed parties restart, the network
                             stops losing, changes and requests stop
        + 2 heartbeats       invariant 2: every scheduler holds every source as published
        + 2 claim deadlines  invariant 3: every claim of a live scheduler resolved once
        replay (optional)    invariant 5: each scheduler's update log replays clean
      -> violations (empty: the schedule passed)

The parties are the real code a deployment runs, not models of it:

* a reporter is a :class:`~compute_reporter.manager.ReporterManager` whose epochs come
  from an :class:`~compute_reporter.epochs.EpochStore` in its own state directory; it
  takes control bytes through ``handle_bytes`` and its batches are encoded as the
  service encodes them.  A crash loses the manager; the restart rebuilds it from the
  hosts' true documents (what the tracker reads back), with new persisted epochs,
  whatever the wall clock says (it may have gone back);
* a scheduler is a :class:`~shared_host_manager.cache.HostStateCache` over a
  :class:`~protocol.receiver.ReceiverMachine`, a :class:`DecisionEngine` and a
  :class:`RequestTracker` fed from ``drain_outcomes`` by an ingest listener, as
  :class:`~shared_host_manager.decision.manager.SchedulerManager` feeds it; its state file
  is written by ``cache.save`` every SNAPSHOT_INTERVAL and read back by ``cache.load`` at
  a restart, after a crash that may have damaged it (a torn or corrupted write);
* the stream is an append-only log with offsets and retention, each scheduler reading at
  its own offset (a resumed offset no longer retained is a retention gap, answered with
  ``cache.resync_all`` as the service does); the control plane delivers each cast at most
  once, late, twice or in any order.

Every party has a clock of its own (offset and rate), so timers run skewed; reporters'
wall clocks may jump back across a restart.  All randomness comes from the schedule's
generator and every container is iterated in a fixed order: no wall clock, no hash order.
"""

from __future__ import annotations

import os
import random
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compute_reporter.epochs import EpochStore
from compute_reporter.manager import ReporterManager
from protocol.codec import Decoder, Encoder
from protocol.document import DROP, SET, Document, Op, apply_ops, copy_document, digest
from protocol.errors import ProtocolError
from protocol.hostdoc import COMPUTE, INSTANCES
from protocol.messages import Claim, ClaimResult, Delta, Message, Snapshot
from protocol.receiver import Outcome, ReceiverMachine
from protocol.resources import overcommitted
from protocol.signing import Keyring
from shared_host_manager.cache import HostStateCache
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, RequestSpec
from shared_host_manager.decision.request_tracker import RequestTracker, claims_of
from shared_host_manager.updatelog.recorder import Recorder
from simulator.faults.planted import PlantedBug, receiver_policy
from simulator.synthetic_hosts import host_doc

# -- timing of the simulated world (seconds of virtual time) ---------------------------
STEP = 0.05
HB = 1.0
#: the receivers' settings (design §4.3: resync_backoff_max at most a heartbeat interval)
RECEIVER = dict(reorder_window=4, reorder_timeout=0.2, resync_timeout=0.3, resync_backoff_max=HB,
                down_interval=3.5, claim_deadline=2.5)
#: tiny rings, so that resyncs and corrections often fall back to a snapshot
REPORTER = dict(coalesce_window=0.05, heartbeat_interval=HB, ring_size=4)
SNAPSHOT_INTERVAL = 2.0
#: invariant 2's bound, from the moment faults stop
CONVERGENCE_BOUND = 2 * HB
#: what a healthy network may still have in flight when convergence is checked
IN_FLIGHT = 0.2
BROKER = "broker"
MASTER = b"fault simulation master secret"

INVARIANTS = {
    "no_overcommit": "1. a compute node never accepts beyond capacity",
    "convergence": "2. views equal their sources within two heartbeat intervals of the faults' end",
    "claim_once": "3. each claim resolves exactly once, as the arbiter decided",
    "ledger": "3. a view's pending usage is the sum of its pending claims, all of its epoch",
    "correction": "5.3: a rejection brings the view up to the version judged",
    "version_monotonic": "4. a held version never goes backwards",
    "view_exact": "1/4. a held document is exactly the source's at the held version",
    "replay": "5. replaying a scheduler's update log reproduces its digests and effects",
    "no_crash": "6. no input, however bad, crashes a party",
}


@dataclass
class Violation:
    seed: int
    schedule: int
    step: int
    time: float
    invariant: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "schedule": self.schedule, "step": self.step,
                "time": round(self.time, 3), "invariant": self.invariant, "detail": self.detail}


@dataclass
class Profile:
    """What one schedule does, and how often (drawn once per schedule)."""

    hosts: int
    reporters: int
    schedulers: int
    signing: bool
    fault_time: float
    drop: float
    duplicate: float
    delay: float
    stream_drop: float
    stream_duplicate: float
    stream_reorder: float
    read_rate: int
    change: float
    release: float
    request: float
    burst: float
    reporter_crash: float
    scheduler_crash: float
    damage: float
    partition: float
    retention: float
    control_loss: float
    garbage: float
    skew: float
    max_batch_items: int

    @classmethod
    def draw(cls, rng: random.Random) -> Profile:
        def some(p: float) -> float:  # a fault is off in about a third of the schedules
            return 0.0 if rng.random() < 0.35 else rng.uniform(0, p)
        return cls(
            hosts=rng.randint(2, 5), reporters=rng.randint(1, 2), schedulers=rng.randint(1, 3),
            signing=rng.random() < 0.5, fault_time=rng.uniform(2.0, 10.0),
            drop=some(0.3), duplicate=some(0.2), delay=some(0.2),
            stream_drop=some(0.1), stream_duplicate=some(0.1), stream_reorder=some(0.1),
            read_rate=rng.choice((1, 2, 8, 64)),
            change=rng.uniform(0.05, 0.5), release=rng.uniform(0.0, 0.1),
            request=rng.uniform(0.05, 0.25), burst=some(0.05),
            reporter_crash=some(0.01), scheduler_crash=some(0.01), damage=rng.random(),
            partition=some(0.02), retention=some(0.01), control_loss=some(0.005),
            garbage=some(0.03), skew=some(0.02), max_batch_items=rng.choice((2, 5, 500)))


class PartyClock:
    """A process's monotonic clock: its own origin and rate (skew), fixed per incarnation."""

    def __init__(self, offset: float, rate: float) -> None:
        self.offset = offset
        self.rate = rate

    def at(self, now: float) -> float:
        return self.offset + self.rate * now


class _Crash(Exception):
    """A party raised out of a step (invariant 6); the world records it and goes on."""


#: the parties' wall clock at the world's time 0 (a reporter's may go back across a restart)
WALL_EPOCH = 1.7e9


# -- parties ------------------------------------------------------------------------------

class Reporter:
    def __init__(self, world: FaultWorld, name: str, hosts: list[str]) -> None:
        self.world = world
        self.name = name
        self.hosts = hosts
        self.state_dir = os.path.join(world.directory, name)
        self._manager: ReporterManager | None = None
        self.pclock = PartyClock(0.0, 1.0)
        self.wall_offset = WALL_EPOCH
        self.params: dict[str, Any] = dict(REPORTER, max_batch_items=world.profile.max_batch_items)
        keyring = Keyring(master=MASTER) if world.profile.signing else None
        self.encoder = Encoder(keyring)
        self.decoder = Decoder(keyring)
        self.recorder: Recorder | None = None

    # what an update log's recorder reads of a reporter (RecordedReporter)
    @property
    def manager(self) -> ReporterManager:
        assert self._manager is not None
        return self._manager

    def clock(self) -> float:
        return self.pclock.at(self.world.now)

    @property
    def up(self) -> bool:
        return self._manager is not None

    def start(self, now: float) -> None:
        w = self.world
        self.pclock = w.new_clock()
        if w.rng.random() < 0.3:
            self.wall_offset -= w.rng.uniform(0, 5)  # the wall clock went back across the restart
        wall_ns = int((self.wall_offset + now) * 1e9)
        epochs = EpochStore(self.state_dir).new_epochs(self.hosts, wall_ns)
        self._manager = ReporterManager(
            self.name, {h: w.truth[h] for h in self.hosts}, epochs, **self.params)
        if w.record_dir is not None:
            self.recorder = Recorder(w.record_dir)
            self.recorder.reporter_attached(self)

    def crash(self) -> None:
        w = self.world
        for host, machine in self.manager.machines.items():
            # what the host really is: its tracker reads it back at the restart
            w.truth[host] = copy_document(machine.document)
        self._manager = None
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None

    def handle(self, body: bytes) -> None:
        now = self.clock()
        dropped = self.manager.handle_bytes(body, self.decoder, now)
        if self.recorder is not None:
            if dropped is None:
                self.recorder.control(body, now)
            else:
                self.recorder.dropped(body, "control", None, now)

    def local(self, now: float) -> float:
        return self.pclock.at(now)


class Scheduler:
    def __init__(self, world: FaultWorld, name: str) -> None:
        self.world = world
        self.name = name
        self.state_path = os.path.join(world.directory, name, f"cache-{name}.msgpack")
        self.cache: HostStateCache | None = None
        self.engine: DecisionEngine | None = None
        self.tracker: RequestTracker | None = None
        self.pclock = PartyClock(0.0, 1.0)
        self.cursor = 0
        #: the stream's newest offset when this incarnation started, or last came back from
        #: a partition from the broker: its backlog's end (as the kombu consumer looks)
        self.backlog_end = -1
        self.parted_from_broker = False
        self.incarnation = 0
        self.next_save = 0.0
        keyring = Keyring(master=MASTER) if world.profile.signing else None
        self.encoder = Encoder(keyring)
        self.decoder = Decoder(keyring)
        #: this incarnation's claims: id -> the claim; and their terminal outcomes
        self.claims: dict[str, Claim] = {}
        self.outcomes: dict[str, list[Outcome]] = {}
        self.held: dict[str, tuple[int, int]] = {}
        self.recorders: list[Recorder] = []

    @property
    def up(self) -> bool:
        return self.cache is not None

    @property
    def receiver(self) -> ReceiverMachine:
        assert self.cache is not None
        return self.cache.receiver

    def local(self, now: float) -> float:
        return self.pclock.at(now)

    def start(self, now: float) -> None:
        w = self.world
        self.pclock = w.new_clock()
        self.incarnation += 1
        self.claims, self.outcomes, self.held = {}, {}, {}
        receiver = ReceiverMachine(self.name, policy=receiver_policy(w.planted),
                                   **RECEIVER)  # type: ignore[arg-type]
        cache = HostStateCache(receiver, self._send, decoder=self.decoder,
                               clock=lambda: self.local(w.now),
                               wall_clock=lambda: WALL_EPOCH + w.now)
        recorder: Recorder | None = None
        if w.record_dir is not None:
            recorder = Recorder(w.record_dir, checkpoint_interval=1.0)
            cache.set_recorder(recorder)
            self.recorders.append(recorder)
        self.cache = cache
        self.backlog_end = w.stream_first + len(w.stream) - 1
        offset = cache.load(self.state_path)
        self.cursor = w.stream_first if offset is None else offset + 1
        config = SchedulerConfig()
        self.engine = DecisionEngine(receiver, config=config,
                                     rng=random.Random(w.rng.getrandbits(32)))
        if recorder is not None:  # the cache's recorder logs the decisions too
            self.engine.set_observer(recorder)
        self.tracker = RequestTracker(self.engine, keep_finished=16)
        cache.add_listener(self)
        self.next_save = self.local(now) + SNAPSHOT_INTERVAL
        if offset is not None and offset + 1 < w.stream_first:
            # the saved offset is gone: as SchedulerService._on_retention_gap
            self.cursor = w.stream_first
            cache.resync_all()

    def stop(self, clean: bool) -> None:
        assert self.cache is not None
        if clean:
            self.cache.save(self.state_path)
        if self.cache.recorder is not None:
            self.cache.recorder.close()
        self.cache = self.engine = self.tracker = None

    def _send(self, endpoint: str, message: Message) -> None:
        self.world.cast(self.name, endpoint, self.encoder.encode(message))

    def send_claims(self, claims: list[Claim]) -> None:
        """Cast the claims the engine registered (the world has no threads: at once)."""
        assert self.cache is not None
        for claim in claims:
            self.claims[claim.claim_id] = claim
            endpoint = self.cache.endpoint_of(claim.source)
            if endpoint is not None:
                self.world.cast(self.name, endpoint, self.encoder.encode(claim))
                if self.cache.recorder is not None:
                    self.cache.recorder.sent(endpoint, claim, self.local(self.world.now))

    def ingest_done(self) -> None:
        """The cache's IngestListener, under its lock, as SchedulerManager's."""
        assert self.cache is not None and self.tracker is not None
        outcomes = self.cache.receiver.drain_outcomes()
        if not outcomes:
            return
        self.world.checker.outcomes(self, outcomes)
        self.send_claims(claims_of(self.tracker.process(outcomes, self.local(self.world.now))))


# -- the world -------------------------------------------------------------------------------

class FaultWorld:
    def __init__(self, seed: int, schedule: int, directory: str, *,
                 planted: frozenset[PlantedBug] = frozenset(), record_dir: str | None = None,
                 profile: Profile | None = None) -> None:
        self.seed = seed
        self.schedule = schedule
        self.rng = random.Random(f"{seed}:{schedule}")
        self.profile = profile or Profile.draw(self.rng)
        self.directory = directory
        self.planted = planted
        self.record_dir = record_dir
        self.now = 0.0
        self.step = 0
        self.faulty = True
        self.violations: list[Violation] = []
        p = self.profile
        # the hosts' true documents (the trackers' view), small and near full
        self.truth: dict[str, Document] = {}
        for i in range(p.hosts):
            vcpus = self.rng.choice((4, 8))
            self.truth[f"cn-{i}"] = host_doc(f"host{i}", vcpus=vcpus, memory_mb=vcpus * 2048,
                                             disk_gb=100, cpu_ratio=1.0)
        hosts = sorted(self.truth)
        self.reporters = [Reporter(self, f"rep-{r}", hosts[r::p.reporters])
                          for r in range(p.reporters)]
        self.reporters = [r for r in self.reporters if r.hosts]
        self.serving = {h: r for r in self.reporters for h in r.hosts}
        self.schedulers = [Scheduler(self, f"sch-{s}") for s in range(p.schedulers)]
        self.parties = ([BROKER] + [r.name for r in self.reporters]
                        + [s.name for s in self.schedulers])
        # the network
        #: (body, publish time on its publisher's wall clock), as the kombu stream's shm-ts
        self.stream: list[tuple[bytes, float]] = []
        self.stream_first = 0  # offset of stream[0]
        self.in_flight: list[tuple[float, int, str, bytes]] = []  # (due, n, to, body)
        self._sent = 0
        self.partitions: dict[frozenset[str], float] = {}  # pair -> healed at
        self.down_until: dict[str, float] = {}
        self.checker = Checker(self)
        self._requests = 0

    # -- helpers --------------------------------------------------------------------------

    def new_clock(self) -> PartyClock:
        skew = self.profile.skew
        return PartyClock(self.rng.uniform(0, 1000), 1.0 + self.rng.uniform(-skew, skew))

    def parted(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.partitions

    def cast(self, sender: str, to: str, body: bytes) -> None:
        """A control-plane cast: at most once, late, duplicated or reordered."""
        p, rng = self.profile, self.rng
        if self.faulty:
            if (self.parted(sender, to) or self.parted(sender, BROKER) or self.parted(to, BROKER)
                    or rng.random() < p.drop):
                return
        copies = 2 if self.faulty and rng.random() < p.duplicate else 1
        for _ in range(copies):
            delay = rng.uniform(0.002, 0.03)
            if self.faulty and rng.random() < p.delay:
                delay += rng.uniform(0.1, 2.0)
            self._sent += 1
            self.in_flight.append((self.now + delay, self._sent, to, body))

    def publish(self, reporter: Reporter, body: bytes) -> None:
        p, rng = self.profile, self.rng
        if self.faulty and (self.parted(reporter.name, BROKER) or rng.random() < p.stream_drop):
            return  # the publish failed for good (design §7.1: a gap at the next heartbeat)
        entry = (body, reporter.wall_offset + self.now)
        self.stream.append(entry)
        if self.faulty and rng.random() < p.stream_duplicate:
            self.stream.append(entry)  # a publish retry stored twice
        if self.faulty and len(self.stream) >= 2 and rng.random() < p.stream_reorder:
            self.stream[-1], self.stream[-2] = self.stream[-2], self.stream[-1]

    def _guard(self, who: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # invariant 6: nothing escapes a party's step
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            self.checker.violate("no_crash", f"{who}: {type(exc).__name__}: {exc} "
                                             f"({os.path.basename(tb.filename)}:{tb.lineno})")
            return None

    # -- the schedule's actions --------------------------------------------------------------

    def _actions(self) -> None:
        p, rng, now = self.profile, self.rng, self.now
        for party, until in sorted(self.down_until.items()):
            if until <= now:
                del self.down_until[party]
                self._restart(party)
        for pair, until in sorted(self.partitions.items(), key=lambda kv: sorted(kv[0])):
            if until <= now:
                del self.partitions[pair]
        if not self.faulty:
            return
        up_reporters = [r for r in self.reporters if r.up]
        if up_reporters and rng.random() < p.change:
            self._change(rng.choice(up_reporters))
        if up_reporters and rng.random() < p.release:
            self._release(rng.choice(up_reporters))
        if rng.random() < p.request:
            self._requests_burst(1 if rng.random() >= p.burst * 10 else rng.randint(3, 12))
        for r in self.reporters:
            if r.up and rng.random() < p.reporter_crash:
                r.crash()
                self.down_until[r.name] = now + rng.uniform(0.1, 3.0)
        for s in self.schedulers:
            if s.up and rng.random() < p.scheduler_crash:
                self._crash_scheduler(s)
        if rng.random() < p.partition:
            a, b = rng.sample(self.parties, 2)
            self.partitions[frozenset((a, b))] = now + rng.uniform(0.2, 4.0)
        if self.stream and rng.random() < p.retention:
            drop = rng.randint(1, len(self.stream))
            del self.stream[:drop]
            self.stream_first += drop
        if rng.random() < p.control_loss:
            self.in_flight.clear()
        if rng.random() < p.garbage:
            self._garbage()

    def _change(self, r: Reporter) -> None:
        """A tracker change on one host: load, a stat, aggregates, a disabled service."""
        rng, host = self.rng, self.rng.choice(r.hosts)
        local = r.local(self.now)
        what = rng.random()
        ops: list[Op]
        if what < 0.5:
            ops = [[SET, COMPUTE, "num_io_ops", rng.randint(0, 5)]]
        elif what < 0.8:
            ops = [[SET, "stats", f"k{rng.randint(0, 3)}", rng.randint(0, 9)]]
        elif what < 0.95:
            ops = ([[SET, "aggregates", "agg", {"name": "a", "metadata": {"x": str(rng.randint(0, 2))}}]]
                   if rng.random() < 0.5 else [[DROP, "aggregates"]])
        else:
            ops = [[SET, "service", "disabled", rng.random() < 0.5]]
        self._guard(r.name, lambda: r.manager.change(host, ops, local))

    def _release(self, r: Reporter) -> None:
        host = self.rng.choice(r.hosts)
        instances = sorted(r.manager.machines[host].document.get(INSTANCES, {}))
        if instances:
            inst = self.rng.choice(instances)
            self._guard(r.name, lambda: r.manager.release(host, inst, r.local(self.now)))

    def _requests_burst(self, n: int) -> None:
        up = [s for s in self.schedulers if s.up]
        for _ in range(n):
            if not up:
                return
            s = self.rng.choice(up)
            self._requests += 1
            vcpus = self.rng.choice((1, 1, 2, 4))
            spec = RequestSpec(flavor=Flavor(vcpus=vcpus, memory_mb=vcpus * 1024, root_gb=10),
                               instance_uuids=[f"vm-{self.schedule}-{self._requests}-{i}"
                                               for i in range(self.rng.choice((1, 1, 1, 2)))],
                               request_id=f"r{self._requests}")

            def submit(s: Scheduler = s, spec: RequestSpec = spec) -> None:
                assert s.cache is not None and s.tracker is not None
                with s.cache.lock:
                    try:
                        s.send_claims(s.tracker.submit(spec, s.local(self.now)).claims)
                    except NoValidHost:
                        pass
            self._guard(s.name, submit)

    def _crash_scheduler(self, s: Scheduler) -> None:
        rng = self.rng
        clean = rng.random() < 0.3
        self._guard(s.name, lambda: s.stop(clean))
        s.cache = s.engine = s.tracker = None
        if not clean and os.path.exists(s.state_path) and rng.random() < self.profile.damage * 0.3:
            self._damage(s.state_path)
        self.down_until[s.name] = self.now + rng.uniform(0.1, 3.0)

    def _damage(self, path: str) -> None:
        """A torn or corrupted state file (a filesystem that reordered, a bad disk)."""
        with open(path, "rb") as f:
            data = bytearray(f.read())
        rng = self.rng
        if not data:
            return
        if rng.random() < 0.5:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        with open(path, "wb") as f:
            f.write(bytes(data))

    def _restart(self, party: str) -> None:
        for r in self.reporters:
            if r.name == party and not r.up:
                self._guard(party, lambda r=r: r.start(self.now))
        for s in self.schedulers:
            if s.name == party and not s.up:
                self._guard(party, lambda s=s: s.start(self.now))

    def _garbage(self) -> None:
        """Bad input on either plane: random bytes, or a real message cut or bit-flipped.

        Only bytes the receiving side's decoder refuses are sent: a mutation that still
        decodes is a different valid message (with signing off, anyone may publish one),
        an attack rather than a fault, which invariant 6 does not cover.
        """
        rng = self.rng
        data = bytearray(rng.choice(self.stream)[0]) if self.stream and rng.random() < 0.7 else None
        if data:
            if rng.random() < 0.5:
                data = data[:rng.randrange(len(data))]
            else:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = bytearray(rng.randbytes(rng.randint(0, 64)))
        body = bytes(data)
        decoder = self.schedulers[0].decoder
        try:
            decoder.decode(body)
            return
        except ProtocolError:
            pass
        except Exception as exc:
            self.checker.violate("no_crash", f"decoder: {type(exc).__name__}: {exc}")
            return
        if rng.random() < 0.5:
            self.stream.append((body, WALL_EPOCH + self.now))
        else:
            target = rng.choice([r.name for r in self.reporters] + [s.name for s in self.schedulers])
            self.in_flight.append((self.now, 0, target, body))

    # -- the machinery of one step ------------------------------------------------------------

    def _deliver(self) -> None:
        due = [m for m in self.in_flight if m[0] <= self.now]
        if not due:
            return
        self.in_flight = [m for m in self.in_flight if m[0] > self.now]
        due.sort()
        for _, _, to, body in due:
            self._deliver_one(to, body)

    def _deliver_one(self, to: str, body: bytes) -> None:
        for r in self.reporters:
            if r.name == to:
                if r.up:
                    self._guard(r.name, r.handle, body)
                return
        for s in self.schedulers:
            if s.name == to:
                if s.cache is not None:
                    self.checker.control(s, body)
                return

    def _poll_reporters(self) -> None:
        for r in self.reporters:
            if not r.up:
                continue
            manager = r.manager
            local = r.local(self.now)
            due = manager.next_deadline()
            if due is None or due > local:
                continue
            out = self._guard(r.name, manager.poll, local)
            if out is None:
                continue
            batches, control = out
            for batch in batches:
                self.checker.published(batch.items)
                body = r.encoder.encode(batch)
                self.publish(r, body)
                if r.recorder is not None:
                    r.recorder.published(body, local)
            for send in control:
                msg = send.message
                if type(msg) is ClaimResult:
                    self.checker.verdict(msg)
                    self.checker.published(msg.correction)
                else:
                    self.checker.published(getattr(msg, "items", []))
                assert send.to is not None
                self.cast(r.name, send.to, r.encoder.encode(msg))
                if r.recorder is not None:
                    r.recorder.sent(send.to, msg, local)

    def _read_stream(self) -> None:
        for s in self.schedulers:
            cache = s.cache
            if cache is None:
                continue
            if self.faulty and self.parted(s.name, BROKER):
                s.parted_from_broker = True
                continue
            if s.parted_from_broker:  # reconnected: what it missed is its backlog
                s.parted_from_broker = False
                s.backlog_end = self.stream_first + len(self.stream) - 1
            if s.cursor < self.stream_first:
                # retention dropped what this consumer had not read (design §4.4)
                s.cursor = self.stream_first
                self._guard(s.name, cache.resync_all)
            end = self.stream_first + len(self.stream)
            n = min(end - s.cursor, self.profile.read_rate if self.faulty else 1 << 30)
            if n <= 0:
                continue
            start = s.cursor - self.stream_first
            batch = [(body, offset, published if offset <= s.backlog_end else None)
                     for offset, (body, published)
                     in enumerate(self.stream[start:start + n], s.cursor)]
            s.cursor += n
            self._guard(s.name, cache.ingest_stream_batch, batch)

    def _tick_schedulers(self) -> None:
        for s in self.schedulers:
            cache = s.cache
            if cache is None:
                continue
            self._guard(s.name, cache.tick)
            if cache is s.cache and s.local(self.now) >= s.next_save:
                s.next_save = s.local(self.now) + SNAPSHOT_INTERVAL
                self._guard(s.name, cache.save, s.state_path)

    def _one_step(self) -> None:
        self._actions()
        self._deliver()
        self._poll_reporters()
        self._read_stream()
        self._tick_schedulers()
        self.checker.after_step()
        self.step += 1
        self.now = round(self.step * STEP, 6)

    # -- the schedule ---------------------------------------------------------------------------

    def run(self) -> list[Violation]:
        p = self.profile
        for r in self.reporters:
            self._guard(r.name, lambda r=r: r.start(self.now))
        for s in self.schedulers:
            self._guard(s.name, lambda s=s: s.start(self.now))
        while self.now < p.fault_time and not self.violations:
            self._one_step()
        # faults stop: partitions heal, crashed parties restart, the network stops losing
        self.faulty = False
        self.partitions.clear()
        for party in sorted(self.down_until):
            self._restart(party)
        self.down_until.clear()
        self.in_flight = [(min(due, self.now + 0.03), n, to, body)
                          for due, n, to, body in self.in_flight]
        end_of_faults = self.now
        while self.now < end_of_faults + CONVERGENCE_BOUND and not self.violations:
            self._one_step()
        if not self.violations:
            self.checker.converged()
        settle = end_of_faults + CONVERGENCE_BOUND + 2 * RECEIVER["claim_deadline"] + 1.0
        while self.now < settle and not self.violations:
            self._one_step()
        if not self.violations:
            self.checker.resolved()
        for s in self.schedulers:
            if s.up:
                self._guard(s.name, lambda s=s: s.stop(clean=True))
        for r in self.reporters:
            if r.recorder is not None:
                r.recorder.close()
        if self.record_dir is not None and not self.violations:
            self.checker.replayed()
        return self.violations


# -- the invariants --------------------------------------------------------------------------------

@dataclass
class _Published:
    """Every version each source published: its digest, and when."""

    docs: dict[tuple[str, int], Document] = field(default_factory=dict)
    digests: dict[tuple[str, int, int], bytes] = field(default_factory=dict)
    times: dict[str, list[tuple[float, tuple[int, int]]]] = field(default_factory=dict)


class Checker:
    """The design's invariants (design §6), checked against an independent record of the truth.

    The truth is rebuilt from what the reporters publish (every snapshot and delta, before
    the network may lose it), never read from a receiver: a source's document at each
    version it published, and the arbiter's verdict on each claim id.
    """

    def __init__(self, world: FaultWorld) -> None:
        self.world = world
        self.pub = _Published()
        self.verdicts: dict[str, bool] = {}
        self._exact_checked: dict[tuple[str, str], tuple[int, int]] = {}
        self._usage_checked: dict[str, tuple[int, int, bool]] = {}

    def violate(self, invariant: str, detail: str) -> None:
        w = self.world
        w.violations.append(Violation(w.seed, w.schedule, w.step, w.now, invariant, detail))

    # -- the truth ---------------------------------------------------------------------

    def published(self, items: list[Any]) -> None:
        pub = self.pub
        for item in items:
            t = type(item)
            if t is Snapshot:
                key = (item.source, item.epoch, item.seq)
                if key in pub.digests:
                    continue
                doc = copy_document(item.doc)
                pub.docs[(item.source, item.epoch)] = doc
                pub.digests[key] = digest(doc)
                pub.times.setdefault(item.source, []).append((self.world.now, (item.epoch, item.seq)))
            elif t is Delta:
                key = (item.source, item.epoch, item.seq)
                if key in pub.digests:
                    continue
                prior = pub.docs.get((item.source, item.epoch))
                if prior is None or (item.source, item.epoch, item.seq - 1) not in pub.digests:
                    self.violate("view_exact", f"{item.source} published delta {item.epoch}:{item.seq} "
                                               "without its predecessor")
                    continue
                apply_ops(prior, item.ops)
                pub.digests[key] = digest(prior)
                pub.times.setdefault(item.source, []).append((self.world.now, (item.epoch, item.seq)))

    def verdict(self, result: ClaimResult) -> None:
        self.verdicts.setdefault(result.claim_id, result.accepted)

    # -- per step ------------------------------------------------------------------------

    def control(self, s: Scheduler, body: bytes) -> None:
        """Deliver a control message to a scheduler, checking what a rejection must do."""
        cache = s.cache
        assert cache is not None
        result: ClaimResult | None = None
        try:
            msg = s.decoder.decode(body)
            if type(msg) is ClaimResult and not msg.accepted:
                view = cache.receiver.sources.get(msg.source)
                if view is not None and msg.claim_id in view.pending:
                    result = msg
        except ProtocolError:
            pass
        self.world._guard(s.name, lambda: cache.ingest_control(body))
        if result is not None and s.cache is cache:
            view = cache.receiver.sources.get(result.source)
            if view is not None and view.version < (result.epoch, result.seq):
                self.violate("correction", f"{s.name} holds {result.source} at {view.epoch}:{view.seq} "
                                           f"after a rejection judged at {result.epoch}:{result.seq}")

    def outcomes(self, s: Scheduler, outcomes: list[tuple[str, str, Outcome]]) -> None:
        for claim_id, source, outcome in outcomes:
            if outcome is Outcome.ACCEPTED:
                continue
            seen = s.outcomes.setdefault(claim_id, [])
            seen.append(outcome)
            if len(seen) > 1:
                self.violate("claim_once", f"{s.name}: claim {claim_id} resolved {[o.value for o in seen]}")
            verdict = self.verdicts.get(claim_id)
            if outcome is Outcome.INCLUDED and verdict is not True:
                self.violate("claim_once", f"{s.name}: claim {claim_id} on {source} included, "
                                           f"but the arbiter's verdict was {verdict}")
            if outcome is Outcome.REJECTED and verdict is not False:
                self.violate("claim_once", f"{s.name}: claim {claim_id} on {source} rejected, "
                                           f"but the arbiter's verdict was {verdict}")

    def after_step(self) -> None:
        w = self.world
        for r in w.reporters:
            if not r.up:
                continue
            for host, machine in r.manager.machines.items():
                # usage changes only with a change or a claim, each published at once
                state = (machine.epoch, machine.seq, machine.has_pending)
                if self._usage_checked.get(host) == state:
                    continue
                self._usage_checked[host] = state
                over = overcommitted(machine.document.get(COMPUTE, {}))
                if over:
                    self.violate("no_overcommit", f"{host} overcommitted in {over}")
        for s in w.schedulers:
            if s.cache is None:
                continue
            for source, view in s.cache.receiver.sources.items():
                if view.doc is None:
                    continue
                version = view.version
                before = s.held.get(source)
                if before is not None and version < before:
                    self.violate("version_monotonic", f"{s.name}: {source} went from "
                                                      f"{before} back to {version}")
                s.held[source] = version
                key = (s.name, source)
                if self._exact_checked.get(key) != version:
                    self._exact_checked[key] = version
                    self._exact(s, source, view.doc, version)
                if not view.pending and not view.pending_usage:
                    continue
                usage: dict[str, int] = {}
                for claim_id, pending in view.pending.items():
                    if pending.claim.epoch != view.epoch:
                        self.violate("ledger", f"{s.name}: claim {claim_id} of epoch {pending.claim.epoch} "
                                               f"pending on {source} at epoch {view.epoch}")
                    for resource, amount in pending.claim.resources.items():
                        usage[resource] = usage.get(resource, 0) + amount
                if {k: v for k, v in usage.items() if v} != view.pending_usage:
                    self.violate("ledger", f"{s.name}: pending usage of {source} is {view.pending_usage}, "
                                           f"its pending claims sum to {usage}")

    def _exact(self, s: Scheduler, source: str, doc: Document, version: tuple[int, int]) -> None:
        expected = self.pub.digests.get((source, *version))
        if expected is None:
            self.violate("view_exact", f"{s.name} holds {source} at {version[0]}:{version[1]}, "
                                       "a version never published")
        elif digest(doc) != expected:
            self.violate("view_exact", f"{s.name} holds {source} at {version[0]}:{version[1]} "
                                       "with a document the source never had there")

    # -- at the end ------------------------------------------------------------------------

    def converged(self) -> None:
        w = self.world
        horizon = w.now - IN_FLIGHT
        for s in w.schedulers:
            if s.cache is None:
                self.violate("convergence", f"{s.name} is not running")
                continue
            for r in w.reporters:
                if not r.up:
                    continue
                for host in r.hosts:
                    published = [v for t, v in self.pub.times.get(host, []) if t <= horizon]
                    if not published:
                        continue
                    want = max(published)
                    view = s.cache.receiver.sources.get(host)
                    if view is None or view.doc is None:
                        self.violate("convergence", f"{s.name} holds nothing of {host} "
                                                    f"{CONVERGENCE_BOUND}s after the faults stopped")
                    elif view.version < want:
                        self.violate("convergence", f"{s.name} holds {host} at {view.epoch}:{view.seq}, "
                                                    f"source published {want[0]}:{want[1]}")
                    elif view.down:
                        self.violate("convergence", f"{s.name} sees {host} down")

    def resolved(self) -> None:
        for s in self.world.schedulers:
            if s.cache is None:
                continue
            left = s.cache.receiver.pending_claims()
            if left:
                self.violate("claim_once", f"{s.name}: {left} claims still pending at the end")
            for claim_id in sorted(s.claims):
                if len(s.outcomes.get(claim_id, [])) != 1:
                    self.violate("claim_once", f"{s.name}: claim {claim_id} resolved "
                                               f"{[o.value for o in s.outcomes.get(claim_id, [])]}")

    def replayed(self) -> None:
        from shared_host_manager.updatelog.reader import find_logs
        from shared_host_manager.updatelog.replay import replay
        w = self.world
        assert w.record_dir is not None
        for base, parts in sorted(find_logs(w.record_dir).items()):
            if not os.path.basename(base).startswith("scheduler-"):
                continue
            result = replay(parts)
            if not result.ok or result.damage is not None:
                problems = result.mismatches or result.effect_mismatches or result.decision_diffs
                first = problems[0] if problems else str(result.damage)
                self.violate("replay", f"{os.path.basename(base)}: {first}")


#: every this many schedules, each party records an update log and each scheduler's log is
#: replayed at the end (invariant 5); recording on every schedule would double the cost
REPLAY_EVERY = 50


def run_schedule(seed: int, schedule: int, directory: str, *,
                 planted: frozenset[PlantedBug] = frozenset(),
                 record_dir: str | None = None) -> list[Violation]:
    """Run schedule ``schedule`` of ``seed`` in ``directory`` (its state files, then removed)."""
    work = os.path.join(directory, f"s{schedule}")
    os.makedirs(work, exist_ok=True)
    if record_dir is None and schedule % REPLAY_EVERY == 0:
        record_dir = os.path.join(work, "logs")
    try:
        return FaultWorld(seed, schedule, work, planted=planted, record_dir=record_dir).run()
    finally:
        shutil.rmtree(work, ignore_errors=True)
