"""``shm bench ingest``: one scheduler process reading a large cloud's cell streams over RabbitMQ.

What is measured: the ingest of one scheduler, the part of its work that grows with the
hosts whatever the decisions (docs/capacity.md).  ``--hosts`` hosts in ``--cells`` cells,
one stream per cell on the broker at ``--url``, every host its own reporter as in a nova
deployment (one source per message), changing on average once per ``--change-interval``
seconds and sending a heartbeat every ``--heartbeat-interval`` seconds: nova's rates by
default (a report every 60 s, a heartbeat every 10 s).  The hosts' messages come from the
reporters' own state machines (``ReporterManager``, one per cell, driven in virtual time),
so every delta and heartbeat is what a reporter publishes and every digest matches.

Processes: the cloud (generates and publishes), the scheduler (a ``SchedulerService`` as
deployed, reading the deployment's stream and every cell's), the newcomer, and this one.
Three phases:

* **catch-up**: the streams hold every host's announcement and ``--backlog`` seconds of
  the cloud's traffic before the scheduler starts; measured: seconds and CPU seconds of the
  scheduler process until it applied all of it, so messages per CPU second achieved when
  the messages come in full batches;
* **live**: the cloud then publishes ``--live`` more seconds of traffic at its own pace
  (the rate it is meant to have), and the scheduler applies it as it comes; measured: the
  scheduler process's share of a core meanwhile (CPU seconds over wall seconds), CPU per
  message, publish-to-applied staleness (p50 and p99, bucket upper bounds) and the seconds
  it needed after the last publish to apply everything;
* **newcomer** (with ``--checkpoint-interval`` > 0): the scheduler publishes
  checkpoints of its whole view meanwhile (design §4.5) and one more at the end; a fresh
  scheduler process then starts with no state of its own, restores the newest checkpoint and
  reads every cell stream on from the checkpoint's offsets; measured: seconds and CPU
  seconds from its service start until every host is active and every cell stream applied
  to its end, and the resync requests it sent.

Both beside the rate needed (messages per second of the whole cloud) and the headroom
(achieved per CPU second over needed).  RabbitMQ, the cloud and the scheduler share this
machine's cores: the live phase reports the cloud's achieved rate too, and a cloud that
cannot publish at the rate it is meant to have says so.

Usage: ``shm bench ingest --hosts 100000 --cells 50 --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import resource
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: virtual seconds between the reporters' polls while the traffic is generated
TICK = 0.05


def _cell_names(cells: int) -> list[str]:
    return [f"cell{i + 1}" for i in range(cells)]


def _settings(url: str, name: str, confirms: bool = True, tail_probe_interval: float = 5.0
              ) -> Any:
    from transport.kombu_stream import StreamSettings

    return StreamSettings(url=url, name=name, publisher_confirms=confirms,
                          tail_probe_interval=tail_probe_interval)


def generate(hosts: int, cells: int, seconds: float, *, change_interval: float,
             heartbeat_interval: float, seed: int) -> dict[str, list[tuple[float, bytes]]]:
    """Each cell's messages in publish order, ``(virtual time, body)``: every host's
    announcement at 0, then ``seconds`` of changes and heartbeats."""
    from compute_reporter.manager import ReporterManager
    from compute_reporter.tracker import simulated_document
    from protocol.codec import Encoder
    from protocol.document import SET
    from protocol.hostdoc import COMPUTE, METRICS

    rng = random.Random(seed)
    encoder = Encoder()
    names = _cell_names(cells)
    out: dict[str, list[tuple[float, bytes]]] = {}
    for c, cell in enumerate(names):
        n = hosts // cells + (1 if c < hosts % cells else 0)
        sources = [f"{cell}-h{i:06d}" for i in range(n)]
        docs = {s: simulated_document(s, i, rng) for i, s in enumerate(sources)}
        manager = ReporterManager(f"bench-{cell}", docs, dict.fromkeys(sources, 1),
                                  coalesce_window=0.0, heartbeat_interval=heartbeat_interval,
                                  max_batch_items=1)
        messages: list[tuple[float, bytes]] = []
        rate = n / change_interval if change_interval > 0 else 0.0
        next_change = rng.expovariate(rate) if rate else float("inf")
        now = 0.0
        while True:
            while next_change <= now:
                manager.change(rng.choice(sources), [
                    [SET, COMPUTE, "num_io_ops", rng.randrange(0, 8)],
                    [SET, METRICS, "cpu.percent", rng.randrange(0, 100)]], next_change)
                next_change += rng.expovariate(rate)
            batches, _ = manager.poll(now)
            messages.extend((now, encoder.encode(b)) for b in batches)
            if now >= seconds:
                break
            now = round(now + TICK, 6)
        out[cell] = messages
    return out


def _cloud_proc(args: dict[str, Any], ready: Any, go: Any, report: Any) -> None:
    """Generate, publish the announcements and the backlog, then (on ``go``) the live part at
    its pace."""
    from transport.kombu_stream import KombuStreamPublisher

    t0 = time.time()
    traffic = generate(args["hosts"], args["cells"], args["backlog"] + args["live"],
                       change_interval=args["change_interval"],
                       heartbeat_interval=args["heartbeat_interval"], seed=args["seed"])
    generated_s = time.time() - t0
    publishers = {cell: KombuStreamPublisher(_settings(args["url"], f"{args['stream']}.{cell}",
                                                       confirms=False))
                  for cell in traffic}
    backlog = {cell: [body for t, body in msgs if t <= args["backlog"]]
               for cell, msgs in traffic.items()}
    live = sorted((t - args["backlog"], cell, body) for cell, msgs in traffic.items()
                  for t, body in msgs if t > args["backlog"])
    live_counts = Counter(cell for _, cell, _ in live)
    t1 = time.time()
    for cell, bodies in backlog.items():
        for body in bodies:
            publishers[cell].publish(body)
    ready.put({"backlog": {c: len(b) for c, b in backlog.items()},
               "live": {c: live_counts[c] for c in traffic},
               "generated_s": round(generated_s, 1),
               "backlog_published_s": round(time.time() - t1, 1)})
    go.wait()
    start = time.time()
    behind = 0.0
    for t, cell, body in live:
        delay = start + t - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            behind = max(behind, -delay)
        publishers[cell].publish(body)
    ended = time.time()
    report.put({"live_published": len(live), "live_seconds": round(ended - start, 2),
                "live_end": ended, "cloud_behind_max_s": round(behind, 2)})
    for p in publishers.values():
        p.close()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _delivered(service: Any) -> dict[str, int]:
    return {cell: (s.delivered if s is not None else 0)
            for cell, s in service.cell_stream_stats().items()}


def _staleness(service: Any) -> dict[str, list[int]]:
    """Each cell consumer's publish-to-applied staleness so far: cumulative bucket counts."""
    return {cell: s.staleness.snapshot()[0] for cell, s in service.cell_stream_stats().items()
            if s is not None and s.staleness is not None}


def _staleness_since(service: Any, before: dict[str, list[int]]) -> list[int]:
    """The staleness every cell consumer observed since ``before`` (:func:`_staleness`):
    cumulative counts per bucket, summed over the cells."""
    total: list[int] = []
    for cell, cumulative in _staleness(service).items():
        was = before.get(cell, [0] * len(cumulative))
        since = [c - w for c, w in zip(cumulative, was, strict=True)]
        total = since if not total else [t + c for t, c in zip(total, since, strict=True)]
    return total


def _scheduler_proc(args: dict[str, Any], expected: Any, go_live: Any, live_info: Any,
                    out: Any) -> None:
    from transport.metrics import LATENCY_BUCKETS, bucket_quantile

    backlog = expected.get()
    service, close = _service(args, "bench-ingest")
    cpu0, t0 = _cpu(), time.time()
    service.start()

    def wait_for(counts: dict[str, int], timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = _delivered(service)
            if all(got.get(c, 0) >= n for c, n in counts.items()):
                return True
            time.sleep(0.05)
        return False

    caught_up = wait_for(backlog, args["timeout"])
    t1, cpu1 = time.time(), _cpu()
    figures = service.figures()
    result: dict[str, Any] = {
        "catch_up": {"messages": sum(backlog.values()), "complete": caught_up,
                     "seconds": round(t1 - t0, 2), "cpu_seconds": round(cpu1 - cpu0, 2),
                     "held": figures["sources"]["held"],
                     "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}}
    before = _staleness(service)
    delivered_before = _delivered(service)
    go_live.set()
    t2, cpu2 = time.time(), _cpu()
    info = live_info.get()
    want = {c: delivered_before.get(c, 0) + n for c, n in info["live"].items()}
    live_done = wait_for(want, args["timeout"])
    t3, cpu3 = time.time(), _cpu()
    figures = service.figures()
    staleness = _staleness_since(service, before)
    live_messages = sum(info["live"].values())
    result["live"] = {
        "messages": live_messages, "complete": live_done,
        "seconds": round(t3 - t2, 2), "cpu_seconds": round(cpu3 - cpu2, 2),
        "drain_after_last_publish_s": round(max(0.0, t3 - info["live_end"]), 2),
        "staleness_p50_le_ms": _ms(bucket_quantile(LATENCY_BUCKETS, staleness, 0.5)),
        "staleness_p99_le_ms": _ms(bucket_quantile(LATENCY_BUCKETS, staleness, 0.99)),
        "cloud": {k: v for k, v in info.items() if k not in ("live", "live_end")}}
    result["receiver"] = {k: figures["receiver"].get(k, 0) for k in
                          ("applied", "snapshots", "gaps", "resyncs_requested", "divergences",
                           "went_down")}
    result["sources"] = figures["sources"]
    result["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if service.checkpoints is not None:
        service.checkpoints.publish()  # the newest, at the streams' end
        result["checkpoints_published"] = service.checkpoints.published
        result["checkpoint_lock_held_ms_max"] = round(service.checkpoints.held_s_max * 1e3, 1)
        result["checkpoint_pack_s_max"] = round(service.checkpoints.pack_s_max, 3)
    with service.cache.lock:
        result["final_offsets"] = dict(service.cache.cell_offsets)
    close()
    out.put(result)


def _service(args: dict[str, Any], name: str) -> tuple[Any, Callable[[], None]]:
    """A scheduler service reading the deployment's stream and every cell's, as deployed but
    for the control plane (nobody to answer: every message is on the streams), and what
    stops it and closes its planes."""
    from shared_host_manager.service import SchedulerService
    from transport.inprocess import InProcessBus
    from transport.kombu_stream import KombuStreamDataPlane

    top = KombuStreamDataPlane(_settings(args["url"], args["stream"]))
    planes = {cell: KombuStreamDataPlane(_settings(args["url"], f"{args['stream']}.{cell}",
                                                   tail_probe_interval=args["tail_probe_interval"]))
              for cell in _cell_names(args["cells"])}
    control = InProcessBus(threaded=True)
    service = SchedulerService(name, top, control, reporter_topic="r", scheduler_topic="s",
                               cell_planes=planes, down_interval=3 * args["heartbeat_interval"],
                               checkpoint_interval=args["checkpoint_interval"])

    def close() -> None:
        service.stop()
        for plane in (top, *planes.values()):
            plane.close()
        control.close()

    return service, close


def _newcomer_proc(args: dict[str, Any], final: dict[str, int], hosts: int, out: Any) -> None:
    """A fresh scheduler: restores the newest checkpoint, reads every cell stream to its end."""
    service, close = _service(args, "bench-newcomer")
    cpu0, t0 = _cpu(), time.time()
    service.start()
    restored_s = time.time() - t0
    ready = False
    deadline = t0 + args["timeout"]
    while time.time() < deadline:
        figures = service.figures()
        offsets = figures["cell_offsets"]
        if (figures["sources"]["active"] >= hosts
                and all(offsets.get(c, -1) >= o for c, o in final.items())):
            ready = True
            break
        time.sleep(0.02)
    t1, cpu1 = time.time(), _cpu()
    restored = service.checkpoints.restored if service.checkpoints is not None else None
    out.put({"ready": ready, "seconds": round(t1 - t0, 2), "cpu_seconds": round(cpu1 - cpu0, 2),
             "restore_seconds": round(restored_s, 2),
             "restored_sources": restored.sources if restored is not None else 0,
             "resyncs_requested": figures["receiver"].get("resyncs_requested", 0),
             "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
    close()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or seconds == float("inf") else round(1000 * seconds, 1)


def _delete_streams(url: str, names: list[str]) -> None:
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        for name in names:
            try:
                conn.channel().queue_delete(queue=name)
            except Exception:  # a stream never declared: nothing to delete
                pass


def run(args: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, report, expected, live_info, out = (ctx.Queue() for _ in range(5))
    go, go_live = ctx.Event(), ctx.Event()
    cloud = ctx.Process(target=_cloud_proc, args=(args, ready, go, report), name="cloud")
    sched = ctx.Process(target=_scheduler_proc, args=(args, expected, go_live, live_info, out),
                        name="scheduler")
    from shared_host_manager.checkpoint import SUFFIX

    names = [args["stream"], args["stream"] + SUFFIX,
             *(f"{args['stream']}.{c}" for c in _cell_names(args["cells"]))]
    try:
        cloud.start()
        counts = ready.get(timeout=args["timeout"])
        sched.start()
        expected.put(counts["backlog"])
        go_live.wait(args["timeout"] + 60)
        go.set()
        info = report.get(timeout=args["timeout"] + args["live"])
        live_info.put({**info, "live": counts["live"]})
        result = out.get(timeout=args["timeout"] + 60)
        sched.join(timeout=60)
        if args["checkpoint_interval"] > 0:
            newcomer = ctx.Process(target=_newcomer_proc, name="newcomer",
                                   args=(args, result.pop("final_offsets"), args["hosts"], out))
            newcomer.start()
            result["newcomer"] = out.get(timeout=args["timeout"] + 60)
            newcomer.join(timeout=60)
    finally:
        for p in (cloud, sched):
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        _delete_streams(args["url"], names)
    needed = args["hosts"] * (1 / args["change_interval"] + 1 / args["heartbeat_interval"])
    catch = result["catch_up"]
    live = result["live"]
    per_cpu = catch["messages"] / catch["cpu_seconds"] if catch["cpu_seconds"] else None
    result.update({
        "config": {k: args[k] for k in ("hosts", "cells", "change_interval",
                                        "heartbeat_interval", "backlog", "live", "seed",
                                        "tail_probe_interval", "checkpoint_interval")},
        "cloud": {k: counts[k] for k in ("generated_s", "backlog_published_s")},
        "needed_messages_per_s": round(needed),
        "catch_up_messages_per_cpu_s": round(per_cpu) if per_cpu else None,
        "live_cpu_share": round(live["cpu_seconds"] / live["seconds"], 3)
        if live["seconds"] else None,
        "live_cpu_us_per_message": round(1e6 * live["cpu_seconds"] / live["messages"], 1)
        if live["messages"] else None,
        "headroom": round(per_cpu / needed, 2) if per_cpu and needed else None,
    })
    return result


def main(argv: list[str] | None = None, prog: str = "shm bench ingest") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=100000)
    p.add_argument("--cells", type=int, default=50)
    p.add_argument("--change-interval", type=float, default=60.0,
                   help="seconds between a host's changes, on average (nova: 60)")
    p.add_argument("--heartbeat-interval", type=float, default=10.0)
    p.add_argument("--backlog", type=float, default=30.0,
                   help="seconds of the cloud's traffic on the streams before the scheduler starts")
    p.add_argument("--live", type=float, default=30.0,
                   help="seconds of traffic published at its pace once the scheduler caught up")
    p.add_argument("--tail-probe-interval", type=float, default=5.0,
                   help="the scheduler's [data_plane] tail_probe_interval (0: no probe)")
    p.add_argument("--checkpoint-interval", type=float, default=0.0,
                   help="the scheduler's [cache] checkpoint_interval; a newcomer then starts from "
                        "the newest checkpoint (0, the default: no checkpoints, no newcomer)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--url", default=DEFAULT_URL, help="kombu URL of RabbitMQ")
    p.add_argument("--json", help="write the figures to this file")
    a = p.parse_args(argv)
    if a.hosts < 1 or a.cells < 1 or a.cells > a.hosts:
        p.error("--hosts must be >= 1 and --cells between 1 and --hosts")
    if a.change_interval <= 0 or a.heartbeat_interval <= 0 or a.backlog < 0 or a.live <= 0:
        p.error("--change-interval, --heartbeat-interval and --live must be > 0, --backlog >= 0")
    args = {**vars(a), "stream": f"shm-bench-ingest-{uuid.uuid4().hex[:8]}"}
    result = run(args)
    catch, live = result["catch_up"], result["live"]
    print(f"{a.hosts} hosts in {a.cells} cells, one source per message; needed "
          f"{result['needed_messages_per_s']} messages/s")
    print(f"  catch-up: {catch['messages']} messages in {catch['seconds']} s, "
          f"{catch['cpu_seconds']} CPU s: {result['catch_up_messages_per_cpu_s']} per CPU second "
          f"(headroom {result['headroom']}x); {catch['held']} hosts held, RSS {catch['rss_mb']} MB")
    print(f"  live: {live['messages']} messages in {live['seconds']} s, {live['cpu_seconds']} CPU s "
          f"({result['live_cpu_share']} of a core, {result['live_cpu_us_per_message']} us a "
          f"message); staleness p50 <= {live['staleness_p50_le_ms']} ms, p99 <= "
          f"{live['staleness_p99_le_ms']} ms; applied {live['drain_after_last_publish_s']} s "
          f"after the last publish; cloud behind its pace by up to "
          f"{live['cloud']['cloud_behind_max_s']} s")
    if "checkpoint_pack_s_max" in result:
        print(f"  checkpoints: {result['checkpoints_published']} published, each holding the "
              f"cache lock <= {result['checkpoint_lock_held_ms_max']} ms, packed outside it in "
              f"<= {result['checkpoint_pack_s_max']} s")
    newcomer = result.get("newcomer")
    if newcomer is not None:
        print(f"  newcomer from the newest checkpoint ({newcomer['restored_sources']} hosts): "
              f"ready in {newcomer['seconds']} s ({newcomer['cpu_seconds']} CPU s), "
              f"{newcomer['resyncs_requested']} resync requests")
    print(f"  receiver: {result['receiver']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    complete = catch["complete"] and live["complete"] and (newcomer is None or newcomer["ready"])
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
