"""The placement feed's database reads, timed on MariaDB at 1 000 and 10 000 providers.

What it measures (``shared_host_manager.placement.database.PlacementDatabase``, the feed's
reader, against placement's own schema loaded with :meth:`RealPlacement.bulk_load`: compute
nodes as ``simulator.bench_placement.providers`` draws them, each with one consumer's
allocations of VCPU, MEMORY_MB and DISK_GB):

* ``fingerprint()`` -- the cheap change check of every poll: the providers' count, sum of
  generations and highest id, and the allocation rows' count and sum (two one-row SELECTs
  in one transaction);
* ``listing()`` -- every provider's mark (generation, created_at, allocation count and sum),
  made only when the fingerprint moved;
* ``read()`` of ten providers -- what a poll with ten changed providers reads.

Medians of repeated calls, wall clock, on whatever else the machine runs.  Run::

    .venv/bin/python -m simulator.bench_feed_check [--sizes 1000,10000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    call()  # warm: the connection pool, the server's caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run(sizes: list[int], repeat: int, seed: int = 1) -> list[dict[str, Any]]:
    from shared_host_manager.placement.database import PlacementDatabase
    from simulator.bench_placement import providers
    from simulator.placement_real import RealPlacement, server_url

    out = []
    for n in sizes:
        provs = providers(n, random.Random(seed + n))
        placement = RealPlacement(server_url(f"shm_bench_feed_check_{n}"))
        try:
            placement.bulk_load(provs)
            db = PlacementDatabase(placement.db_url)
            try:
                fp = db.fingerprint()
                ten = [p["uuid"] for p in provs[:: max(1, n // 10)][:10]]
                out.append({
                    "providers": fp[0], "allocation_rows": fp[3],
                    "fingerprint_ms": _median_ms(db.fingerprint, repeat),
                    "listing_ms": _median_ms(db.listing, max(3, repeat // 5)),
                    "read_10_ms": _median_ms(functools.partial(db.read, ten), max(3, repeat // 5)),
                })
            finally:
                db.close()
        finally:
            placement.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.bench_feed_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000", help="provider counts (default 1000,10000)")
    p.add_argument("--repeat", type=int, default=50, help="fingerprint calls timed (default 50)")
    args = p.parse_args(argv)
    for row in run([int(s) for s in args.sizes.split(",")], args.repeat):
        print(f"{row['providers']:>6} providers, {row['allocation_rows']:>6} allocation rows: "
              f"fingerprint {row['fingerprint_ms']:.2f} ms, listing {row['listing_ms']:.1f} ms, "
              f"read of 10 {row['read_10_ms']:.1f} ms (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
