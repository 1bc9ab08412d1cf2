"""``shm sim --processes P --reporter-processes M``: the hosts' reporters in processes of their own too.

With ``--processes`` alone the schedulers run in processes (:mod:`simulator.processes`)
but every reporter stays in the main process, whose one core's worth of Python then
caps a 10 000-host run.  With ``--reporter-processes M`` the sorted hosts are cut into
M contiguous shares, one per spawned reporter process; a process serves its share with
real :class:`~compute_reporter.service.ReporterService` instances of at most
``hosts_per_reporter`` hosts each (named ``reporter-<k>`` as in-process, ``k`` counting
over the whole cloud), each publishing on the run's stream and answering claims and
resyncs over oslo.messaging, as deployed.  The main process keeps the workload, the
churn, the NoValidHost oracle and every figure.

Churn.  A claim reaches its reporter from the scheduler over the broker, as deployed;
only the deletions matching each boot are the simulator's own.  They go to the owning
process over a pipe of its own (one per reporter process, one way, ordered, read by a
thread there), not as control messages over the broker: in a deployment a deletion is
nova-compute's local call to its reporter, so sending it through RabbitMQ would add
traffic (and RPC work in the reporters' servers) that no deployment has, and skew
``broker messages/s`` and the claims' latency.  Before the run is quiesced the main
process sends a marker down every churn pipe and the "quiesce" request waits for it,
so every deletion of the run is applied before the views are compared.

Figures.  The source-side times staleness needs (``first_change``, see
:mod:`simulator.processes`) are recorded in each reporter process, under its
reporters' locks, and sent back once the clients have stopped (CLOCK_MONOTONIC is one
clock for the whole machine).  The hosts' true state -- for the 0-overcommit check,
placement quality and the NoValidHost oracle -- is gathered from the processes when
needed, each host with the first-change time of the version it is at (the oracle's
"changed since the decision" test).  Convergence compares the schedulers' views with
the published (version, digest) each reporter process reports; broker messages/s adds
up the reporters' own counts.

Life cycle::

    main: the run's transport (the owner: it deletes the stream and queues at the end)
      -> spawn M reporter processes, each with its hosts' documents (prefilled here)
    child: join the run's transport (not its owner), start its reporters, record
           first changes from now on  -> "ready"
    main:  scheduler processes start (simulator.processes), the run goes on;
           deletions -> churn pipes; "versions" / "published" / "truth" as needed
    main run end: churn marker, "quiesce" (drift stops), "published" until converged,
           "first_change", "truth", "stats"
    main stop(): the schedulers stop first, then "stop" -> child stops its reporters
           (their goodbyes published) -> "stopped", exits; then the transport closes.

A child whose main process disappears sees its pipes close and shuts down.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from compute_reporter.service import ReporterService
from compute_reporter.tracker import SimulatedTracker
from protocol.source import SourceMachine
from simulator.processes import (
    ANSWER_TIMEOUT,
    READY_TIMEOUT,
    ChildProcess,
    ProcessSimulation,
    run_child,
)
from simulator.run_transport import RunTransport
from simulator.simulation import _reporter_truth, reporter_size

Truth = dict[str, tuple[int, int, dict]]


# -- the child process ---------------------------------------------------------------


class _ReporterChild:
    """One reporter process: its reporters, the deletions sent to them, its first changes."""

    def __init__(self, index: int, run: dict[str, Any],
                 shares: list[tuple[str, int, dict[str, dict]]], churn: Connection,
                 ctl: Connection) -> None:
        self.index = index
        self.run = run
        self.shares = shares
        self.churn = churn
        self.ctl = ctl
        self.clock = time.monotonic
        self.reporters: list[ReporterService] = []
        self.reporter_of: dict[str, ReporterService] = {}
        self.first_change: dict[tuple[str, int, int], float] = {}
        self._drained = threading.Event()

    def _on_change(self, machine: SourceMachine, ops: list) -> None:
        # called under the reporter's lock, at the source, for every change
        key = (machine.source, machine.epoch, machine.seq + 1)
        if key not in self.first_change:
            self.first_change[key] = self.clock()

    def main(self) -> None:
        run = self.run
        transport = RunTransport(run["transport"], suffix=run["suffix"], owner=False,
                                 cells=run["cells"], cell_urls=run["cell_urls"])
        rtopic, stopic = transport.topics
        try:
            for name, seed, docs in self.shares:
                k = int(name.rsplit("-", 1)[1])  # reporter-<k>: its cell as in-process
                tracker = SimulatedTracker(0, seed=seed, documents=docs,
                                           change_interval=run["drift_interval"],
                                           delete_probability=0)
                reporter = ReporterService(
                    name, tracker, transport.reporter_plane(k), transport.control,
                    reporter_topic=rtopic,
                    scheduler_topic=stopic, heartbeat_interval=run["heartbeat_interval"],
                    coalesce_window=run["coalesce_window"])
                self.reporters.append(reporter)
                self.reporter_of.update(dict.fromkeys(docs, reporter))
            for reporter in self.reporters:
                reporter.start()
            for reporter in self.reporters:
                with reporter.manager._lock:
                    for machine in reporter.manager.machines.values():
                        machine.on_change = self._on_change
            threading.Thread(target=self._churn, name="churn", daemon=True).start()
            self.ctl.send(("ready",))
            while True:
                try:
                    kind = self.ctl.recv()[0]
                except (EOFError, OSError):  # the main process is gone
                    return
                if kind == "versions":
                    self.ctl.send(("versions", self._versions()))
                elif kind == "published":
                    self.ctl.send(("published", self._published()))
                elif kind == "truth":
                    self.ctl.send(("truth", *self._truth()))
                elif kind == "quiesce":
                    # every deletion the main process sent is applied before drift stops
                    drained = self._drained.wait(ANSWER_TIMEOUT)
                    for reporter in self.reporters:
                        reporter.tracker.stop()
                    self.ctl.send(("quiesce", drained))
                elif kind == "first_change":
                    self.ctl.send(("first_change", dict(self.first_change)))
                elif kind == "stats":
                    self.ctl.send(("stats", sum(r.stats["published"] + r.stats["casts"]
                                                for r in self.reporters)))
                elif kind == "cpu":
                    self.ctl.send(("cpu", time.process_time()))
                elif kind == "stop":
                    break
        finally:
            for reporter in self.reporters:
                try:
                    reporter.stop()
                except Exception as exc:
                    print(f"warning: stopping {reporter.name}: {exc}", file=sys.stderr)
            transport.close()
        self.ctl.send(("stopped",))

    def _churn(self) -> None:
        """Apply the deletions the main process sends, in its order."""
        try:
            while True:
                message = self.churn.recv()
                if message[0] == "release":
                    _, source, instance = message
                    reporter = self.reporter_of[source]
                    reporter.manager.release(source, instance, self.clock())
                    reporter.wake()
                elif message[0] == "drained":
                    self._drained.set()
        except (EOFError, OSError):  # the run is over, or the main process is gone
            pass

    def _versions(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                out.update((s, m.version) for s, m in reporter.manager.machines.items())
        return out

    def _published(self) -> dict[str, tuple[tuple[int, int], bytes]] | None:
        out = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                for s, m in reporter.manager.machines.items():
                    if m.has_pending:
                        return None
                    out[s] = (m.version, m.published_digest())
        return out

    def _truth(self) -> tuple[Truth, dict[tuple[str, int, int], float]]:
        """Every host's (epoch, seq, document), and when the change making that version was
        first made (for the versions this process saw made)."""
        truth: Truth = {}
        for reporter in self.reporters:
            with reporter.manager._lock:
                truth.update(_reporter_truth(reporter))
        when = {}
        for s, (e, q, _) in truth.items():
            t = self.first_change.get((s, e, q))
            if t is not None:
                when[(s, e, q)] = t
        return truth, when


def _reporter_main(index: int, run: dict[str, Any], shares: list[tuple[str, int, dict[str, dict]]],
                   churn: Connection, ctl: Connection) -> None:
    """Entry point of a reporter process (multiprocessing 'spawn' target)."""
    run_child(lambda: _ReporterChild(index, run, shares, churn, ctl).main(), ctl)


# -- the main process's side --------------------------------------------------------


class ReporterProcess(ChildProcess):
    """The main process's handle on one reporter process: control pipe and churn pipe."""

    def __init__(self, ctx: Any, index: int, run: dict[str, Any],
                 shares: list[tuple[str, int, dict[str, dict]]]) -> None:
        self.index = index
        self.reporter_names = [name for name, _, _ in shares]
        self.hosts = sum(len(docs) for _, _, docs in shares)
        churn_theirs, self.churn = ctx.Pipe(duplex=False)  # (their reading end, our writing end)
        self._churn_lock = threading.Lock()
        super().__init__(ctx, f"reporter process {index} ({self.hosts} hosts)",
                         f"shm-sim-reporter-{index}", _reporter_main,
                         (index, run, shares, churn_theirs), [self.churn], [churn_theirs])

    def release(self, source: str, instance: str) -> None:
        with self._churn_lock:
            self.churn.send(("release", source, instance))

    def drained(self) -> None:
        """Mark the end of the run's deletions (the "quiesce" request waits for it)."""
        with self._churn_lock:
            self.churn.send(("drained",))


class ReporterProcessSimulation(ProcessSimulation):
    """``ProcessSimulation`` with the reporters in ``cfg.reporter_processes`` processes
    (module docstring)."""

    def __init__(self, cfg: Any, mode: str) -> None:
        if not cfg.reporter_processes:
            raise ValueError("reporter processes need --reporter-processes")
        super().__init__(cfg, mode)
        self.reporter_processes: list[ReporterProcess] = []
        self._owner: dict[str, ReporterProcess] = {}

    def _start_reporters(self) -> None:
        cfg = self.cfg
        self.transport = RunTransport(cfg.transport, cells=cfg.cells,
                                      relay_cell=self.outage.cell if self.outage else None)
        if self.outage is not None:
            self.outage.relay = self.transport.relay
        rtopic, _ = self.transport.topics
        ctx = mp.get_context("spawn")
        run = {"transport": cfg.transport, "suffix": self.transport.suffix,
               "drift_interval": cfg.drift_interval, "heartbeat_interval": cfg.heartbeat_interval,
               "coalesce_window": cfg.coalesce_window, "cells": cfg.cells,
               "cell_urls": self.transport.cell_urls}
        sources = sorted(self.cloud.documents)
        n, m, per = len(sources), cfg.reporter_processes, reporter_size(cfg)
        assert m is not None  # __init__ refuses a run without reporter processes
        k = 0
        for j in range(m):
            # a contiguous, even share per process, cut into reporters of at most `per` hosts
            lo, hi = j * n // m, (j + 1) * n // m
            shares = []
            for i in range(lo, hi, per):
                chunk = sources[i:min(i + per, hi)]
                shares.append((f"reporter-{k}", cfg.seed + i,
                               {s: self.cloud.documents[s] for s in chunk}))
                self.note_cell(k, chunk)
                k += 1
            proc = ReporterProcess(ctx, j, run, shares)
            self.reporter_processes.append(proc)
            self.transport.queues.extend(f"{rtopic}.{name}" for name in proc.reporter_names)
            for _, _, docs in shares:
                self._owner.update(dict.fromkeys(docs, proc))
        for proc in self.reporter_processes:
            proc.start()
        for proc in self.reporter_processes:
            proc.expect("ready", READY_TIMEOUT)

    def _children(self) -> list[ChildProcess]:
        return [*self.schedulers, *self.reporter_processes]

    def _release(self, source: str, instance: str) -> None:
        self._owner[source].release(source, instance)

    def _published_versions(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for proc in self.reporter_processes:
            out.update(proc.request(("versions",), "versions")[1])
        return out

    def _published(self) -> dict[str, tuple[tuple[int, int], bytes]] | None:
        out = {}
        for proc in self.reporter_processes:
            part = proc.request(("published",), "published")[1]
            if part is None:
                return None
            out.update(part)
        return out

    def _truth(self) -> dict[str, tuple[int, int, dict]]:
        out: dict[str, tuple[int, int, dict]] = {}
        for proc in self.reporter_processes:
            _, truth, when = proc.request(("truth",), "truth")
            out.update(truth)
            # the oracle asks when the version it checks was first changed
            self._first_change.update(when)
        return out

    def _stop_drift(self) -> None:
        for proc in self.reporter_processes:
            proc.drained()
        for proc in self.reporter_processes:
            if not proc.request(("quiesce",), "quiesce")[1]:
                print(f"warning: {proc.name} did not see the end of the run's deletions",
                      file=sys.stderr)

    def _source_first_changes(self) -> dict[tuple[str, int, int], float]:
        out = dict(self._first_change)
        for proc in self.reporter_processes:
            out.update(proc.request(("first_change",), "first_change")[1])
        return out

    def _reporters_sent(self) -> int:
        return sum(proc.request(("stats",), "stats")[1] for proc in self.reporter_processes)

    def _stop_reporters(self) -> None:
        # the schedulers have stopped (Simulation.stop): the reporters' goodbyes go out last
        for proc in self.reporter_processes:
            proc.begin_stop()
        for proc in self.reporter_processes:
            proc.stop()

    def _figures(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = super()._figures(*args, **kwargs)
        out["reporter_processes"] = self.cfg.reporter_processes
        return out


__all__ = ["ReporterProcess", "ReporterProcessSimulation"]
