"""nova-scheduler-shared times select_destinations into the cache service's decision figures
(shm_decisions_total, shm_decision_seconds)."""

from __future__ import annotations

import pytest
from nova import exception

from shared_host_manager.nova import cmd

pytestmark = pytest.mark.nova


class _Service:
    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    def record_decision(self, seconds: float, outcome: str) -> None:
        self.seen.append((seconds, outcome))


def test_select_destinations_is_timed_by_outcome(monkeypatch):
    service = _Service()
    monkeypatch.setattr(cmd, "_service", service)

    def select(self, ctx, fail=None):
        if fail is not None:
            raise fail
        return ["host"]

    timed = cmd._timed(select)
    assert timed(None, None) == ["host"]
    with pytest.raises(exception.NoValidHost):
        timed(None, None, fail=exception.NoValidHost(reason="full"))
    with pytest.raises(RuntimeError):
        timed(None, None, fail=RuntimeError("boom"))
    assert [o for _, o in service.seen] == ["scheduled", "no_valid_host", "error"]
    assert all(s >= 0 for s, _ in service.seen)
