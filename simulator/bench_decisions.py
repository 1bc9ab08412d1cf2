"""``shm bench decisions``: scheduling decisions per second in one process.

What is measured: :meth:`DecisionEngine.select_destinations` for one-instance
requests over ``--hosts`` synthetic hosts held by a real ReceiverMachine, with
the default filters and weighers (``[filter_scheduler] enabled_filters`` /
``weight_classes`` defaults): nova 34's own classes through the vector core
(``[filter_scheduler] decision_core = nova``; the names nova has no class for,
ResourceFitFilter and AvailabilityZoneFilter, are the engine's).  A decision is everything the scheduler does
before the claim leaves: index sync, filtering, weighing, the random pick
among the top hosts, alternates, building the claim, registering it as
pending, and returning it (not cast here: the transport is not measured).
Also reported: how many changed rows per second the index recomputes after
ingest (``index_sync_rows_per_s``), and the scheduler's memory per host
(``rss_per_host_bytes``: the resident set the fast path's receiver, documents,
index and decision state add once its runs are done, divided by the hosts;
Linux only, else null).  The request mix exercises the
per-host-group filters: a third ask for an architecture, a
fifth for an availability zone, a tenth for aggregate extra specs, a
twentieth for anti-affinity.

Both paths run on the same cloud and request sequence: the vectorised fast
path (``decisions_per_s``) and nova's per-host slow path
(``slow_decisions_per_s``); the median of ``--runs`` runs is reported, with
every run.  Between runs the pending claims are expired (untimed) so every run
starts from the same free capacity.

The floors this benchmark is held to (docs/benchmarks.md): 3 000 decisions/s
on the fast path at 1 000 hosts, 1 000/s at 10 000.

Usage: ``shm bench decisions --hosts 1000 --json out.json [--runs 5]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import resource
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np

from protocol.document import SET
from protocol.messages import Delta
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.engine import FAST, SLOW, DecisionEngine, NoValidHost
from shared_host_manager.decision.request import Flavor, InstanceGroup, RequestSpec
from shared_host_manager.gc_threshold import add_option, tuned
from simulator.simulation import MISSING_NOVA, nova_installed
from simulator.synthetic_hosts import cloud, load_receiver

FLAVORS = (Flavor(1, 512, 10), Flavor(2, 4096, 20), Flavor(4, 8192, 40), Flavor(8, 16384, 80),
           Flavor(2, 2048, 20, extra_specs={"ssd": "true"}))


def request_mix(count: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    ids = random.Random(-seed)  # instance uuids: the flavors drawn stay those of earlier runs
    specs = []
    for i in range(count):
        flavor = FLAVORS[4] if i % 10 == 9 else FLAVORS[rng.randrange(4)]
        specs.append(RequestSpec(
            flavor=flavor,
            image_properties={"hw_architecture": "x86_64"} if i % 3 == 0 else {},
            availability_zone="az1" if i % 5 == 0 else None,
            instance_group=InstanceGroup("anti-affinity", members=[f"m{i}"]) if i % 20 == 0 else None,
            project_id="p1", instance_uuids=[str(uuid.UUID(int=ids.getrandbits(128), version=4))],
            request_id=f"r{i}"))
    return specs


def _rss_bytes() -> int | None:
    """This process's resident set now (not the peak: the peak includes freed set-up garbage)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return None


def _run(engine: DecisionEngine, specs: list[RequestSpec], now: float
         ) -> tuple[float, float, int]:
    """Decide ``specs``: (wall seconds, CPU seconds of this process, NoValidHost count)."""
    failed = 0
    select = engine.select_destinations
    start, cpu = time.perf_counter(), time.process_time()
    for spec in specs:
        try:
            select(spec, now)
        except NoValidHost:
            failed += 1
    return time.perf_counter() - start, time.process_time() - cpu, failed


def _engine(path: str, hosts: int, seed: int) -> DecisionEngine:
    receiver = load_receiver(cloud(hosts, seed), name=f"bench-{path}", down_interval=1e12,
                             claim_deadline=1.0)
    return DecisionEngine(receiver, config=SchedulerConfig(),
                          path=path, rng=random.Random(seed))


def measure(path: str, hosts: int, decisions: int, runs: int, seed: int) -> dict[str, Any]:
    """``runs`` timed runs of ``decisions`` decisions on ``path``."""
    gc.collect()
    rss_before = _rss_bytes()
    setup, setup_cpu = time.perf_counter(), time.process_time()
    engine = _engine(path, hosts, seed)
    setup_s, setup_cpu_s = time.perf_counter() - setup, time.process_time() - setup_cpu
    now = 0.0
    rates: list[float] = []
    cpu_rates: list[float] = []
    failures: list[int] = []
    for run in range(runs):
        elapsed, cpu, failed = _run(engine, request_mix(decisions, seed * 1000 + run), now)
        rates.append(decisions / elapsed)
        cpu_rates.append(decisions / cpu if cpu > 0 else 0.0)
        failures.append(failed)
        # untimed: expire this run's claims so every run starts from the same capacity
        now += 2.0
        engine.receiver.tick(now)
        engine.receiver.drain_outcomes()
        engine.index.sync()
    # after the runs: what a deciding scheduler holds (pending claims expired, index synced);
    # the synthetic documents stay referenced by the receiver, as decoded ones would
    gc.collect()
    rss_after = _rss_bytes()
    rss_per_host = (None if rss_before is None or rss_after is None
                    else round((rss_after - rss_before) / hosts))
    return {
        "path": path, "decisions_per_run": decisions,
        "runs": [round(r, 1) for r in rates], "median": round(statistics.median(rates), 1),
        # per second of this process's CPU: the figure a busy machine disturbs least
        "cpu_runs": [round(r, 1) for r in cpu_rates],
        "cpu_median": round(statistics.median(cpu_rates), 1),
        "no_valid_host": failures, "setup_s": round(setup_s, 3),
        "setup_cpu_s": round(setup_cpu_s, 3),
        "rss_before_mb": None if rss_before is None else round(rss_before / 2**20, 1),
        "rss_after_mb": None if rss_after is None else round(rss_after / 2**20, 1),
        "rss_per_host_bytes": rss_per_host,
        "filters": [f.name for f in engine.filters],
        "weighers": [w.name for w in engine.weighers],
    }


def measure_sync(hosts: int, seed: int, rounds: int = 5) -> tuple[float, float]:
    """Rows per second :meth:`HostIndex.sync` recomputes after deltas (the per-ingest cost):
    per wall second and per CPU second of this process (medians)."""
    receiver = load_receiver(cloud(hosts, seed), name="bench-sync", down_interval=1e12)
    engine = DecisionEngine(receiver, rng=random.Random(seed))
    changed = min(hosts, 2000)
    rates, cpu_rates = [], []
    for r in range(rounds):
        for i in range(changed):
            source = f"cn-{i:05d}"
            receiver.receive(Delta(source, 1, r + 1, [[SET, "compute", "num_io_ops", r % 3]]), 0.0)
        start, cpu = time.perf_counter(), time.process_time()
        engine.index.sync()
        rates.append(changed / (time.perf_counter() - start))
        cpu_s = time.process_time() - cpu
        cpu_rates.append(changed / cpu_s if cpu_s > 0 else 0.0)
    return round(statistics.median(rates), 1), round(statistics.median(cpu_rates), 1)


def main(argv: list[str] | None = None, prog: str = "shm bench decisions") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000, help="number of hosts (default 1000)")
    parser.add_argument("--runs", type=int, default=5, help="runs per path; the median is reported")
    parser.add_argument("--decisions", type=int, default=3000,
                        help="fast-path decisions per run (default 3000)")
    parser.add_argument("--slow-decisions", type=int, default=None,
                        help="slow-path decisions per run (default: about 2 s of work per run)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    add_option(parser, "deciding")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.hosts < 1 or args.runs < 1 or args.decisions < 1:
        parser.error("--hosts, --runs and --decisions must be positive")
    if not nova_installed():
        parser.error(MISSING_NOVA)
    from shared_host_manager.nova.testing import fixtures as nova_fixtures

    nova_fixtures.setup_nova()
    with tuned(args.gc_young_threshold):
        return _measure_and_report(args)


def _measure_and_report(args: argparse.Namespace) -> int:
    slow_decisions = args.slow_decisions or max(3, min(args.decisions, 200_000 // args.hosts))

    fast = measure(FAST, args.hosts, args.decisions, args.runs, args.seed)
    slow = measure(SLOW, args.hosts, slow_decisions, args.runs, args.seed)
    sync_rate, sync_cpu_rate = measure_sync(args.hosts, args.seed)
    result = {
        "benchmark": "decisions",
        "hosts": args.hosts,
        "decisions_per_s": fast["median"],
        "slow_decisions_per_s": slow["median"],
        "ratio": round(fast["median"] / slow["median"], 1) if slow["median"] else None,
        "index_sync_rows_per_s": sync_rate,
        "index_sync_rows_per_cpu_s": sync_cpu_rate,
        # measured around the fast path, which runs first: the slow path's engine is built later
        "rss_per_host_bytes": fast["rss_per_host_bytes"],
        "gc_young_threshold": args.gc_young_threshold,
        "fast": fast,
        "slow": slow,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    print(f"{args.hosts} hosts, default filters and weighers, median of {args.runs} runs:")
    for name, m in (("fast", fast), ("slow", slow)):
        print(f"  {name} path: {m['median']:>10.1f} decisions/s   runs {m['runs']}   "
              f"per CPU second {m['cpu_median']:.1f}")
    print(f"  ratio:     {result['ratio']}x (fast / slow)")
    print(f"  index sync after ingest: {sync_rate:.0f} changed rows/s, "
          f"per CPU second {sync_cpu_rate:.0f}")
    if fast["rss_per_host_bytes"] is not None:
        print(f"  memory: {fast['rss_per_host_bytes']} bytes per host (resident set "
              f"{fast['rss_before_mb']} -> {fast['rss_after_mb']} MB); set-up "
              f"{fast['setup_s']} s, {fast['setup_cpu_s']} s CPU")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
