"""``shm bench stream``: the host-state stream over a real RabbitMQ, measured end to end.

One reporter process serves ``--sources`` simulated hosts, each changing on
average once per ``--change-interval`` seconds; ``--schedulers`` scheduler
processes read the stream.  Every party is a separate process, as deployed.

Measured:

* staleness: for every delta, the time from the first change it carries (at
  the source, before coalescing) until it is applied at *every* scheduler
  (wall clock; all processes share the machine's clock), p50/p99/max;
* sources per broker message (items per published batch) and broker
  messages per second (stream publishes and control casts);
* restart catch-up: one scheduler is stopped (it saves its cache and offset),
  stays down ``--down`` seconds while changes keep flowing, and is restarted:
  the time from its service start until it has applied the first change made
  after that (everything before it in the stream has been applied by then);
  compared with a full resync: a fresh scheduler that skips the stream's
  history and asks every source for a snapshot, timed from its service start
  until it holds all of them.  Neither includes starting the Python process;
* cold start, the new way and the old way side by side (``--cold-starts``, in
  this order): a fresh scheduler with no state file that asks the running
  schedulers for a checkpoint, restores the one taken in answer (or, none within
  its wait, the newest they published every ``--checkpoint-interval`` seconds)
  and reads the stream after it (``checkpoint``); one that restores the newest
  periodic checkpoint without asking (``newest``, as before asks); then fresh
  schedulers with checkpoints off (today's cold start): one on the whole stream
  this run wrote (``stream``), and one on a stream retained from the newest
  checkpoint's offset on (``window``: retention dropped the announcements, as in
  any deployment older than the stream's max age: every source shows up by its
  next delta or heartbeat and is resynced); each: seconds from its service start
  until every source is active and it has applied the first change made after its
  start (caught up with the stream), the resync requests it sent, and the CPU
  seconds its process used meanwhile (user + system, every thread).

With ``--cells C`` (design §4.6) the sources are spread over C reporter processes,
one per cell, each publishing on its cell's stream (``<stream>.cell1`` ..
``<stream>.cellC``, all on this broker, standing in for the cells' own brokers);
every scheduler reads every cell's stream at its own offset, and its checkpoints
carry each cell's offset.  The figures are the same, over all the cells.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import resource
import sys
import tempfile
import time
import uuid
from typing import Any

import msgpack

from protocol.messages import Delta
from protocol.receiver import ReceiverObserver, SourceView

#: the cold starts a run measures (--cold-starts), in this order
COLD_STARTS = ("checkpoint", "newest", "stream", "window")
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_OSLO_URL = "rabbit://guest:guest@127.0.0.1:5672/"


def _cell_names(args: dict[str, Any]) -> list[str]:
    return [f"cell{c + 1}" for c in range(args["cells"])]


def _reporter_name(cell: str | None) -> str:
    return "bench-reporter" if cell is None else f"bench-reporter-{cell}"


def _stream_plane(args: dict[str, Any], cell: str | None = None) -> Any:
    """The data plane of the deployment's stream, or of ``cell``'s."""
    from transport.cells import cell_stream_name
    from transport.kombu_stream import KombuStreamDataPlane, StreamSettings

    name = args["stream"] if cell is None else cell_stream_name(args["stream"], cell)
    return KombuStreamDataPlane(StreamSettings(url=args["url"], name=name))


def _planes(args: dict[str, Any], cell: str | None = None):
    """The data plane of the deployment's stream, or of ``cell``'s, and the control plane."""
    from oslo_config import cfg

    from transport import no_eventlet  # noqa: F401
    from transport.oslo_rpc import OsloRpcControlPlane

    conf = cfg.ConfigOpts()
    conf([])
    return _stream_plane(args, cell), OsloRpcControlPlane(conf, args["oslo_url"])


def _cell_planes(args: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's data plane of every cell's stream (none without cells)."""
    return {c: _stream_plane(args, c) for c in _cell_names(args)}


def _share(total: int, parts: int, k: int) -> int:
    """Part ``k`` of ``total`` split as evenly as can be into ``parts``."""
    return total // parts + (1 if k < total % parts else 0)


def _reporter_proc(args: dict[str, Any], stop: Any, ready: Any, out: str,
                   cell: str | None = None, sources: int | None = None) -> None:
    """The reporter of every source, or with ``cell`` of ``sources`` of them, on its stream."""
    from compute_reporter.service import ReporterService
    from compute_reporter.tracker import SimulatedTracker
    from protocol.messages import Batch, Send

    data, control = _planes(args, cell)
    tracker = SimulatedTracker(args["sources"] if sources is None else sources, seed=1,
                               prefix="bench" if cell is None else f"bench-{cell}",
                               change_interval=args["change_interval"], delete_probability=0)
    service = ReporterService(_reporter_name(cell), tracker, data, control,
                              reporter_topic=args["topics"][0], scheduler_topic=args["topics"][1],
                              coalesce_window=args["coalesce_window"],
                              heartbeat_interval=args["heartbeat_interval"])
    first_change: dict[tuple[str, int, int], float] = {}
    items = [0, 0]
    orig_start = service.start

    def start() -> None:
        orig_start()
        manager = service.manager
        orig_change, orig_send = manager.change, service._send

        def change(source: str, ops: list, now: float) -> None:
            machine = manager.machines[source]
            fresh = not machine.has_pending
            key = (source, machine.epoch, machine.seq + 1)
            t = time.time()
            orig_change(source, ops, now)
            if fresh and machine.has_pending:
                first_change[key] = t

        def send(batches: list[Batch], control: list[Send]) -> None:
            items[0] += sum(len(b.items) for b in batches)
            items[1] += len(batches)
            orig_send(batches, control)

        manager.change = change  # type: ignore[method-assign]  # wrapped in place, to count and time
        service._send = send  # type: ignore[method-assign]  # wrapped in place, to count and time

    service.start = start  # type: ignore[method-assign]  # wrapped in place, to count and time
    service.start()
    ready.put(("reporter", {host: _reporter_name(cell) for host in tracker.hosts()}))
    t0 = time.time()
    stop.wait()
    service.stop()
    elapsed = time.time() - t0
    with open(out, "wb") as f:
        f.write(msgpack.packb({
            "first_change": [[*k, v] for k, v in first_change.items()],
            "items": items[0], "batches": items[1], "elapsed": elapsed,
            "published": service.stats["published"], "casts": service.stats["casts"],
            "changes": tracker.changes,
        }))
    control.close()
    data.close()


def _retention_window(data: Any, name: str) -> str:
    """A state directory whose cache file holds no view and the newest checkpoint's offset:
    the scheduler then starts as a cold start does on a stream whose retention begins there
    (every announcement dropped, as in a deployment running longer than stream_max_age),
    reading the same part of the stream as one started from that checkpoint."""
    from protocol.receiver import ReceiverMachine
    from shared_host_manager import checkpoint
    from shared_host_manager.cache import HostStateCache

    cache = HostStateCache(ReceiverMachine(name), lambda endpoint, msg: None)
    plane = checkpoint.checkpoint_plane(data)
    assert plane is not None
    reader = checkpoint.Checkpointer(name, cache, plane, interval=0.0, peers=lambda: ())
    newest = max((checkpoint.decode(body, None) for body, _ in reader.read_newest()),
                 key=lambda cp: cp.taken_ns, default=None)
    # its offsets on every stream (each cell's too), none of its views
    if newest is None or cache.restore_state(newest.state, "the newest checkpoint",
                                             keep=lambda source: False) is None:
        raise RuntimeError("no checkpoint on the stream to start the retention window at")
    cache.origins.clear()
    cache.source_cells.clear()
    if cache.offset is None and not cache.cell_offsets:
        raise RuntimeError("the newest checkpoint holds no stream offset")
    state_dir = tempfile.mkdtemp(prefix="shm-bench-window-")
    cache.save(f"{state_dir}/cache-{name}.msgpack")
    return state_dir


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _AppliedTimes(ReceiverObserver):
    """When a scheduler's receiver applied each delta: ``(source, epoch, seq, wall time)``."""

    def __init__(self) -> None:
        self.times: list[tuple[str, int, int, float]] = []

    def delta_applied(self, view: SourceView, delta: Delta) -> None:
        self.times.append((delta.source, delta.epoch, delta.seq, time.time()))


def _scheduler_proc(args: dict[str, Any], name: str, stop: Any, ready: Any, out: str,
                    state_dir: str | None, known: dict[str, str] | None, expect: int,
                    checkpoint_interval: float = 0.0, window: bool = False,
                    signal_caught_up: bool = False, ask: bool = True) -> None:
    from shared_host_manager.service import SchedulerService

    data, control = _planes(args)
    cell_planes = _cell_planes(args)
    if window:
        state_dir = _retention_window(data, name)
    service = SchedulerService(name, data, control, reporter_topic=args["topics"][0],
                               scheduler_topic=args["topics"][1], state_dir=state_dir,
                               known_sources=known, down_interval=3 * args["heartbeat_interval"],
                               checkpoint_interval=checkpoint_interval, checkpoint_ask=ask,
                               cell_planes=cell_planes)
    applied = _AppliedTimes()
    receiver = service.receiver
    receiver.set_observer(applied)
    cpu_started = _cpu()
    started = time.time()
    service.start()
    start_returned = time.time()
    all_held = all_active = caught_up = None
    #: (wall time, CPU seconds since the service start), to read the CPU at "ready" afterwards
    cpu: list[tuple[float, float]] = [(started, 0.0)]
    while not stop.wait(0.05):
        cpu.append((time.time(), _cpu() - cpu_started))
        if expect and all_active is None:
            with service.cache.lock:
                views = receiver.sources.values()
                held = sum(1 for v in views if v.doc is not None)
                active = sum(1 for v in views if v.status.value == "active")
            if all_held is None and held >= expect:
                all_held = time.time()
                ready.put((name, all_held - started))
            if active >= expect:
                all_active = time.time()
        if signal_caught_up and all_active is not None and caught_up is None:
            # about caught up: on every stream the reporters publish on (each cell's), the
            # newest message applied was published less than 0.5 s ago (the exact figure is
            # taken afterwards, from the reporters' change times)
            streams = (list(service.cell_stream_stats().values()) if cell_planes
                       else [service.stream_stats()])
            newest = [s.applied_published_at if s is not None else None for s in streams]
            if all(a is not None and time.time() - a < 0.5 for a in newest):
                caught_up = time.time()
                ready.put((name, caught_up - started))
    checkpoints = service.checkpoints
    restored = checkpoints.restored if checkpoints is not None else None
    token = checkpoints.asked_token if checkpoints is not None else None
    service.stop()
    with open(out, "wb") as f:
        f.write(msgpack.packb({
            "applied": applied.times, "started": started, "all_held": all_held,
            "all_active": all_active, "start_returned": start_returned, "cpu": cpu,
            "resyncs": receiver.stats["resyncs_requested"], "messages": service.cache.messages,
            "resumed_from": service.resumed_from, "invalid": dict(service.cache.invalid),
            "retention_gaps": service.retention_gaps,
            "checkpoint": None if restored is None else {
                "sources": restored.sources, "offset": restored.offset,
                "age_s": started - restored.taken_ns / 1e9,  # at its start (< 0: taken after)
                "answered": token is not None and token in restored.answers},
            "checkpoints_published": checkpoints.published if checkpoints is not None else 0,
            "checkpoint_bytes": (checkpoints.last_published or (0,))[0]
            if checkpoints is not None else 0,
        }))
    control.close()
    data.close()
    for plane in cell_planes.values():
        plane.close()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(args: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    work = tempfile.mkdtemp(prefix="shm-bench-stream-")
    stop_all, stop_restart = ctx.Event(), ctx.Event()
    ready: Any = ctx.Queue()
    n_sched = args["schedulers"]
    procs: dict[str, Any] = {}

    def spawn(key: str, target: Any, *a: Any) -> None:
        procs[key] = ctx.Process(target=target, args=a, daemon=True)
        procs[key].start()

    sched_names = [f"bench-s{i}" for i in range(n_sched)]
    # The restarted scheduler gets its own stop event so it can go down mid-run.
    for i, name in enumerate(sched_names):
        stop = stop_restart if i == n_sched - 1 else stop_all
        spawn(name, _scheduler_proc, args, name, stop, ready, f"{work}/{name}.1", work, None,
              args["sources"], args["checkpoint_interval"])
    cells = _cell_names(args)
    reporters = [f"reporter-{c}" for c in cells] or ["reporter"]
    if cells:
        for k, cell in enumerate(cells):
            spawn(reporters[k], _reporter_proc, args, stop_all, ready, f"{work}/{reporters[k]}",
                  cell, _share(args["sources"], len(cells), k))
    else:
        spawn("reporter", _reporter_proc, args, stop_all, ready, f"{work}/reporter")
    #: every source -> the reporter serving it
    served: dict[str, str] = {}
    for _ in range(n_sched + len(reporters)):
        key, value = ready.get(timeout=120)
        if key == "reporter":
            served.update(value)
    hosts = list(served)
    measure_start = time.time()
    time.sleep(args["duration"])
    measure_end = time.time()
    # Restart catch-up: stop the last scheduler, keep changing, restart it from its offset.
    stop_restart.set()
    procs[sched_names[-1]].join(60)
    time.sleep(args["down"])
    stop_again = ctx.Event()
    spawn("restarted", _scheduler_proc, args, sched_names[-1], stop_again, ready,
          f"{work}/{sched_names[-1]}.2", work, None, 0)
    time.sleep(max(5.0, args["down"]))
    # Cold starts, one after the other (they share the machine), before the full resync below
    # (its requests keep the reporter busy long after it is done): from the newest checkpoint;
    # with checkpoints off on the whole stream this run wrote (today's, while every
    # announcement is still retained); and with checkpoints off on a stream retained from that
    # checkpoint's offset on (today's once retention dropped the announcements).
    # The resyncing one last: the reporter answers its requests for a while after it is ready.
    every = {"checkpoint": (args["checkpoint_interval"] or 30.0, False, True),
             "newest": (args["checkpoint_interval"] or 30.0, False, False),
             "stream": (0.0, False, True), "window": (0.0, True, True)}
    cold = {mode: every[mode] for mode in args["cold_starts"]}
    timed_out: list[str] = []
    for mode, (interval, window, ask) in cold.items() if args["cold_start"] else ():
        stop_cold = ctx.Event()
        name = f"bench-cold-{mode}"
        spawn(f"cold-{mode}", _scheduler_proc, args, name, stop_cold, ready,
              f"{work}/cold-{mode}", None, None, len(hosts), interval, window, True, ask)
        # every source held, then about caught up with the stream's tail
        if (_ready(ready, name, args["cold_timeout"]) is None
                or _ready(ready, name, args["cold_timeout"]) is None):
            timed_out.append(mode)
            print(f"cold start {mode!r}: not ready within {args['cold_timeout']:g} s "
                  "(--cold-timeout); its figures are what it reached", file=sys.stderr)
        else:
            time.sleep(args["cold_settle"])  # it applies changes made after its start meanwhile
        stop_cold.set()
        procs[f"cold-{mode}"].join(60)
    if args["cold_start"]:
        time.sleep(max(5.0, args["down"]))  # the reporter answers the last resyncs
    # Full resync: a fresh scheduler that asks every source.
    spawn("fresh", _scheduler_proc, args, "bench-fresh", stop_again, ready, f"{work}/fresh", None,
          served, len(hosts))
    full_resync_s = _ready(ready, "bench-fresh", args["cold_timeout"])
    if full_resync_s is None:
        timed_out.append("full_resync")
        print(f"full resync: not done within {args['cold_timeout']:g} s (--cold-timeout)",
              file=sys.stderr)
        full_resync_s = float("nan")
    stop_all.set()
    stop_again.set()
    for p in procs.values():
        p.join(60)

    def load(path: str) -> dict:
        with open(path, "rb") as f:
            return msgpack.unpackb(f.read(), strict_map_key=False)

    outs = [load(f"{work}/{r}") for r in reporters]
    rep = {key: sum(o[key] for o in outs)
           for key in ("items", "batches", "published", "casts", "changes")}
    rep["elapsed"] = max(o["elapsed"] for o in outs)
    first = {(s, e, q): t for o in outs for s, e, q, t in o["first_change"]}
    live = [load(f"{work}/{n}.1") for n in sched_names]
    applied_at: dict[tuple, list[float]] = {}
    for sched in live:
        for s, e, q, t in sched["applied"]:
            applied_at.setdefault((s, e, q), []).append(t)
    staleness = []
    for key, t_change in first.items():
        times = applied_at.get(key)
        if measure_start + 2 <= t_change <= measure_end - 1 and times and len(times) == n_sched:
            staleness.append(max(times) - t_change)
    restarted = load(f"{work}/{sched_names[-1]}.2")
    # Both figures start when the scheduler service starts (the process is up, its modules
    # imported), as full_resync_s does: the first change made after that, once applied, means
    # everything the stream held before it has been applied too (the stream is ordered).
    started = restarted["started"]
    fresh_applied = [t for s, e, q, t in restarted["applied"] if first.get((s, e, q), 0) >= started]
    catch_up = (min(fresh_applied) - started) if fresh_applied else float("nan")
    fresh = load(f"{work}/fresh")
    cold_figures: dict[str, Any] = {}
    for mode in cold if args["cold_start"] else ():
        try:
            cold_run = load(f"{work}/cold-{mode}")
        except FileNotFoundError:  # it did not stop within the join: nothing of it to report
            continue
        cold_figures.update(_cold_start_figures(mode, cold_run, first))
    published = [s.get("checkpoints_published", 0) for s in live]
    return {
        "sources": args["sources"], "cells": len(cells), "schedulers": n_sched,
        "duration_s": args["duration"],
        "change_interval_s": args["change_interval"], "coalesce_window_s": args["coalesce_window"],
        "changes_per_s": rep["changes"] / rep["elapsed"],
        "staleness_ms_p50": 1000 * _pct(staleness, 0.50),
        "staleness_ms_p99": 1000 * _pct(staleness, 0.99),
        "staleness_ms_max": 1000 * max(staleness) if staleness else float("nan"),
        "deltas_measured": len(staleness),
        "sources_per_message": rep["items"] / max(rep["batches"], 1),
        "broker_messages_per_s": (rep["published"] + rep["casts"]) / rep["elapsed"],
        "stream_messages_per_s": rep["published"] / rep["elapsed"],
        "restart_down_s": args["down"],
        "restart_catch_up_s": catch_up,
        "restart_resyncs": restarted["resyncs"],
        "restart_messages_replayed": restarted["messages"],
        "full_resync_s": full_resync_s,
        "full_resync_requests": fresh["resyncs"],
        "invalid": [s["invalid"] for s in live],
        "checkpoint_interval_s": args["checkpoint_interval"],
        "checkpoints_published": sum(published),
        "checkpoint_bytes": max((s.get("checkpoint_bytes", 0) for s in live), default=0),
        **cold_figures,
        "timed_out": timed_out,
    }


def _ready(ready: Any, name: str, timeout: float) -> float | None:
    """The next figure scheduler ``name`` reports on ``ready``, None once ``timeout`` seconds
    passed; what another one reported meanwhile (one stopped after a timeout) is dropped."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            who, value = ready.get(timeout=left)
        except queue.Empty:
            return None
        if who == name:
            return float(value)
    return None


def _cold_start_figures(mode: str, run: dict, first: dict) -> dict[str, Any]:
    """A fresh scheduler's figures: ready when every source is active and it has applied the
    first change made after its start (so the views are current, not only held)."""
    started = run["started"]
    after = [t for s, e, q, t in run["applied"] if first.get((s, e, q), 0) >= started]
    caught_up = min(after) if after else float("nan")
    active = run["all_active"] if run["all_active"] is not None else float("nan")
    ready = max(active, caught_up)
    cpu = next((c for t, c in run["cpu"] if t >= ready), float("nan"))
    out = {
        f"cold_{mode}_ready_s": ready - started,
        f"cold_{mode}_all_active_s": active - started,
        f"cold_{mode}_caught_up_s": caught_up - started,
        f"cold_{mode}_start_call_s": run["start_returned"] - started,
        f"cold_{mode}_resync_requests": run["resyncs"],
        f"cold_{mode}_cpu_s": cpu,
        f"cold_{mode}_messages": run["messages"],
        f"cold_{mode}_retention_gaps": run.get("retention_gaps", 0),
    }
    if run.get("checkpoint"):
        out[f"cold_{mode}_checkpoint_age_s"] = run["checkpoint"]["age_s"]
        # taken in answer to this newcomer's ask, or the newest periodic one
        out[f"cold_{mode}_checkpoint_answered"] = run["checkpoint"].get("answered", False)
    elif mode == "checkpoint":
        out["cold_checkpoint_restored"] = False
    return out


def main(argv: list[str], prog: str = "shm bench stream") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--cells", type=int, default=0,
                        help="spread the sources over this many cells, a reporter process and "
                             "a stream each (0: one stream, one reporter)")
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--change-interval", type=float, default=1.0)
    parser.add_argument("--coalesce-window", type=float, default=0.01)
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    parser.add_argument("--down", type=float, default=10.0, help="seconds the restarted scheduler is down")
    parser.add_argument("--checkpoint-interval", type=float, default=10.0,
                        help="seconds between the running schedulers' checkpoints (0: none)")
    parser.add_argument("--no-cold-start", dest="cold_start", action="store_false",
                        help="skip the cold starts")
    parser.add_argument("--cold-starts", default=",".join(COLD_STARTS),
                        help="the cold starts to measure, in this order: checkpoint (asked "
                             "for), newest (the newest periodic checkpoint), stream (the "
                             "whole stream), window (a retention window)")
    parser.add_argument("--cold-timeout", type=float, default=300.0,
                        help="seconds a cold-started or fully resyncing scheduler may take to "
                             "be ready; past it, its figures are what it reached")
    parser.add_argument("--cold-settle", type=float, default=2.0,
                        help="seconds a cold-started scheduler runs on once caught up")
    parser.add_argument("--url", default=DEFAULT_URL, help="kombu URL of RabbitMQ (data plane)")
    parser.add_argument("--oslo-url", default=DEFAULT_OSLO_URL, help="oslo.messaging URL (control plane)")
    parser.add_argument("--json", help="write the figures to this file")
    ns = parser.parse_args(argv)
    if ns.cells < 0 or (ns.cells and ns.cells > ns.sources):
        parser.error(f"--cells {ns.cells}: from 0 to --sources ({ns.sources})")
    if ns.cold_timeout <= 0:
        parser.error(f"--cold-timeout {ns.cold_timeout:g}: must be > 0")
    ns.cold_starts = [m.strip() for m in ns.cold_starts.split(",") if m.strip()]
    unknown = sorted(set(ns.cold_starts) - set(COLD_STARTS))
    if unknown or not ns.cold_starts:
        parser.error(f"--cold-starts: choose from {', '.join(COLD_STARTS)} "
                     f"(got {', '.join(unknown) or 'none'})")
    suffix = uuid.uuid4().hex[:8]
    args = dict(vars(ns), stream=f"shm-bench-{suffix}",
                topics=(f"shm-bench-reporter-{suffix}", f"shm-bench-scheduler-{suffix}"))
    try:
        result = run(args)
    finally:
        _cleanup(args)
    for key, value in result.items():
        print(f"{key:28} {value:.3f}" if isinstance(value, float) else f"{key:28} {value}")
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


def _cleanup(args: dict[str, Any]) -> None:
    """Delete the stream and the RPC queues this run created."""
    from kombu import Connection

    from transport.cells import cell_stream_name

    cells = _cell_names(args)
    names = [args["stream"], *args["topics"]]
    names += [cell_stream_name(args["stream"], c) for c in cells]
    served_by: list[str | None] = [*cells] or [None]
    names += [f"{args['topics'][0]}.{_reporter_name(c)}" for c in served_by]
    names += [f"{args['topics'][1]}.bench-s{i}" for i in range(args["schedulers"])]
    names += [f"{args['topics'][1]}.bench-fresh", f"{args['stream']}.checkpoint"]
    names += [f"{args['topics'][1]}.bench-cold-{mode}"
              for mode in COLD_STARTS]
    try:
        with Connection(args["url"], connect_timeout=5) as conn:
            for name in names:
                channel = conn.channel()
                try:
                    channel.queue_delete(queue=name)
                except Exception:
                    pass
    except Exception as exc:  # cleanup is best effort; say so
        print(f"cleanup failed: {exc}", file=sys.stderr)
