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
import gc
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from typing import Any

from shared_host_manager.gc_threshold import add_option, tuned

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
    p.add_argument("--per-host", action="store_true",
                   help="also time the drop-in with nova's per-host handlers (vector_decisions off)")
    p.add_argument("--decision-only", action="store_true",
                   help="time only host states + filtering + weighing inside SharedHostManager, "
                        "vector core vs nova's per-host handlers (no nova database: fast to set up "
                        "at 10 000 hosts)")
    p.add_argument("--api-services", action="store_true",
                   help="with --decision-only: an API-side source holding a service record for "
                        "every host, as nova-conductor publishes one when each compute's service "
                        "is created (a deployment's usual state, design §2); one host in 50 "
                        "disabled there")
    p.add_argument("--aggregates", type=int, default=0, metavar="N",
                   help="with --decision-only: N host aggregates (availability zones with a "
                        "weight multiplier in their metadata), each host in one of them")
    add_option(p, "the drop-in decides", ". nova's database side always runs with Python's "
               "700, as stock nova-scheduler does")
    p.add_argument("--dir", help="directory for the SQLite files (default: a temporary one)")
    p.add_argument("--record", metavar="DIR",
                   help="also a drop-in whose cache keeps an update log in DIR, with nova's "
                        "decisions step by step ([update_log] enabled): what recording costs "
                        "(--decision-only: side by side; else the shared side records)")
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
    with tuned(args.gc_young_threshold):  # main() may run inside another program (the tests)
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    if args.decision_only:
        result = run_decision_only(args)
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            _print_decision_only(result)
        return 0
    with tempfile.TemporaryDirectory(prefix="shm-bench-nova-") as tmp:
        result = run(args, args.dir or tmp)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print(result)
    return 0


def _record(cache: Any, directory: str | None) -> Any:
    """An update log on the drop-in's cache (``--record``), or None."""
    if not directory:
        return None
    from shared_host_manager.updatelog.recorder import Recorder

    recorder = Recorder(directory)
    cache.set_recorder(recorder)
    return recorder


def run_decision_only(args: argparse.Namespace) -> dict[str, Any]:
    """get_host_states_by_uuids + get_filtered_hosts + get_weighed_hosts of one SharedHostManager,
    with the vector core and with nova's handlers, alternating, on the bench's hosts."""
    from protocol import hostdoc
    from shared_host_manager.nova import host_manager as shm
    from shared_host_manager.nova.core import document as ndoc
    from shared_host_manager.nova.testing import fixtures as fx

    filters = args.filters.split(",") if args.filters else list(DEFAULT_FILTERS)
    if args.numa and "NUMATopologyFilter" not in filters:
        filters.append("NUMATopologyFilter")
    fx.setup_nova(**{"filter_scheduler.enabled_filters": filters, "service_down_time": 86400})
    nodes = [fx.compute_node(i, free_ram_mb=16384 + (i * 7919) % 40000) for i in range(args.hosts)]
    docs = {cn.uuid: ndoc.document_from_compute_node(
        cn, service=fx.service_dict(cn.host), cell_uuid=fx.CELL1,
        instances=[fx.uuid_for(f"inst-{cn.host}", k) for k in range(args.instances_per_host)])
        for cn in nodes}
    if args.api_services:
        # one host in 50 disabled by an operator since its compute last reported
        docs["nova-api"] = {hostdoc.API_SERVICES: {
            cn.host: {"disabled": i % 50 == 7, "forced_down": False,
                      "disabled_reason": "maintenance" if i % 50 == 7 else None,
                      "deleted": False, "changed": time.time()} for i, cn in enumerate(nodes)}}
    cache = fx.cache_from_documents(docs)
    managers = {"vector": shm.SharedHostManager(cache, register_claims=False,
                                                default_cell_uuid=fx.CELL1)}
    managers["per-host"] = managers["vector"]
    recorder = None
    if args.record:
        # the same hosts in a second cache that keeps an update log: side by side, what
        # recording nova's decisions costs
        recorded = fx.cache_from_documents(docs)
        recorder = _record(recorded, args.record)
        managers["recorded"] = shm.SharedHostManager(recorded, register_claims=False,
                                                     default_cell_uuid=fx.CELL1)
    if args.aggregates:
        aggs = fx.zones([cn.host for cn in nodes], args.aggregates)
        for manager in {id(m): m for m in managers.values()}.values():
            manager.update_aggregates(aggs)
    ctx = None  # SharedHostManager reads no request context
    uuids = [cn.uuid for cn in nodes]
    sides = {"vector": True, "per-host": False, "recorded": True}
    sides = {s: v for s, v in sides.items() if s in managers}
    times: dict[str, dict[str, list[float]]] = {s: {"host_states": [], "filter": [], "weigh": [],
                                                    "total": []} for s in sides}
    best: dict[str, Any] = {}
    seq = iter(range(10**9))

    def one(side: str, timed: bool) -> None:
        manager = managers[side]
        manager.vector_decisions = sides[side]
        spec = fx.request_spec(instance_uuid=fx.uuid_for("bench", next(seq)))
        c0, t0 = time.process_time(), time.perf_counter()
        hosts = manager.get_host_states_by_uuids(ctx, uuids, spec)
        c1, t1 = time.process_time(), time.perf_counter()
        passed = manager.get_filtered_hosts(hosts, spec, 0)
        c2, t2 = time.process_time(), time.perf_counter()
        weighed = manager.get_weighed_hosts(passed, spec)
        c3, t3 = time.process_time(), time.perf_counter()
        best[side] = (len(weighed), [(w.obj.host, w.weight) for w in weighed[:3]])
        if timed:
            for k, v in (("host_states", t1 - t0), ("filter", t2 - t1), ("weigh", t3 - t2),
                         ("total", t3 - t0), ("cpu_host_states", c1 - c0), ("cpu_filter", c2 - c1),
                         ("cpu_weigh", c3 - c2), ("cpu_total", c3 - c0)):
                times[side].setdefault(k, []).append(v)

    for side in sides:
        for _ in range(args.warmup):
            one(side, False)
    for _ in range(args.rounds):
        for side in sides:
            gc.collect()  # untimed: each side's block pays only for the garbage it makes
            for _ in range(args.requests if side != "per-host" else max(1, args.requests // 5)):
                one(side, True)
    assert best["vector"] == best["per-host"], (best["vector"], best["per-host"])
    out: dict[str, Any] = {"hosts": args.hosts, "filters": filters,
                           "instances_per_host": args.instances_per_host,
                           "api_services": args.api_services, "aggregates": args.aggregates,
                           "hosts_passed": best["vector"][0]}
    if recorder is not None:
        recorder.close()
        out["update_log_bytes"] = sum(os.path.getsize(f) for f in recorder.files)
    out["gc_thresholds"] = list(gc.get_threshold())
    for side in sides:
        out[side] = {k: round(statistics.median(v) * 1000, 2) for k, v in times[side].items()}
        # the mean carries what a median hides: the rare request that pays a full collection
        out[side]["mean_total"] = round(statistics.fmean(times[side]["total"]) * 1000, 2)
        out[side]["cpu_mean_total"] = round(statistics.fmean(times[side]["cpu_total"]) * 1000, 2)
        out[side]["samples"] = len(times[side]["total"])
    out["speedup"] = round(out["per-host"]["total"] / out["vector"]["total"], 1)
    out["speedup_cpu"] = round(out["per-host"]["cpu_total"] / out["vector"]["cpu_total"], 1)
    if recorder is not None:
        out["recording_cost_cpu"] = round(out["recorded"]["cpu_total"] / out["vector"]["cpu_total"], 2)
    return out


def _print_decision_only(r: dict[str, Any]) -> None:
    print(f"SharedHostManager host states + filter + weigh, {r['hosts']} hosts, filters: "
          f"{', '.join(r['filters'])}")
    print(f"gc thresholds {tuple(r['gc_thresholds'])}")
    print(f"{'(median ms)':16} {'host states':>12} {'filter':>9} {'weigh':>9} {'total':>9} "
          f"{'mean':>9} {'n':>4}")
    for side in [s for s in ("vector", "per-host", "recorded") if s in r]:
        s = r[side]
        print(f"{side:16} {s['host_states']:>12} {s['filter']:>9} {s['weigh']:>9} {s['total']:>9} "
              f"{s['mean_total']:>9} {s['samples']:>4}")
        print(f"{'  CPU time':16} {s['cpu_host_states']:>12} {s['cpu_filter']:>9} {s['cpu_weigh']:>9} "
              f"{s['cpu_total']:>9} {s['cpu_mean_total']:>9}")
    print(f"vector core vs nova's per-host handlers: {r['speedup']}x, CPU time {r['speedup_cpu']}x "
          "(same top hosts and weights)")
    if "recording_cost_cpu" in r:
        print(f"recording an update log: CPU time x{r['recording_cost_cpu']} "
              f"({r['update_log_bytes']} bytes written)")


def run(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from shared_host_manager.nova.testing import fixtures as fx

    filters = args.filters.split(",") if args.filters else list(DEFAULT_FILTERS)
    if args.numa and "NUMATopologyFilter" not in filters:
        filters.append("NUMATopologyFilter")
    t0 = time.perf_counter()
    pair = fx.SchedulerPair(directory, hosts=args.hosts, filters=filters,
                            instances_per_host=args.instances_per_host,
                            sync_instance_info=not args.unsynced_instance_info)
    recorder = _record(pair.cache, args.record)
    setup_s = time.perf_counter() - t0
    counter = _SqlCounter()
    event.listen(Engine, "before_cursor_execute", counter)
    sides = ["nova", "shared"] + (["shared-per-host"] if args.per_host else [])
    samples: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    statements: dict[str, list[int]] = {side: [] for side in sides}
    phases: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    seq = iter(range(10**9))
    shared_hm = pair.managers["shared"].host_manager
    shared_gc = gc.get_threshold()
    python_gc = (700, shared_gc[1], shared_gc[2])

    def one(side: str, timed: bool) -> None:
        instance = fx.uuid_for(f"bench-{side}", next(seq))
        shared_hm.vector_decisions = side == "shared"
        before = dict(shared_hm.phase_seconds)
        counter.n = 0
        start, cpu_start = time.perf_counter(), time.process_time()
        selected = pair.select(side.partition("-")[0], instance)
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
        assert selected >= 1
        if timed:
            samples[side].append(elapsed)
            cpu[side].append(cpu_elapsed)
            statements[side].append(counter.n)
            if side != "nova":
                spent = {k: v - before.get(k, 0.0) for k, v in shared_hm.phase_seconds.items()}
                spent["other"] = elapsed - sum(spent.values())
                for k, v in spent.items():
                    phases[side].setdefault(k, []).append(v)

    try:
        for side in sides:
            with pair.side(side.partition("-")[0]):
                for _ in range(args.warmup):
                    one(side, False)
        for _ in range(args.rounds):
            for side in sides:
                with pair.side(side.partition("-")[0]):
                    # each side as its process runs: stock nova-scheduler with Python's GC,
                    # nova-scheduler-shared with its own threshold (--gc-young-threshold)
                    gc.set_threshold(*(python_gc if side == "nova" else shared_gc))
                    gc.collect()  # untimed: each side's block pays only for the garbage it makes
                    for _ in range(args.requests):
                        one(side, True)
        gc.set_threshold(*shared_gc)
    finally:
        shared_hm.vector_decisions = True
        event.remove(Engine, "before_cursor_execute", counter)
        pair.close()
    out: dict[str, Any] = {
        "hosts": args.hosts, "filters": filters, "instances_per_host": args.instances_per_host,
        "instance_info_synced": not args.unsynced_instance_info, "setup_s": round(setup_s, 2),
        "samples_per_side": len(samples["nova"]), "gc_thresholds": {
            "nova": list(python_gc), "shared": list(shared_gc)},
    }
    for side in sides:
        xs = sorted(samples[side])
        out[side] = {
            "median_ms": round(statistics.median(xs) * 1000, 2),
            "mean_ms": round(statistics.fmean(xs) * 1000, 2),
            "min_ms": round(xs[0] * 1000, 2),
            "max_ms": round(xs[-1] * 1000, 2),
            "cpu_median_ms": round(statistics.median(cpu[side]) * 1000, 2),
            "sql_per_request": statistics.median(statements[side]),
        }
        if phases[side]:
            out[side]["phases_median_ms"] = {k: round(statistics.median(v) * 1000, 2)
                                             for k, v in sorted(phases[side].items())}
    if recorder is not None:
        recorder.close()
        out["update_log_bytes"] = sum(os.path.getsize(f) for f in recorder.files)
    out["speedup"] = round(out["nova"]["median_ms"] / out["shared"]["median_ms"], 2)
    out["speedup_cpu"] = round(out["nova"]["cpu_median_ms"] / out["shared"]["cpu_median_ms"], 2)
    if "shared-per-host" in out:
        out["speedup_per_host"] = round(out["nova"]["median_ms"] / out["shared-per-host"]["median_ms"], 2)
    return out


def _print(r: dict[str, Any]) -> None:
    print(f"select_destinations, {r['hosts']} hosts, filters: {', '.join(r['filters'])}")
    print(f"instances/host {r['instances_per_host']}, instance info synced: {r['instance_info_synced']}, "
          f"{r['samples_per_side']} timed requests per side (setup {r['setup_s']} s)")
    print(f"gc thresholds: nova {tuple(r['gc_thresholds']['nova'])}, shared "
          f"{tuple(r['gc_thresholds']['shared'])}")
    print(f"{'':16} {'median ms':>10} {'mean ms':>9} {'min ms':>9} {'max ms':>9} {'CPU ms':>8} "
          f"{'SQL/request':>12}")
    for side, label in (("nova", "nova (DB)"), ("shared", "shared"),
                        ("shared-per-host", "shared per-host")):
        if side not in r:
            continue
        s = r[side]
        print(f"{label:16} {s['median_ms']:>10} {s['mean_ms']:>9} {s['min_ms']:>9} {s['max_ms']:>9} "
              f"{s['cpu_median_ms']:>8} {s['sql_per_request']:>12}")
    for side in ("shared", "shared-per-host"):
        if side in r:
            ph = r[side]["phases_median_ms"]
            print(f"{side} phases (median ms): " + ", ".join(f"{k} {v}" for k, v in ph.items()))
    print(f"speedup (nova median / shared median): {r['speedup']}x; "
          f"CPU time: {r['speedup_cpu']}x")
    if "speedup_per_host" in r:
        print(f"speedup with nova's per-host handlers in the drop-in: {r['speedup_per_host']}x")


if __name__ == "__main__":
    raise SystemExit(main())
