"""Shared helpers of the decision-path tests, exposed as fixtures (import-mode=importlib)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from protocol.hostdoc import is_host
from protocol.messages import Claim
from protocol.receiver import ReceiverMachine
from shared_host_manager.decision.engine import apply_vector
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import HostIndex
from shared_host_manager.decision.request import RequestSpec, RequestView
from shared_host_manager.decision.world import IndexWorld, ReceiverWorld
from simulator.synthetic_hosts import load_receiver


class FilterHarness:
    """Runs one filter both ways (per host, and vector over the index) and checks they agree."""

    def receiver(self, docs: Mapping[str, Mapping[str, Any]], *, down: tuple[str, ...] = (),
                 pending: tuple[tuple[str, dict[str, int], str], ...] = ()) -> ReceiverMachine:
        rec = load_receiver(docs, down_interval=1e9)
        for source in down:
            rec.sources[source].down = True
        for i, (source, resources, instance) in enumerate(pending):
            view = rec.sources[source]
            rec.add_claim(Claim(f"pending-{i}", rec.name, source, view.epoch, view.seq, resources,
                                instance), 0.0)
        return rec

    def passing(self, filt: Any, rec: ReceiverMachine, spec: RequestSpec,
                uuids: tuple[str, ...] = ("new-instance",)) -> set[str]:
        req = RequestView(spec, ReceiverWorld(rec), uuids)
        per_host = {s for s, v in rec.sources.items()
                    if is_host(v.doc) and filt.host_passes(HostView(v), req)}
        ix = HostIndex(rec)
        res = filt.vector(ix, RequestView(spec, IndexWorld(ix), uuids))
        if res is not None:
            mask = apply_vector(ix.live[: ix.size].copy(), res)
            vector = {ix.sources[r] for r in np.flatnonzero(mask)}
            assert vector == per_host, f"vector {sorted(vector)} != per-host {sorted(per_host)}"
        return per_host

    def run(self, filt: Any, docs: Mapping[str, Mapping[str, Any]], spec: RequestSpec,
            **kw: Any) -> set[str]:
        uuids = kw.pop("uuids", ("new-instance",))
        return self.passing(filt, self.receiver(docs, **kw), spec, uuids)


@pytest.fixture
def harness() -> FilterHarness:
    return FilterHarness()
