"""Update-log benchmark: what recording costs on the ingest path, and how fast a log replays.

What it measures (one process, one thread; run on a quiet machine):

* ``overhead_pct`` – ingest throughput of :class:`~shared_host_manager.cache.HostStateCache`
  (``ingest_stream`` of encoded batches: decode, receive under the lock, and
  the recorder's hooks) with an update log versus without, side by side: each
  batch goes to a plain cache and to a recording one back to back (the order
  alternating per batch), every call timed on its own in CPU time of the
  ingesting thread, so other processes on a shared machine do not skew it
  (deltas per CPU-second); medians over ``--runs`` rounds.  The recording
  cache's clock is its own accumulated ingest time, so it writes a checkpoint
  every ``--checkpoint-interval`` seconds of ingest work, exactly as a
  saturated scheduler would (with the default 5 s, runs shorter than that
  contain no checkpoint: see ``checkpoint_ms``); the timed region includes the
  final flush of the log buffer.  A timer tick every
  ``--tick`` seconds (the scheduler's timer thread) runs in both.
* ``checkpoint_ms`` – one checkpoint right after every view changed: with
  every view digested, and with the default digest budget (what a saturated
  scheduler pays, and holds its cache lock for, once per interval), so the
  overhead at any interval and source count can be worked out.
* ``replay_records_per_s`` – ``shm replay`` speed over the recorded log
  (decode + receive + every check), median over the runs.

The workload is :class:`simulator.bench_protocol.Workload` (realistic compute
documents, single-field changes, boots and deletions, batched).

Run it as ``python -m simulator.bench_updatelog`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from protocol.receiver import ReceiverMachine
from shared_host_manager.cache import HostStateCache
from shared_host_manager.updatelog.reader import resolve_log
from shared_host_manager.updatelog.recorder import Recorder
from shared_host_manager.updatelog.replay import replay
from simulator.bench_protocol import Workload


def _cache(recorder: Recorder | None, clock: Any = time.monotonic) -> HostStateCache:
    receiver = ReceiverMachine("bench-scheduler", down_interval=1e9)
    return HostStateCache(receiver, lambda endpoint, msg: None, recorder=recorder, clock=clock)


class _WorkClock:
    """The recording cache's clock: seconds of its own ingest work so far, so it checkpoints
    every ``interval`` seconds of work, exactly as a saturated scheduler does."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _ingest_side_by_side(work: Workload, recorder: Recorder, tick: float
                         ) -> tuple[float, float, HostStateCache, HostStateCache]:
    """Feed every batch to a plain cache and to a recording one, back to back.

    The order alternates per batch and each call is timed on its own in CPU
    time of this thread (``time.thread_time``: time spent descheduled by other
    processes is not counted), so both caches see the same machine.
    Returns (plain seconds, recording seconds, plain cache, recording cache).
    """
    work_clock = _WorkClock()
    plain, recording = _cache(None), _cache(recorder, work_clock)
    for offset, body in enumerate(work.snapshot_bytes):  # establish every source (not timed)
        plain.ingest_stream(body, offset)
        recording.ingest_stream(body, offset)
    base = len(work.snapshot_bytes)
    a, b = plain.ingest_stream, recording.ingest_stream
    clock = time.thread_time
    ta = tb = 0.0
    gc.collect()
    next_tick = time.monotonic() + tick
    for i, body in enumerate(work.batches):
        offset = base + i
        if i & 1:
            t0 = clock()
            a(body, offset)
            t1 = clock()
            b(body, offset)
            t2 = clock()
            ta += t1 - t0
            tb += t2 - t1
            work_clock.t = tb
        else:
            t0 = clock()
            b(body, offset)
            t1 = clock()
            a(body, offset)
            t2 = clock()
            tb += t1 - t0
            ta += t2 - t1
            work_clock.t = tb
        if time.monotonic() >= next_tick:
            t0 = clock()
            plain.tick()
            t1 = clock()
            recording.tick()
            t2 = clock()
            ta += t1 - t0
            tb += t2 - t1
            next_tick += tick
    t0 = clock()
    recorder.flush()
    tb += clock() - t0
    return ta, tb, plain, recording


def _checkpoint_ms(work: Workload, directory: str, interval: float) -> tuple[float, float]:
    """One checkpoint right after every view changed, in ms (median of 5): with an
    unlimited digest budget, and with the recorder's default budget for ``interval``."""
    out = []
    for budget in (float("inf"), None):
        rec = Recorder(os.path.join(directory, str(budget)), checkpoint_interval=interval,
                       digest_budget=budget)
        cache = _cache(rec)
        for offset, body in enumerate(work.snapshot_bytes):
            cache.ingest_stream(body, offset)
        times = []
        for _ in range(5):
            for view in cache.receiver.sources.values():
                view._digest = None  # as after a change
                view.seq += 1
            with cache.lock:
                t0 = time.thread_time()
                rec._checkpoint(cache.clock())
                times.append((time.thread_time() - t0) * 1e3)
        rec.close()
        out.append(statistics.median(times))
    return out[0], out[1]


def run(*, hosts: int = 2000, deltas: int = 200_000, batch: int = 100, runs: int = 5,
        checkpoint_interval: float = 5.0, tick: float = 0.05, seed: int = 1,
        progress: Any = None) -> dict[str, Any]:
    say = progress or (lambda text: None)
    say(f"generating {deltas} deltas from {hosts} sources ...")
    work = Workload(hosts=hosts, deltas=deltas, batch=batch, instances=20, boot_fraction=0.2,
                    seed=seed, keyring=None)
    n = len(work.items)
    top = tempfile.mkdtemp(prefix="shm-bench-ulog-")
    per_run: list[dict[str, Any]] = []
    try:
        for i in range(runs):
            directory = os.path.join(top, f"run{i}")
            rec = Recorder(directory, checkpoint_interval=checkpoint_interval)
            t_plain, t_record, plain, recording = _ingest_side_by_side(work, rec, tick)
            rec.close()
            times = {"plain": t_plain, "record": t_record}
            a, b = plain.receiver, recording.receiver
            if a.stats["applied"] != b.stats["applied"] or a.stats["applied"] < n:
                raise RuntimeError(f"run {i}: applied {a.stats['applied']} / {b.stats['applied']} of {n}")
            del plain, recording, a, b
            parts = resolve_log(os.path.join(directory, "scheduler-bench-scheduler.ulog"))
            log_bytes = sum(os.path.getsize(p) for p in parts)
            gc.collect()
            cpu0 = time.thread_time()
            result = replay(parts)
            replay_cpu = time.thread_time() - cpu0
            if not result.ok or result.damage is not None:
                raise RuntimeError(f"run {i}: replay failed: {result.mismatches[:1]} "
                                   f"{result.effect_mismatches[:1]} {result.damage}")
            r = {
                "plain_deltas_per_s": n / times["plain"],
                "record_deltas_per_s": n / times["record"],
                "overhead_pct": (times["record"] / times["plain"] - 1) * 100,
                "replay_records_per_s": result.records / replay_cpu,
                "replay_deltas_per_s": n / replay_cpu,
                "replay_records_per_wall_s": result.records_per_s,
                "records": result.records,
                "checkpoints": result.checkpoints,
                "log_bytes": log_bytes,
                "checkpoint_digests": result.digests_verified,
            }
            per_run.append(r)
            say(f"run {i + 1}/{runs}: plain {r['plain_deltas_per_s']:,.0f} deltas/s, recording "
                f"{r['record_deltas_per_s']:,.0f} ({r['overhead_pct']:+.1f} %), replay "
                f"{r['replay_records_per_s']:,.0f} records/s ({r['checkpoints']} checkpoints)")
            shutil.rmtree(directory, ignore_errors=True)
        checkpoint_ms, checkpoint_bounded_ms = _checkpoint_ms(work, os.path.join(top, "checkpoint"),
                                                              checkpoint_interval)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}
    plain, record = med["plain_deltas_per_s"], med["record_deltas_per_s"]
    return {
        "benchmark": "updatelog",
        "plain_deltas_per_s": plain,
        "record_deltas_per_s": record,
        "overhead_pct": (plain / record - 1) * 100,
        "overhead_pct_median_of_pairs": med["overhead_pct"],
        "replay_records_per_s": med["replay_records_per_s"],
        "replay_checkpoint_digests": med["checkpoint_digests"],
        "replay_deltas_per_s": med["replay_deltas_per_s"],
        "replay_records_per_wall_s": med["replay_records_per_wall_s"],
        "checkpoint_ms_all_views_changed": checkpoint_ms,
        "checkpoint_ms_bounded": checkpoint_bounded_ms,
        "log_bytes_per_delta": med["log_bytes"] / n,
        "params": {"hosts": hosts, "deltas": n, "batch": batch, "batches": len(work.batches),
                   "runs": runs, "checkpoint_interval": checkpoint_interval, "tick": tick,
                   "seed": seed, "batch_bytes_mean": work.stream_bytes / len(work.batches),
                   "msgpack": ".".join(map(str, __import__("msgpack").version))},
        "runs": per_run,
    }


def format_table(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [
        f"update log: {p['hosts']} sources, {p['deltas']:,} deltas in {p['batches']:,} batches "
        f"(~{p['batch_bytes_mean']:,.0f} B each), {p['runs']} runs, checkpoint every "
        f"{p['checkpoint_interval']} s",
        f"  ingest without log   {r['plain_deltas_per_s']:>12,.0f} deltas per CPU-second (median)",
        f"  ingest with log      {r['record_deltas_per_s']:>12,.0f} deltas per CPU-second (median)",
        f"  recording overhead   {r['overhead_pct']:>12.1f} %  (median of per-round pairs: "
        f"{r['overhead_pct_median_of_pairs']:.1f} %)",
        f"  one checkpoint       {r['checkpoint_ms_all_views_changed']:>12.1f} ms with all "
        f"{p['hosts']} views changed and digested; {r['checkpoint_ms_bounded']:.1f} ms with the "
        f"default digest budget (the rest are digested at later checkpoints)",
        f"  log size             {r['log_bytes_per_delta']:>12.1f} bytes per delta",
        f"  replay               {r['replay_records_per_s']:>12,.0f} records per CPU-second "
        f"({r['replay_deltas_per_s']:,.0f} deltas; {r['replay_records_per_wall_s']:,.0f} records "
        f"per wall second; median)",
        "  per run: " + ", ".join(f"{x['overhead_pct']:+.1f}%" for x in r["runs"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "shm bench updatelog") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="deltas per stream message")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--checkpoint-interval", type=float, default=5.0)
    parser.add_argument("--tick", type=float, default=0.05, help="timer tick interval (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args(argv)
    result = run(hosts=args.hosts, deltas=args.deltas, batch=args.batch, runs=args.runs,
                 checkpoint_interval=args.checkpoint_interval, tick=args.tick, seed=args.seed,
                 progress=lambda text: print(text, file=sys.stderr))
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
