"""``shm sim --processes P``: the shared mode's schedulers in processes of their own, as deployed.

In a deployment every scheduler is a Python process of its own, reading the
RabbitMQ stream and casting claims over oslo.messaging.  With ``--processes
P`` (shared mode, ``--transport rabbit://...``) the simulator runs its M
schedulers that way: P child processes (spawned, not forked), scheduler ``i``
in process ``i % P``, each a real :class:`~simulator.modes.SharedScheduler`
(a :class:`~shared_host_manager.decision.manager.SchedulerManager`) with its own
stream consumer and RPC server.  The compute side stays in the main process:
the reporters arbitrating every claim, the seeded :class:`Workload`, the churn
(boots and the matching deletions) and every figure -- the reporters too move out
with ``--reporter-processes`` (:mod:`simulator.reporter_processes`, which builds on
the hooks here: :class:`ChildProcess`, ``_source_first_changes``, ``_children``).

Clients.  Client ``c`` uses scheduler ``c % M`` (as in-process) and runs as a
thread *inside that scheduler's process*, so decisions never cross a process
boundary: ``select_destinations`` is a local call, timed there.  The client
gets each request from the main process over a pipe of its own, made when it
asks for it (so a server group's members are those booted so far, exactly as
in-process; pre-generating the requests would freeze the members), and sends
back the outcome (placed instance -> host, failed, decision and end-to-end
seconds, claims, rejections, timeout) with the time its decision began.  The
main process records it with :meth:`Simulation.record_outcome` (metrics, NoValidHost
oracle, churn through the reporters), then answers with the next request, or
with None when the run is over.  One message each way per request.

Staleness.  Each child samples its own views like the in-process sampler (20
random sources per scheduler every 100 ms): it reads ``(epoch, seq)`` and the
time ``t`` *under the cache lock*, so the view held exactly that version at
``t``.  The main process records, at the source, the time of the first change
going into each next version, ``first_change[(source, epoch, seq)]``.  The view
was behind at ``t`` iff the change after the one it holds, ``(source, epoch,
seq + 1)``, had been made by ``t``; its staleness is then ``t - first_change``,
otherwise 0 -- the in-process sampler's definition, evaluated after the fact.
The samples are evaluated once the clients have stopped, so every change made
before any sample is already recorded.  The times are comparable because both
sides read ``time.monotonic``: CLOCK_MONOTONIC is one system-wide clock on
Linux, the same in every process of the machine.

Life cycle::

    main: reporters start (Simulation._start_reporters)
      -> spawn P children, each with its schedulers' settings, the run's
         stream/topic suffix, its clients' pipes and a control pipe
    child: join the run's transport (not its owner), start its schedulers,
           wait until each holds every host  -> "ready"
    main:  "versions" until every view has applied what was published before
           the question (a cold read of the stream can lag behind on a busy
           machine; the run must not count that warm-up as staleness)
    main run():  "go" -> child starts its client threads and its sampler
                 main thread per client: serve requests, record outcomes,
                 until the run ends (then answer None: the client exits)
                 "finish" -> child joins its clients, stops sampling -> "samples"
                 quiesce; "views" -> every local view's (version, digest),
                 compared with the sources' published ones until they agree
    main stop(): "stop" -> child stops its schedulers, closes its planes
                 -> "stopped", exits; main joins it (terminate/kill after a
                 grace period, so nothing outlives the run), then stops the
                 reporters and deletes the run's stream and queues.

A child whose main process disappears sees its pipes close and shuts down.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import random
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from simulator.modes import REQUEST_TIMEOUT, ModeSettings, SharedScheduler
from simulator.run_transport import RunTransport
from simulator.simulation import Simulation, scheduler_sums, view_digests, wait_until

#: seconds a child may take to start (interpreter, imports) and read every host
READY_TIMEOUT = 240.0
#: seconds a child may take to answer anything else, or to stop
ANSWER_TIMEOUT = REQUEST_TIMEOUT + 30.0
#: in-process sampler's cadence, repeated in every child
SAMPLE_EVERY, SAMPLE_SOURCES = 0.1, 20

Sample = tuple[str, int, int, float]  # source, epoch, seq held, sample time (CLOCK_MONOTONIC)


def staleness(samples: list[Sample], first_change: dict[tuple[str, int, int], float]) -> list[float]:
    """Seconds each sampled view was behind its source (see the module docstring)."""
    starts: dict[str, list[tuple[int, float]]] | None = None
    out = []
    for source, epoch, seq, t in samples:
        since = first_change.get((source, epoch, seq + 1))
        if since is None or since > t:
            # the view's epoch may be over (a source restart): behind since the
            # first change of a newer epoch, as the in-process sampler counts it
            if starts is None:
                starts = {}
                for (s, e, q), when in dict(first_change).items():
                    if q == 1:
                        starts.setdefault(s, []).append((e, when))
            newer = [when for e, when in starts.get(source, ()) if e > epoch and when <= t]
            since = min(newer) if newer else None
        out.append(t - since if since is not None else 0.0)
    return out


# -- the child process ---------------------------------------------------------------


class _Child:
    """One scheduler process: its schedulers, its clients, its sampler."""

    def __init__(self, index: int, run: dict[str, Any], settings: list[ModeSettings],
                 clients: list[tuple[int, int, Connection]], ctl: Connection) -> None:
        self.index = index
        self.run = run
        self.settings = settings
        self.clients = clients
        self.ctl = ctl
        self.clock = time.monotonic
        self.schedulers: list[SharedScheduler] = []
        self._threads: list[threading.Thread] = []
        self._sampler: threading.Thread | None = None
        self._sampling = threading.Event()
        self._samples: list[Sample] = []

    def main(self) -> None:
        run = self.run
        transport = RunTransport(run["transport"], suffix=run["suffix"], owner=False,
                                 cells=run["cells"], cell_urls=run["cell_urls"])
        try:
            self.schedulers = [SharedScheduler(s, transport.data, transport.control,
                                               transport.cell_planes)
                               for s in self.settings]
            for sched in self.schedulers:
                sched.follow_membership = run["ownership"]
            for sched in self.schedulers:
                sched.start()
            n = len(run["sources"])
            wait_until(lambda: all(len(s.versions()) >= n for s in self.schedulers), 120,
                             f"scheduler process {self.index} to see every host")
            wait_until(lambda: all(len(s.service.peers) == run["schedulers"]
                                   for s in self.schedulers), 30,
                       f"scheduler process {self.index} to see its peers")
            self.ctl.send(("ready",))
            while True:
                try:
                    kind = self.ctl.recv()[0]
                except (EOFError, OSError):  # the main process is gone
                    return
                if kind == "go":
                    self._begin()
                elif kind == "finish":
                    self.ctl.send(("samples", self._end()))
                elif kind == "views":
                    self.ctl.send(("views", [view_digests(s) for s in self.schedulers]))
                elif kind == "quality":
                    self.ctl.send(("quality", [scheduler_sums(s) for s in self.schedulers]))
                elif kind == "versions":
                    self.ctl.send(("versions", [s.versions() for s in self.schedulers]))
                elif kind == "cpu":
                    self.ctl.send(("cpu", time.process_time()))
                elif kind == "stop":
                    break
        finally:
            self._sampling.set()
            for sched in self.schedulers:
                try:
                    sched.stop()
                except Exception as exc:
                    print(f"warning: stopping {sched.name}: {exc}", file=sys.stderr)
            transport.close()
        self.ctl.send(("stopped",))

    def _begin(self) -> None:
        for client, local, conn in self.clients:
            t = threading.Thread(target=self._client, args=(self.schedulers[local], conn),
                                 name=f"client-{client}", daemon=True)
            self._threads.append(t)
        self._sampler = threading.Thread(target=self._sample, name="staleness-sampler", daemon=True)
        self._sampler.start()
        for t in self._threads:
            t.start()

    def _end(self) -> list[Sample]:
        for t in self._threads:  # the main process has answered each one's last request
            t.join(ANSWER_TIMEOUT)
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join()
        return self._samples

    def _client(self, sched: SharedScheduler, conn: Connection) -> None:
        """A closed-loop client: ask for a request, place it here, report the outcome."""
        try:
            conn.send(("next",))
            while (spec := conn.recv()) is not None:
                start = time.perf_counter()
                decided_at = self.clock()
                outcome = sched.schedule(spec)
                e2e = time.perf_counter() - start
                conn.send(("outcome", outcome, e2e, decided_at))
        except (EOFError, OSError):  # the main process ended the run, or is gone
            pass
        except Exception as exc:  # a broken client must show in the main process
            try:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
            except (EOFError, OSError):
                pass
        finally:
            conn.close()

    def _sample(self) -> None:
        rng = random.Random(f"{self.run['seed']}-staleness-{self.index}")
        sources = self.run["sources"]
        while not self._sampling.wait(SAMPLE_EVERY):
            sample = rng.sample(sources, min(SAMPLE_SOURCES, len(sources)))
            for sched in self.schedulers:
                with sched.lock:  # the view cannot move while read: it held this at t
                    t = self.clock()
                    views = sched.receiver.sources
                    for s in sample:
                        view = views.get(s)
                        if view is not None and view.doc is not None:
                            self._samples.append((s, view.epoch, view.seq, t))


def run_child(main: Any, ctl: Connection) -> None:
    """A spawned child's body: ``main()`` (building the child and running it), with Ctrl-C
    left to the main process and any failure sent up the control pipe as a traceback before
    the child exits 1."""
    # Ctrl-C reaches the whole process group: the main process alone decides, and stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        main()
    except BaseException:
        try:
            ctl.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise SystemExit(1) from None


def _child_main(index: int, run: dict[str, Any], settings: list[ModeSettings],
                clients: list[tuple[int, int, Connection]], ctl: Connection) -> None:
    """Entry point of a scheduler process (multiprocessing 'spawn' target)."""
    run_child(lambda: _Child(index, run, settings, clients, ctl).main(), ctl)


# -- the main process's side --------------------------------------------------------


class ChildGone(RuntimeError):
    """A scheduler process exited (or its pipe broke) before answering."""


def _spawned(gc_thresholds: tuple[int, int, int], target: Any, *args: Any) -> None:
    """A spawned child's first step: the run's garbage-collector thresholds (``shm sim`` sets
    them for the deciding processes, gc_threshold.py; a spawned interpreter starts with
    Python's own), then ``target(*args)``."""
    gc.set_threshold(*gc_thresholds)
    target(*args)


class ChildProcess:
    """The main process's handle on one spawned child: its control pipe (one request, one
    answer, under a lock) and its life cycle.  ``target(*args, ctl)`` runs in the child,
    with the garbage-collector thresholds of the process that made the handle;
    ``theirs`` are the child's ends of other pipes (closed here once it holds them),
    ``mine`` the main process's ends of those (closed when the child is asked to stop)."""

    def __init__(self, ctx: Any, name: str, process_name: str, target: Any, args: tuple,
                 mine: list[Connection], theirs: list[Connection]) -> None:
        self.name = name
        self._mine = mine
        self._theirs = theirs
        self.ctl, self._ctl_theirs = ctx.Pipe()
        self._lock = threading.Lock()
        self._stopping = False
        self.process = ctx.Process(target=_spawned, name=process_name, daemon=True,
                                   args=(gc.get_threshold(), target, *args, self._ctl_theirs))

    def start(self) -> None:
        self.process.start()
        # the child holds its ends now; dropping ours lets either side see the other go
        for conn in (*self._theirs, self._ctl_theirs):
            conn.close()

    def send(self, message: tuple) -> None:
        with self._lock:
            self.ctl.send(message)

    def expect(self, kind: str, timeout: float = ANSWER_TIMEOUT) -> tuple:
        """The next message of ``kind`` from the child (others are dropped); raises if it
        fails, exits or stays silent for ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                try:
                    ready = self.ctl.poll(min(0.5, max(0.0, deadline - time.monotonic())))
                    message = self.ctl.recv() if ready else None
                except (EOFError, OSError):
                    raise ChildGone(f"{self.name} exited (code {self.process.exitcode})") from None
                if message is not None:
                    if message[0] == "error":
                        raise RuntimeError(f"{self.name} failed:\n{message[1]}")
                    if message[0] == kind:
                        return message
                elif not self.process.is_alive():
                    raise ChildGone(f"{self.name} exited (code {self.process.exitcode})")
                elif time.monotonic() >= deadline:
                    raise TimeoutError(f"{self.name}: no {kind!r} within {timeout:.0f}s")

    def request(self, message: tuple, kind: str) -> tuple:
        self.send(message)
        return self.expect(kind)

    def begin_stop(self) -> None:
        """Ask the child to stop (its other pipes close: a client still waiting for a
        request ends now)."""
        for conn in self._mine:
            conn.close()
        if not self._stopping and self.process.pid is not None and self.process.is_alive():
            self._stopping = True
            try:
                self.send(("stop",))
            except OSError:  # it is gone already
                pass

    def stop(self) -> None:
        """Let the child stop what it runs and wait for it to exit; nothing outlives the run."""
        if self.process.pid is None:  # never started
            for conn in (*self._mine, *self._theirs, self._ctl_theirs, self.ctl):
                conn.close()
            return
        self.begin_stop()
        try:
            if self.process.is_alive():
                self.expect("stopped")
        except ChildGone:  # it failed or was killed, and said so (or could not): nothing to stop
            pass
        finally:
            self.process.join(10)
            if self.process.is_alive():
                print(f"warning: {self.name} did not exit; terminating it", file=sys.stderr)
                self.process.terminate()
                self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
            self.ctl.close()


class SchedulerProcess(ChildProcess):
    """The main process's handle on one scheduler process (what ``Simulation.schedulers`` holds)."""

    def __init__(self, ctx: Any, index: int, run: dict[str, Any], settings: list[ModeSettings],
                 clients: dict[int, tuple[int, Connection, Connection]]) -> None:
        self.index = index
        #: client index -> the main process's end of its pipe
        self.conns = {c: mine for c, (_, mine, _) in clients.items()}
        super().__init__(
            ctx, f"scheduler process {index} ({', '.join(s.name for s in settings)})",
            f"shm-sim-scheduler-{index}", _child_main,
            (index, run, settings, [(c, local, theirs) for c, (local, _, theirs) in clients.items()]),
            list(self.conns.values()), [theirs for _, _, theirs in clients.values()])


class ProcessSimulation(Simulation):
    """The shared mode with its schedulers in ``cfg.processes`` processes (module docstring)."""

    def __init__(self, cfg: Any, mode: str) -> None:
        if mode != "shared" or not cfg.processes:
            raise ValueError("scheduler processes are for the shared mode (--processes)")
        super().__init__(cfg, mode)
        self._conns: dict[int, Connection] = {}
        self._process_of: dict[int, SchedulerProcess] = {}
        self._cpu: dict[str, tuple[float, float]] = {}

    def _start_schedulers(self) -> None:
        cfg = self.cfg
        settings = self._mode_settings()
        ctx = mp.get_context("spawn")
        m, p = len(settings), cfg.processes
        assert p is not None  # __init__ refuses a run without scheduler processes
        run = {"transport": cfg.transport, "suffix": self.transport.suffix, "seed": cfg.seed,
               "sources": sorted(self.cloud.documents),
               "ownership": cfg.peer_ownership, "schedulers": len(settings), "cells": cfg.cells,
               "cell_urls": self.transport.cell_urls}
        for j in range(p):
            # scheduler i runs in process i % p, as its (i // p)-th; client c uses scheduler c % m
            clients = {}
            for c in range(cfg.clients):
                if (c % m) % p == j:
                    mine, theirs = ctx.Pipe()
                    clients[c] = ((c % m) // p, mine, theirs)
                    self._conns[c] = mine
            proc = SchedulerProcess(ctx, j, run, settings[j::p], clients)
            self.schedulers.append(proc)
            self._process_of.update(dict.fromkeys(clients, proc))
        for proc in self.schedulers:
            proc.start()
        for proc in self.schedulers:
            proc.expect("ready", READY_TIMEOUT)
        # Holding every host is not being current: P processes reading the stream from its
        # start on a busy machine may still be seconds behind, which the run would count
        # as staleness (and decide on).  The run starts once every view has applied all
        # that was published before it was asked.
        wait_until(self._caught_up, 60, "scheduler processes to catch up with the stream")

    def _caught_up(self) -> bool:
        published = self._published_versions()
        return all(all(views.get(s, (-1, -1)) >= version for s, version in published.items())
                   for proc in self.schedulers for views in proc.request(("versions",), "versions")[1])

    # -- the run: Simulation.run, with these parts served across the processes --------

    def _client_loop(self, index: int, stop: threading.Event) -> None:
        """Serve client ``index`` (a thread in its scheduler's process): requests out,
        outcomes in, recorded here exactly as an in-process client's."""
        conn = self._conns[index]
        spec = None
        try:
            while True:
                if not conn.poll(ANSWER_TIMEOUT):
                    raise TimeoutError(f"no word from the process of client {index} "
                                       f"in {ANSWER_TIMEOUT:.0f}s")
                try:
                    message = conn.recv()
                except EOFError:
                    proc = self._process_of[index]
                    raise RuntimeError(f"{proc.name} is gone (exit code "
                                       f"{proc.process.exitcode})") from None
                if message[0] == "error":
                    raise RuntimeError(f"in its scheduler process: {message[1]}")
                if message[0] == "outcome":
                    _, outcome, e2e, decided_at = message
                    self.record_outcome(spec, outcome, e2e, decided_at)
                spec = None if stop.is_set() else self._next_request()
                conn.send(spec)
                if spec is None:
                    return
        finally:
            conn.close()  # the client, if still waiting, sees the end

    def _sample_staleness(self, stop: threading.Event) -> None:
        """The children sample their own views; this starts them (and their clients) and,
        when the run is over, turns their samples into staleness figures."""
        try:
            cpu_before = self._cpu_seconds()
            for proc in self.schedulers:
                proc.send(("go",))
            stop.wait()
            self._cpu = self._cpu_seconds(cpu_before)
            samples: list[Sample] = []
            for proc in self.schedulers:
                samples.extend(proc.request(("finish",), "samples")[1])
            self.metrics.staleness_s.extend(staleness(samples, self._source_first_changes()))
        except Exception as exc:  # fails the run like a broken client
            self.client_errors.append(f"staleness sampling: {type(exc).__name__}: {exc}")

    def _source_first_changes(self) -> dict[tuple[str, int, int], float]:
        """When each version's first change was made, at its source (every one made so far)."""
        return self._first_change

    def _children(self) -> list[ChildProcess]:
        """Every process of the run but this one."""
        return list(self.schedulers)

    def _cpu_seconds(self, since: dict[str, tuple[float, float]] | None = None
                     ) -> dict[str, tuple[float, float]]:
        """Each process's CPU seconds so far and when they were read (``since``: the
        difference from that reading instead)."""
        now = {"main": (time.process_time(), time.monotonic())}
        for proc in self._children():
            cpu = proc.request(("cpu",), "cpu")[1]
            now[proc.process.name.removeprefix("shm-sim-")] = (cpu, time.monotonic())
        if since is None:
            return now
        return {name: (cpu - since[name][0], at - since[name][1])
                for name, (cpu, at) in now.items() if name in since}

    def _views(self) -> list[dict[str, tuple[tuple[int, int], bytes | None]]]:
        return [views for proc in self.schedulers for views in proc.request(("views",), "views")[1]]

    def quality_sums(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        for proc in self.schedulers:
            for quality in proc.request(("quality",), "quality")[1]:
                for key, value in quality.items():
                    sums[key] = sums.get(key, 0.0) + value
        return sums

    def stop(self) -> None:
        for proc in self.schedulers:  # they stop side by side; Simulation.stop waits for each
            proc.begin_stop()
        super().stop()

    def _figures(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = super()._figures(*args, **kwargs)
        out["scheduler_processes"] = self.cfg.processes
        # the share of one core each process took while the clients ran (the main process:
        # every thread of it, clients' servers, churn, oracle, in-process reporters)
        out["cpu_pct_per_process"] = {name: round(100.0 * cpu / wall, 1) if wall > 0 else None
                                      for name, (cpu, wall) in self._cpu.items()}
        return out


__all__ = ["ChildGone", "ChildProcess", "ProcessSimulation", "SchedulerProcess", "staleness"]
