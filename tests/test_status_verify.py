"""`shm status --verify`'s comparison (shm_cli.status.Convergence and verify()), driven with
scripted reads: churn is no divergence, a scheduler behind is, and so is another document at
the same version.  The same check against real processes under churn:
tests/integration/test_operating.py."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from shm_cli import status as status_cli

R, S0, S1 = "http://r0", "http://s0", "http://s1"
D = {n: f"{n:02x}" * 32 for n in range(1, 20)}  # digests by seq


def _v(seq: int, digest: bool = True, epoch: int = 7) -> list[Any]:
    return [epoch, seq, D[seq] if digest else None]


def _h(seq: int, epoch: int = 7, digest: str | None = None) -> list[Any]:
    return [epoch, seq, digest or D[seq], "active"]


class Script:
    """fetch() answering from scripted rounds: each round one read of every process, in the
    order verify() reads them; the last round repeats."""

    def __init__(self, rounds: list[dict[str, dict[str, list[Any]]]]) -> None:
        self.rounds = rounds
        self.reads: list[str] = []

    def __call__(self, url: str, sources: bool = False, timeout: float = 5.0) -> dict[str, Any]:
        role = "reporter" if url == R else "scheduler"
        out: dict[str, Any] = {"role": role, "name": url.split("//")[1], "healthy": True}
        if sources:
            self.reads.append(url)
            done = sum(1 for u in self.reads if u == url) - 1
            out["views"] = self.rounds[min(done, len(self.rounds) - 1)][url]
        return out


def _verify(monkeypatch, rounds, timeout: float = 10.0) -> tuple[int, str, Script]:
    script = Script(rounds)
    monkeypatch.setattr(status_cli, "fetch", script)
    monkeypatch.setattr(status_cli.time, "sleep", lambda s: None)
    console = Console(record=True, width=200)
    code = status_cli.verify([R, S0, S1], timeout, 0.0, console, 20)
    return code, console.export_text(), script


def test_churn_is_no_divergence(monkeypatch):
    # every read: both schedulers one step behind a source that just changed (its delta in
    # flight), or at the reporter's version while its digest is pending (a change not yet
    # published); a round later they hold what was published at the read before
    rounds = [
        {R: {"a": _v(5), "b": _v(3, digest=False), "c": _v(9)},
         S0: {"a": _h(4), "b": _h(3), "c": _h(9)}, S1: {"a": _h(4), "b": _h(3), "c": _h(9)}},
        {R: {"a": _v(6), "b": _v(4, digest=False), "c": _v(9)},
         S0: {"a": _h(5), "b": _h(4), "c": _h(9)}, S1: {"a": _h(6), "b": _h(3), "c": _h(9)}},
    ]
    code, out, _ = _verify(monkeypatch, rounds)
    assert code == status_cli.EXIT_OK, out
    assert "all 3 agree" in out and "2 reads" in out


def test_the_reporters_are_read_before_the_schedulers(monkeypatch):
    _, _, script = _verify(monkeypatch, [{R: {"a": _v(1)}, S0: {"a": _h(1)}, S1: {"a": _h(1)}}])
    assert script.reads == [R, S0, S1]


def test_a_scheduler_behind_what_was_published_a_read_earlier_differs(monkeypatch):
    rounds = [{R: {"a": _v(5), "b": _v(2)}, S0: {"a": _h(5), "b": _h(2)},
               S1: {"a": _h(3), "b": _h(2)}}]  # s1 stopped applying "a" at 3
    code, out, script = _verify(monkeypatch, rounds, timeout=0.0)
    assert code == status_cli.EXIT_DIFFERENT, out
    assert "1 differ" in out and "a: r0 at 7:5" in out and "s1 holds 7:3" in out


def test_a_restarted_scheduler_agrees_once_it_caught_up(monkeypatch):
    rounds = [
        {R: {"a": _v(5), "b": _v(2)}, S0: {"a": _h(5), "b": _h(2)}, S1: {}},
        {R: {"a": _v(6), "b": _v(2)}, S0: {"a": _h(6), "b": _h(2)}, S1: {"b": _h(2)}},
        {R: {"a": _v(7), "b": _v(2)}, S0: {"a": _h(7), "b": _h(2)}, S1: {"a": _h(6), "b": _h(2)}},
    ]
    state = status_cli.Convergence({})
    for i, r in enumerate(rounds):
        state.observe({s: (R, v) for s, v in r[R].items()}, {S0: r[S0], S1: r[S1]})
        assert state.pending == [{"a", "b"}, {"a"}, set()][i]
    # a newer epoch (the source restarted) is after every version of the old one
    state = status_cli.Convergence({})
    state.observe({"a": (R, _v(5))}, {S0: {"a": _h(1, epoch=8)}, S1: {"a": _h(5)}})
    assert state.pending == set()


def test_another_document_at_the_same_version_differs_whenever_the_digests_are_seen(monkeypatch):
    other = "ee" * 32
    # s1 holds seq 4 with another document; the reporter's digest of 4 is pending at the
    # first read and known at the second (when s1 already holds 5)
    rounds = [
        {R: {"a": _v(4, digest=False)}, S0: {"a": _h(4)}, S1: {"a": _h(4, digest=other)}},
        {R: {"a": [7, 5, D[5]]}, S0: {"a": _h(5)}, S1: {"a": _h(5)}},
    ]
    state = status_cli.Convergence({})
    state.observe({"a": (R, rounds[0][R]["a"])}, {S0: rounds[0][S0], S1: rounds[0][S1]})
    assert state.differ() == []  # in versions it agrees; the digest of 4 is not known yet
    state.observe({"a": (R, [7, 4, D[4]])}, {S0: rounds[0][S0], S1: rounds[0][S1]})
    assert state.differ() == ["a"] and "same version, different documents" in state.content["a"]


@pytest.mark.parametrize("reads", [1, 5])
def test_digests_are_compared_where_both_are_known(monkeypatch, reads):
    rounds = [{R: {"a": _v(3), "b": _v(8, digest=False)}, S0: {"a": _h(3), "b": _h(8)},
               S1: {"a": _h(3), "b": _h(8)}}] * reads
    code, out, _ = _verify(monkeypatch, rounds)
    assert code == status_cli.EXIT_OK and "digests compared for 1" in out, out


@pytest.mark.parametrize("healthy_at_the_end", [True, False])
def test_with_verify_health_is_judged_when_the_verification_ended(monkeypatch, capsys,
                                                                  healthy_at_the_end):
    """A scheduler restarted a moment ago is unhealthy ("not running": it restores its state)
    when the table is read, then catches up: --verify waits for it and exits 0.  One still
    unhealthy once the verification ended is named, and the exit is 1."""
    rounds = [{R: {"a": _v(5)}, S0: {"a": _h(5)}, S1: {}},
              {R: {"a": _v(5)}, S0: {"a": _h(5)}, S1: {"a": _h(5)}}]
    script = Script(rounds)
    plain: dict[str, int] = {}

    def fetch(url: str, sources: bool = False, timeout: float = 5.0) -> dict[str, Any]:
        out = script(url, sources, timeout)
        if url == S1 and not sources:
            plain[url] = plain.get(url, 0) + 1
            starting = plain[url] < 3 or not healthy_at_the_end
            out.update(healthy=not starting, health="not running" if starting else "ok")
        return out

    monkeypatch.setattr(status_cli, "fetch", fetch)
    monkeypatch.setattr(status_cli.time, "sleep", lambda s: None)
    code = status_cli.main([R, S0, S1, "--verify", "--timeout", "10", "--interval", "0"])
    out = capsys.readouterr().out
    assert "all 1 agree" in out
    assert code == (0 if healthy_at_the_end else 1)
    assert ("s1 is unhealthy: not running" in out) is not healthy_at_the_end
