"""Ranking: every host a request fits, best first — filters, then weighers.

Role: the part of a decision that reads the view and claims nothing.  Given a
request's scratch (:class:`~shared_host_manager.decision.request.RequestView`),
:meth:`Ranking.rank` yields ``(source, weight)`` pairs in decision order; the
engine picks among the first of them (:mod:`.peers`), the claims are built
from them (:mod:`.claims`).

Two interchangeable paths decide identically (the differential tests prove it):

* **slow** (nova's way): a HostView per host, every filter's ``host_passes``
  per host, every weigher per host, normalise, sort.  O(hosts) Python.
* **fast**: every filter's vector form over the columnar index (bool columns,
  row sets, or per-group answers for aggregate/capability filters), then the
  hosts this request already touched are re-checked in Python with the
  request's scratch, then the weighers as numpy column operations with the
  same float operations as the slow path, then a partial sort that orders
  only the top of the list.  Filters without a vector form (plugins) run per
  host on the survivors: lazily in weight order, stopping once enough hosts
  passed, when the order cannot depend on which hosts they remove (at most one
  weigher with a multiplier, uniform across hosts); otherwise on all survivors
  before weighing, as nova would.

Ties are ordered by source id in both paths.

Life cycle: one :class:`Ranking` per engine, holding its filters and weighers
for the engine's life.  A ranking (the iterable :meth:`rank` returns) lives for
one instance of one decision: the fast path's is lazy and reads the index as it
is iterated, so it must be consumed under the same lock, before the index is
synced again.  Per ranking, a few O(hosts) numpy arrays (masks, gathered weigher
columns) and a handful of Python objects; nothing is allocated per host in Python.
Pure: no clock, no randomness, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from protocol.hostdoc import enabled, is_host
from protocol.receiver import ReceiverMachine
from shared_host_manager.decision.filters import BaseHostFilter
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import (
    AGGREGATE_GROUPS,
    PASS_ALL,
    BoolArray,
    Exclude,
    FloatArray,
    HostIndex,
    IntArray,
    Only,
    VectorResult,
)
from shared_host_manager.decision.request import RequestSpec, RequestView
from shared_host_manager.decision.weights import BaseHostWeigher, weigh_hosts
from shared_host_manager.decision.world import IndexWorld, ReceiverWorld

FAST = "fast"
SLOW = "slow"

#: positions or rows of the index (np.flatnonzero's result)
RowArray: TypeAlias = npt.NDArray[np.intp]


def _top(w: FloatArray, rk: IntArray, n: int) -> RowArray:
    """Positions of the ``n`` best entries, ordered by weight desc then rank asc (exact at ties)."""
    m = len(w)
    if n >= m:
        return np.lexsort((rk, -w))
    kth = m - n
    threshold = np.partition(w, kth)[kth]
    cand = np.flatnonzero(w >= threshold)  # every entry tied with the n-th is a candidate
    order = np.lexsort((rk[cand], -w[cand]))
    return cand[order[:n]]


def apply_vector(mask: BoolArray, res: VectorResult) -> BoolArray:
    """``mask`` narrowed by a filter's vector answer (in place when possible)."""
    if res is PASS_ALL:
        return mask
    if type(res) is Only:
        keep = np.zeros(len(mask), dtype=bool)
        rows = np.fromiter(res.rows, dtype=np.intp)
        keep[rows] = mask[rows]
        return keep
    if type(res) is Exclude:
        mask[np.fromiter(res.rows, dtype=np.intp)] = False
        return mask
    mask &= res
    return mask


def normalise(wg: BaseHostWeigher, x: FloatArray, among: BoolArray | None = None) -> bool:
    """In place: ``x`` clamped and normalised as weights.clamp, bounds and normalize do for
    ``weigh_hosts`` (the same float operations in the same order, so both paths' weights are
    bit-identical), over the rows ``among`` (default: all); False when all normalise to 0."""
    if not len(x):
        return False
    # clamp only when a value is out of bounds: a pass over x instead of a write
    if wg.minval is not None and float(x.min()) < wg.minval:
        np.maximum(x, wg.minval, out=x)
    if wg.maxval is not None and float(x.max()) > wg.maxval:
        np.minimum(x, wg.maxval, out=x)
    sel = x if among is None else x[among]
    if not len(sel):
        return False
    lo = wg.minval if wg.minval is not None else float(sel.min())
    hi = wg.maxval if wg.maxval is not None else float(sel.max())
    if lo == hi:
        return False
    x -= lo
    x /= hi - lo
    return True


class _FastRanking:
    """Candidates in decision order, computed lazily from the weight vector."""

    __slots__ = ("index", "req", "idx", "w", "deferred", "hv")

    def __init__(self, index: HostIndex, req: RequestView, idx: RowArray, w: FloatArray,
                 deferred: list[BaseHostFilter], hv: dict[int, HostView]) -> None:
        self.index = index
        self.req = req
        self.idx = idx
        self.w = w
        self.deferred = deferred
        self.hv = hv

    def __iter__(self) -> Iterator[tuple[str, float]]:
        idx, w = self.idx, self.w
        m = len(idx)
        if m == 0:
            return
        ix = self.index
        rk = ix.rank[idx]
        sources = ix.sources
        done, n = 0, 8
        while done < m:
            n = min(n, m)
            for p in _top(w, rk, n)[done:]:
                row = int(idx[p])
                if self.deferred and not self._deferred_pass(row):
                    continue
                source = sources[row]
                if source is None:  # cannot be: idx holds live rows only
                    raise LookupError(f"row {row} of the host index holds no source")
                yield source, float(w[p])
            done, n = n, n * 8

    def _deferred_pass(self, row: int) -> bool:
        hv = self.hv.get(row) or HostView(self.index.view(row))
        return all(f.host_passes(hv, self.req) for f in self.deferred)


class Ranking:
    """Filters and weighers over one receiver and its index; see the module docstring."""

    def __init__(self, receiver: ReceiverMachine, index: HostIndex,
                 filters: Sequence[BaseHostFilter], weighers: Sequence[BaseHostWeigher]) -> None:
        self.receiver = receiver
        self.index = index
        self.filters = list(filters)
        self.weighers = list(weighers)

    def request_view(self, spec: RequestSpec, fast: bool = True, uuids: Sequence[str] = ()
                     ) -> RequestView:
        """The request's scratch, seeing other hosts through the path's own world."""
        world = IndexWorld(self.index) if fast else ReceiverWorld(self.receiver)
        return RequestView(spec, world, uuids)

    def rank(self, req: RequestView, fast: bool) -> Iterable[tuple[str, float]]:
        """Every host passing the filters for ``req``'s current instance, best first."""
        return self.rank_fast(req) if fast else self.rank_slow(req)

    def used_filters(self, req: RequestView) -> list[BaseHostFilter]:
        forced = bool(req.spec.force_hosts or req.spec.force_nodes)
        return [f for f in self.filters if f.active(req) and (f.placement or not forced)]

    @staticmethod
    def name_ok(hv: HostView, spec: RequestSpec) -> bool:
        """nova's ignore_hosts / force_hosts / force_nodes (case-insensitive)."""
        if spec.ignore_hosts and hv.host.lower() in {h.lower() for h in spec.ignore_hosts}:
            return False
        if spec.force_hosts and hv.host.lower() not in {h.lower() for h in spec.force_hosts}:
            return False
        if spec.force_nodes and hv.nodename.lower() not in {n.lower() for n in spec.force_nodes}:
            return False
        return True

    def explain(self, req: RequestView, fast: bool, i: int, n: int) -> str:
        """nova's NoValidHost reason: how many hosts each filter started and ended with."""
        counts = self._filter_counts_fast(req) if fast else self._filter_counts_slow(req)
        results = ", ".join(f"{name}: (start: {a}, end: {b})" for name, a, b in counts)
        what = f"instance {i + 1} of {n} ({req.instance_uuid})" if n > 1 else str(req.instance_uuid)
        return f"There are not enough hosts available for {what}. Filter results: [{results}]"

    def recheck(self, source: str, spec: RequestSpec, instance_uuid: str,
                siblings: Sequence[str] = ()) -> str | None:
        """Why claiming ``source`` for ``instance_uuid`` would be wrong in our view now (None: fine).

        The tracker's check before it claims an alternate (nova checks group policy
        late on the compute node; here the scheduler re-runs its filters): the host is
        up and enabled, the instance is not already there, the resources fit by the
        arbiter's rule, and every filter this request uses still passes.  ``siblings``
        are the request's other instances (members of its server group, like this one).
        """
        view = self.receiver.sources.get(source)
        if view is None or not is_host(view.doc):
            return "host is no longer known"
        hv = HostView(view)
        if not enabled(hv.service) or not hv.is_up:
            return "compute service is down or disabled"
        if instance_uuid and instance_uuid in hv.instances:
            return f"instance {instance_uuid} is already on this host"
        req = self.request_view(spec, True, [instance_uuid, *siblings])
        reason = hv.fits(req.resources)
        if reason is not None:
            return reason
        req.begin(0, instance_uuid)
        for f in self.used_filters(req):
            if not f.host_passes(hv, req):
                return f"{f.name} no longer passes"
        return None

    # -- slow path ------------------------------------------------------------------------

    def _slow_hosts(self, req: RequestView) -> list[HostView]:
        spec = req.spec
        return [hv for hv in (HostView(v, req.consumed.get(v.source))
                              for v in self.receiver.sources.values() if is_host(v.doc))
                if self.name_ok(hv, spec)]

    def rank_slow(self, req: RequestView) -> list[tuple[str, float]]:
        hosts = self._slow_hosts(req)
        forced = bool(req.spec.force_hosts or req.spec.force_nodes)
        for f in self.filters:  # every enabled filter, per host, as nova
            if forced and not f.placement:
                continue
            hosts = [h for h in hosts if f.host_passes(h, req)]
            if not hosts:
                break
        return [(w.obj.uuid, w.weight) for w in weigh_hosts(self.weighers, hosts, req)]

    def _filter_counts_slow(self, req: RequestView) -> list[tuple[str, int, int]]:
        hosts = self._slow_hosts(req)
        out = []
        for f in self.used_filters(req):
            start = len(hosts)
            hosts = [h for h in hosts if f.host_passes(h, req)]
            out.append((f.name, start, len(hosts)))
        return out

    # -- fast path ----------------------------------------------------------------------------

    def _fast_mask(self, req: RequestView, counts: list[tuple[str, int, int]] | None = None
                   ) -> tuple[BoolArray, list[BaseHostFilter], dict[int, HostView]]:
        """Hosts passing every vector filter, plus the filters left to run per host.

        With ``counts`` (explaining a failure) every filter is applied in order,
        per host where it has no vector form, and the survivors counted after each.
        """
        ix = self.index
        n = ix.size
        spec = req.spec
        mask = ix.live[:n].copy()
        # nova's ignore_hosts / force_hosts / force_nodes come first
        if spec.ignore_hosts:
            mask[ix.rows_of_hosts(spec.ignore_hosts, lower=True)] = False
        if spec.force_hosts:
            mask = apply_vector(mask, Only(ix.rows_of_hosts(spec.force_hosts, lower=True)))
        if spec.force_nodes:
            mask = apply_vector(mask, Only(ix.rows_of_nodes(spec.force_nodes)))
        # hosts earlier instances of this request went to: the request's scratch changes
        # their answers, so every used filter decides them per host
        touched: dict[int, HostView] = {}
        for source, over in req.consumed.items():
            row = ix.row_of.get(source)
            if row is not None:
                touched[row] = HostView(ix.receiver.sources[source], over)
        used = self.used_filters(req)
        deferred: list[BaseHostFilter] = []
        req.candidate_rows = None
        for f in used:
            before = mask.copy() if counts is not None else mask
            req.candidates = mask
            res = f.vector(ix, req)
            if counts is not None or (res is not None and res is not PASS_ALL):
                req.candidate_rows = None  # the candidates may narrow: their rows are found again
            if counts is not None:
                if res is None:
                    for row in np.flatnonzero(mask).tolist():
                        mask[row] = f.host_passes(touched.get(row) or HostView(ix.view(row)), req)
                else:
                    mask = apply_vector(mask, res)
                for row, hv in touched.items():
                    mask[row] = bool(before[row]) and f.host_passes(hv, req)
                counts.append((f.name, int(np.count_nonzero(before)), int(np.count_nonzero(mask))))
            elif res is None:
                deferred.append(f)
            else:
                mask = apply_vector(mask, res)
        req.candidates = req.candidate_rows = None
        if counts is None:
            for row, hv in touched.items():
                mask[row] = self.name_ok(hv, spec) and all(f.host_passes(hv, req) for f in used)
        return mask, deferred, touched

    def _filter_counts_fast(self, req: RequestView) -> list[tuple[str, int, int]]:
        counts: list[tuple[str, int, int]] = []
        self._fast_mask(req, counts)
        return counts

    def multipliers(self) -> list[tuple[BaseHostWeigher, float | FloatArray]]:
        """(weigher, its multiplier: one float for every host, or one per aggregate group)."""
        out: list[tuple[BaseHostWeigher, float | FloatArray]] = []
        ix = self.index
        for wg in self.weighers:
            default = wg.default_multiplier
            vals, uniform = ix.group_values(AGGREGATE_GROUPS, (wg.name, wg.multiplier_name, default),
                                            wg.weight_multiplier)
            if uniform:
                out.append((wg, float(vals[0]) if len(vals) else float(default)))
            else:
                out.append((wg, vals))
        return out

    def rank_fast(self, req: RequestView) -> _FastRanking:
        ix = self.index
        mask, deferred, touched = self._fast_mask(req)
        idx = np.flatnonzero(mask)
        mults = self.multipliers()
        if deferred:
            weighing = [m for m in mults if not isinstance(m[1], float) or m[1] != 0.0]
            if len(weighing) > 1 or (weighing and not isinstance(weighing[0][1], float)):
                # the normalisation (min/max over the final hosts) could reorder hosts
                # depending on which ones the deferred filters remove: filter them all first
                keep = [row for row in idx.tolist()
                        if all(f.host_passes(touched.get(row) or HostView(ix.view(row)), req)
                               for f in deferred)]
                idx = np.asarray(keep, dtype=np.intp)
                deferred = []
        m = len(idx)
        w = np.zeros(m, dtype=np.float64)
        if m > 1:
            touched_pos = []
            for row, hv in touched.items():
                p = int(np.searchsorted(idx, row))
                if p < m and idx[p] == row:
                    touched_pos.append((p, hv))
            gid = None
            for wg, mult in mults:
                if isinstance(mult, float) and mult == 0.0:
                    continue  # adds 0.0 * x: no change (skipped like a zero multiplier)
                column = (ix.weigher_cols[wg.index_column][idx] if wg.index_column is not None
                          else wg.vector_weights(ix, req, idx))
                if column is None:
                    x = np.fromiter(
                        (wg._weigh_object(touched.get(r) or HostView(ix.view(r)), req)
                         for r in idx.tolist()), dtype=np.float64, count=m)
                else:
                    x = column
                    for p, hv in touched_pos:
                        x[p] = wg._weigh_object(hv, req)
                if not normalise(wg, x):
                    continue
                if isinstance(mult, float):
                    x *= mult
                else:
                    if gid is None:
                        gid = ix.gid[AGGREGATE_GROUPS][idx]
                    x *= mult[gid]
                w += x
        return _FastRanking(ix, req, idx, w, deferred, touched)


__all__ = ["FAST", "SLOW", "Ranking", "RowArray", "apply_vector", "normalise"]
