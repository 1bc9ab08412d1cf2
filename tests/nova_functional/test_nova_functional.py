"""nova 34's own functional tests, unmodified, with nova's HostManager and with the drop-in.

The selection (``selection.txt``, docs/development.md "nova's functional tests") runs twice
in subprocesses (``worker.py``), ``SHM_NOVA_FUNCTIONAL_WORKERS`` processes per
side (default 3: a worker keeps about 70 % of a core busy, so three use two cores better
than two), once as nova ships it (the baseline), once with every nova TestCase using
:class:`shared_host_manager.nova.fixtures.SharedHostManagerFixture`.
Pass: no test that passes on the baseline fails with the drop-in (a test that
fails with the drop-in runs again alone, on both sides, and counts only if it
fails again there while passing with nova's HostManager; otherwise the summary
lists it as ``flaky``, or as ``failed_alone_on_both_sides``), and the
drop-in served every test (nova's own HostManager never read hosts from the
database, and every test that scheduled went through our decisions), and every
decision recorded in the schedulers' update logs re-runs the same
(``SHM_NOVA_FUNCTIONAL_REPLAY=0`` leaves the logs out).

It runs in CI (``.ci/run``) and with the rest of the suite; it is marked ``nova_functional``
and ``slow`` (it takes minutes): ``-m "not nova_functional"`` leaves it out.  Once collection
has selected it, its worker processes start at once, at the lowest CPU priority (nice 19),
and run beside the rest of the suite (tests/conftest.py, :func:`start_in_background`): the
suite's own tests keep the CPU they need, the workers take what is left, and the test, put
last, only waits for what is not done by then.  Outcomes and
times of both sides are written to ``SHM_NOVA_FUNCTIONAL_OUT`` (default: a temporary
directory) as JSON lines; ``SHM_NOVA_FUNCTIONAL_SELECTION`` names another selection file (a
quick local check).

The baseline side's outcomes are recorded in ``baseline.json`` for the nova and
placement releases they were measured on, one per test: when the releases match
what is installed and every selected test has its outcome there, the recorded
outcomes stand for the baseline run (nova's tests with nova's HostManager give
the same outcomes on the same releases), and the baseline runs live only for
the tests that fail with the drop-in (the "again" step above, unchanged).
Otherwise, or with ``SHM_NOVA_FUNCTIONAL_BASELINE=run``, the whole baseline
runs; ``SHM_NOVA_FUNCTIONAL_BASELINE=record`` runs it and writes its tests' outcomes into the
file (the other tests' stay).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("nova.scheduler")
pytest.importorskip("placement")

from nova_paste import paste_config as _paste_config  # noqa: E402

HERE = Path(__file__).resolve().parent
TOP = HERE.parent.parent

pytestmark = [pytest.mark.nova_functional, pytest.mark.nova, pytest.mark.slow]


#: seconds a worker may go without reporting a test before it is taken for hung (the longest
#: test of the selection takes under a minute): nova's fixtures can deadlock under native
#: threads (a CellDatabases lock, seen once in NUMA live migration rollback on nova's side)
STALL = float(os.environ.get("SHM_NOVA_FUNCTIONAL_STALL", "180"))


BASELINE = HERE / "baseline.json"


def _releases() -> dict[str, str]:
    from importlib.metadata import version

    return {"nova": version("nova"), "openstack-placement": version("openstack-placement")}


def _recorded_baseline(ids: list[str]) -> dict[str, dict] | None:
    """The recorded baseline outcomes if they were measured on these releases and hold every
    selected test (None: run the baseline)."""
    if os.environ.get("SHM_NOVA_FUNCTIONAL_BASELINE", "recorded") != "recorded":
        return None
    if not BASELINE.exists():
        return None
    recorded = json.loads(BASELINE.read_text())
    if recorded["releases"] != _releases() or not set(ids) <= set(recorded["outcomes"]):
        return None
    return {i: {"id": i, "outcome": recorded["outcomes"][i], "seconds": None, "detail": "recorded"}
            for i in ids}


def _record_baseline(ids: list[str], rows: dict[str, dict]) -> None:
    """Write these tests' outcomes; those of other tests recorded on the same releases stay."""
    kept: dict[str, str] = {}
    if BASELINE.exists():
        old = json.loads(BASELINE.read_text())
        if old["releases"] == _releases():
            kept = old["outcomes"]
    kept.update((i, rows[i]["outcome"]) for i in ids if i in rows)
    BASELINE.write_text(json.dumps({"releases": _releases(), "outcomes": dict(sorted(kept.items()))},
                                   indent=1, sort_keys=True) + "\n")


def _rows(result: Path) -> list[dict]:
    if not result.exists():
        return []
    return [json.loads(line) for line in result.read_text().splitlines() if line.strip()]


#: the worker processes running now, killed if the session ends before they do
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
#: set when the session ends: no worker starts any more
_STOPPING = threading.Event()
#: the first runs (the listing, the baseline unless recorded, the drop-in's side), started
#: in the background once collection selected the test (None: the test starts them)
_FIRST: concurrent.futures.Future | None = None


def _lowest_priority() -> None:
    os.nice(19)


def _run_side(side: str, ids: list[str], workers: int, out: Path,
              nice: bool = False) -> tuple[dict[str, dict], float]:
    """Each worker runs a shard of ``ids``; a worker that reports nothing for STALL seconds is
    killed, the test it was in is recorded as failed ("hung or crashed", as is the test a
    worker crashed in), and a new worker runs the rest of its shard.  ``nice``: the workers
    run at the lowest CPU priority (beside the rest of the suite)."""
    env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING="1",
               PYTHONPATH=os.pathsep.join([str(TOP), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    rows: dict[str, dict] = {}
    pending = [(f"{side}-{k}", ids[k::workers]) for k in range(workers) if ids[k::workers]]
    while pending:
        procs = []
        for name, shard in pending:
            ids_file = out / f"{name}.ids"
            ids_file.write_text("\n".join(shard) + "\n")
            result = out / f"{name}.jsonl"
            log = open(out / f"{name}.log", "w")
            with _LIVE_LOCK:
                if _STOPPING.is_set():
                    raise RuntimeError("the test session ended before nova's functional tests")
                proc = subprocess.Popen(
                    [sys.executable, str(HERE / "worker.py"), "--side", side, "--ids",
                     str(ids_file), "--out", str(result)],
                    cwd=str(out), env=env, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=_lowest_priority if nice else None)
                _LIVE.add(proc)
            procs.append((name, shard, proc, result, log))
        pending = []
        for name, shard, proc, result, log in procs:
            reported, since = 0, time.monotonic()
            while proc.poll() is None:
                time.sleep(1.0)
                done = len(_rows(result))
                if done != reported:
                    reported, since = done, time.monotonic()
                elif time.monotonic() - since > STALL:
                    proc.kill()
                    proc.wait()
                    break
            log.close()
            with _LIVE_LOCK:
                _LIVE.discard(proc)
            got = _rows(result)
            rows.update((row["id"], row) for row in got)
            if proc.returncode != 0 and len(got) < len(shard):
                # killed (hung) or crashed in the next test: that one fails, the rest runs again
                rows[shard[len(got)]] = {"id": shard[len(got)], "outcome": "fail",
                                         "seconds": None, "detail": f"hung or crashed; {log.name}"}
                if len(got) + 1 < len(shard):
                    pending.append((f"{name}r", shard[len(got) + 1:]))
    return rows, time.monotonic() - started


def start_in_background() -> None:
    """Start the first runs now, in a thread, the workers at the lowest CPU priority; the
    test waits for them (called by tests/conftest.py once collection selected the test)."""
    global _FIRST
    if _FIRST is None:
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nova-functional")
        _FIRST = pool.submit(_first_runs, True)
        pool.shutdown(wait=False)


def stop_background() -> None:
    """Kill the workers still running (the session ended before the test waited for them)."""
    with _LIVE_LOCK:
        _STOPPING.set()
        for proc in list(_LIVE):
            proc.kill()


def _first_runs(nice: bool = False) -> dict[str, Any]:
    """The selection listed, the baseline (recorded, or run), the drop-in's side run."""
    _paste_config()
    out = Path(os.environ.get("SHM_NOVA_FUNCTIONAL_OUT") or tempfile.mkdtemp(prefix="shm-nova-ft-"))
    out.mkdir(parents=True, exist_ok=True)
    workers = int(os.environ.get("SHM_NOVA_FUNCTIONAL_WORKERS", "3"))
    env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING="1")
    selection = os.environ.get("SHM_NOVA_FUNCTIONAL_SELECTION") or str(HERE / "selection.txt")
    listed = subprocess.run([sys.executable, str(HERE / "worker.py"), "--list", selection],
                            cwd=str(out), env=env, capture_output=True, text=True, timeout=600)
    assert listed.returncode == 0, listed.stderr[-3000:]
    ids = [line for line in listed.stdout.splitlines() if line.startswith("nova.tests.")]
    assert len(ids) > (100 if selection.endswith("/selection.txt") else 0), \
        f"the selection lists only {len(ids)} tests"

    recorded = _recorded_baseline(ids)
    if recorded is not None:
        baseline, base_s = recorded, 0.0
    else:
        baseline, base_s = _run_side("nova", ids, workers, out, nice)
        if os.environ.get("SHM_NOVA_FUNCTIONAL_BASELINE") == "record":
            _record_baseline(ids, baseline)
    shared, shared_s = _run_side("shared", ids, workers, out, nice)
    return {"out": out, "ids": ids, "workers": workers, "recorded": recorded,
            "baseline": baseline, "base_s": base_s, "shared": shared, "shared_s": shared_s,
            "background": nice}


def _summed(results: Iterable[dict[str, Any]], key: str) -> dict[str, int]:
    """The tests' maps under ``key`` (a count per name) summed name by name, names sorted."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.get(key) or {})
    return dict(sorted(total.items()))


@pytest.mark.timeout(3600)  # both sides of the selection: minutes, not the suite's 300 s
def test_nova_functional_selection_passes_with_the_drop_in():
    first = _FIRST.result() if _FIRST is not None else _first_runs()
    out, ids, workers, recorded = first["out"], first["ids"], first["workers"], first["recorded"]
    baseline, base_s, shared, shared_s = (first["baseline"], first["base_s"], first["shared"],
                                          first["shared_s"])
    summary = {
        "selected": len(ids),
        "baseline": {o: sum(1 for r in baseline.values() if r["outcome"] == o)
                     for o in ("pass", "fail", "skip", "xfail")},
        "shared": {o: sum(1 for r in shared.values() if r["outcome"] == o)
                   for o in ("pass", "fail", "skip", "xfail")},
        "baseline_seconds": round(base_s, 1), "shared_seconds": round(shared_s, 1),
        "baseline_recorded": recorded is not None,
        "workers": workers, "beside_the_suite": first["background"],
        # every scheduler's update log, re-run as `shm replay --decisions` does
        "replay": {k: sum(r.get(k, 0) for r in shared.values())
                   for k in ("replayed_decisions", "replay_checked", "replay_skipped",
                             "replay_other_code")},
        # allocation candidates of the drop-in's schedulers: from memory (the placement view,
        # fed by the fixture's placement feed) or from placement, and why placement
        "candidates": {
            "tests_with_feed": sum(1 for r in shared.values() if r.get("placement_feeds")),
            "from_memory": sum(r.get("candidates_from_memory", 0) for r in shared.values()),
            "from_placement": sum(r.get("candidates_from_placement", 0) for r in shared.values()),
            "by_reason": _summed(shared.values(), "candidates_by_reason")},
        # the drop-in schedulers' claims by how they retired (a build a compute refused:
        # dropped with the report that ends it; expired: nothing heard by the deadline)
        "claims_by_outcome": _summed(shared.values(), "claims_by_outcome"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))

    missing = [i for i in ids if i not in baseline or i not in shared]
    assert not missing, f"{len(missing)} tests did not report (worker crashed?): {missing[:5]}; logs in {out}"
    passing = [i for i in ids if baseline[i]["outcome"] == "pass"]
    assert len(passing) >= 0.9 * len(ids), f"the baseline itself fails: {summary}"
    # nova's move tests wait a fixed time for each state (ten polls 0.5 s apart); on a
    # loaded machine one of them times out now and then on either side. A test that failed
    # with the drop-in runs again alone, on both sides: a regression fails again with the
    # drop-in while it passes with nova's HostManager; otherwise it is reported as flaky.
    first = [i for i in passing if shared[i]["outcome"] != "pass"]
    if first:
        again = out / "again"
        again.mkdir(exist_ok=True)
        base_again, _ = _run_side("nova", first, 1, again)
        shared_again, _ = _run_side("shared", first, 1, again)
        flaky = [i for i in first if shared_again.get(i, {}).get("outcome") == "pass"]
        shared.update({i: shared_again[i] for i in flaky})
        # failing alone on both sides is nova's test, not the drop-in: listed, not counted
        both = [i for i in first if i not in flaky
                and base_again.get(i, {}).get("outcome") != "pass"]
        passing = [i for i in passing if i not in both]
        summary["flaky"] = flaky
        summary["failed_alone_on_both_sides"] = both
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps({"flaky": flaky, "failed_alone_on_both_sides": both}))
    regressions = {i: shared[i]["detail"][-1500:] for i in passing if shared[i]["outcome"] != "pass"}
    assert not regressions, (f"{len(regressions)} tests pass with nova's HostManager and fail with the "
                             f"drop-in:\n" + "\n\n".join(f"{i}\n{d}" for i, d in regressions.items()))
    # the drop-in served every test: nova's HostManager never read hosts, every test used the
    # fixture, and the tests that scheduled did it through SharedHostManager
    assert all(shared[i]["fixture"] for i in passing)
    assert not [i for i in passing if shared[i]["nova_host_reads"]]
    # the decisions in each scheduler's update log re-run the same; a test that patched a filter
    # or weigher class while deciding is told apart by the code digests, not re-run
    replay_diffs = {i: shared[i]["replay_diffs"] for i in passing if shared[i].get("replay_diffs")}
    assert not replay_diffs, f"re-run from the update log differently: {replay_diffs}"
    if os.environ.get("SHM_NOVA_FUNCTIONAL_REPLAY", "1") != "0":
        # most decisions are re-run; those of a test that patched a filter or weigher class,
        # or configured one of its own, are not, and are not counted against it
        replayed = summary["replay"]
        assert replayed["replay_checked"] >= 0.8 * (replayed["replayed_decisions"]
                                                     - replayed["replay_other_code"]), replayed
    # the fixture's placement feed fed every drop-in scheduler: allocation candidates come from
    # memory except for the request shapes placement keeps (a class in several groups under
    # isolate, names the feed's copy does not know yet)
    cands = summary["candidates"]
    assert cands["from_memory"] >= 0.8 * (cands["from_memory"] + cands["from_placement"]), cands
    assert not set(cands["by_reason"]) & {"stale", "error"}, cands
    scheduled = [i for i in passing if shared[i]["decisions"]]
    assert len(scheduled) >= 0.8 * len(passing), "most tests schedule servers"
    assert sum(shared[i]["host_state_requests"] for i in scheduled) >= \
        0.8 * sum(shared[i]["decisions"] for i in scheduled)


def test_the_recorded_baseline_stands_only_for_its_releases_and_tests(monkeypatch):
    """baseline.json answers for the tests it lists, on the releases it names: a selection of
    some of them uses it, a selection with one test it does not list runs the baseline."""
    recorded = json.loads(BASELINE.read_text())
    ids = list(recorded["outcomes"])
    monkeypatch.delenv("SHM_NOVA_FUNCTIONAL_BASELINE", raising=False)
    got = _recorded_baseline(ids)
    if recorded["releases"] != _releases():
        assert got is None
        return
    assert got is not None and {i: r["outcome"] for i, r in got.items()} == recorded["outcomes"]
    some = _recorded_baseline(ids[1:])
    assert some is not None and set(some) == set(ids[1:])
    assert _recorded_baseline([*ids, "nova.tests.functional.test_x.T.test_y"]) is None
    monkeypatch.setenv("SHM_NOVA_FUNCTIONAL_BASELINE", "run")
    assert _recorded_baseline(ids) is None


def test_recording_a_share_keeps_the_other_tests_outcomes(monkeypatch, tmp_path):
    """Recording the baseline of some tests rewrites theirs and keeps the others' (same
    releases); on other releases only the new outcomes are written."""
    path = tmp_path / "baseline.json"
    monkeypatch.setitem(globals(), "BASELINE", path)
    path.write_text(json.dumps({"releases": _releases(), "outcomes": {"a": "pass", "b": "fail"}}))
    _record_baseline(["b", "c"], {"b": {"outcome": "pass"}, "c": {"outcome": "skip"}})
    assert json.loads(path.read_text())["outcomes"] == {"a": "pass", "b": "pass", "c": "skip"}
    path.write_text(json.dumps({"releases": {"nova": "0"}, "outcomes": {"a": "pass"}}))
    _record_baseline(["c"], {"c": {"outcome": "pass"}})
    assert json.loads(path.read_text()) == {"releases": _releases(), "outcomes": {"c": "pass"}}


def test_a_selection_takes_another_selections_tests_less_its_own_excludes(tmp_path):
    """``selection <file>`` names the tests of another selection file; the file's own
    ``exclude`` lines drop some of them again (how selection.txt is selection-wide.txt less
    the variants CI leaves out)."""
    (tmp_path / "wide.txt").write_text("module nova.tests.functional.test_service\n"
                                       "include TestOldComputeCheck\\.\n")
    (tmp_path / "share.txt").write_text("selection wide.txt\n"
                                        "exclude test_api_fails_to_start_with_old_compute$\n")
    env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING="1")

    def listed(name: str) -> list[str]:
        out = subprocess.run([sys.executable, str(HERE / "worker.py"), "--list",
                              str(tmp_path / name)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return [line for line in out.stdout.splitlines() if line.startswith("nova.tests.")]

    wide, share = listed("wide.txt"), listed("share.txt")
    assert len(wide) == 3 and all(".TestOldComputeCheck." in i for i in wide), wide
    assert share == [i for i in wide if not i.endswith(".test_api_fails_to_start_with_old_compute")]
    assert len(share) == 2
