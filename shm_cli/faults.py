"""``shm faults``: the whole system under seeded fault schedules, invariants checked.

``shm faults --schedules N [--seed S] [--json FILE]`` runs N schedules (the real
reporter, cache, decision and claim code over a simulated network in virtual time,
:mod:`simulator.faults`) and exits 0 only if no invariant of design §6 was violated.
``shm faults --seed S --schedule K [--record DIR]`` runs schedule K again, exactly,
with every party's update log written to DIR, for ``shm replay``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from simulator.faults.planted import PlantedBug
from simulator.faults.run import reproduce, run_schedules
from simulator.faults.world import INVARIANTS


def build_parser(prog: str = "shm faults") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 no violation, 1 violations found, 2 usage.")
    p.add_argument("--schedules", type=int, default=1000, metavar="N",
                   help="schedules to run (default: %(default)s)")
    p.add_argument("--seed", type=int, help="seed of the schedules (default: a fresh one, printed)")
    p.add_argument("--first", type=int, default=0, metavar="K",
                   help="number of the first schedule (default: 0)")
    p.add_argument("--schedule", type=int, metavar="K",
                   help="run only schedule K of --seed, writing every party's update log (--record)")
    p.add_argument("--record", metavar="DIR",
                   help="with --schedule: where the update logs go (default: faults-SEED-K)")
    p.add_argument("--workers", type=int, default=1, metavar="J",
                   help="processes to spread the schedules over (default: 1)")
    p.add_argument("--plant", action="append", default=[], metavar="BUG",
                   choices=[b.value for b in PlantedBug],
                   help="plant a known bug in every scheduler's receiver, to see the simulator find it "
                        f"(repeatable; one of {', '.join(b.value for b in PlantedBug)})")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.schedules < 1:
        print("shm faults: --schedules must be at least 1", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("shm faults: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.record and args.schedule is None:
        print("shm faults: --record needs --schedule K (the schedule to reproduce)", file=sys.stderr)
        return 2
    planted = frozenset(PlantedBug(b) for b in args.plant)
    if args.schedule is not None:
        if args.seed is None:
            print("shm faults: --schedule needs the --seed it was run with", file=sys.stderr)
            return 2
        directory = args.record or f"faults-{args.seed}-{args.schedule}"
        violations = reproduce(args.seed, args.schedule, directory, planted=planted)
        for v in violations:
            print(f"seed {v.seed} schedule {v.schedule} step {v.step} (t={v.time:.2f}s): "
                  f"{v.invariant}: {v.detail}")
        print(f"update logs of every party in {directory}/; "
              f"'shm replay {os.path.join(directory, 'scheduler-NAME.ulog')}' replays one "
              f"(add --diff {os.path.join(directory, 'reporter-NAME.ulog')} for the first divergence)")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"seed": args.seed, "schedule": args.schedule, "record": directory,
                           "violations": [v.as_dict() for v in violations]}, f, indent=2)
        return 1 if violations else 0

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"shm faults: seed {seed}, schedules {args.first}..{args.first + args.schedules - 1}"
          + (f", planted: {', '.join(sorted(args.plant))}" if planted else ""), flush=True)

    started = time.monotonic()
    last = [0]

    def progress(done: int, bad: int) -> None:
        if not args.quiet and (done - last[0] >= 1000 or done == args.schedules):
            last[0] = done
            elapsed = time.monotonic() - started
            print(f"  {done}/{args.schedules} schedules in {elapsed:.0f}s "
                  f"({done / max(elapsed, 1e-9):.1f}/s), {bad} violations", file=sys.stderr, flush=True)

    report = run_schedules(seed, args.schedules, first=args.first, workers=args.workers,
                           planted=planted, progress=progress)
    for v in report.violations:
        print(f"VIOLATION seed {v.seed} schedule {v.schedule} step {v.step} (t={v.time:.2f}s): "
              f"{v.invariant} ({INVARIANTS.get(v.invariant, '')}): {v.detail}")
    print(f"{report.schedules} schedules in {report.seconds:.1f}s ({report.per_second:.1f}/s), "
          f"{len(report.violations)} violations")
    if report.violations:
        v = report.violations[0]
        print(f"reproduce: shm faults --seed {v.seed} --schedule {v.schedule}"
              + "".join(f" --plant {b}" for b in sorted(args.plant)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
