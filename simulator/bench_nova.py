"""``shm bench nova``: select_destinations time, nova 34's DB-fed HostManager vs SharedHostManager.

Same process, same ComputeNodes, same filters and weighers, same fake placement
(every host is a candidate, every claim succeeds), nova's real
``SchedulerManager.select_destinations(..., return_objects=True,
return_alternates=True)`` on both sides:

* **nova**: nova's own HostManager reading nova's schema in SQLite files
  (created from nova's models; cell mapping, one Service per host, the
  ComputeNodes, host mappings and instances written as nova writes them).  The
  computes' instance info is synced first, as ``sync_instance_info`` does every
  120 s in a deployment, so nova does not query instances per host; the
  request filters run for real (``owner_nova_filter`` queries the service
  versions).
* **shared**: SharedHostManager over a cache holding the documents the compute
  hook makes of the same ComputeNodes.

The two run in alternating rounds (so machine noise hits both), after warm-up
requests; the figure is the median per request.  SQLite is local and in the
page cache, i.e. the cheapest database nova can have: a networked MySQL only
widens the gap.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings
from typing import Any

DEFAULT_FILTERS = ["ComputeFilter", "ComputeCapabilitiesFilter", "ImagePropertiesFilter",
                   "ServerGroupAntiAffinityFilter", "ServerGroupAffinityFilter"]


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=1000, help="compute nodes (default 1000)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--requests", type=int, default=5, help="timed requests per side per round (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per side first (default 2)")
    p.add_argument("--instances-per-host", type=int, default=2, help="instances on each host (default 2)")
    p.add_argument("--numa", action="store_true",
                   help="add NUMATopologyFilter (nova's costliest filter) to nova's default filters")
    p.add_argument("--filters", help="comma-separated enabled_filters (default: nova's defaults)")
    p.add_argument("--unsynced-instance-info", action="store_true",
                   help="do not sync instance info first: nova then queries instances per host")
    p.add_argument("--dir", help="directory for the SQLite files (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p


class _SqlCounter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *args: Any) -> None:
        self.n += 1


def main(argv: list[str] | None = None, prog: str = "shm bench nova") -> int:
    args = build_parser(prog).parse_args(argv)
    warnings.simplefilter("ignore")
    logging.getLogger("nova").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="shm-bench-nova-") as tmp:
        result = run(args, args.dir or tmp)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print(result)
    return 0


def run(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from shared_host_manager.nova import fixtures as fx

    filters = args.filters.split(",") if args.filters else list(DEFAULT_FILTERS)
    if args.numa and "NUMATopologyFilter" not in filters:
        filters.append("NUMATopologyFilter")
    t0 = time.perf_counter()
    pair = fx.SchedulerPair(directory, hosts=args.hosts, filters=filters,
                            instances_per_host=args.instances_per_host,
                            sync_instance_info=not args.unsynced_instance_info)
    setup_s = time.perf_counter() - t0
    counter = _SqlCounter()
    event.listen(Engine, "before_cursor_execute", counter)
    samples: dict[str, list[float]] = {"nova": [], "shared": []}
    statements: dict[str, list[int]] = {"nova": [], "shared": []}
    seq = iter(range(10**9))

    def one(side: str, timed: bool) -> None:
        instance = fx.uuid_for(f"bench-{side}", next(seq))
        counter.n = 0
        start = time.perf_counter()
        selected = pair.select(side, instance)
        elapsed = time.perf_counter() - start
        assert selected >= 1
        if timed:
            samples[side].append(elapsed)
            statements[side].append(counter.n)

    try:
        for side in pair.SIDES:
            with pair.side(side):
                for _ in range(args.warmup):
                    one(side, False)
        for _ in range(args.rounds):
            for side in pair.SIDES:
                with pair.side(side):
                    for _ in range(args.requests):
                        one(side, True)
    finally:
        event.remove(Engine, "before_cursor_execute", counter)
        pair.close()
    out: dict[str, Any] = {
        "hosts": args.hosts, "filters": filters, "instances_per_host": args.instances_per_host,
        "instance_info_synced": not args.unsynced_instance_info, "setup_s": round(setup_s, 2),
        "samples_per_side": len(samples["nova"]),
    }
    for side in ("nova", "shared"):
        xs = sorted(samples[side])
        out[side] = {
            "median_ms": round(statistics.median(xs) * 1000, 1),
            "min_ms": round(xs[0] * 1000, 1),
            "max_ms": round(xs[-1] * 1000, 1),
            "sql_per_request": statistics.median(statements[side]),
        }
    out["speedup"] = round(out["nova"]["median_ms"] / out["shared"]["median_ms"], 2)
    return out


def _print(r: dict[str, Any]) -> None:
    print(f"select_destinations, {r['hosts']} hosts, filters: {', '.join(r['filters'])}")
    print(f"instances/host {r['instances_per_host']}, instance info synced: {r['instance_info_synced']}, "
          f"{r['samples_per_side']} timed requests per side (setup {r['setup_s']} s)")
    print(f"{'':10} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'SQL/request':>12}")
    for side, label in (("nova", "nova (DB)"), ("shared", "shared")):
        s = r[side]
        print(f"{label:10} {s['median_ms']:>10} {s['min_ms']:>9} {s['max_ms']:>9} {s['sql_per_request']:>12}")
    print(f"speedup (nova median / shared median): {r['speedup']}x")


if __name__ == "__main__":
    raise SystemExit(main())
