"""``shm sim``'s driver: run each host-manager mode on the same seeded workload and compare.

:func:`run` runs every requested mode one after the other (a
:class:`~simulator.simulation.Simulation`, or a
:class:`~simulator.processes.ProcessSimulation` for the shared mode with
``--processes``, a :class:`~simulator.reporter_processes.ReporterProcessSimulation`
with ``--reporter-processes`` too), then puts the figures side by side: :func:`summary_table`
is the table ``shm sim`` prints, the returned dict the JSON it writes.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from simulator.processes import ProcessSimulation
from simulator.reporter_processes import ReporterProcessSimulation
from simulator.simulation import SimConfig, Simulation, check_config

MODES = ("shared", "legacy", "caching")


def run_mode(cfg: SimConfig, mode: str) -> dict[str, Any]:
    check_config(cfg)
    if cfg.processes and cfg.reporter_processes and mode == "shared":
        sim: Simulation = ReporterProcessSimulation(cfg, mode)
    elif cfg.processes and mode == "shared":
        sim = ProcessSimulation(cfg, mode)
    else:
        sim = Simulation(cfg, mode)
    try:
        sim.start()
        return sim.run()
    finally:
        sim.stop()


def run(cfg: SimConfig) -> dict[str, Any]:
    modes = MODES if cfg.host_manager == "all" else (cfg.host_manager,)
    check_config(cfg)
    results = {mode: run_mode(cfg, mode) for mode in modes}
    report: dict[str, Any] = {"config": asdict(cfg), "results": results}
    if cfg.processes:
        # only the shared schedulers run in processes; say where every mode's ran
        report["config"]["processes_apply_to"] = ["shared"]
        for result in results.values():
            result.setdefault("scheduler_processes", 0)
    if "shared" in results:
        shared = results["shared"]["scheduled_per_s"]
        ratios = {}
        for other in ("legacy", "caching"):
            if other in results and results[other]["scheduled_per_s"]:
                ratios[f"shared_vs_{other}_scheduled_per_s"] = round(
                    shared / results[other]["scheduled_per_s"], 2)
        report["ratios"] = ratios
    return report


def summary_table(report: dict[str, Any]) -> str:
    rows = [
        ("scheduled requests/s", "scheduled_per_s"),
        ("decision ms p50", "decision_ms_p50"),
        ("decision ms p99", "decision_ms_p99"),
        ("end-to-end ms p50", "e2e_ms_p50"),
        ("end-to-end ms p99", "e2e_ms_p99"),
        ("claims", "claims"),
        ("claims rejected", "claims_rejected"),
        ("claims rejected %", "claims_rejected_pct"),
        ("retries per request", "retries_per_request"),
        ("retries per scheduled", "retries_per_scheduled"),
        ("NoValidHost (wrong, in flight)", None),
        ("NoValidHost caught up (decided)", "no_valid_host_catch_ups"),
        ("staleness ms p50", "staleness_ms_p50"),
        ("staleness ms p99", "staleness_ms_p99"),
        ("staleness ms max", "staleness_ms_max"),
        ("broker messages/s", "broker_messages_per_s"),
        ("database statements/s", "db_statements_per_s"),
        ("overcommitted hosts", "overcommitted_hosts"),
        ("server-group violations", "server_group_violations"),
        ("weight gap to best (mean)", "weight_gap_mean"),
        ("chosen host rank (mean)", "chosen_rank_mean"),
        ("free RAM stdev %", "free_ram_stdev_pct"),
        ("free disk stdev %", "free_disk_stdev_pct"),
        ("scarce requests handed over", "scarce_handed_over"),
        ("requests handed to owners", "handed_to_owner"),
        ("rejected own/peer/scarce/alt", "claims_rejected_by_choice"),
        ("converged at the end", "converged"),
    ]
    results = report["results"]
    names = list(results)
    if any("scheduler_processes" in r for r in results.values()):
        rows.insert(0, ("scheduler processes", "scheduler_processes"))
    if any("reporter_processes" in r for r in results.values()):
        rows.insert(1, ("reporter processes", "reporter_processes"))
    if any(r.get("cells") for r in results.values()):
        rows.insert(0, ("cell streams", "cells"))
    if any("outage_cell" in r for r in results.values()):
        rows += [("cell away", "outage_cell"), ("  its hosts", "outage_cell_hosts"),
                 ("  seconds away", "outage_seconds"),
                 ("  scheduled/s meanwhile", "outage_scheduled_per_s"),
                 ("  placed elsewhere meanwhile", "outage_placed_elsewhere"),
                 ("  placed on it meanwhile", "outage_placed_on_cell"),
                 ("  placed on it after down", "outage_placed_on_cell_after_down"),
                 ("  rejoined s after return", "outage_rejoin_s")]
    width = max(len(r[0]) for r in rows) + 2
    table: list[tuple[str, list[str]]] = []
    for label, key in rows:
        cells: list[str] = []
        for n in names:
            r = results[n]
            if key is None:
                flight = r.get("no_valid_host_wrong_in_flight")
                value: Any = (f"{r['no_valid_host']} ({r['no_valid_host_wrong']}, "
                              f"{'-' if flight is None else flight})")
            elif key == "no_valid_host_catch_ups" and key in r:
                value = f"{r[key]} ({r.get('no_valid_host_caught_up', 0)})"
            elif key == "claims_rejected_by_choice":
                value = _by_choice(r.get(key))
            else:
                value = r.get(key)
            if key in ("scheduler_processes", "reporter_processes") and not value:
                value = "in-process"
            if isinstance(value, float):
                value = f"{value:.2f}"
            cells.append("-" if value is None else str(value))
        table.append((label, cells))
    # each column as wide as its widest cell, one space apart, at least 14
    widths = [max(14, len(n) + 1, *(len(cells[i]) + 1 for _, cells in table))
              for i, n in enumerate(names)]
    lines = [f"{'':{width}}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))]
    for label, cells in table:
        lines.append(f"{label:{width}}"
                     + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    for key, value in (report.get("ratios") or {}).items():
        lines.append(f"{key}: {value}x")
    return "\n".join(lines)


def _by_choice(counts: dict[str, int] | None) -> str | None:
    """Claims rejected by how their host was chosen, as own/peer/scarce/alternate (an
    affinity group's first member, and a scheduler alone, count as its own choice)."""
    if counts is None:
        return None
    own = sum(counts.get(c, 0) for c in ("owned", "alone", "anchor"))
    return "/".join(str(n) for n in (own, counts.get("peer", 0), counts.get("scarce", 0),
                                     counts.get("alternate", 0)))


__all__ = ["MODES", "run", "run_mode", "summary_table"]
