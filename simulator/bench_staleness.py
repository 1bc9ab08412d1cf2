"""``shm bench staleness``: the shared mode over RabbitMQ against a stored reference.

Runs ``shm sim --host-manager shared --transport URL --nodes 1000 --schedulers 2
--duration 30 --seed 7`` (each run a process of its own, as the command is run by
hand), takes the medians of the runs' view staleness p99 and scheduled requests per
second, and prints them beside the reference file's (``simulator/reference/
staleness.json`` by default), with the process's CPU time beside its wall time.  It
exits 1 when the staleness p99 is more than ``--factor`` times the reference's, or the
scheduled requests per second less than the reference's divided by
``--throughput-factor``.  ``--against DIR`` runs the code in DIR (a ``git worktree`` of
the reference commit) interleaved with this code instead, and compares with its medians:
the machine's load then weighs on both sides alike.  DIR gets its own package metadata
first (``setup.py egg_info``): the filters and weighers are entry points, and a run in
which one does not load stops the benchmark rather than measure another scheduler.

The whole cloud shares one Python process here, so every extra cast per claim is CPU
the stream consumer and the reporters wait for: staleness grows with it long before
throughput shows it.  The machine's load moves both figures, between sessions by up to
3x: a stored reference catches a regression of that order (staleness p99 about tenfold
and 0.57x the throughput is what this benchmark is kept for), ``--against`` a smaller one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_REFERENCE = os.path.join(os.path.dirname(__file__), "reference", "staleness.json")
DEFAULT_SIM_ARGS = ["--host-manager", "shared", "--nodes", "1000", "--schedulers", "2",
                    "--duration", "30", "--seed", "7"]
#: the figures compared, and whether higher is better
FIGURES = {"staleness_ms_p99": False, "scheduled_per_s": True}


@dataclass
class Row:
    figure: str
    measured: float
    reference: float
    ratio: float
    regressed: bool


def read_reference(path: str) -> dict[str, Any]:
    """The reference file: a JSON object with a number for every compared figure."""
    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    if not isinstance(ref, dict):
        raise ValueError(f"{path}: a JSON object expected")
    for name in FIGURES:
        value = ref.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}: {name} must be a number >= 0, got {value!r}")
    return ref


def compare(measured: dict[str, float], reference: dict[str, Any], factor: float,
            throughput_factor: float | None = None) -> list[Row]:
    """One row per figure: measured/reference, and whether it is worse than allowed: higher
    than ``factor`` x the reference for staleness, lower than the reference divided by
    ``throughput_factor`` (default: ``factor``) for throughput."""
    tfactor = factor if throughput_factor is None else throughput_factor
    if factor < 1 or tfactor < 1:
        raise ValueError("factors must be >= 1")
    rows = []
    for name, higher_is_better in FIGURES.items():
        got, ref = float(measured[name]), float(reference[name])
        ratio = got / ref if ref else float("inf") if got else 1.0
        regressed = got * tfactor < ref if higher_is_better else got > ref * factor
        rows.append(Row(name, got, ref, ratio, regressed))
    return rows


def median_figures(results: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each compared figure (and of CPU and wall seconds) over the runs."""
    keys = [*FIGURES, "cpu_s", "wall_s"]
    return {k: statistics.median(float(r[k]) for r in results) for k in keys if k in results[0]}


def prepare_checkout(code_dir: str) -> None:
    """Give the checkout in ``code_dir`` its own package metadata (``setup.py egg_info``):
    the scheduler's filters and weighers are entry points, and without it the reference
    runs with this code's list, whose modules it may not have (its filters then do not
    load and it measures another scheduler)."""
    if not os.path.exists(os.path.join(code_dir, "setup.py")):
        return
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info"], cwd=code_dir,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"setup.py egg_info in {code_dir} failed: {proc.stderr[-2000:]}")


def _command_module(code_dir: str) -> str:
    """The ``shm`` command's module in a checkout (its older layouts had it elsewhere)."""
    if os.path.isdir(os.path.join(code_dir, "shm_cli")):
        return "shm_cli.main"
    return "shared_host_manager.cmd.shm"


def _run_once(transport: str, sim_args: list[str], code_dir: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sim.json")
        env = dict(os.environ)
        module = "shm_cli.main"
        if code_dir is not None:
            env["PYTHONPATH"] = os.path.abspath(code_dir)
            module = _command_module(code_dir)
        cmd = [sys.executable, "-m", module, "sim", "--transport", transport,
               *sim_args, "--json", out]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                cwd=code_dir, env=env)
        _, err = proc.communicate()
        wall = time.monotonic() - start
        if proc.returncode:
            raise RuntimeError(f"shm sim failed ({proc.returncode}): "
                               f"{err.decode(errors='replace')[-2000:]}")
        missing = [line for line in err.decode(errors="replace").splitlines()
                   if "cannot load" in line and "plugin" in line]
        if missing:  # a filter or weigher left out: another scheduler than the one compared
            raise RuntimeError(f"shm sim in {code_dir or 'this checkout'}: {missing[0]}")
        with open(out, encoding="utf-8") as f:
            data = json.load(f)
    results = data["results"]
    shared = results["shared"] if isinstance(results, dict) else results[0]
    figures = {k: shared[k] for k in FIGURES}
    figures["wall_s"] = wall
    return figures


def _run_timed(transport: str, sim_args: list[str], code_dir: str | None = None
               ) -> dict[str, Any]:
    """One run, with the child's CPU time (user + system, set-up included)."""
    before = os.times()
    figures = _run_once(transport, sim_args, code_dir)
    after = os.times()
    figures["cpu_s"] = ((after.children_user - before.children_user)
                        + (after.children_system - before.children_system))
    return figures


def main(argv: list[str] | None = None, prog: str = "shm bench staleness") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--transport", default="rabbit://guest:guest@127.0.0.1:5672/")
    p.add_argument("--runs", type=int, default=3, help="runs; medians reported (default 3)")
    p.add_argument("--reference", default=DEFAULT_REFERENCE, help="reference JSON file")
    p.add_argument("--factor", type=float, default=3.0,
                   help="staleness p99 above this factor of the reference exits 1 (default 3)")
    p.add_argument("--throughput-factor", type=float, default=1.5,
                   help="scheduled/s below the reference divided by this exits 1 (default 1.5)")
    p.add_argument("--against", metavar="DIR",
                   help="run the code in DIR (e.g. a git worktree of the reference commit) "
                   "interleaved with this code and compare with it instead of the file")
    p.add_argument("--write-reference", metavar="FILE",
                   help="write the medians measured as a new reference file")
    p.add_argument("--json", metavar="FILE", help="write every run and the medians here")
    p.add_argument("sim_args", nargs="*", help="shm sim options after '--' "
                   f"(default: {' '.join(DEFAULT_SIM_ARGS)})")
    args = p.parse_args(argv)
    sim_args = args.sim_args or DEFAULT_SIM_ARGS
    reference = None if args.write_reference or args.against else read_reference(args.reference)
    runs: list[dict[str, Any]] = []
    against: list[dict[str, Any]] = []

    def show(label: str, r: dict[str, Any]) -> None:
        print(f"{label}: staleness p99 {r['staleness_ms_p99']:.1f} ms, "
              f"{r['scheduled_per_s']:.1f} scheduled/s, CPU {r['cpu_s']:.1f} s, "
              f"wall {r['wall_s']:.1f} s", flush=True)

    if args.against:
        prepare_checkout(args.against)
    for i in range(args.runs):
        if args.against:
            against.append(_run_timed(args.transport, sim_args, args.against))
            show(f"run {i + 1}/{args.runs} {args.against}", against[-1])
        runs.append(_run_timed(args.transport, sim_args))
        show(f"run {i + 1}/{args.runs}", runs[-1])
    med = median_figures(runs)
    if against:
        reference = median_figures(against)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": runs, "medians": med, "sim_args": sim_args,
                       "against": against, "reference": reference}, f, indent=1)
    if args.write_reference:
        with open(args.write_reference, "w", encoding="utf-8") as f:
            json.dump({"command": "shm sim --transport " + args.transport + " "
                       + " ".join(sim_args), "runs": args.runs,
                       "date": time.strftime("%Y-%m-%d"),
                       **{k: round(v, 2) for k, v in med.items()}}, f, indent=1)
            f.write("\n")
        print(f"reference written to {args.write_reference}")
        return 0
    assert reference is not None
    rows = compare(med, reference, args.factor, args.throughput_factor)
    print(f"{'median of ' + str(args.runs) + ' runs':<22}{'measured':>12}{'reference':>12}"
          f"{'ratio':>8}")
    for row in rows:
        limit = args.factor if row.figure == "staleness_ms_p99" else args.throughput_factor
        flag = f"  REGRESSED (beyond {limit:g}x)" if row.regressed else ""
        print(f"{row.figure:<22}{row.measured:>12.2f}{row.reference:>12.2f}"
              f"{row.ratio:>8.2f}{flag}")
    print(f"{'CPU s (wall s)':<22}{med['cpu_s']:>6.1f} ({med['wall_s']:.1f})"
          f"{reference.get('cpu_s', float('nan')):>8.1f} ({reference.get('wall_s', float('nan')):.1f})")
    return 1 if any(row.regressed for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
