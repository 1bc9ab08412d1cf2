"""``shm bench <benchmark> [options]``: the project's benchmarks behind one command.

Every benchmark is a module with a ``main(argv, prog=...)`` function that parses
its own options; it registers here in :data:`BENCHMARKS` (name -> ("module:function",
one-line help)).  Modules are imported only when their benchmark runs, so
``shm bench --help`` stays cheap.

* ``protocol`` – decode+apply throughput, delta vs snapshot size, digest cost
  (:mod:`simulator.bench_protocol`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: name -> ("module:function", help).  The function takes (argv, prog=...) and returns an exit code.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "protocol": (
        "simulator.bench_protocol:main",
        "deltas decoded+applied per second, delta vs snapshot bytes, digest cost",
    ),
    "stream": (
        "simulator.bench_stream:main",
        "over RabbitMQ: staleness, sources per message, restart catch-up vs full resync",
    ),
    "ingest": (
        "simulator.bench_ingest:main",
        "over RabbitMQ: one scheduler process reading a large cloud's cell streams, "
        "catch-up and live",
    ),
    "staleness": (
        "simulator.bench_staleness:main",
        "over RabbitMQ: shm sim's staleness p99 and scheduled/s against a stored reference",
    ),
    "nova": (
        "simulator.bench_nova:main",
        "select_destinations: nova 34's DB-fed HostManager vs SharedHostManager (needs nova)",
    ),
    "updatelog": (
        "simulator.bench_updatelog:main",
        "update-log recording overhead on ingest, replay speed",
    ),
    "decisions": (
        "simulator.bench_decisions:main",
        "scheduling decisions per second (fast columnar path vs per-host path)",
    ),
    "placement": (
        "simulator.bench_placement:main",
        "allocation candidates from memory vs placement's own query on the same providers "
        "(needs openstack-placement)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shm bench",
        description="Run a benchmark; 'shm bench <benchmark> --help' lists its options.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="<benchmark>", required=True)
    for name, (_, text) in BENCHMARKS.items():
        # the benchmark parses its own options (including --help) from the rest of argv
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = build_parser().parse_known_args(argv[:1])
    rest += argv[1:]
    module, func = BENCHMARKS[args.benchmark][0].split(":")
    run = getattr(importlib.import_module(module), func)
    return int(run(rest, prog=f"shm bench {args.benchmark}") or 0)


if __name__ == "__main__":
    sys.exit(main())
