"""``shm replay LOG...``: rebuild a scheduler's host-state cache from its update log, and check it.

Replays the log record by record through the receiver code the cache runs
(:mod:`shared_host_manager.updatelog.replay`), verifying at every checkpoint that the
rebuilt views have the recorded digests (invariant 5) and at every step that
the same resync requests and claim outcomes come out.  Then, depending on the
options:

* ``--source S [--at RECORD | --until TIME]`` – S's state at that point
  (version, digest, liveness, pending claims, document);
* ``--source S --history`` – every version of S: how it arrived (stream,
  resync answer, claim correction, restore), what changed, which claims it
  included, and the events around it (gaps, resync requests, claim outcomes);
* ``--diff LOG2`` – per source, the first version at which two logs' views
  diverged and why (a missed delta: gap then resync; a late resync; a
  rejected claim; different content), for two schedulers or a scheduler and
  a reporter;
* ``--decisions`` – re-run every recorded decision on the replayed view with
  the recorded RNG state and report any that now comes out differently
  (``--decision-option NAME=VALUE`` re-runs them with a changed option).  A
  nova-scheduler-shared log holds nova's decisions step by step: they are
  re-run with the drop-in's own code (:mod:`shared_host_manager.nova.replay.steps`,
  needs the ``nova`` extra), and ``--decision-option GROUP.OPTION=VALUE``
  changes a nova.conf option for the re-run.

LOG is a part (``scheduler-s0.ulog.0003``), a log's base path
(``scheduler-s0.ulog``: all its parts, in order) or a directory (lists its
logs).  A damaged log is replayed up to the damage, which is reported with
its byte offset and record number.

Exit status: 0 every check passed; 1 a difference was found (checkpoint,
step effects, decision, or a divergence with --diff); 2 usage error; 3 the
log is damaged (everything before the damage replayed and checked).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
from typing import Any

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.updatelog.diff import DiffResult, diff_logs
from shared_host_manager.updatelog.reader import Damage, find_logs, resolve_log
from shared_host_manager.updatelog.replay import (
    ReplayResult,
    Tracer,
    gap_text,
    history,
    replay,
    view_json,
)

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3


def build_parser(prog: str = "shm replay") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 checks passed, 1 differences found, 2 usage, "
                                       "3 log damaged (prefix replayed).")
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="a log part, a log's base path (all parts) or a directory (list its logs)")
    p.add_argument("--source", metavar="S",
                   help="show this source's state (or --history); with --diff, only this source")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--at", type=int, metavar="RECORD", help="stop after record RECORD")
    stop.add_argument("--until", type=float, metavar="TIME",
                      help="stop after the last record at clock value <= TIME")
    p.add_argument("--history", action="store_true",
                   help="every version of --source and what changed, with events")
    p.add_argument("--diff", metavar="LOG2", help="compare with another log")
    cut = p.add_mutually_exclusive_group()
    cut.add_argument("--at-offset", type=int, metavar="N",
                     help="with --diff: compare both views as they were before the first stream "
                          "message past offset N (default for two schedulers: the last offset both "
                          "applied, so end-of-log skew between live processes is not a divergence)")
    cut.add_argument("--at-time", metavar="T",
                     help="with --diff: compare both views as they were at wall-clock time T "
                          "(ISO 8601, e.g. 2026-11-23T21:30:00, local time unless it has a zone; "
                          "or seconds since the epoch)")
    cut.add_argument("--whole", action="store_true",
                     help="with --diff: compare the whole logs, without aligning them")
    p.add_argument("--decisions", action="store_true",
                   help="re-run every recorded decision on the replayed view")
    p.add_argument("--decision-option", action="append", default=[], metavar="NAME=VALUE",
                   help="with --decisions: re-run with this scheduler option changed (what-if); "
                        "for a nova-scheduler-shared log, a nova.conf option as GROUP.OPTION, "
                        "e.g. filter_scheduler.ram_weight_multiplier=-1")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--limit", type=int, default=20, metavar="N",
                   help="show at most N differences or history rows per section (default 20; 0: all)")
    return p


def _paths(args: list[str]) -> list[str]:
    paths: list[str] = []
    for arg in args:
        found = resolve_log(arg)
        if not found:
            raise FileNotFoundError(f"no update log at {arg!r}")
        paths.extend(found)
    return paths


def _limit(items: list, n: int) -> list:
    return items if n <= 0 else items[:n]


def _t(now: Any) -> str:
    return f"{now:.3f}" if isinstance(now, float) else str(now)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- results as data ---------------------------------------------------------------


def result_json(r: ReplayResult) -> dict[str, Any]:
    return {
        "role": r.role, "name": r.name, "files": r.paths, "sessions": r.sessions,
        "records": r.records, "last_record": r.last_record, "last_time": r.last_now,
        "bytes": r.bytes, "seconds": r.elapsed, "records_per_s": r.records_per_s,
        "stopped_early": r.stopped_early, "ok": r.ok,
        "checkpoints": r.checkpoints, "checkpoints_failed": r.checkpoints_failed,
        "mismatches": [_jsonable(m) for m in r.mismatches],
        "effects_checked": r.effects_checked,
        "effect_mismatches": [_jsonable(m) for m in r.effect_mismatches],
        "decisions": r.decisions, "decisions_checked": r.decisions_checked,
        "decisions_skipped": r.decisions_skipped, "decision_diffs": [_jsonable(d) for d in r.decision_diffs],
        "decisions_note": r.decisions_note, "dropped": r.dropped, "sent": r.sent,
        "divergence_alerts": r.divergences,
        "stream_offsets_missing": [[a, b, cell] for _, a, b, cell in r.stream_gaps],
        "damage": _damage_json(r.damage),
        "damages": [_damage_json(d) for d in r.damages],
        "notes": [[i, t, text] for i, t, text in r.notes],
    }


def _damage_json(d: Damage | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"file": d.path, "offset": d.offset, "record": d.record, "reason": d.reason,
            "resumed": d.resumed}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return value


# -- text -----------------------------------------------------------------------------


def summary_lines(r: ReplayResult, limit: int = 20) -> list[str]:
    files = len(r.paths)
    lines = [f"replayed {r.role} {r.name!r}: {r.records} records ({files} file{'s' * (files != 1)}, "
             f"{_bytes(r.bytes)}, {r.sessions} session{'s' * (r.sessions != 1)}) in {r.elapsed:.3f} s "
             f"- {r.records_per_s:,.0f} records/s"]
    if r.stopped_early:
        lines.append(f"  stopped after record {r.last_record} (t={_t(r.last_now)})")
    if r.role == "scheduler":
        if not r.mismatches and r.checkpoints:
            lines.append(f"  checkpoints: {r.checkpoints} verified, every view equal to the recorded "
                         "digests (invariant 5 holds)")
        elif not r.checkpoints:
            lines.append("  checkpoints: none recorded in the replayed range")
        else:
            lines.append(f"  checkpoints: {r.checkpoints} verified, {r.checkpoints_failed} DIFFER")
        if r.effect_mismatches:
            lines.append(f"  step effects: {len(r.effect_mismatches)} step(s) DIFFER "
                         f"(of {r.effects_checked})")
        else:
            lines.append(f"  step effects: {r.effects_checked} steps, same resync requests and claim "
                         "outcomes")
    else:
        lines.append(f"  published stream replayed; heartbeat digests "
                     f"{'all agree' if not r.mismatches else 'DISAGREE'}")
    if r.mismatches:
        m = r.mismatches[0]
        lines.append(f"  FIRST DIFFERENCE at record {m['record']} ({m['kind']}, t={_t(m['now'])}): "
                     f"{m['detail']}")
        for s in m.get("sources", []):
            lines.append(f"    {s['source']}: recorded {s['recorded']}; replayed {s['replayed']}; "
                         f"records touching it since the last good checkpoint: {s['records']}")
        for m in _limit(r.mismatches[1:], limit):
            lines.append(f"  then at record {m['record']} ({m['kind']}): {m['detail']}")
    for m in _limit(r.effect_mismatches, limit):
        lines.append(f"  effects differ at record {m['record']} ({m['kind']}, t={_t(m['now'])}): "
                     f"{m['detail']}")
    extras = []
    if r.dropped:
        extras.append(f"{r.dropped} invalid message(s) dropped")
    if r.stream_gaps:
        gaps = ", ".join(gap_text(gap) for gap in r.stream_gaps[:5])
        extras.append(f"stream offsets never received: {gaps}{'...' if len(r.stream_gaps) > 5 else ''}")
    if r.divergences:
        extras.append(f"{r.divergences} digest divergence alert(s) replayed")
    if extras:
        lines.append("  " + "; ".join(extras))
    if r.role == "scheduler":
        if r.decisions and not r.decisions_checked and not r.decisions_note:
            lines.append(f"  decisions: {r.decisions} recorded (--decisions re-runs them)")
        elif r.decisions_checked or r.decisions_note:
            lines.append(f"  decisions: {r.decisions} recorded, {r.decisions_checked} re-run, "
                         f"{len(r.decision_diffs)} came out differently"
                         + (f", {r.decisions_skipped} not reproducible" if r.decisions_skipped else ""))
            if r.decisions_note:
                lines.append(f"    note: {r.decisions_note}")
            for d in _limit(r.decision_diffs, limit):
                lines.append(f"    DIFFERENT: decision {d['id']} at record {d['record']} "
                             f"({_request_text(d.get('request'))}): {d['what']}")
    for d in r.damages:
        if d.resumed:
            lines.append(f"  session cut short: {d.describe()}")
    if r.damage is not None:
        d = r.damage
        lines.append(f"  LOG DAMAGED: stopped at byte {d.offset} of {d.path} (record {d.record}): "
                     f"{d.reason}; the records before it were replayed and checked")
    elif not r.stopped_early:
        lines.append("  log intact")
    return lines


def _request_text(summary: Any) -> str:
    if not isinstance(summary, dict):
        return "request"
    rid = summary.get("request_id") or "request"
    res = summary.get("resources") or {}
    return f"{rid} {', '.join(f'{k}={v}' for k, v in res.items())}".strip()


def state_lines(source: str, view: Any, r: ReplayResult) -> list[str]:
    where = f"record {r.last_record} (t={_t(r.last_now)})"
    if view is None:
        return [f"{source}: not known to {r.role} {r.name!r} at {where}"]
    d = view_json(view)
    lines = [f"{source} at {where} in {r.role} {r.name!r}:",
             f"  status {d['status']}, version {d['epoch']}:{d['seq']}, digest {d['digest']}, "
             f"last heard t={_t(d['last_heard'])}" + (", DOWN" if d["down"] else "")]
    if d["buffered"]:
        lines.append(f"  buffered deltas (waiting for a gap to close): {d['buffered']}")
    if d["resync_pending"]:
        lines.append("  a resync request is unanswered")
    if d["pending_claims"]:
        for cid, p in d["pending_claims"].items():
            lines.append(f"  pending claim {cid}: {p['resources']} for {p['instance'] or '-'} "
                         f"(based on {p['based_on'][0]}:{p['based_on'][1]}, "
                         f"{'accepted, ' if p['accepted'] else ''}deadline t={_t(p['deadline'])})")
    else:
        lines.append("  no pending claims")
    if d["document"] is not None:
        lines.append("  document:")
        for ns in sorted(d["document"]):
            lines.append(f"    {ns}:")
            for key in sorted(d["document"][ns]):
                lines.append(f"      {key} = {json.dumps(d['document'][ns][key], sort_keys=True)}")
    return lines


def history_lines(source: str, rows: list[dict[str, Any]], r: ReplayResult, limit: int) -> list[str]:
    lines = [f"history of {source} in {r.role} {r.name!r} (records up to {r.last_record}):",
             f"  {'record':>7} {'time':>12}  {'version':<26} {'how':<26} changes / event"]
    shown = rows if limit <= 0 else rows[-limit:] if len(rows) > limit else rows
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} earlier rows (--limit 0 shows all)")
    for row in shown:
        if row["type"] == "event":
            lines.append(f"  {row['record']:>7} {row['now']:>12.3f}  {'':<26} {'event':<26} {row['text']}")
            continue
        version = f"{row['version'][0]}:{row['version'][1]}"
        how = f"{row['how']} via {row['plane']}" + (" (reordered)" if row["reordered"] else "")
        if row["ops"] is None:
            change = "(whole document)"
        else:
            change = ", ".join(row["ops"]) or "(no change)"
        if row["claims"]:
            change += f"; includes claims {', '.join(row['claims'])}"
        lines.append(f"  {row['record']:>7} {row['now']:>12.3f}  {version:<26} {how:<26} {change}")
    return lines


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.datetime.fromisoformat(text).timestamp()


def diff_lines(d: DiffResult, limit: int) -> list[str]:
    a, b = d.a, d.b
    real = [x for x in d.diverged if x.kind != "behind"]
    behind = [x for x in d.diverged if x.kind == "behind"]
    cut = ""
    if d.aligned_at is not None:
        what, where = d.aligned_at
        cut = (f"; both cut at stream offset {int(where)}" if what == "offset" else
               f"; both cut at {datetime.datetime.fromtimestamp(where).isoformat(timespec='seconds')}")
    lines = [f"a = {a.role} {a.name!r} ({a.records} records), b = {b.role} {b.name!r} ({b.records} records)"
             f"{cut}",
             f"  {d.common} sources in both: {len(real)} diverged, {len(behind)} only behind at the end, "
             f"{d.common - len(d.diverged)} identical; only in a: {len(d.only_a)}, "
             f"only in b: {len(d.only_b)}"]
    for x in _limit(real, limit) + _limit(behind, limit):
        lines.append(f"  {x.source} first diverged at version {x.version[0]}:{x.version[1]}: "
                     f"{x.kind.replace('_', ' ')} ({'in both' if x.side == 'both' else 'in ' + x.side})")
        lines.append(f"      a: {x.a}")
        lines.append(f"      b: {x.b}")
        lines.append(f"      why: {x.text}")
    for label, r in (("a", a), ("b", b)):
        if not r.ok or r.damages:
            lines.append(f"  log {label}: " + "; ".join(summary_lines(r, 3)[1:]).strip())
    return lines


# -- main ----------------------------------------------------------------------------------


def _list_directory(directory: str) -> int:
    logs = find_logs(directory)
    if not logs:
        print(f"no update logs in {directory}", file=sys.stderr)
        return EXIT_USAGE
    print(f"update logs in {directory}:")
    for base, parts in logs.items():
        size = sum(os.path.getsize(p) for p in parts)
        print(f"  {os.path.basename(base):<40} {len(parts)} file{'s' * (len(parts) != 1)}, {_bytes(size)}")
    return EXIT_OK


def main(argv: list[str] | None = None, prog: str = "shm replay") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if len(args.logs) == 1 and os.path.isdir(args.logs[0]):
        return _list_directory(args.logs[0])
    if args.history and not args.source:
        parser.error("--history needs --source")
    options: dict[str, str] = {}
    for item in args.decision_option:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--decision-option wants NAME=VALUE, got {item!r}")
        options[name.strip()] = value.strip()
    if options and not args.decisions:
        parser.error("--decision-option needs --decisions")
    nova_options = {k: v for k, v in options.items() if "." in k}
    options = {k: v for k, v in options.items() if "." not in k}
    for name in nova_options:
        problem = _nova_option_problem(name)
        if problem:
            parser.error(f"--decision-option {name}: {problem}")
    if options:
        known = {f.name for f in dataclasses.fields(SchedulerConfig)}
        for name in options:
            if name not in known:
                parser.error(f"--decision-option: unknown option {name!r} "
                             f"(known: {', '.join(sorted(known))})")
    try:
        paths = _paths(args.logs)
        paths_b = _paths([args.diff]) if args.diff else None
    except FileNotFoundError as exc:
        print(f"shm replay: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if (args.at_offset is not None or args.at_time or args.whole) and paths_b is None:
        parser.error("--at-offset, --at-time and --whole go with --diff")
    at_wall = None
    if args.at_time:
        try:
            at_wall = _parse_time(args.at_time)
        except ValueError:
            parser.error(f"--at-time: not a time: {args.at_time!r}")

    if paths_b is not None:
        d = diff_logs(paths, paths_b, at_offset=args.at_offset, at_wall=at_wall, align=not args.whole)
        if args.source:
            d.diverged = [x for x in d.diverged if x.source == args.source]
        if args.json:
            print(json.dumps({"a": result_json(d.a), "b": result_json(d.b), "common": d.common,
                              "aligned_at": list(d.aligned_at) if d.aligned_at else None,
                              "only_a": d.only_a, "only_b": d.only_b,
                              "diverged": [x.as_dict() for x in d.diverged]}, indent=2))
        else:
            print("\n".join(diff_lines(d, args.limit)))
        if d.diverged or not (d.a.ok and d.b.ok):
            return EXIT_DIFFERENT
        return EXIT_DAMAGED if d.a.damages or d.b.damages else EXIT_OK

    tracer = Tracer(only={args.source}, keep_ops=True) if args.history else None
    try:
        r = replay(paths, at=args.at, until=args.until, tracer=tracer, decisions=args.decisions,
                   decision_options=options,
                   host_manager=functools.partial(_nova_replayer, nova_options))
    except (AttributeError, TypeError, ValueError) as exc:  # a bad --decision-option value
        print(f"shm replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        out: dict[str, Any] = {"replay": result_json(r)}
        if args.source:
            view = r.receiver.sources.get(args.source) if r.receiver is not None else None
            out["state"] = dict(view_json(view), record=r.last_record, time=r.last_now)
        if tracer is not None:
            out["history"] = history(tracer, args.source)
        print(json.dumps(_jsonable(out), indent=2))
    else:
        lines = summary_lines(r, args.limit)
        if args.source and r.receiver is not None:
            lines.append("")
            if tracer is not None:
                lines.extend(history_lines(args.source, history(tracer, args.source), r, args.limit))
                lines.append("")
            lines.extend(state_lines(args.source, r.receiver.sources.get(args.source), r))
        print("\n".join(lines))
    if not r.ok:
        return EXIT_DIFFERENT
    return EXIT_DAMAGED if r.damages else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())


_NOVA_MISSING = ("re-running a nova scheduler's decisions needs nova: "
                 "pip install 'shared-host-manager[nova]'")


def _nova_option_problem(name: str) -> str | None:
    """Why GROUP.OPTION is not a nova.conf option (None: it is)."""
    try:
        from shared_host_manager.nova.replay.steps import option_problem
    except ImportError:
        return _NOVA_MISSING
    return option_problem(name)


def _nova_replayer(options: dict[str, str]) -> Any:
    """The re-runner of a nova scheduler's recorded steps (built at the log's first one)."""
    try:
        from shared_host_manager.nova.replay.steps import StepReplayer
    except ImportError as exc:
        raise RuntimeError(_NOVA_MISSING) from exc
    return StepReplayer(options)
