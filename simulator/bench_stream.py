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
  until it holds all of them.  Neither includes starting the Python process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from typing import Any

import msgpack

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_OSLO_URL = "rabbit://guest:guest@127.0.0.1:5672/"


def _planes(args: dict[str, Any]):
    from oslo_config import cfg

    from transport import no_eventlet  # noqa: F401
    from transport.kombu_stream import KombuStreamDataPlane, StreamSettings
    from transport.oslo_rpc import OsloRpcControlPlane

    conf = cfg.ConfigOpts()
    conf([])
    data = KombuStreamDataPlane(StreamSettings(url=args["url"], name=args["stream"]))
    return data, OsloRpcControlPlane(conf, args["oslo_url"])


def _reporter_proc(args: dict[str, Any], stop: Any, ready: Any, out: str) -> None:
    from compute_reporter.service import ReporterService
    from compute_reporter.tracker import SimulatedTracker
    from protocol.messages import Batch, Send

    data, control = _planes(args)
    tracker = SimulatedTracker(args["sources"], seed=1, prefix="bench",
                               change_interval=args["change_interval"], delete_probability=0)
    service = ReporterService("bench-reporter", tracker, data, control,
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
    ready.put(("reporter", tracker.hosts()))
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


def _scheduler_proc(args: dict[str, Any], name: str, stop: Any, ready: Any, out: str,
                    state_dir: str | None, known: dict[str, str] | None, expect: int) -> None:
    from protocol.messages import Batch, Delta
    from shared_host_manager.service import SchedulerService

    data, control = _planes(args)
    service = SchedulerService(name, data, control, reporter_topic=args["topics"][0],
                               scheduler_topic=args["topics"][1], state_dir=state_dir,
                               known_sources=known, down_interval=3 * args["heartbeat_interval"])
    applied: list[tuple[str, int, int, float]] = []
    receiver = service.receiver
    orig_receive = receiver.receive

    def receive(msg: Any, now: float) -> list:
        sends = orig_receive(msg, now)
        if type(msg) is Batch:
            t = time.time()
            sources = receiver.sources
            for item in msg.items:
                if type(item) is Delta:
                    view = sources.get(item.source)
                    if view is not None and view.epoch == item.epoch and view.seq >= item.seq:
                        applied.append((item.source, item.epoch, item.seq, t))
        return sends

    receiver.receive = receive  # type: ignore[method-assign]  # wrapped in place, to count and time
    started = time.time()
    service.start()
    all_held = None
    while not stop.wait(0.01):
        if all_held is None and expect:
            with service.cache.lock:
                held = sum(1 for v in receiver.sources.values() if v.doc is not None)
            if held >= expect:
                all_held = time.time()
                ready.put((name, all_held - started))
    service.stop()
    with open(out, "wb") as f:
        f.write(msgpack.packb({
            "applied": applied, "started": started, "all_held": all_held,
            "resyncs": receiver.stats["resyncs_requested"], "messages": service.cache.messages,
            "resumed_from": service.resumed_from, "invalid": dict(service.cache.invalid),
        }))
    control.close()
    data.close()


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
              args["sources"])
    spawn("reporter", _reporter_proc, args, stop_all, ready, f"{work}/reporter")
    hosts: list[str] = []
    for _ in range(n_sched + 1):
        key, value = ready.get(timeout=120)
        if key == "reporter":
            hosts = value
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
    # Full resync: a fresh scheduler that asks every source.
    spawn("fresh", _scheduler_proc, args, "bench-fresh", stop_again, ready, f"{work}/fresh", None,
          dict.fromkeys(hosts, "bench-reporter"), len(hosts))
    _, full_resync_s = ready.get(timeout=120)
    stop_all.set()
    stop_again.set()
    for p in procs.values():
        p.join(60)

    def load(path: str) -> dict:
        with open(path, "rb") as f:
            return msgpack.unpackb(f.read(), strict_map_key=False)

    rep = load(f"{work}/reporter")
    first = {(s, e, q): t for s, e, q, t in rep["first_change"]}
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
    return {
        "sources": args["sources"], "schedulers": n_sched, "duration_s": args["duration"],
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
    }


def main(argv: list[str], prog: str = "shm bench stream") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--change-interval", type=float, default=1.0)
    parser.add_argument("--coalesce-window", type=float, default=0.01)
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    parser.add_argument("--down", type=float, default=10.0, help="seconds the restarted scheduler is down")
    parser.add_argument("--url", default=DEFAULT_URL, help="kombu URL of RabbitMQ (data plane)")
    parser.add_argument("--oslo-url", default=DEFAULT_OSLO_URL, help="oslo.messaging URL (control plane)")
    parser.add_argument("--json", help="write the figures to this file")
    ns = parser.parse_args(argv)
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

    names = [args["stream"], *args["topics"]]
    names += [f"{args['topics'][0]}.bench-reporter"]
    names += [f"{args['topics'][1]}.bench-s{i}" for i in range(args["schedulers"])]
    names += [f"{args['topics'][1]}.bench-fresh"]
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
