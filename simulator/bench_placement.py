"""Allocation candidates from memory vs placement's own query, on the same providers.

What it measures, per provider count (``--providers``, default 1 000 and 10 000):

* ``memory`` -- :func:`shared_host_manager.placement.answer` (querystring
  parsed, candidates selected, the body built) on a
  :class:`~shared_host_manager.placement.ProviderState` of the providers;
* ``placement`` -- placement's own ``GET /allocation_candidates`` through its
  WSGI application in this process (:mod:`simulator.placement_real`: no
  socket, no keystone; its query, its objects and its JSON encoding), on
  SQLite (a file) or MariaDB (``--db mariadb``: 127.0.0.1:3306) holding the
  same providers (bulk-loaded into placement's tables);

each request timed on its own (memory under the garbage-collector threshold
the scheduler runs with, ``--gc-young-threshold``), wall clock and CPU time
of this thread (the latter is what the target is read on when the machine is
shared: other processes' load does not count), medians and p99, and the ratio of
placement's to memory's.  Before timing, every request's two answers are
compared (the number of candidates and every memory candidate among
placement's full set; the bodies are equal when nothing is cut).

Requests are nova 34's for a flavor (``resources=DISK_GB:..,MEMORY_MB:..,VCPU:..``
at microversion 1.36, ``limit=1000`` = ``[scheduler] max_placement_results``,
``root_required=!COMPUTE_STATUS_DISABLED`` from the compute-status prefilter),
a quarter with a required CPU trait, a quarter with an availability zone's
aggregate (``member_of=in:``), some with a forbidden aggregate
(``isolate_aggregates``).  Providers are compute nodes with VCPU, MEMORY_MB and
DISK_GB inventories (nova's ratios and reserved memory), usages up to their
capacity, 20-40 standard traits, 2 % disabled, one of ten zone aggregates.
With ``--trees F``, a share F of them carry a provider tree as nova's libvirt
driver reports a GPU: a child provider with a VGPU inventory and a trait of
its own, and a share F of the requests are a vGPU flavor's (``VGPU:1`` beside
the flavor's classes, in the unsuffixed group as nova puts a flavor's
``resources:VGPU=1``).  placement then takes its tree code path for every
request, and memory answers both kinds: the others as on roots, the vGPU
ones by combining each tree's root and child.
With ``--shared-storage F``, each zone has a storage pool: a sharing provider
(``MISC_SHARES_VIA_AGGREGATE``) with a DISK_GB inventory in the zone's
aggregate, and a share F of the compute nodes have no DISK_GB of their own
(their disk is the pool's).  placement takes its sharing code path for every
request then, and each compute node of a zone offers its own disk, where it
has one, and the pool's.

Run it as ``python -m simulator.bench_placement`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
import uuid as uuid_mod
from collections.abc import Callable
from typing import Any

from shared_host_manager.gc_threshold import YOUNG_THRESHOLD, add_option, tuned
from shared_host_manager.placement import ProviderState, Unanswered, answer

CPU_TRAITS = ["HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE42", "HW_CPU_X86_AVX512F",
              "HW_CPU_X86_AESNI", "HW_CPU_X86_VMX", "HW_CPU_X86_SVM", "HW_CPU_X86_F16C",
              "HW_CPU_X86_FMA3", "HW_CPU_X86_BMI", "HW_CPU_X86_BMI2", "HW_CPU_X86_SSE41",
              "HW_CPU_X86_SSSE3", "HW_CPU_X86_MMX", "HW_CPU_X86_SSE", "HW_CPU_X86_SSE2"]
COMPUTE_TRAITS = ["COMPUTE_NET_ATTACH_INTERFACE", "COMPUTE_VOLUME_ATTACH_WITH_TAG",
                  "COMPUTE_VOLUME_EXTEND", "COMPUTE_VOLUME_MULTI_ATTACH", "COMPUTE_TRUSTED_CERTS",
                  "COMPUTE_IMAGE_TYPE_QCOW2", "COMPUTE_IMAGE_TYPE_RAW", "COMPUTE_IMAGE_TYPE_ISO",
                  "COMPUTE_DEVICE_TAGGING", "COMPUTE_NET_ATTACH_INTERFACE_WITH_TAG",
                  "COMPUTE_ACCELERATORS", "COMPUTE_SOCKET_PCI_NUMA_AFFINITY",
                  "COMPUTE_RESCUE_BFV", "COMPUTE_NODE", "COMPUTE_GRAPHICS_MODEL_VIRTIO",
                  "COMPUTE_NET_VIF_MODEL_VIRTIO", "COMPUTE_STORAGE_BUS_VIRTIO",
                  "COMPUTE_SECURITY_UEFI_SECURE_BOOT", "COMPUTE_ADDRESS_SPACE_PASSTHROUGH",
                  "COMPUTE_ADDRESS_SPACE_EMULATED"]
ZONES = [str(uuid_mod.UUID(int=0xA9 << 120 | i)) for i in range(10)]
SHARING = "MISC_SHARES_VIA_AGGREGATE"
ISOLATED = str(uuid_mod.UUID(int=0xB9 << 120 | 1))
FLAVORS = [(1, 512, 1), (1, 2048, 20), (2, 4096, 40), (4, 8192, 80), (8, 16384, 160), (16, 65536, 320)]


def providers(n: int, rng: random.Random, trees: float = 0.0,
              shared_storage: float = 0.0) -> list[dict[str, Any]]:
    """``n`` compute-node providers as nova's resource tracker reports them, a share ``trees``
    of them with a vGPU child provider (placed right after its root); with ``shared_storage``,
    a storage pool per zone and that share of the compute nodes without a disk of their own."""
    out: list[dict[str, Any]] = []
    if shared_storage:
        for z, zone in enumerate(ZONES):
            disk = 50 * n
            out.append({
                "uuid": str(uuid_mod.UUID(int=rng.getrandbits(128), version=4)),
                "name": f"pool-{z}", "generation": 1,
                "inventories": {"DISK_GB": {"total": disk, "reserved": 0, "min_unit": 1, "max_unit": disk,
                                            "step_size": 1, "allocation_ratio": 1.0}},
                "usages": {"DISK_GB": int(disk * rng.random() * 0.8)},
                "traits": [SHARING], "aggregates": [zone],
            })
    for i in range(n):
        vcpus = rng.choice([32, 48, 64, 96, 128])
        mem = rng.choice([131072, 262144, 393216, 524288])
        disk = rng.choice([1000, 2000, 4000])
        cpu_ratio = rng.choice([4.0, 16.0])
        fill = rng.random()
        traits = rng.sample(COMPUTE_TRAITS, rng.randint(10, 20)) + rng.sample(CPU_TRAITS, rng.randint(10, 16))
        if rng.random() < 0.02:
            traits.append("COMPUTE_STATUS_DISABLED")
        aggs = [ZONES[i % len(ZONES)]] + ([ISOLATED] if rng.random() < 0.05 else [])
        diskless = shared_storage and rng.random() < shared_storage
        out.append({
            "uuid": str(uuid_mod.UUID(int=rng.getrandbits(128), version=4)),
            "name": f"compute-{i:05d}", "generation": 1,
            "inventories": {
                "VCPU": {"total": vcpus, "reserved": 0, "min_unit": 1, "max_unit": vcpus,
                         "step_size": 1, "allocation_ratio": cpu_ratio},
                "MEMORY_MB": {"total": mem, "reserved": 512, "min_unit": 1, "max_unit": mem,
                              "step_size": 1, "allocation_ratio": 1.0},
                "DISK_GB": {"total": disk, "reserved": 0, "min_unit": 1, "max_unit": disk,
                            "step_size": 1, "allocation_ratio": 1.0},
            },
            "usages": {"VCPU": int(vcpus * cpu_ratio * fill), "MEMORY_MB": int((mem - 512) * fill),
                       "DISK_GB": int(disk * fill * 0.8)},
            "traits": sorted(traits), "aggregates": aggs,
        })
        if diskless:
            del out[-1]["inventories"]["DISK_GB"], out[-1]["usages"]["DISK_GB"]
        if trees and rng.random() < trees:
            root = out[-1]["uuid"]
            vgpus = rng.choice([4, 8, 16])
            out.append({
                "uuid": str(uuid_mod.UUID(int=rng.getrandbits(128), version=4)),
                "name": f"compute-{i:05d}_pci_0000_81_00_0", "generation": 1,
                "parent_provider_uuid": root, "root_provider_uuid": root,
                "inventories": {"VGPU": {"total": vgpus, "reserved": 0, "min_unit": 1,
                                         "max_unit": vgpus, "step_size": 1, "allocation_ratio": 1.0}},
                "usages": {"VGPU": rng.randint(0, vgpus)},
                "traits": ["CUSTOM_NVIDIA_11"], "aggregates": [],
            })
    return out


def requests(k: int, rng: random.Random, vgpu: float = 0.0) -> list[str]:
    """``k`` querystrings as nova 34's ResourceRequest.to_querystring writes them, a share
    ``vgpu`` of them a vGPU flavor's."""
    from urllib.parse import urlencode

    out = []
    for _ in range(k):
        vcpu, mem, disk = rng.choice(FLAVORS)
        gpu = ",VGPU:1" if vgpu and rng.random() < vgpu else ""
        pairs = [("limit", "1000"), ("resources", f"DISK_GB:{disk},MEMORY_MB:{mem},VCPU:{vcpu}{gpu}"),
                 ("root_required", "!COMPUTE_STATUS_DISABLED")]
        if rng.random() < 0.25:
            pairs.append(("required", rng.choice(["HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F"])))
        if rng.random() < 0.25:
            pairs.append(("member_of", "in:" + rng.choice(ZONES)))
        if rng.random() < 0.2:
            pairs.append(("member_of", "!in:" + ISOLATED))
        out.append(urlencode(sorted(pairs)))
    return out


def _timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    result = call()
    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    return (w1 - w0) / 1e6, (c1 - c0) / 1e6, result


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, int(round(0.99 * len(ordered))) - 1))]
    return {"median": statistics.median(ordered), "p99": p99, "n": len(ordered)}


def _agrees(mine: Any, status: int, theirs: Any, full: Any) -> bool:
    if isinstance(mine, Unanswered) or status != 200:
        return False

    def key(areq: Any) -> str:  # placement's mappings are sets
        mappings = {g: sorted(rps) for g, rps in areq.get("mappings", {}).items()}
        return json.dumps({**areq, "mappings": mappings}, sort_keys=True)

    everything = {key(a) for a in full["allocation_requests"]}
    if len(mine["allocation_requests"]) != len(theirs["allocation_requests"]):
        return False
    if not all(key(a) in everything for a in theirs["allocation_requests"]):
        return False
    if len(theirs["allocation_requests"]) < len(everything):
        return True

    # nothing cut: the same summaries, every member of a candidate's tree among them
    # (placement's traits are a set)
    def summaries(body: Any) -> dict[str, Any]:
        return {u: {**s, "traits": sorted(s["traits"])} for u, s in body["provider_summaries"].items()}

    return summaries(mine) == summaries(theirs)


def run(counts: list[int], db: str, memory_requests: int, placement_requests: int, seed: int,
        progress: Callable[[str], None], trees: float = 0.0, shared_storage: float = 0.0,
        gc_young_threshold: int = YOUNG_THRESHOLD) -> dict[str, Any]:
    from simulator.placement_real import RealPlacement, server_url

    result: dict[str, Any] = {"database": db, "microversion": "1.36", "limit": 1000, "trees": trees,
                              "shared_storage": shared_storage, "gc_young_threshold": gc_young_threshold,
                              "sizes": []}
    for n in counts:
        rng = random.Random(seed + n)
        provs = providers(n, rng, trees, shared_storage)
        qs = requests(max(memory_requests, placement_requests), rng, trees)
        t0 = time.perf_counter()
        state = ProviderState.from_dict({"providers": provs})
        build_s = time.perf_counter() - t0
        url = server_url(f"shm_bench_placement_{seed}_{n}") if db == "mariadb" else None
        placement = RealPlacement(url)
        try:
            if trees:
                placement.ok("PUT", "/traits/CUSTOM_NVIDIA_11")
            progress(f"{n} providers: loading placement's {placement.backend} database")
            placement.bulk_load(provs)
            # the comparison, untimed: every request's answers agree
            agree = 0
            for q in qs[:placement_requests]:
                mine = answer(state, q)
                status, theirs = placement.request("GET", "/allocation_candidates?" + q, version="1.36")
                full = answer(state, q.replace("limit=1000&", ""))
                agree += _agrees(mine, status, theirs, full)
            progress(f"{n} providers: answers agree on {agree}/{placement_requests} requests")
            # memory: warm up the summaries cache once, as a running scheduler has it
            for q in qs[:50]:
                answer(state, q)
            mem_wall, mem_cpu, returned = [], [], []
            # under the collector threshold nova-scheduler-shared runs with (placement's own
            # process keeps Python's default)
            with tuned(gc_young_threshold):
                for q in (qs * (1 + memory_requests // len(qs)))[:memory_requests]:
                    w, c, body = _timed(functools.partial(answer, state, q))
                    mem_wall.append(w)
                    mem_cpu.append(c)
                    returned.append(len(body["allocation_requests"]))
            progress(f"{n} providers: memory done")
            pl_wall, pl_cpu = [], []
            for q in qs[:placement_requests]:
                w, c, _ = _timed(functools.partial(
                    placement.request, "GET", "/allocation_candidates?" + q, version="1.36"))
                pl_wall.append(w)
                pl_cpu.append(c)
            progress(f"{n} providers: placement done")
        finally:
            placement.close()
        size: dict[str, Any] = {
            "providers": n, "state_build_s": build_s, "agree": f"{agree}/{placement_requests}",
            "candidates_median": statistics.median(returned),
            "memory_wall_ms": _stats(mem_wall), "memory_cpu_ms": _stats(mem_cpu),
            "placement_wall_ms": _stats(pl_wall), "placement_cpu_ms": _stats(pl_cpu),
        }
        for kind in ("wall", "cpu"):
            m, p = size[f"memory_{kind}_ms"], size[f"placement_{kind}_ms"]
            size[f"ratio_{kind}"] = {"median": p["median"] / m["median"], "p99": p["p99"] / m["p99"]}
        result["sizes"].append(size)
    return result


def format_table(result: dict[str, Any]) -> str:
    trees = (f"; {result['trees']:.0%} of them with a vGPU child provider, {result['trees']:.0%} "
             f"of the requests for a vGPU") if result.get("trees") else ""
    if result.get("shared_storage"):
        trees += (f"; a storage pool per zone (sharing provider), {result['shared_storage']:.0%} of the "
                  f"compute nodes without a disk of their own")
    lines = [f"GET /allocation_candidates at {result['microversion']}, limit={result['limit']}; "
             f"placement on {result['database']} (in-process WSGI){trees}",
             f"{'providers':>9} {'clock':>5} {'memory med':>10} {'p99':>8} {'placement med':>13} "
             f"{'p99':>9} {'ratio med':>9} {'p99':>7}  candidates  agree"]
    for s in result["sizes"]:
        for kind in ("cpu", "wall"):
            m, p, r = s[f"memory_{kind}_ms"], s[f"placement_{kind}_ms"], s[f"ratio_{kind}"]
            lines.append(
                f"{s['providers']:>9} {kind:>5} {m['median']:>8.3f}ms {m['p99']:>6.3f}ms "
                f"{p['median']:>11.1f}ms {p['p99']:>7.1f}ms {r['median']:>8.0f}x {r['p99']:>6.0f}x  "
                f"{s['candidates_median']:>10.0f}  {s['agree']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m simulator.bench_placement") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--db", choices=["sqlite", "mariadb"], default="sqlite",
                        help="placement's database (mariadb: root@127.0.0.1:3306, a scratch database)")
    parser.add_argument("--memory-requests", type=int, default=2000)
    parser.add_argument("--placement-requests", type=int, default=30)
    parser.add_argument("--trees", type=float, default=0.0, metavar="F",
                        help="share of compute nodes with a vGPU child provider, and of requests "
                             "for a vGPU (0 to 1; default 0)")
    parser.add_argument("--shared-storage", type=float, default=0.0, metavar="F",
                        help="a storage pool (sharing provider of DISK_GB) per zone, and the share of "
                             "compute nodes without a disk of their own (0 to 1; default 0: no pools)")
    add_option(parser, "memory is timed", "; placement keeps Python's default")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args(argv)
    for name in ("trees", "shared_storage"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be between 0 and 1")
    result = run(args.providers, args.db, args.memory_requests, args.placement_requests, args.seed,
                 progress=lambda text: print(text, file=sys.stderr), trees=args.trees,
                 shared_storage=args.shared_storage, gc_young_threshold=args.gc_young_threshold)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
