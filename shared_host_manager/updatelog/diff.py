"""``shm replay --diff``: where two views of the same sources first differed, and why.

Both logs are replayed with a :class:`~.replay.Tracer` (every version each
view reached, how and when); per source, the first version at which the two
lists part is located and classified: ``missed_delta`` (one side never got a
delta in order and caught up by a resync), ``late_resync`` (it did, but its
resync came late), ``rejected_claim`` (a claim's correction brought it), or
``content`` (same version, different digest: a divergence).  A scheduler's log
can be held against another scheduler's or against a reporter's (the
authoritative sequence of the versions it published).

Two schedulers are compared at the same stream position: both logs are
replayed up to a stream offset (``at_offset``; by default the last offset
*both* applied) or a wall-clock time (``at_wall``), so that one live process
being a few messages ahead of the other when the logs were copied is not
reported as hundreds of sources "behind".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared_host_manager.updatelog.replay import (
    ReplayResult,
    Tracer,
    Version,
    gap_text,
    last_stream_offset,
    replay,
)


def _class(v: Version) -> str:
    return "stream" if v.plane in ("stream", "published") else v.plane


def _vtext(version: tuple[int, int]) -> str:
    return f"{version[0]}:{version[1]}"


def _how(v: Version) -> str:
    via = {"stream": "the stream", "published": "publication", "resync": "a resync answer",
           "correction": "a claim rejection's correction", "restore": "the local state file"}[v.plane]
    text = f"{v.how} via {via} at record {v.record} (t={v.now:.3f})"
    if v.reordered and v.plane == "stream":
        text += f", reordered ({v.detail})"
    return text


def explain(tracer: Tracer, source: str, entry: Version, resync_timeout: float,
            stream_gaps: Sequence[tuple[int, int, int, str | None]] = ()) -> tuple[str, str]:
    """(kind, text): why ``entry`` (a version not reached via the stream) came the way it did."""
    events = tracer.events.get(source, [])
    if entry.plane == "correction":
        rejected = [e for e in events if e.kind == "claim_result" and e.record == entry.record]
        what = rejected[0].text if rejected else entry.detail
        return "rejected_claim", f"{what}; the correction carried this version"
    if entry.plane == "restore":
        return "restored", "restored from the local state file after a restart"
    if entry.plane != "resync":
        return "other", _how(entry)
    # the resync round this answer closed: requests since the previous answer
    before = [e for e in events if e.record < entry.record]
    last_answer = max((e.record for e in before if e.kind == "resync_answered"), default=-1)
    requests = [e for e in before if e.kind == "resync_requested" and e.record > last_answer]
    gaps = [e for e in before if e.kind == "gap" and e.record > last_answer]
    parts = []
    kind = "missed_delta"
    if gaps:
        g = gaps[0]
        parts.append(f"missed delta: gap detected at record {g.record} (t={g.now:.3f}) when delta "
                     f"{g.data['arrived']} arrived while holding {g.data['held']}")
        lost = [gap_text(gap) for gap in stream_gaps if gap[0] <= g.record]
        if lost:
            parts.append(f"stream offsets never received: {', '.join(lost[-3:])}")
    elif requests and requests[0].data.get("reason", "").startswith("heartbeat"):
        parts.append(f"missed delta: noticed from a {requests[0].data['reason']} at record "
                     f"{requests[0].record} (t={requests[0].now:.3f})")
    elif requests:
        kind = "resync"
        parts.append(f"resync ({requests[0].data.get('reason')})")
    if requests:
        first = requests[0]
        waited = entry.now - first.now
        parts.append(f"resync requested at record {first.record} (t={first.now:.3f}"
                     f"{', ' + first.data['reason'] if gaps else ''}), answered at record "
                     f"{entry.record} (t={entry.now:.3f}, {waited:.3f} s later"
                     f"{f', after {len(requests)} requests' if len(requests) > 1 else ''})")
        if len(requests) > 1 or waited > resync_timeout:
            kind = "late_resync"
    else:
        parts.append(f"resync answer at record {entry.record} (t={entry.now:.3f}) with no request "
                     "recorded before it")
    return kind, "; ".join(parts)


@dataclass
class SourceDiff:
    source: str
    version: tuple[int, int]
    kind: str
    side: str  # which log deviates: "a", "b" or "both"
    text: str
    a: str
    b: str

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": list(self.version), "kind": self.kind,
                "side": self.side, "explanation": self.text, "a": self.a, "b": self.b}


@dataclass
class DiffResult:
    a: ReplayResult
    b: ReplayResult
    common: int = 0
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    diverged: list[SourceDiff] = field(default_factory=list)
    #: where both were cut: ("offset", N), ("time", T) or None (whole logs)
    aligned_at: tuple[str, float] | None = None


def _first_divergence(source: str, ta: Tracer, tb: Tracer, ra: ReplayResult, rb: ReplayResult
                      ) -> SourceDiff | None:
    la, lb = ta.versions.get(source, []), tb.versions.get(source, [])
    va = {v.version: v for v in la}
    vb = {v.version: v for v in lb}
    start = max(la[0].version, lb[0].version)
    timeout_a = float(ra.config.get("resync_timeout", 2.0))
    timeout_b = float(rb.config.get("resync_timeout", 2.0))

    def side_text(tr: Tracer, entries: list[Version], v: tuple[int, int]) -> str:
        e = {x.version: x for x in entries}.get(v)
        if e is not None:
            return _vtext(v) + ": " + _how(e)
        later = next((x for x in entries if x.version > v), None)
        if later is not None:
            return f"{_vtext(v)}: never held; jumped to {_vtext(later.version)} by {_how(later)}"
        last = entries[-1]
        return f"{_vtext(v)}: never reached; the log ends holding {_vtext(last.version)}"

    def why(label: str, tr: Tracer, entries: list[Version], v: tuple[int, int], timeout: float,
            r: ReplayResult) -> tuple[str, str]:
        e = {x.version: x for x in entries}.get(v)
        if e is None:
            later = next((x for x in entries if x.version > v), None)
            if later is None:
                pending = [ev for ev in tr.events.get(source, []) if ev.record > entries[-1].record]
                tail = f"; after it: {pending[-1].text} (record {pending[-1].record})" if pending else ""
                return "behind", f"{label} never reached {_vtext(v)} (its log ends holding " \
                                 f"{_vtext(entries[-1].version)}{tail})"
            kind, text = explain(tr, source, later, timeout, r.stream_gaps)
            return kind, f"{label} skipped {_vtext(v)}..{_vtext((later.epoch, later.seq - 1))}: {text}"
        kind, text = explain(tr, source, e, timeout, r.stream_gaps)
        return kind, f"{label}: {text}"

    for v in sorted(set(va) | set(vb)):
        if v < start:
            continue
        ea, eb = va.get(v), vb.get(v)
        if ea is not None and eb is not None:
            if ea.digest is not None and eb.digest is not None and ea.digest != eb.digest:
                return SourceDiff(source, v, "content", "both",
                                  f"same version, different documents (digest {ea.digest.hex()} vs "
                                  f"{eb.digest.hex()})", side_text(ta, la, v), side_text(tb, lb, v))
            if _class(ea) == _class(eb):
                continue
        deviants = []
        if ea is None or _class(ea) != "stream":
            deviants.append(("a", why("a", ta, la, v, timeout_a, ra)))
        if eb is None or _class(eb) != "stream":
            deviants.append(("b", why("b", tb, lb, v, timeout_b, rb)))
        if not deviants:  # both deviate identically (e.g. both restored): not a divergence
            continue
        side = deviants[0][0] if len(deviants) == 1 else "both"
        kind = deviants[0][1][0]
        text = " | ".join(d[1][1] for d in deviants)
        return SourceDiff(source, v, kind, side, text, side_text(ta, la, v), side_text(tb, lb, v))
    return None


def diff_logs(paths_a: Sequence[str], paths_b: Sequence[str], *, at_offset: int | None = None,
              at_wall: float | None = None, align: bool = True) -> DiffResult:
    """Replay both logs with tracing; per common source, the first version where they diverge.

    ``at_offset`` / ``at_wall`` cut both logs at that stream offset / time; without either,
    two scheduler logs are cut at the last stream offset both applied (``align``)."""
    if at_offset is None and at_wall is None and align:
        last_a, last_b = last_stream_offset(paths_a), last_stream_offset(paths_b)
        if last_a is not None and last_b is not None and last_a != last_b:
            at_offset = min(last_a, last_b)
    ta, tb = Tracer(), Tracer()
    ra = replay(paths_a, tracer=ta, until_offset=at_offset, until_wall=at_wall)
    rb = replay(paths_b, tracer=tb, until_offset=at_offset, until_wall=at_wall)
    out = DiffResult(ra, rb)
    if at_offset is not None:
        out.aligned_at = ("offset", at_offset)
    elif at_wall is not None:
        out.aligned_at = ("time", at_wall)
    sa = {s for s, v in ta.versions.items() if v}
    sb = {s for s, v in tb.versions.items() if v}
    out.only_a = sorted(sa - sb)
    out.only_b = sorted(sb - sa)
    common = sorted(sa & sb)
    out.common = len(common)
    for source in common:
        d = _first_divergence(source, ta, tb, ra, rb)
        if d is not None:
            out.diverged.append(d)
    order = {"content": 0, "rejected_claim": 1, "missed_delta": 2, "late_resync": 3}
    out.diverged.sort(key=lambda d: (d.kind == "behind", order.get(d.kind, 4), d.source))
    return out
