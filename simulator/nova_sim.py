"""``shm sim --scheduler nova``: nova 34's own scheduler on its whole path, legacy vs shared.

Every simulated scheduler is nova's real ``SchedulerManager``, with placement
(``openstack-placement``, in-process on its own database) and nova's database
behind it; the computes write what nova's resource tracker writes.  The nova
side lives in :mod:`shared_host_manager.nova.testing.simulation` (this module imports
no nova): ``legacy`` is nova's own HostManager reading nova's database,
``shared`` the drop-in fed by the stream.  The cloud and the workload are
today's ``shm sim``'s (:func:`~simulator.topology.build_cloud`,
:class:`~simulator.workload.Workload`, same seed, same pre-fill, same churn:
every server that boots is matched by the deletion of a running one), its
availability zones and SSD aggregate included: they become nova host
aggregates (API database, mirrored to placement), a request's availability
zone is the RequestSpec's, its flavor's extra specs (the ``ssd`` flavor's
``aggregate_instance_extra_specs:ssd``) the flavor's, and without
``--filters`` nova's default filters run with AggregateInstanceExtraSpecsFilter
added (:data:`WORKLOAD_FILTERS`), as an operator with such aggregates enables it.

Life cycle of :func:`run`: each host manager runs in a process of its own
(nova's configuration, its DB context managers and placement's are process
globals), one after the other: build the cloud (placement providers,
inventories and the pre-filled servers' allocations; nova's database; the
schedulers, and for ``shared`` the reporters and caches), run ``clients``
closed-loop client threads round robin over the schedulers for
``duration`` seconds or ``requests`` requests, check the hosts (computes and
placement), return the figures.  All parties of a run share one process and
its GIL, as in ``shm sim``.

Figures per host manager: today's (scheduled/s, decision and end-to-end
latency, claims and refusals, NoValidHost, overcommitted hosts, server-group
violations), the servers placed in a requested availability zone or by an
aggregate extra spec and those of them outside it (must be 0), plus the time
per phase per request -- placement query, host states, filter + weigh,
placement claim, other (the rest of ``select_destinations``: request filters,
Selection objects), compute (the builds) -- as medians and as each phase's
share of the mean end-to-end time; and per request the scheduler's own time
(host states + filter + weigh + other: what the host manager changes) apart
from placement's (query + claims).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from shared_host_manager.nova.testing.simulation import PHASES as NOVA_PHASES
from simulator.simulation import RunShape, _Progress, drive_clients, ms, request_figures
from simulator.topology import build_cloud
from simulator.workload import Workload

MODES = ("shared", "legacy")
#: the phases of a request, in the order they happen
PHASES = (*NOVA_PHASES, "other", "compute")
#: added to nova's default filters when ``--filters`` is not given: the workload's SSD flavor
#: asks for the SSD aggregate through its extra specs (availability zones need no filter in
#: nova 34: its request filter asks placement for the zone's aggregate)
WORKLOAD_FILTERS = ("AggregateInstanceExtraSpecsFilter",)
#: the extra specs AggregateInstanceExtraSpecsFilter reads (nova's scope for them)
AGGREGATE_SPEC = "aggregate_instance_extra_specs:"
#: the scheduler's own work (what the host manager changes) and placement's, per request
OWN = ("memory_candidates", "host_states", "filter_weigh", "other")
PLACEMENT = ("placement_query", "placement_claim")


@dataclass
class NovaSimConfig(RunShape):
    nodes: int = 100
    #: nova's [filter_scheduler] enabled_filters (None: nova's defaults)
    filters: list[str] | None = None
    #: the drop-in's [shared_host_manager] host_ownership (shared mode)
    host_ownership: bool = False
    #: shared mode: each scheduler casts the claims placement accepted to its peers ([cache]
    #: announce_claims, with membership on the stream)
    announce_claims: bool = True
    #: placement served from this many processes of its own (0: in the run's process)
    placement_processes: int = 0


def check_config(cfg: NovaSimConfig) -> None:
    """Refuse what nova mode cannot run (ValueError, saying what instead)."""
    if cfg.host_manager not in (*MODES, "all"):
        raise ValueError(f"--scheduler nova runs the shared and legacy host managers "
                         f"(nova's CachingScheduler was removed), not {cfg.host_manager!r}")
    if cfg.schedulers < 1 or cfg.clients < 1 or cfg.nodes < 1:
        raise ValueError("--nodes, --schedulers and --clients must be at least 1")
    if cfg.placement_processes < 0:
        raise ValueError("--placement-processes must be 0 (in-process) or more")
    if cfg.placement_processes and not cfg.db_url:
        raise ValueError("--placement-processes needs a database server for placement's "
                         "workers to share: --db-url mysql+pymysql://... or postgresql://...")


@dataclass
class _Metrics:
    requests: int = 0
    scheduled: int = 0
    instances: int = 0
    no_valid_host: int = 0
    compute_rejected: int = 0
    group_rejected: int = 0
    claims: int = 0
    claims_refused: int = 0
    claims_skipped: int = 0
    claim_conflicts: int = 0
    #: GET /allocation_candidates placement served; requests answered from memory; SQL
    #: statements the schedulers ran on nova's databases while deciding
    candidate_queries: int = 0
    candidates_from_memory: int = 0
    sql_statements: int = 0
    #: servers placed for a request with an availability zone / whose flavor asks for aggregate
    #: metadata, and those of them on a host outside the zone or without the metadata
    az_servers: int = 0
    aggregate_spec_servers: int = 0
    outside_aggregate_servers: int = 0
    decision_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    own_s: list[float] = field(default_factory=list)
    placement_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _aggregates(cloud: Any) -> list[Any]:
    from shared_host_manager.nova.testing.simulation import SimAggregate

    return [SimAggregate(name=a["name"], metadata=dict(a["metadata"]), hosts=list(a["hosts"]))
            for _, a in sorted(cloud.aggregates.items())]


def _aggregate_specs(spec: Any) -> dict[str, str]:
    """The aggregate metadata ``spec``'s flavor asks for (AggregateInstanceExtraSpecsFilter's)."""
    return {k[len(AGGREGATE_SPEC):]: v for k, v in spec.flavor.extra_specs.items()
            if k.startswith(AGGREGATE_SPEC)}


def _in_place(spec: Any, metadata: list[dict[str, str]]) -> bool:
    """Whether a host whose aggregates have ``metadata`` is where ``spec`` asked: in its zone's
    aggregate, and every aggregate extra spec's value in one of the host's aggregates (the
    workload asks only for plain values, no operators)."""
    zone = spec.availability_zone
    return ((not zone or any(m.get("availability_zone") == zone for m in metadata))
            and all(any(m.get(k) == v for m in metadata)
                    for k, v in _aggregate_specs(spec).items()))


def _hosts(cloud: Any) -> list[Any]:
    from shared_host_manager.nova.testing.simulation import SimHost

    out = []
    for source in sorted(cloud.documents):
        doc = cloud.documents[source]
        c = doc["compute"]
        out.append(SimHost(
            source=source, host=c["host"], vcpus=c["vcpus"], memory_mb=c["memory_mb"],
            disk_gb=c["disk_gb"], cpu_allocation_ratio=c["cpu_allocation_ratio"],
            ram_allocation_ratio=c["ram_allocation_ratio"],
            disk_allocation_ratio=c["disk_allocation_ratio"],
            reserved_memory_mb=c.get("reserved_memory_mb", 0),
            instances={u: dict(i["resources"]) for u, i in doc.get("instances", {}).items()}))
    return out


class NovaRun:
    """One host manager's run (in its own process); see the module docstring."""

    def __init__(self, cfg: NovaSimConfig, mode: str, directory: str) -> None:
        from shared_host_manager.nova.testing.simulation import NovaCloud

        self.cfg, self.mode = cfg, mode
        self.cloud = build_cloud(cfg.nodes, cfg.seed)
        self.workload = Workload(cfg.seed)
        self.prefilled = self.workload.prefill(self.cloud.documents, cfg.fill)
        self.host_of = {s: d["compute"]["host"] for s, d in self.cloud.documents.items()}
        #: source -> the metadata of each of its aggregates
        self.metadata_of = {s: [a["metadata"] for a in d.get("aggregates", {}).values()]
                            for s, d in self.cloud.documents.items()}
        self.metrics = _Metrics()
        self._workload_lock = threading.Lock()
        self.errors: list[str] = []
        started = time.perf_counter()
        self.nova = NovaCloud(_hosts(self.cloud), mode=mode, schedulers=cfg.schedulers,
                              directory=directory, cell_uuid=self.cloud.cell_uuid,
                              filters=cfg.filters, db_url=cfg.db_url,
                              aggregates=_aggregates(self.cloud),
                              extra_filters=None if cfg.filters else list(WORKLOAD_FILTERS),
                              hosts_per_reporter=cfg.hosts_per_reporter,
                              host_ownership=cfg.host_ownership,
                              announce_claims=cfg.announce_claims,
                              placement_processes=cfg.placement_processes)
        self.setup_s = time.perf_counter() - started

    def _request(self) -> tuple[Any, Any] | None:
        """The workload's next request and its nova form (group hosts as the conductor finds them)."""
        from shared_host_manager.nova.testing.simulation import SimRequest

        with self._workload_lock:
            if self.cfg.requests is not None and self.workload.issued >= self.cfg.requests:
                return None
            spec = self.workload.next_request()
            group = spec.instance_group
            hosts = []
            if group is not None:
                hosts = [self.host_of[self.workload.running[m]] for m in group.members
                         if m in self.workload.running]
        req = SimRequest(instance_uuids=list(spec.instance_uuids), vcpus=spec.flavor.vcpus,
                         memory_mb=spec.flavor.memory_mb, root_gb=spec.flavor.root_gb,
                         project_id=spec.project_id,
                         availability_zone=spec.availability_zone,
                         extra_specs=dict(spec.flavor.extra_specs),
                         group_uuid=group.uuid if group is not None else None,
                         group_policy=group.policy if group is not None else None,
                         group_members=list(group.members) if group is not None else [],
                         group_hosts=hosts)
        return spec, req

    def _client(self, index: int, stop: threading.Event) -> None:
        try:
            scheduler = index % self.cfg.schedulers
            while not stop.is_set():
                made = self._request()
                if made is None:
                    return
                spec, req = made
                start = time.perf_counter()
                outcome = self.nova.schedule(scheduler, req)
                e2e = time.perf_counter() - start
                self._record(spec, outcome, e2e)
        except Exception:  # a client's failure ends the run with its traceback
            self.errors.append(traceback.format_exc())
            stop.set()

    def _record(self, spec: Any, outcome: Any, e2e: float) -> None:
        m = self.metrics
        with m.lock:
            m.requests += 1
            m.instances += len(spec.instance_uuids)
            m.decision_s.append(outcome.decision_s)
            m.e2e_s.append(e2e)
            m.claims += outcome.claims
            m.claims_refused += outcome.claims_refused
            m.claims_skipped += outcome.claims_skipped
            m.claim_conflicts += outcome.claim_conflicts
            m.candidate_queries += outcome.candidate_queries
            m.candidates_from_memory += "memory_candidates" in outcome.phases
            m.sql_statements += outcome.sql_statements
            m.compute_rejected += outcome.compute_rejected
            m.group_rejected += outcome.group_rejected
            for phase in PHASES:
                m.phases[phase].append(outcome.phases.get(phase, 0.0))
            m.own_s.append(sum(outcome.phases.get(p, 0.0) for p in OWN))
            m.placement_s.append(sum(outcome.phases.get(p, 0.0) for p in PLACEMENT))
            if outcome.failed:
                m.no_valid_host += len(outcome.failed) - outcome.compute_rejected
            else:
                m.scheduled += 1
            placed = len(outcome.placed)
            if spec.availability_zone:
                m.az_servers += placed
            if _aggregate_specs(spec):
                m.aggregate_spec_servers += placed
            m.outside_aggregate_servers += sum(
                not _in_place(spec, self.metadata_of[s]) for s in outcome.placed.values())
        if outcome.placed:
            with self._workload_lock:
                self.workload.booted(spec, outcome.placed)
                deletions = [d for d in (self.workload.pick_deletion() for _ in outcome.placed) if d]
            for instance, _source in deletions:
                self.nova.delete(instance)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        progress = _Progress(f"nova {self.mode}", None if cfg.requests else cfg.duration,
                             cfg.requests, cfg.progress)
        before, placement_before = os.times(), self._placement_cpu()
        elapsed = drive_clients(self._client, cfg.clients, None if cfg.requests else cfg.duration,
                                progress, lambda: self.metrics.requests)
        after, placement_after = os.times(), self._placement_cpu()
        if self.errors:
            raise RuntimeError("simulation clients failed:\n" + self.errors[0])
        checked = self.nova.check()
        out = self._figures(elapsed, checked)
        # CPU beside wall: this process's (schedulers, computes, clients; placement too when
        # in-process), and placement's workers' when it has processes of its own
        out["cpu_s"] = round(after.user + after.system - before.user - before.system, 1)
        out["placement_cpu_s"] = (None if placement_before is None or placement_after is None
                                  else round(placement_after - placement_before, 1))
        return out

    def _placement_cpu(self) -> float | None:
        return self.nova.placement.cpu_seconds()

    def _figures(self, elapsed: float, checked: dict[str, Any]) -> dict[str, Any]:
        m = self.metrics

        mean_e2e = statistics.fmean(m.e2e_s) if m.e2e_s else 0.0
        phases = {}
        for phase in PHASES:
            xs = m.phases[phase]
            mean = statistics.fmean(xs) if xs else 0.0
            phases[phase] = {"p50_ms": ms(xs, 0.5), "mean_ms": round(1000 * mean, 3),
                             "share_pct": round(100 * mean / mean_e2e, 1) if mean_e2e else None}
        out: dict[str, Any] = {
            "scheduler": "nova",
            **request_figures(m.requests, m.scheduled, elapsed, m.decision_s, m.e2e_s, m.claims,
                              m.claims_refused),
            "e2e_ms_mean": round(1000 * mean_e2e, 3),
            # select_destinations without placement: host states, filter + weigh, the rest
            "scheduler_own_ms_p50": ms(m.own_s, 0.50),
            "scheduler_own_ms_p99": ms(m.own_s, 0.99),
            # placement's two calls (candidates, claims with nova's retries)
            "placement_ms_p50": ms(m.placement_s, 0.50),
            # claims the drop-in did not send: its view knew placement would refuse them
            "claims_skipped": m.claims_skipped,
            # claims placement answered 409 placement.concurrent_update, retried by nova
            "claim_conflicts": m.claim_conflicts,
            # placement's GET /allocation_candidates served; requests answered from memory
            "allocation_candidate_queries": m.candidate_queries,
            "candidates_from_memory": m.candidates_from_memory,
            "candidates_from_memory_pct": round(100 * m.candidates_from_memory / m.requests, 2)
            if m.requests else None,
            "scheduler_sql_statements": m.sql_statements,
            "no_valid_host": m.no_valid_host,
            "compute_rejected": m.compute_rejected,
            "group_check_rejected": m.group_rejected,
            "server_group_violations": len(self.workload.violations),
            "az_servers": m.az_servers,
            "aggregate_spec_servers": m.aggregate_spec_servers,
            "outside_aggregate_servers": m.outside_aggregate_servers,
            "prefilled_instances": self.prefilled,
            "setup_s": round(self.setup_s, 1),
            "setup_s_by_part": {k: round(v, 1) for k, v in self.nova.setup_s.items()},
            "filters": self.nova.filters,
            "phases": phases,
        }
        out.update(checked)
        out.update(self.nova.placement_figures())
        out.update(self.nova.request_filter_figures())
        return out

    def close(self) -> None:
        self.nova.close()


def run_mode(cfg: NovaSimConfig, mode: str) -> dict[str, Any]:
    """One host manager's run, in this process (nova's globals: once per process)."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    for name in ("nova", "placement", "keystoneauth", "oslo_policy", "oslo_db", "stevedore"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix=f"shm-sim-nova-{mode}-") as tmp:
        run = NovaRun(cfg, mode, tmp)
        try:
            return run.run()
        finally:
            run.close()


def _child(cfg: NovaSimConfig, mode: str, conn: Any) -> None:
    try:
        conn.send(("ok", run_mode(cfg, mode)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_mode_in_process(cfg: NovaSimConfig, mode: str) -> dict[str, Any]:
    """:func:`run_mode` in a fresh process (spawned: no nova state carried over)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(cfg, mode, child), name=f"shm-sim-nova-{mode}")
    proc.start()
    child.close()
    try:
        status, payload = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the {mode} run's process died (exit code {proc.exitcode})") from None
    proc.join()
    if status != "ok":
        raise RuntimeError(f"the {mode} run failed:\n{payload}")
    return payload


def run(cfg: NovaSimConfig) -> dict[str, Any]:
    check_config(cfg)
    modes = MODES if cfg.host_manager == "all" else (cfg.host_manager,)
    results = {}
    for mode in modes:
        if cfg.progress:
            print(f"nova {mode}: setting up {cfg.nodes} nodes, {cfg.schedulers} schedulers...",
                  file=sys.stderr)
        results[mode] = run_mode_in_process(cfg, mode)
    report: dict[str, Any] = {"config": asdict(cfg), "results": results}
    if "shared" in results and "legacy" in results and results["legacy"]["scheduled_per_s"]:
        report["ratios"] = {"shared_vs_legacy_scheduled_per_s": round(
            results["shared"]["scheduled_per_s"] / results["legacy"]["scheduled_per_s"], 2)}
        if results["shared"]["scheduler_own_ms_p50"]:
            report["ratios"]["legacy_vs_shared_scheduler_own_ms_p50"] = round(
                results["legacy"]["scheduler_own_ms_p50"] / results["shared"]["scheduler_own_ms_p50"], 2)
    return report


def summary_table(report: dict[str, Any]) -> str:
    results = report["results"]
    modes = list(results)
    rows = [
        ("scheduled requests/s", "scheduled_per_s"),
        ("requests", "requests"),
        ("select_destinations ms p50", "decision_ms_p50"),
        ("select_destinations ms p99", "decision_ms_p99"),
        ("end-to-end ms p50", "e2e_ms_p50"),
        ("end-to-end ms p99", "e2e_ms_p99"),
        ("scheduler's own ms p50 (no placement)", "scheduler_own_ms_p50"),
        ("scheduler's own ms p99", "scheduler_own_ms_p99"),
        ("placement ms p50 (query + claims)", "placement_ms_p50"),
        ("GET /allocation_candidates (placement)", "allocation_candidate_queries"),
        ("candidates from memory (requests)", "candidates_from_memory"),
        ("SQL statements while deciding", "scheduler_sql_statements"),
        ("request filters from the catalogue", "request_filters_from_catalogue"),
        ("request filters read nova's DB", "request_filter_db_fallbacks"),
        ("placement claims refused", "claims_rejected"),
        ("claims not sent (view: no room)", "claims_skipped"),
        ("claims retried (generation conflict)", "claim_conflicts"),
        ("NoValidHost (instances)", "no_valid_host"),
        ("builds refused at the compute", "compute_rejected"),
        ("  of them by the server-group check", "group_check_rejected"),
        ("overcommitted hosts (computes)", "overcommitted_hosts"),
        ("overcommitted hosts (placement)", "placement_overcommitted_hosts"),
        ("hosts whose allocations differ", "allocation_mismatched_hosts"),
        ("server group violations", "server_group_violations"),
        ("servers placed in a requested zone", "az_servers"),
        ("servers placed by aggregate extra specs", "aggregate_spec_servers"),
        ("  of them outside zone / aggregate", "outside_aggregate_servers"),
        ("decisions on an owned host", "owned_choices"),
        ("claims announced to the peers", "claims_announced"),
        ("CPU s while running (this process)", "cpu_s"),
        ("CPU s while running (placement's)", "placement_cpu_s"),
        ("set-up s", "setup_s"),
    ]
    cfg = report["config"]
    workers = cfg.get("placement_processes")
    placement = f"{workers} processes" if workers else "in-process"
    lines = [f"nova 34 SchedulerManager, {cfg['nodes']} nodes, {cfg['schedulers']} schedulers, "
             f"{cfg['clients']} clients, placement {placement}, nova DB "
             f"{'SQLite' if not cfg['db_url'] else cfg['db_url'].split(':')[0]}",
             f"filters: {', '.join(next(iter(results.values()))['filters'])}",
             f"{'':38}" + "".join(f"{m:>14}" for m in modes)]
    for label, key in rows:
        lines.append(f"{label:38}" + "".join(f"{str(results[m].get(key)):>14}" for m in modes))
    lines.append("time per request by phase, median ms (share of the mean end-to-end time):")
    for phase in PHASES:
        cells = ""
        for m in modes:
            ph = results[m]["phases"][phase]
            cells += f"{ph['p50_ms']} ({ph['share_pct']}%)".rjust(22)
        lines.append(f"  {phase:32}{cells}")
    for name, value in report.get("ratios", {}).items():
        lines.append(f"{name}: {value}x")
    return "\n".join(lines)


def main(cfg: NovaSimConfig, json_path: str | None) -> int:
    """Run, print the table, write the JSON; 1 if any host ended overcommitted."""
    import json

    report = run(cfg)
    print(summary_table(report))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"figures written to {json_path}")
    bad = [m for m, r in report["results"].items()
           if r["overcommitted_hosts"] or r["placement_overcommitted_hosts"]]
    if bad:
        print(f"INVARIANT BROKEN: overcommitted hosts in {bad}", file=sys.stderr)
        return 1
    return 0
