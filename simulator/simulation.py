"""One simulation run of one mode: a cloud of compute nodes, schedulers of one host-manager mode, and clients.

Life cycle of :func:`run_mode`::

    build the seeded cloud and workload (pre-filled to ``fill``)
      -> start the transport (in-process bus, or RabbitMQ), the reporters
         (each a real ReporterService serving ``hosts_per_reporter`` nodes,
         arbitrating every claim) and, for the database modes, the database
      -> start the schedulers of the mode and wait until they see every host
      -> ``clients`` closed-loop client threads issue the workload's requests,
         round robin over the schedulers, for ``duration`` seconds or
         ``requests`` requests; every server that boots is matched by the
         deletion of a random running one (steady occupancy)
         (meanwhile: a progress bar, and a sampler comparing every
          scheduler's view with the sources at the same instant)
      -> quiesce: clients stop, in-flight requests finish, background drift
         stops; wait for the views to converge
      -> measure, stop everything, return the figures.

All parties run in this process as threads (the GIL makes them share one
core's worth of Python, whatever the mode, so the modes compare fairly) --
except with ``processes`` (``shm sim --processes P``, shared mode over
RabbitMQ): the schedulers and their clients then run in P processes of their
own, as deployed (:mod:`simulator.processes`), and with ``reporter_processes``
the reporters too (:mod:`simulator.reporter_processes`), through the hooks
``_release``, ``_truth``, ``_published``, ``_published_versions``,
``_stop_drift``, ``_reporters_sent`` and ``_stop_reporters``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compute_reporter.service import ReporterService
from compute_reporter.tracker import SimulatedTracker
from protocol.document import Op, copy_document
from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine
from protocol.resources import capacity, free, overcommitted
from protocol.source import SourceMachine
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import DecisionEngine, NoValidHost
from shared_host_manager.updatelog.recorder import record_run
from simulator.cell_outage import CellOutage
from simulator.cell_outage import parse as parse_outage
from simulator.database import HostDatabase
from simulator.modes import DatabaseScheduler, ModeSettings, Outcome, SharedScheduler
from simulator.run_transport import RunTransport
from simulator.topology import build_cloud
from simulator.workload import Workload
from transport.rpcapi import peer_topic

NVH_ORACLE_CHECKS = 50
#: the share of a core the NoValidHost oracle may take (``--nvh-oracle-share``)
NVH_ORACLE_SHARE = 0.1


@dataclass
class RunShape:
    """What every simulator run is: which host managers, how big a cloud, how many schedulers
    and clients, for how long, from which seed (``shm sim``, with either scheduler)."""

    host_manager: str = "all"
    nodes: int = 1000
    schedulers: int = 2
    clients: int = 8
    duration: float = 20.0
    requests: int | None = None
    seed: int = 42
    fill: float = 0.8
    db_url: str | None = None
    hosts_per_reporter: int = 500
    progress: bool = True


@dataclass
class SimConfig(RunShape):
    transport: str = "fake"
    refresh_interval: float = 60.0
    drift_interval: float = 10.0
    heartbeat_interval: float = 10.0
    coalesce_window: float = 0.02
    host_subset_size: int | None = None
    host_subset_choice: str = "rendezvous"
    peer_ownership: bool = True
    #: shared mode: schedulers announce their claims to their live peers (design §5.2)
    announce_claims: bool = True
    #: shared mode: scarce requests go to the peers' coordinator ([filter_scheduler]
    #: scarce_coordinator, design §5.4)
    scarce_coordinator: bool = True
    #: shared mode: a request owning none of its best hosts goes to their owner
    #: ([filter_scheduler] hand_to_owner, design §5.4)
    hand_to_owner: bool = True
    #: shared mode: seconds a scheduler lets the hosts' latest changes reach it before a
    #: NoValidHost ([filter_scheduler] no_valid_host_catch_up; None: the coalescing window)
    nvh_catch_up: float | None = None
    #: directory for update logs of every party (shm replay reads them)
    record: str | None = None
    #: shared mode over RabbitMQ: run the schedulers in this many processes (None: in-process)
    processes: int | None = None
    #: with ``processes``: spread the hosts' reporters over this many processes (None: in the
    #: main process)
    reporter_processes: int | None = None
    #: shared mode: the hosts' reporters publish on this many cell streams, which every
    #: scheduler reads (design §4.6; 0: the one stream)
    cells: int = 0
    #: with ``cells`` over RabbitMQ: "CELL:START:SECONDS", that cell's broker away for SECONDS
    #: from START seconds into the run (simulator.cell_outage)
    cell_outage: str | None = None
    #: the NoValidHost oracle: at most this many checks per run, at most this share of a core
    nvh_checks: int = NVH_ORACLE_CHECKS
    nvh_oracle_share: float = NVH_ORACLE_SHARE


#: what check_config says when nova is not installed
MISSING_NOVA = "nova is not installed; pip install 'shared-host-manager[sim]'"


def nova_installed() -> bool:
    """Whether nova 34 can be imported (every engine decides with its classes)."""
    try:
        return importlib.util.find_spec("nova") is not None
    except ValueError:  # a module blocked in sys.modules (None) has no spec
        return False


def reporter_size(cfg: SimConfig) -> int:
    """Hosts per reporter: ``hosts_per_reporter``, fewer with cells, so that every cell has a
    reporter (reporter ``k`` is in cell ``k % cells``)."""
    if cfg.cells <= 0:
        return cfg.hosts_per_reporter
    return max(1, min(cfg.hosts_per_reporter, -(-cfg.nodes // cfg.cells)))


def check_config(cfg: SimConfig) -> None:
    """Refuse combinations that cannot run (ValueError, saying what to do instead)."""
    if cfg.nvh_checks < 0:
        raise ValueError("--nvh-checks must be 0 or more")
    if not 0.0 < cfg.nvh_oracle_share <= 1.0:
        raise ValueError("--nvh-oracle-share must be above 0 and at most 1 (a share of one core)")
    if cfg.nvh_catch_up is not None and cfg.nvh_catch_up < 0:
        raise ValueError("--nvh-catch-up must be 0 (off) or more seconds")
    if not nova_installed():
        # every mode decides with nova's filter and weigher classes ([filter_scheduler]
        # decision_core)
        raise ValueError(MISSING_NOVA)
    if cfg.cells < 0:
        raise ValueError("--cells must be 0 (one stream) or more")
    if cfg.cells and cfg.host_manager != "shared":
        raise ValueError("--cells applies to the shared host manager only (--host-manager "
                         "shared): legacy and caching read a database, not streams")
    if cfg.cell_outage is not None:
        parse_outage(cfg.cell_outage, cfg.cells)
        if not cfg.transport.startswith("rabbit://"):
            raise ValueError("--cell-outage needs --transport rabbit://...: the cell's broker "
                             "is the local RabbitMQ behind a relay the run stops")
    if cfg.record and cfg.processes is not None:
        raise ValueError("--record records in-process runs; drop --processes (or record each "
                         "scheduler process with [update_log] in its own configuration)")
    if cfg.processes is None:
        if cfg.reporter_processes is not None:
            raise ValueError("--reporter-processes needs --processes (and --transport "
                             "rabbit://...): the reporters leave the main process only beside "
                             "the schedulers")
        return
    if cfg.processes < 1:
        raise ValueError("--processes must be at least 1")
    if not cfg.transport.startswith("rabbit://"):
        raise ValueError("--processes needs --transport rabbit://user:pass@host:port/: scheduler "
                         "processes reach the reporters through the broker (the in-process bus "
                         "cannot cross processes)")
    if cfg.host_manager not in ("shared", "all"):
        raise ValueError("--processes applies to the shared host manager only "
                         "(--host-manager shared, or all: legacy and caching then run in-process)")
    if cfg.processes > cfg.schedulers:
        raise ValueError(f"--processes {cfg.processes} exceeds --schedulers {cfg.schedulers}: "
                         "each process runs at least one scheduler")
    if cfg.reporter_processes is None:
        return
    if cfg.reporter_processes < 1:
        raise ValueError("--reporter-processes must be at least 1")
    if cfg.host_manager != "shared":
        raise ValueError("--reporter-processes applies to the shared host manager only "
                         "(--host-manager shared): legacy and caching write their database "
                         "from in-process reporters")
    if cfg.reporter_processes > cfg.nodes:
        raise ValueError(f"--reporter-processes {cfg.reporter_processes} exceeds --nodes "
                         f"{cfg.nodes}: each reporter process serves at least one host")


@dataclass
class Metrics:
    decision_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    requests: int = 0
    scheduled: int = 0
    failed: int = 0
    timed_out: int = 0
    claims: int = 0
    rejected: int = 0
    instances: int = 0
    no_valid_host: int = 0
    nvh_checked: int = 0
    nvh_wrong: int = 0
    #: of nvh_wrong: the host's fitting state had not reached the scheduler (None: unknown)
    nvh_wrong_in_flight: int | None = 0
    nvh_inconclusive: int = 0
    staleness_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(values: list[float], q: float) -> float | None:
    """The q-quantile of seconds, in milliseconds (None without values)."""
    p = _pct(values, q)
    return None if p is None else round(1000 * p, 3)


def request_figures(requests: int, scheduled: int, elapsed: float, decision_s: list[float],
                    e2e_s: list[float], claims: int, rejected: int) -> dict[str, Any]:
    """The figures every run reports alike, whatever decides: throughput, latency, claims."""
    return {
        "requests": requests,
        "scheduled": scheduled,
        "elapsed_s": round(elapsed, 3),
        "scheduled_per_s": round(scheduled / elapsed, 2) if elapsed else 0.0,
        "decision_ms_p50": ms(decision_s, 0.50),
        "decision_ms_p99": ms(decision_s, 0.99),
        "e2e_ms_p50": ms(e2e_s, 0.50),
        "e2e_ms_p99": ms(e2e_s, 0.99),
        "claims": claims,
        "claims_rejected": rejected,
        "claims_rejected_pct": round(100.0 * rejected / claims, 3) if claims else 0.0,
        "retries_per_request": round(rejected / requests, 4) if requests else 0.0,
    }


class _Progress:
    """A progress bar on a terminal; a line every few seconds otherwise (logs, CI)."""

    def __init__(self, label: str, total_s: float | None, total_n: int | None, enabled: bool) -> None:
        self.label, self.total_s, self.total_n = label, total_s, total_n
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = time.monotonic()
        self._last_line = self.start

    def show(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty:
            if now - self._last_line >= 5.0:
                self._last_line = now
                elapsed = now - self.start
                sys.stderr.write(f"{self.label}: {elapsed:.0f}s, {done} requests\n")
            return
        elapsed = now - self.start
        frac = done / self.total_n if self.total_n else elapsed / (self.total_s or 1)
        frac = max(0.0, min(1.0, frac))
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        rate = done / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(f"\r{self.label:8} [{bar}] {elapsed:5.1f}s {done:7d} requests "
                         f"{rate:8.1f}/s")
        sys.stderr.flush()

    def end(self, done: int) -> None:
        if self.enabled and self.tty:
            self.show(done)
            sys.stderr.write("\n")


class _NoValidHostChecker:
    """Runs the NoValidHost oracle in a thread of its own, at a bounded share of the CPU.

    Each check rebuilds the true state of every host (expensive at 10 000
    nodes), so clients only offer their refused requests; one check runs at a
    time, at most ``checks`` per run (``--nvh-checks``), and after a check taking
    t seconds the next waits t(1 - share)/share: at the default share (a tenth)
    the oracle costs at most a tenth of a core.  Offers made while it is busy
    are not checked.  An accepted offer snapshots the versions the deciding
    scheduler holds (``held``, a dict copy under its lock, once per check), so a
    wrong verdict can tell a state still in flight to it from one it held.
    """

    def __init__(self, check: Callable[[Any, float, Mapping[str, tuple[int, int]] | None], None],
                 checks: int = NVH_ORACLE_CHECKS, share: float = NVH_ORACLE_SHARE) -> None:
        self._check = check
        self._checks = checks
        self._wait = (1.0 - share) / share
        self._slot: tuple[Any, float, Mapping[str, tuple[int, int]] | None] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._not_before = 0.0
        self.done = 0
        self._thread = threading.Thread(target=self._run, name="nvh-oracle", daemon=True)
        self._thread.start()

    def offer(self, spec: Any, decided_at: float,
              held: Callable[[], Mapping[str, tuple[int, int]]] | None = None) -> None:
        with self._cond:
            if (self._slot is None and self.done < self._checks
                    and time.monotonic() >= self._not_before):
                self._slot = (spec, decided_at, held() if held is not None else None)
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._slot is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                slot = self._slot
                assert slot is not None  # the wait ends with a slot, or closed
                spec, decided_at, held = slot
            start = time.monotonic()
            try:
                self._check(spec, decided_at, held)
            finally:
                with self._cond:
                    self.done += 1
                    self._slot = None
                    self._not_before = time.monotonic() + self._wait * (time.monotonic() - start)

    def close(self) -> None:
        """Finish the check under way (its verdict counts) and stop."""
        with self._cond:
            self._closed = self._slot is None
            self._cond.notify()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self._cond:
                if self._slot is None:
                    self._closed = True
                    self._cond.notify()
                    break
            time.sleep(0.01)
        self._thread.join(timeout=30)


def drive_clients(client: Callable[[int, threading.Event], None], clients: int,
                  duration: float | None, progress: _Progress, done: Callable[[], int]) -> float:
    """Run ``clients`` client threads (``client(index, stop)``) until they end (a request
    budget) or ``duration`` seconds pass (then ``stop`` is set), showing ``done()`` as
    progress; returns the seconds they ran."""
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(i, stop), daemon=True, name=f"client-{i}")
               for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    deadline = None if duration is None else start + duration
    while any(t.is_alive() for t in threads):
        if deadline is not None and time.monotonic() >= deadline:
            stop.set()
        progress.show(done())
        time.sleep(0.25)
    elapsed = time.monotonic() - start
    progress.end(done())
    return elapsed


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> bool:
    """Poll ``predicate`` every 50 ms for up to ``timeout`` s; warn on stderr when it never held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    print(f"warning: gave up waiting for {what} after {timeout:.0f}s", file=sys.stderr)
    return False


class Simulation:
    """Everything one mode's run needs; see the module docstring."""

    def __init__(self, cfg: SimConfig, mode: str) -> None:
        self.cfg = cfg
        self.mode = mode
        self.cloud = build_cloud(cfg.nodes, cfg.seed)
        self.workload = Workload(cfg.seed)
        self.prefilled = self.workload.prefill(self.cloud.documents, cfg.fill)
        self.metrics = Metrics()
        self._workload_lock = threading.Lock()
        self._first_change: dict[tuple[str, int, int], float] = {}
        self.db: HostDatabase | None = None
        self.reporters: list[ReporterService] = []
        self.reporter_of: dict[str, ReporterService] = {}
        self.schedulers: list[Any] = []
        self.client_errors: list[str] = []
        self.recording: Any = None
        self.clock = time.monotonic
        self._nvh_checker = _NoValidHostChecker(self._check_no_valid_host, cfg.nvh_checks,
                                                cfg.nvh_oracle_share)
        #: --cell-outage: one cell's broker away during the run (shared mode only)
        self.outage = CellOutage(cfg.cell_outage, cfg.cells, 3 * cfg.heartbeat_interval) \
            if cfg.cell_outage is not None and mode == "shared" else None

    # -- set-up -----------------------------------------------------------------

    def _scheduler_config(self) -> SchedulerConfig:
        catch_up = self.cfg.nvh_catch_up
        changes: dict[str, Any] = {
            "host_subset_choice": self.cfg.host_subset_choice,
            "scarce_coordinator": self.cfg.scarce_coordinator,
            "hand_to_owner": self.cfg.hand_to_owner,
            "no_valid_host_catch_up": self.cfg.coalesce_window if catch_up is None else catch_up}
        if self.cfg.host_subset_size is not None:
            changes["host_subset_size_min"] = changes["host_subset_size_max"] = self.cfg.host_subset_size
        return dataclasses.replace(SchedulerConfig(), **changes)

    def _on_change(self, machine: SourceMachine, ops: list[Op]) -> None:
        # called under the reporter's lock, at the source, for every change
        key = (machine.source, machine.epoch, machine.seq + 1)
        if key not in self._first_change:
            self._first_change[key] = self.clock()
        if self.db is not None:
            self.db.write(machine.source, machine.epoch, machine.seq + 1, machine.document, ops)

    def start(self) -> None:
        self._start_reporters()
        self._start_schedulers()

    def _start_reporters(self) -> None:
        """The transport, the reporters (arbitrating from now on) and, for the database modes,
        the database."""
        cfg = self.cfg
        self.transport = RunTransport(cfg.transport if self.mode == "shared" else "fake",
                                      cells=cfg.cells if self.mode == "shared" else 0,
                                      relay_cell=self.outage.cell if self.outage else None)
        if self.outage is not None:
            self.outage.relay = self.transport.relay
        rtopic, stopic = self.transport.topics
        sources = sorted(self.cloud.documents)
        per = reporter_size(cfg)
        for i in range(0, len(sources), per):
            docs = {s: self.cloud.documents[s] for s in sources[i:i + per]}
            tracker = SimulatedTracker(0, seed=cfg.seed + i, documents=docs,
                                       change_interval=cfg.drift_interval, delete_probability=0)
            reporter = ReporterService(
                f"reporter-{i // per}", tracker, self.transport.reporter_plane(i // per),
                self.transport.control, reporter_topic=rtopic, scheduler_topic=stopic,
                heartbeat_interval=cfg.heartbeat_interval, coalesce_window=cfg.coalesce_window)
            self.reporters.append(reporter)
            self.transport.queues.append(f"{rtopic}.{reporter.name}")
            self.note_cell(i // per, docs)
            for s in docs:
                self.reporter_of[s] = reporter
        if self.mode != "shared":
            self.db = HostDatabase(cfg.db_url or f"sqlite:///{_tempdb()}")
        if cfg.record:

            self.recording = record_run(os.path.join(cfg.record, self.mode))
            for reporter in self.reporters:
                self.recording.attach(reporter)
        for reporter in self.reporters:
            reporter.start()
        # Load the database and start writing every change to it at one instant for each
        # host, under every reporter's lock: with changes flowing in between, a host whose
        # change came after its state was read but before its row existed kept the old row.
        with contextlib.ExitStack() as held:
            for reporter in self.reporters:
                held.enter_context(reporter.manager._lock)
            if self.db is not None:
                self.db.reset({s: truth for reporter in self.reporters
                               for s, truth in _reporter_truth(reporter).items()})
            for reporter in self.reporters:
                for machine in reporter.manager.machines.values():
                    machine.on_change = self._on_change

    def _mode_settings(self) -> list[ModeSettings]:
        """Each of the ``cfg.schedulers`` schedulers' settings (their queues are the run's)."""
        cfg = self.cfg
        rtopic, stopic = self.transport.topics
        settings = [ModeSettings(f"{self.mode}-{i}", stopic, rtopic, cfg.schedulers, cfg.seed,
                                 self._scheduler_config(), down_interval=3 * cfg.heartbeat_interval,
                                 refresh_interval=cfg.refresh_interval,
                                 announce_claims=cfg.announce_claims)
                    for i in range(cfg.schedulers)]
        self.transport.queues.extend(f"{topic}.{s.name}" for s in settings
                                     for topic in (stopic, peer_topic(stopic)))
        self.transport.queues.append(peer_topic(stopic))
        return settings

    def _start_schedulers(self) -> None:
        """The mode's schedulers, started; shared: once each holds every host."""
        cfg = self.cfg
        sources = sorted(self.cloud.documents)
        endpoints = {s: r.name for s, r in self.reporter_of.items()}
        for s in self._mode_settings():
            if self.mode == "shared":
                sched: Any = SharedScheduler(s, self.transport.data, self.transport.control,
                                             self.transport.cell_planes)
            else:
                refresh = None if self.mode == "legacy" else cfg.refresh_interval
                assert self.db is not None
                sched = DatabaseScheduler(s, self.transport.control, self.db, refresh, endpoints)
            self.schedulers.append(sched)
        if self.mode == "shared" and not cfg.peer_ownership:
            for sched in self.schedulers:
                sched.follow_membership = False  # each picks by host_subset_choice alone
        if self.recording is not None and self.mode == "shared":
            # the database modes keep no cache: only their reporters are recorded
            for sched in self.schedulers:
                self.recording.attach(sched.service)
                self.recording.attach(sched.engine)
        for sched in self.schedulers:
            sched.start()
        if self.mode == "shared":
            wait_until(lambda: all(len(s.versions()) >= len(sources) for s in self.schedulers),
                       120, "schedulers to see every host")
            # each learns its peers from their entries on the stream (design §2), as deployed
            wait_until(lambda: all(len(s.service.peers) == len(self.schedulers)
                                   for s in self.schedulers), 30, "schedulers to see each other")
            # and to have applied what was published until now (at 10 000 hosts the start-up
            # left a backlog of seconds, which the measured run then counted as staleness)
            published = self._published_versions()
            wait_until(lambda: all(_at_least(s.versions(), published) for s in self.schedulers),
                       120, "schedulers to catch up with the stream")
            # build each scheduler's index now, not inside the first measured decision
            for sched in self.schedulers:
                with sched.lock:
                    sched.engine.index.sync()

    def note_cell(self, k: int, sources: Iterable[str]) -> None:
        """Reporter ``k`` serves ``sources``: the outage's hosts, if it is in its cell."""
        if self.outage is not None and self.transport.reporter_cell(k) == self.outage.cell:
            self.outage.sources.update(sources)

    def _published_versions(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                out.update((s, m.version) for s, m in reporter.manager.machines.items())
        return out

    def _truth(self) -> dict[str, tuple[int, int, dict]]:
        """Every source's authoritative (epoch, seq, document), read under its reporter's lock."""
        out = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                out.update(_reporter_truth(reporter))
        return out

    # -- the run ---------------------------------------------------------------------

    def _client(self, index: int, stop: threading.Event) -> None:
        try:
            self._client_loop(index, stop)
        except Exception as exc:  # a broken client must show, not silently shrink the load
            self.client_errors.append(f"client {index}: {type(exc).__name__}: {exc}")
            stop.set()

    def _client_loop(self, index: int, stop: threading.Event) -> None:
        sched = self.schedulers[index % len(self.schedulers)]
        while not stop.is_set():
            spec = self._next_request()
            if spec is None:
                return
            start = time.perf_counter()
            decided_at = self.clock()
            outcome: Outcome = sched.schedule(spec)
            e2e = time.perf_counter() - start
            # a request handed over (to the coordinator, or an owner) was decided on its view
            decider = sched if not outcome.decided_by else next(
                (s for s in self.schedulers if s.name == outcome.decided_by), sched)
            self.record_outcome(spec, outcome, e2e, decided_at, decider.versions)

    def _next_request(self) -> Any:
        """The workload's next request, made now (its group members are those booted so far);
        None once ``cfg.requests`` have been issued."""
        with self._workload_lock:
            if self.cfg.requests is not None and self.workload.issued >= self.cfg.requests:
                return None
            return self.workload.next_request()

    def record_outcome(self, spec: Any, outcome: Outcome, e2e: float, decided_at: float,
                       held: Callable[[], Mapping[str, tuple[int, int]]] | None = None) -> None:
        """A request's outcome: offered to the NoValidHost oracle, counted, then the churn.

        ``held`` reads the versions the deciding scheduler holds (None: not at hand)."""
        m = self.metrics
        if outcome.failed:
            self._nvh_checker.offer(spec, decided_at, held)
        with m.lock:
            m.requests += 1
            m.decision_s.append(outcome.decision_s)
            m.e2e_s.append(e2e)
            m.claims += outcome.claims
            m.rejected += outcome.rejected
            m.instances += len(spec.instance_uuids)
            m.timed_out += outcome.timed_out
            if outcome.failed:
                m.failed += 1
                m.no_valid_host += len(outcome.failed)
            elif not outcome.timed_out:
                m.scheduled += 1
        if outcome.placed:
            if self.outage is not None:
                self.outage.placed(list(outcome.placed.values()))
            self._churn(spec, outcome.placed)

    def _churn(self, spec: Any, placed: dict[str, str]) -> None:
        with self._workload_lock:
            self.workload.booted(spec, placed)
            deletions = [d for d in (self.workload.pick_deletion() for _ in placed) if d]
        for instance, source in deletions:
            self._release(source, instance)

    def _release(self, source: str, instance: str) -> None:
        """Delete ``instance`` from ``source``, at the reporter that owns the host."""
        self.reporter_of[source].manager.release(source, instance, self.clock())
        self.reporter_of[source].wake()

    def _check_no_valid_host(self, spec: Any, decided_at: float,
                             held: Mapping[str, tuple[int, int]] | None = None) -> None:
        """Was this NoValidHost wrong: did the request fit the sources' true state?

        The oracle places every instance of the request on the sources' state
        now.  If it finds hosts whose state has not changed since the decision
        began, that capacity existed when the scheduler said there was none:
        wrong.  If the hosts it finds changed since (a deletion freed them),
        the verdict is inconclusive and counted apart.  A wrong verdict is also
        counted *in flight* when the scheduler, even after deciding (``held``
        is read then), did not hold that state of one of those hosts: its delta
        was still on its way, so no view of it could have had the capacity.
        """
        m = self.metrics
        with m.lock:
            m.nvh_checked += 1
            if held is None:
                m.nvh_wrong_in_flight = None  # a figure over only some checks would mislead
        oracle = ReceiverMachine("oracle", down_interval=3600.0)
        now = self.clock()
        truth = self._truth()
        for s, (e, q, doc) in truth.items():
            oracle.receive(Snapshot(s, e, q, doc), now)
        engine = DecisionEngine(oracle, config=self._scheduler_config())
        try:
            # every instance of the request, as the scheduler would have placed them
            selections = engine.select_destinations(spec, now, return_alternates=False).rows
        except NoValidHost:
            return
        changed = any(self._first_change.get((row[0].source, *truth[row[0].source][:2]), 0.0)
                      > decided_at for row in selections)
        in_flight = held is not None and any(
            held.get(row[0].source, (-1, -1)) < truth[row[0].source][:2] for row in selections)
        with m.lock:
            if changed:
                m.nvh_inconclusive += 1
                return
            m.nvh_wrong += 1
            if m.nvh_wrong_in_flight is not None and in_flight:
                m.nvh_wrong_in_flight += 1

    def _sample_staleness(self, stop: threading.Event) -> None:
        rng = random.Random(self.cfg.seed)
        sources = sorted(self.cloud.documents)
        while not stop.wait(0.1):
            sample = rng.sample(sources, min(20, len(sources)))
            now = self.clock()
            truth = {}
            for s in sample:
                manager = self.reporter_of[s].manager
                with manager._lock:
                    m = manager.machines[s]
                    truth[s] = (m.epoch, m.seq, m.has_pending)
            for sched in self.schedulers:
                views = sched.versions(sample)  # not all: at 10 000 hosts that held the lock for ms
                for s in sample:
                    epoch, seq, pending = truth[s]
                    held = views.get(s)
                    if held is None:
                        continue
                    if held[0] != epoch:
                        behind_since = self._first_change.get((s, epoch, 1), now)
                    elif held[1] < seq or (held[1] == seq and pending):
                        behind_since = self._first_change.get((s, epoch, held[1] + 1), now)
                    else:
                        behind_since = now
                    self.metrics.staleness_s.append(max(0.0, now - behind_since))

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        sampler_stop = threading.Event()
        progress = _Progress(self.mode, None if cfg.requests else cfg.duration, cfg.requests,
                             cfg.progress)
        sampler = threading.Thread(target=self._sample_staleness, args=(sampler_stop,), daemon=True)
        bus_before = self.transport.stats()
        db_before = self.db.statements if self.db else 0
        sampler.start()
        if self.outage is not None:
            self.outage.begin(self._published_versions, self._views)
        elapsed = drive_clients(self._client, cfg.clients, None if cfg.requests else cfg.duration,
                                progress, lambda: self.metrics.requests)
        sampler_stop.set()
        sampler.join()
        if self.outage is not None:
            self.outage.end()
        self._nvh_checker.close()
        if self.client_errors:
            raise RuntimeError("simulation clients failed: " + "; ".join(self.client_errors[:3]))
        bus_after = self.transport.stats()
        db_statements = (self.db.statements - db_before) if self.db else 0
        # quiesce: no more drift, let the views catch up
        self._stop_drift()
        converged = self._converged(timeout=2 * cfg.heartbeat_interval + 2)
        truth = self._truth()
        over = sum(1 for _, _, doc in truth.values() if overcommitted(doc.get("compute", {})))
        out = self._figures(elapsed, converged, over, bus_before, bus_after, db_statements)
        sums = self.quality_sums()
        out.update(placement_quality([doc for _, _, doc in truth.values()], sums))
        if self.mode == "shared":
            out["scarce_handed_over"] = int(sums.get("scarce_handed_over", 0))
            out["handed_to_owner"] = int(sums.get("handed_to_owner", 0))
            out["no_valid_host_catch_ups"] = int(sums.get("nvh_catch_ups", 0))
            out["no_valid_host_caught_up"] = int(sums.get("nvh_caught_up", 0))
            out["affinity_catch_ups"] = int(sums.get("affinity_catch_ups", 0))
            out["claims_rejected_by_choice"] = {
                key.removeprefix("rejected_"): int(n) for key, n in sorted(sums.items())
                if key.startswith("rejected_")}
        return out

    def _stop_drift(self) -> None:
        """Stop every host's background changes (the run is over)."""
        for reporter in self.reporters:
            reporter.tracker.stop()

    def quality_sums(self) -> dict[str, float]:
        """The schedulers' placement-quality sums (:func:`scheduler_sums`), added up."""
        sums: dict[str, float] = {}
        if self.mode != "shared":
            return sums  # the database modes' engines do not outlive a request or a refresh
        for sched in self.schedulers:
            for key, value in scheduler_sums(sched).items():
                sums[key] = sums.get(key, 0.0) + value
        return sums

    def _converged(self, timeout: float) -> bool:
        if self.mode == "shared":
            def same() -> bool:
                truth = self._published()
                return truth is not None and all(
                    all(views.get(s) == held for s, held in truth.items()) for views in self._views())
            return wait_until(same, timeout, "the shared views to converge")
        # database modes: the database must hold every source's state, and each
        # scheduler's view must be what it read from it
        db = self.db
        assert db is not None  # the database modes open it with their reporters
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            truth = self._truth()
            rows = {s: (e, q) for s, e, q, _ in db.read_hosts()}
            if all(rows.get(s) == (e, q) for s, (e, q, _) in truth.items()):
                break
            time.sleep(0.1)
        else:
            return False
        if self.mode == "legacy":
            return True  # its next request reads exactly this
        versions = {s: (e, q) for s, (e, q, _) in self._truth().items()}
        return all(sched.versions() == versions for sched in self.schedulers)

    def _published(self) -> dict[str, tuple[tuple[int, int], bytes]] | None:
        """Every source's published (version, digest); None while any has unpublished changes."""
        truth = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                for s, m in reporter.manager.machines.items():
                    if m.has_pending:
                        return None
                    truth[s] = (m.version, m.published_digest())
        return truth

    def _views(self) -> list[dict[str, tuple[tuple[int, int], bytes | None]]]:
        """Every shared scheduler's view: source -> (version, digest)."""
        return [view_digests(sched) for sched in self.schedulers]

    def _figures(self, elapsed: float, converged: bool, over: int, bus_before: Any,
                 bus_after: Any, db_statements: int) -> dict[str, Any]:
        m = self.metrics

        retries = max(0, m.claims - (m.instances - m.no_valid_host)) if m.instances else 0
        out: dict[str, Any] = {
            **request_figures(m.requests, m.scheduled, elapsed, m.decision_s, m.e2e_s, m.claims,
                              m.rejected),
            # a mode that refuses most requests at once (NoValidHost) has few retries per
            # request but many per server it places: this one does not flatter it
            "retries_per_scheduled": round(m.rejected / m.scheduled, 4) if m.scheduled else None,
            "extra_claims": retries,
            "no_valid_host": m.no_valid_host,
            "no_valid_host_checked": m.nvh_checked,
            "no_valid_host_wrong": m.nvh_wrong,
            "no_valid_host_wrong_in_flight": m.nvh_wrong_in_flight,
            "no_valid_host_inconclusive": m.nvh_inconclusive,
            "timed_out": m.timed_out,
            "staleness_ms_p50": ms(m.staleness_s, 0.50),
            "staleness_ms_p99": ms(m.staleness_s, 0.99),
            "staleness_ms_max": round(1000 * max(m.staleness_s), 3) if m.staleness_s else None,
            "staleness_samples": len(m.staleness_s),
            "overcommitted_hosts": over,
            "server_group_violations": len(self.workload.violations),
            # which: (group uuid, policy, the host holding too many members or "split")
            "server_group_violation_details": sorted(
                [uuid, self.workload.policy_of(uuid), where]
                for uuid, where in self.workload.violations)[:20],
            "converged": converged,
            "cells": len(self.transport.cell_planes),
            **(self.outage.figures() if self.outage is not None else {}),
            "prefilled_instances": self.prefilled,
            "db_statements_per_s": round(db_statements / elapsed, 1) if self.db else 0.0,
        }
        if bus_before is not None and bus_after is not None:
            out["broker_messages_per_s"] = round((bus_after[0] - bus_before[0]) / elapsed, 1)
            out["broker_bytes_per_s"] = round((bus_after[1] - bus_before[1]) / elapsed, 1)
        else:
            published = self._reporters_sent()
            out["broker_messages_per_s"] = round(published / elapsed, 1)
            out["broker_bytes_per_s"] = None
        out["_staleness_s"] = m.staleness_s
        out["_decision_s"] = m.decision_s
        out["_e2e_s"] = m.e2e_s
        return out

    def _reporters_sent(self) -> int:
        """Messages the reporters have sent so far: batches published and answers cast."""
        return sum(r.stats["published"] + r.stats["casts"] for r in self.reporters)

    def _stop_reporters(self) -> None:
        """Stop the reporters (after the schedulers: their goodbyes go out last)."""
        for reporter in self.reporters:
            reporter.stop()

    def stop(self) -> None:
        for sched in self.schedulers:
            try:
                sched.stop()
            except Exception as exc:
                print(f"warning: stopping {sched.name}: {exc}", file=sys.stderr)
        self._stop_reporters()
        if self.recording is not None:
            self.recording.close()
            for (role, name), path in sorted(self.recording.logs().items()):
                print(f"update log of {role} {name}: {path}", file=sys.stderr)
        if self.db is not None:
            self.db.close()
        self.transport.close()


def scheduler_sums(sched: Any) -> dict[str, float]:
    """One shared scheduler's figures to add up over the run: its engine's placement-quality
    sums (DecisionEngine.quality), the requests it handed to the coordinator (scarce) or
    to the owner of their best hosts, its NoValidHosts decided again after catching up
    with the stream (and how many of those then claimed hosts), its affinity requests
    decided after catching up with their members, and its claims rejected by how their
    host was chosen (``rejected_<choice>``)."""
    rejected = {f"rejected_{choice}": float(n)
                for choice, n in sched.tracker.rejected_by_choice.items()}
    return {**sched.engine.quality, "scarce_handed_over": sched.scarce_stats["handed_over"],
            "handed_to_owner": sched.scarce_stats["handed_to_owner"],
            "nvh_catch_ups": sched.catch_ups, "nvh_caught_up": sched.caught_up_decided,
            "affinity_catch_ups": sched.affinity_catch_ups,
            **rejected}


def placement_quality(documents: list[dict], sums: dict[str, float]) -> dict[str, Any]:
    """How good the placements were, beside how many claims were rejected.

    ``free_ram_stdev_pct`` and ``free_disk_stdev_pct``: the standard deviation across hosts
    of the free fraction of usable RAM and disk at the end, in percentage points (the
    default weighers spread, so lower is better); ``weight_gap_mean``: per instance placed,
    how much less the chosen host weighed than the best one (0: always the best);
    ``chosen_rank_mean``: the chosen host's mean position in the ranking (0: the best).
    """
    out: dict[str, Any] = {}
    for resource, key in (("memory_mb", "free_ram_stdev_pct"), ("disk_gb", "free_disk_stdev_pct")):
        fractions = []
        for doc in documents:
            compute = doc.get("compute") or {}
            cap = capacity(compute, resource)
            if cap:
                fractions.append(100.0 * free(compute, resource) / cap)
        out[key] = round(statistics.pstdev(fractions), 3) if fractions else None
    picks = sums.get("picks", 0.0)
    out["weight_gap_mean"] = round(sums.get("weight_gap", 0.0) / picks, 4) if picks else None
    out["chosen_rank_mean"] = round(sums.get("rank", 0.0) / picks, 3) if picks else None
    return out


def _at_least(held: dict[str, tuple[int, int]], wanted: dict[str, tuple[int, int]]) -> bool:
    """Every wanted source held at that version or a later one."""
    return all(s in held and held[s] >= v for s, v in wanted.items())


def _reporter_truth(reporter: ReporterService) -> dict[str, tuple[int, int, dict]]:
    """Each of a reporter's hosts: (epoch, seq its pending changes will have, document).

    The caller holds the reporter's lock."""
    return {s: (m.epoch, m.seq + (1 if m.has_pending else 0), copy_document(m.document))
            for s, m in reporter.manager.machines.items()}


def _tempdb() -> str:
    fd, path = tempfile.mkstemp(prefix="shm-sim-", suffix=".sqlite")
    os.close(fd)
    return path


def view_digests(sched: Any) -> dict[str, tuple[tuple[int, int], bytes | None]]:
    """A shared scheduler's view of every source it has heard of: (version, digest)."""
    with sched.lock:
        return {s: (v.version, v.digest()) for s, v in sched.receiver.sources.items()}
