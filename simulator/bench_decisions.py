"""``shm bench decisions``: scheduling decisions per second in one process.

What is measured: :meth:`DecisionEngine.select_destinations` for one-instance
requests over ``--hosts`` synthetic hosts held by a real ReceiverMachine, with
the default filters and weighers (``[filter_scheduler] enabled_filters`` /
``weight_classes`` defaults).  A decision is everything the scheduler does
before the claim leaves: index sync, filtering, weighing, the random pick
among the top hosts, alternates, building the claim, registering it as
pending, and handing it to ``send_claim`` (a no-op here: the transport is not
measured).  Also reported: how many changed rows per second the index
recomputes after ingest (``index_sync_rows_per_s``).  The request mix
exercises the per-host-group filters: a third ask for an architecture, a
fifth for an availability zone, a tenth for aggregate extra specs, a
twentieth for anti-affinity.

Both paths run on the same cloud and request sequence: the vectorised fast
path (``decisions_per_s``) and nova's per-host slow path
(``slow_decisions_per_s``); the median of ``--runs`` runs is reported, with
every run.  Between runs the pending claims are expired (untimed) so every run
starts from the same free capacity.

``--core nova`` decides with nova 34's own filter and weigher classes through
the vector core instead of the engine's own (design §10, item 13; names nova has
no class for, ResourceFitFilter and AvailabilityZoneFilter, stay the engine's);
``--core both`` measures the two side by side, run by run, and checks first that
they rank the hosts of the first requests alike.  Both need nova installed.

Usage: ``shm bench decisions --hosts 1000 --json out.json [--runs 5] [--core own|nova|both]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
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


def _run(engine: DecisionEngine, specs: list[RequestSpec], now: float) -> tuple[float, int]:
    failed = 0
    select = engine.select_destinations
    start = time.perf_counter()
    for spec in specs:
        try:
            select(spec, now)
        except NoValidHost:
            failed += 1
    return time.perf_counter() - start, failed


def _engine(path: str, hosts: int, seed: int, core: str) -> DecisionEngine:
    receiver = load_receiver(cloud(hosts, seed), name=f"bench-{path}", down_interval=1e12,
                             claim_deadline=1.0)
    return DecisionEngine(receiver, lambda claim: None, config=SchedulerConfig(decision_core=core),
                          path=path, rng=random.Random(seed))


def measure(path: str, hosts: int, decisions: int, runs: int, seed: int,
            cores: tuple[str, ...] = ("own",)) -> list[dict[str, Any]]:
    """Per core, ``runs`` timed runs of ``decisions`` decisions; the cores take turns run by
    run (side by side on a noisy machine)."""
    engines, setups = [], []
    for core in cores:
        setup = time.perf_counter()
        engines.append(_engine(path, hosts, seed, core))
        setups.append(time.perf_counter() - setup)
    now = 0.0
    rates: list[list[float]] = [[] for _ in cores]
    failures: list[list[int]] = [[] for _ in cores]
    for run in range(runs):
        specs = request_mix(decisions, seed * 1000 + run)
        for k, engine in enumerate(engines):
            elapsed, failed = _run(engine, specs, now)
            rates[k].append(decisions / elapsed)
            failures[k].append(failed)
        # untimed: expire this run's claims so every run starts from the same capacity
        now += 2.0
        for engine in engines:
            engine.receiver.tick(now)
            engine.receiver.drain_outcomes()
            engine.index.sync()
    return [{
        "path": path, "core": core, "decisions_per_run": decisions,
        "runs": [round(r, 1) for r in rates[k]], "median": round(statistics.median(rates[k]), 1),
        "no_valid_host": failures[k], "setup_s": round(setups[k], 3),
        "filters": [f.name for f in engines[k].filters],
        "weighers": [w.name for w in engines[k].weighers],
    } for k, core in enumerate(cores)]


def cores_agree(hosts: int, seed: int, requests: int = 20) -> bool:
    """The engine's own filters and weighers and nova's classes rank the hosts of the first
    ``requests`` requests alike (the same hosts in the same order, weights within 1e-9)."""
    own, nova = _engine(FAST, hosts, seed, "own"), _engine(FAST, hosts, seed, "nova")
    for spec in request_mix(requests, seed):
        a, b = own.ordered_hosts(spec), nova.ordered_hosts(spec)
        if [s for s, _ in a] != [s for s, _ in b] or any(
                abs(x - y) > 1e-9 for (_, x), (_, y) in zip(a, b, strict=True)):
            return False
    return True


def measure_sync(hosts: int, seed: int, rounds: int = 5) -> float:
    """Rows per second :meth:`HostIndex.sync` recomputes after deltas (the per-ingest cost)."""
    receiver = load_receiver(cloud(hosts, seed), name="bench-sync", down_interval=1e12)
    engine = DecisionEngine(receiver, lambda claim: None, rng=random.Random(seed))
    changed = min(hosts, 2000)
    rates = []
    for r in range(rounds):
        for i in range(changed):
            source = f"cn-{i:05d}"
            receiver.receive(Delta(source, 1, r + 1, [[SET, "compute", "num_io_ops", r % 3]]), 0.0)
        start = time.perf_counter()
        engine.index.sync()
        rates.append(changed / (time.perf_counter() - start))
    return round(statistics.median(rates), 1)


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
    parser.add_argument("--core", choices=("own", "nova", "both"), default="own",
                        help="whose filter and weigher classes decide: the engine's own "
                             "(default), nova 34's through the vector core, or both side by "
                             "side (nova needs: pip install 'shared-host-manager[nova]')")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.hosts < 1 or args.runs < 1 or args.decisions < 1:
        parser.error("--hosts, --runs and --decisions must be positive")
    cores: tuple[str, ...] = ("own", "nova") if args.core == "both" else (args.core,)
    if "nova" in cores:
        import importlib.util

        if importlib.util.find_spec("nova") is None:
            parser.error(f"--core {args.core} needs nova; pip install 'shared-host-manager[nova]'")
        from shared_host_manager.nova.testing import fixtures as nova_fixtures

        nova_fixtures.setup_nova()
    slow_decisions = args.slow_decisions or max(3, min(args.decisions, 200_000 // args.hosts))

    agree = cores_agree(args.hosts, args.seed) if args.core == "both" else None
    fast = measure(FAST, args.hosts, args.decisions, args.runs, args.seed, cores)
    slow = measure(SLOW, args.hosts, slow_decisions, args.runs, args.seed, cores)
    sync_rate = measure_sync(args.hosts, args.seed)
    result = {
        "benchmark": "decisions",
        "hosts": args.hosts,
        "core": args.core,
        "decisions_per_s": fast[0]["median"],
        "slow_decisions_per_s": slow[0]["median"],
        "ratio": round(fast[0]["median"] / slow[0]["median"], 1) if slow[0]["median"] else None,
        "index_sync_rows_per_s": sync_rate,
        "fast": fast[0],
        "slow": slow[0],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    if len(cores) == 2:
        result["nova_core"] = {"fast": fast[1], "slow": slow[1], "same_ranking": agree,
                               "fast_ratio": round(fast[1]["median"] / fast[0]["median"], 3)}
    print(f"{args.hosts} hosts, default filters and weighers, median of {args.runs} runs:")
    for k, core in enumerate(cores):
        label = "" if len(cores) == 1 and core == "own" else f" ({core})"
        print(f"  fast path{label}: {fast[k]['median']:>10.1f} decisions/s   runs {fast[k]['runs']}")
        print(f"  slow path{label}: {slow[k]['median']:>10.1f} decisions/s   runs {slow[k]['runs']}")
        ratio = round(fast[k]["median"] / slow[k]["median"], 1) if slow[k]["median"] else None
        print(f"  ratio{label}:     {ratio}x (fast / slow)")
    if len(cores) == 2:
        print(f"  nova's classes / own, fast path: {result['nova_core']['fast_ratio']}x; "
              f"same ranking of the first requests: {'yes' if agree else 'NO'}")
    print(f"  index sync after ingest: {sync_rate:.0f} changed rows/s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
