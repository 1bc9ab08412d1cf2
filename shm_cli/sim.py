"""``shm sim``: the simulator — shared vs legacy vs caching host managers, side by side.

Runs N simulated compute nodes (real compute_reporter services arbitrating
every claim) and M schedulers of each chosen host-manager mode on the same
seeded workload, prints a progress bar and a comparison table, and writes
the figures as JSON (``--json``) and a plot (``--plot``).  With
``--processes P`` (shared mode over RabbitMQ) the schedulers run as P
processes of their own (:mod:`simulator.processes`), and with
``--reporter-processes M`` the reporters as M more (:mod:`simulator.reporter_processes`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from shared_host_manager.gc_threshold import tuned
from simulator.plot import plot
from simulator.run import MODES, run, summary_table
from simulator.simulation import MISSING_NOVA, SimConfig, check_config, nova_installed


def build_parser(prog: str = "shm sim") -> argparse.ArgumentParser:
    d = SimConfig()
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--scheduler", choices=["own", "nova"], default="own",
                   help="'own': the project's decision engine (default); 'nova': nova 34's real "
                        "SchedulerManager with placement (in-process, or --placement-processes) "
                        "and nova's database "
                        "(host managers shared and legacy; needs the [nova-sim] extra)")
    p.add_argument("--host-ownership", action="store_true",
                   help="--scheduler nova, shared: the drop-in's [shared_host_manager] "
                        "host_ownership (each scheduler puts its own best host first; "
                        "membership on the stream)")
    p.add_argument("--placement-processes", type=int, default=0, metavar="N",
                   help="--scheduler nova: serve placement from N processes of its own, as "
                        "uWSGI runs it in a deployment (needs --db-url; default 0: in the "
                        "run's process)")
    p.add_argument("--filters", help="--scheduler nova: comma-separated [filter_scheduler] "
                                     "enabled_filters (default: nova's defaults and "
                                     "AggregateInstanceExtraSpecsFilter, which the workload's "
                                     "SSD flavor needs)")
    p.add_argument("--host-manager", choices=[*MODES, "all"], default=d.host_manager,
                   help="which host manager(s) to run; 'all' runs the three one after the other "
                        "on the same seeded workload (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=d.nodes, help="compute nodes (default: %(default)s)")
    p.add_argument("--schedulers", type=int, default=d.schedulers,
                   help="schedulers per host manager (default: %(default)s)")
    p.add_argument("--clients", type=int, default=d.clients,
                   help="concurrent closed-loop clients (default: %(default)s)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, default=d.duration,
                        help="seconds per host manager (default: %(default)s)")
    length.add_argument("--requests", type=int, help="requests per host manager instead of a duration")
    p.add_argument("--seed", type=int, default=d.seed, help="same seed, same cloud and workload")
    p.add_argument("--fill", type=float, default=d.fill,
                   help="fraction of every host's memory in use when the run starts (default: %(default)s)")
    p.add_argument("--transport", default=d.transport,
                   help="'fake' (in-process, default) or a rabbit://user:pass@host:port/ URL "
                        "(RabbitMQ, shared mode)")
    p.add_argument("--processes", type=int, metavar="P",
                   help="shared mode over RabbitMQ: run the schedulers as P separate processes "
                        "(P = --schedulers: one per scheduler, as deployed), each with its share "
                        "of the clients; the compute nodes and the workload stay in this process. "
                        "Needs --transport rabbit://...; with --host-manager all, legacy and "
                        "caching still run in-process")
    p.add_argument("--reporter-processes", type=int, metavar="M",
                   help="with --processes (shared mode over RabbitMQ): spread the hosts over M "
                        "reporter processes of their own, each serving its share with real "
                        "reporters on the stream and the broker; the workload, the churn and "
                        "every figure stay in this process")
    p.add_argument("--cells", type=int, default=d.cells, metavar="C",
                   help="shared mode: the reporters publish on C cell streams (a stream per "
                        "nova cell, standing in for C brokers), every scheduler reads them all "
                        "(default: %(default)s, one stream)")
    p.add_argument("--cell-outage", metavar="CELL:START:SECONDS",
                   help="with --cells over RabbitMQ: stop that cell's broker (a relay in front "
                        "of it) START seconds into the run for SECONDS, e.g. cell2:10:30; the "
                        "figures say where requests landed meanwhile and how long the cell's "
                        "hosts took to rejoin")
    p.add_argument("--db-url", help="SQLAlchemy URL of the legacy/caching database "
                                    "(default: a temporary SQLite file), e.g. "
                                    "mysql+pymysql://root@127.0.0.1:3306/test")
    p.add_argument("--refresh-interval", type=float, default=d.refresh_interval,
                   help="caching mode: seconds between database reads (default: %(default)s)")
    p.add_argument("--drift-interval", type=float, default=d.drift_interval,
                   help="mean seconds between background changes of each host (default: %(default)s)")
    p.add_argument("--hosts-per-reporter", type=int, default=d.hosts_per_reporter,
                   help="simulated hosts served by one reporter (default: %(default)s)")
    p.add_argument("--heartbeat-interval", type=float, default=d.heartbeat_interval)
    p.add_argument("--host-subset-size", type=int,
                   help="fixed host_subset_size (default: adaptive within the configured bounds)")
    p.add_argument("--host-subset-choice", choices=["rendezvous", "random"], default=d.host_subset_choice,
                   help="how a scheduler picks among the best hosts (default: %(default)s)")
    p.add_argument("--no-peer-ownership", dest="peer_ownership", action="store_false",
                   help="shared mode: do not tell schedulers about each other (each then picks "
                        "only by host_subset_choice)")
    p.add_argument("--no-announce-claims", dest="announce_claims", action="store_false",
                   help="shared mode: schedulers do not cast their claims to their peers "
                        "([cache] announce_claims = false)")
    p.add_argument("--no-scarce-coordinator", dest="scarce_coordinator", action="store_false",
                   help="shared mode: every scheduler decides its own scarce requests instead of "
                        "handing them to the live peers' coordinator ([filter_scheduler] "
                        "scarce_coordinator = false)")
    p.add_argument("--no-hand-to-owner", dest="hand_to_owner", action="store_false",
                   help="shared mode: a scheduler owning none of a request's best hosts takes a "
                        "peer's host instead of handing the request to its owner "
                        "([filter_scheduler] hand_to_owner = false)")
    p.add_argument("--nvh-catch-up", type=float, default=None, metavar="SECONDS",
                   help="shared mode: before a NoValidHost, let the hosts' changes of the last "
                        "SECONDS reach the scheduler, catch up with the stream and decide again "
                        "([filter_scheduler] no_valid_host_catch_up; default: the coalescing "
                        "window; 0: answer at once)")
    p.add_argument("--nvh-checks", type=int, default=d.nvh_checks, metavar="N",
                   help="check at most N refused requests against the hosts' true state "
                        "(NoValidHost (wrong, in flight) in the table; default: %(default)s)")
    p.add_argument("--nvh-oracle-share", type=float, default=d.nvh_oracle_share, metavar="F",
                   help="the share of a core those checks may take, 0 < F <= 1 (default: "
                        "%(default)s; raise it with --nvh-checks to check more of a short run)")
    p.add_argument("--record", metavar="DIR",
                   help="write an update log of every party into DIR/<host manager>/ "
                        "(replay with: shm replay DIR/shared)")
    p.add_argument("--json", help="write the figures to this JSON file")
    p.add_argument("--plot", help="write a PNG: throughput and latency per host manager, staleness CDF")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def main(argv: list[str], prog: str = "shm sim") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.scheduler == "nova":
        return _main_nova(parser, args)
    if args.filters or args.host_ownership or args.placement_processes:
        parser.error("--filters, --host-ownership and --placement-processes apply to "
                     "--scheduler nova")
    names = {f.name for f in fields(SimConfig)}
    cfg = SimConfig(**{k: v for k, v in vars(args).items() if k in names})
    if not nova_installed():
        print(f"{parser.prog}: {MISSING_NOVA}", file=sys.stderr)
        return 2
    try:
        check_config(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    cfg.progress = not args.quiet
    if cfg.requests is not None:
        cfg.duration = 0.0
    # the deciding processes' garbage collector, as nova-scheduler-shared's (the modes alike)
    with tuned():
        report = run(cfg)
    print(summary_table(report))
    if args.plot:

        plot(report, args.plot)
        print(f"plot written to {args.plot}")
    public = {"config": report["config"], "ratios": report.get("ratios", {}),
              "results": {n: {k: v for k, v in r.items() if not k.startswith("_")}
                          for n, r in report["results"].items()}}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(public, f, indent=2)
        print(f"figures written to {args.json}")
    bad = [n for n, r in report["results"].items() if r["overcommitted_hosts"]]
    if bad:
        print(f"INVARIANT BROKEN: overcommitted hosts in {bad}", file=sys.stderr)
        return 1
    return 0


def _main_nova(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--scheduler nova``: nova's own SchedulerManager on its whole path (simulator.nova_sim)."""
    from shared_host_manager.nova.testing import simulation as nova_simulation

    unsupported = [flag for flag, given in (
        ("--processes", args.processes is not None), ("--record", bool(args.record)),
        ("--reporter-processes", args.reporter_processes is not None),
        ("--cells", args.cells != SimConfig.cells),
        ("--cell-outage", args.cell_outage is not None),
        ("--transport", args.transport != "fake"), ("--plot", bool(args.plot)),
        ("--host-subset-size", args.host_subset_size is not None),
        ("--nvh-checks", args.nvh_checks != SimConfig.nvh_checks),
        ("--no-scarce-coordinator", not args.scarce_coordinator),
        ("--nvh-catch-up", args.nvh_catch_up is not None),
        ("--no-hand-to-owner", not args.hand_to_owner),
        ("--nvh-oracle-share", args.nvh_oracle_share != SimConfig.nvh_oracle_share)) if given]
    if unsupported:
        parser.error(f"{', '.join(unsupported)} not supported with --scheduler nova")
    name = nova_simulation.missing()
    if name is not None:
        print(f"{parser.prog} --scheduler nova: {name} is not installed; "
              f"pip install 'shared-host-manager[{nova_simulation.EXTRA}]'", file=sys.stderr)
        return 2
    from simulator import nova_sim

    cfg = nova_sim.NovaSimConfig(
        host_manager=args.host_manager, nodes=args.nodes, schedulers=args.schedulers,
        clients=args.clients, duration=0.0 if args.requests is not None else args.duration,
        requests=args.requests, seed=args.seed, fill=args.fill, db_url=args.db_url,
        hosts_per_reporter=args.hosts_per_reporter,
        filters=args.filters.split(",") if args.filters else None,
        host_ownership=args.host_ownership, announce_claims=args.announce_claims,
        placement_processes=args.placement_processes, progress=not args.quiet)
    try:
        nova_sim.check_config(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    return nova_sim.main(cfg, args.json)
