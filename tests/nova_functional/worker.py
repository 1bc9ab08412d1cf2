"""Run a list of nova's own functional tests in this process and write each outcome as JSON.

Used by :mod:`tests.nova_functional.test_nova_functional` (one process per
worker and per side): ``python worker.py --side nova|shared --ids IDS --out OUT``.
``nova``: nova's tests as shipped (the baseline); ``shared``: the same tests
with :class:`shared_host_manager.nova.fixtures.SharedHostManagerFixture` used
by every nova ``TestCase`` (added in front of nova's own ``setUp``), the tests
themselves unmodified.  Each outcome line records, with the drop-in, how many
host-state requests the drop-in served and whether nova's own HostManager
read hosts from the database (it must not), and how many allocation candidate
requests its schedulers answered from memory (the placement feed the fixture
runs on the test's placement database) and from placement, by reason
(``placement_feeds``, ``candidates_from_memory``, ``candidates_from_placement``,
``candidates_by_reason``: the fixture's ``figures()``), and how its schedulers' claims
retired (``claims_by_outcome``).  Unless ``SHM_NOVA_FUNCTIONAL_REPLAY=0``,
every scheduler also keeps an update log, re-run after the test as ``shm replay
--decisions`` does: the line says how many of nova's decisions were re-run and
which steps came out differently.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import unittest

os.environ.setdefault("OS_NOVA_DISABLE_EVENTLET_PATCHING", "1")
# nova's functional package first: it sets nova up before any other nova module is imported
import nova.tests.functional  # noqa: E402,F401


def _load(ids: list[str]) -> list[unittest.TestCase]:
    """The tests named by ``ids`` (module.Class.test), loaded as nova's loader would
    (``load_tests`` and scenarios included)."""
    loader = unittest.TestLoader()
    wanted = set(ids)
    modules = sorted({i.rsplit(".", 2)[0] for i in ids})
    found: dict[str, unittest.TestCase] = {}
    for module in modules:
        suite = loader.loadTestsFromName(module)
        stack: list = [suite]
        while stack:
            item = stack.pop()
            if isinstance(item, unittest.TestSuite):
                stack.extend(item)
            elif item.id() in wanted:
                found[item.id()] = item
    return [found[i] for i in ids if i in found]


class _Result(unittest.TestResult):
    def __init__(self, out, probe) -> None:
        super().__init__()
        self.out = out
        self.probe = probe
        self.started = 0.0

    def startTest(self, test) -> None:
        super().startTest(test)
        self.started = time.monotonic()
        self.outcome = "pass"
        self.detail = ""
        if self.probe is not None:
            self.probe.reset()

    def _set(self, outcome: str, err=None) -> None:
        self.outcome = outcome
        if isinstance(err, tuple) and err[0] is not None:
            self.detail = "".join(traceback.format_exception(err[0], err[1], err[2]))[-4000:]
        elif err is not None:
            self.detail = str(err)[-4000:]

    def addError(self, test, err) -> None:
        self._set("fail", err)

    def addFailure(self, test, err) -> None:
        self._set("fail", err)

    def addSkip(self, test, reason) -> None:
        self.outcome, self.detail = "skip", str(reason)

    def addExpectedFailure(self, test, err) -> None:
        self.outcome = "xfail"

    def addUnexpectedSuccess(self, test) -> None:
        self.outcome = "fail"
        self.detail = "unexpected success"

    def stopTest(self, test) -> None:
        row = {"id": test.id(), "outcome": self.outcome,
               "seconds": round(time.monotonic() - self.started, 2), "detail": self.detail}
        if self.probe is not None:
            row.update(self.probe.figures())
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        super().stopTest(test)


class _Probe:
    """Per test: what the drop-in served, and any host read of nova's own HostManager.

    Every nova TestCase uses :class:`SharedHostManagerFixture` before its own
    ``setUp`` runs; nova's ``HostManager._get_computes_for_cells`` (where nova
    reads the hosts from the cell databases) is counted: with the drop-in
    active it is never called.
    """

    def __init__(self) -> None:
        from nova import test as nova_test
        from nova.scheduler import host_manager as nova_host_manager

        from shared_host_manager.nova.fixtures import SharedHostManagerFixture

        self.fixture = None
        self.record_dir: str | None = None
        self.nova_reads = 0
        probe = self
        original_reads = nova_host_manager.HostManager._get_computes_for_cells

        def counting(*args, **kwargs):
            probe.nova_reads += 1
            return original_reads(*args, **kwargs)

        nova_host_manager.HostManager._get_computes_for_cells = counting
        original_setup = nova_test.TestCase.setUp

        record = os.environ.get("SHM_NOVA_FUNCTIONAL_REPLAY", "1") != "0"

        def setUp(test, *args, **kwargs):
            probe.record_dir = tempfile.mkdtemp(prefix="shm-ulog-") if record else None
            probe.fixture = test.useFixture(SharedHostManagerFixture(record_dir=probe.record_dir))
            return original_setup(test, *args, **kwargs)

        nova_test.TestCase.setUp = setUp

    def reset(self) -> None:
        self.nova_reads = 0
        self.fixture = None
        if self.record_dir is not None:
            shutil.rmtree(self.record_dir, ignore_errors=True)
        self.record_dir = None

    def figures(self) -> dict:
        out = {"nova_host_reads": self.nova_reads, "fixture": self.fixture is not None}
        if self.fixture is not None:
            out.update(self.fixture.figures())
            if self.record_dir is not None:
                out.update(self._replayed(self.fixture.logs))
        return out

    @staticmethod
    def _replayed(logs: list[str]) -> dict:
        """The test's scheduler logs re-run (stopped schedulers: their logs are closed)."""
        from shared_host_manager.nova.replay.steps import StepReplayer
        from shared_host_manager.updatelog.reader import resolve_log
        from shared_host_manager.updatelog.replay import replay

        out = {"replayed_decisions": 0, "replay_checked": 0, "replay_skipped": 0,
               "replay_other_code": 0, "replay_diffs": [], "replay_notes": []}
        for base in logs:
            parts = resolve_log(base)
            if not parts:
                continue
            r = replay(parts, decisions=True, host_manager=StepReplayer)
            out["replayed_decisions"] += r.decisions
            out["replay_checked"] += r.decisions_checked
            out["replay_skipped"] += r.decisions_skipped
            if r.decisions_note and ("ran other code" in r.decisions_note
                                     or "cannot be loaded here" in r.decisions_note):
                # the test patched a filter or weigher class (nova's NUMA and PCI tests spy on
                # their filters) or configured one of its own (nova's weigher fixtures, gone
                # once the test ended): not re-runnable by design, and said so
                out["replay_other_code"] += r.decisions_skipped
            if r.decisions_note:
                out["replay_notes"].append(r.decisions_note[:300])
            out["replay_diffs"] += [d["what"][:300] for d in r.decision_diffs[:3]]
            out["replay_diffs"] += [f"{m['what']}: {m['detail']}"[:300] for m in r.mismatches[:3]]
            out["replay_diffs"] += [f"damage: {d.describe()}"[:300] for d in r.damages[:1]]
            out["replay_diffs"] += [f"{m['what']}: {m['detail']}"[:300]
                                    for m in r.effect_mismatches[:3]]
        return out


def select(path: str) -> list[str]:
    """The test ids a selection file names (see selection.txt for its format): those of its
    ``selection`` files and of its modules that its ``include`` lines match, less those its
    ``exclude`` lines match."""
    modules: list[str] = []
    include: list[re.Pattern[str]] = []
    exclude: list[re.Pattern[str]] = []
    named: set[str] = set()
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            kind, _, value = line.partition(" ")
            value = value.strip()
            if kind == "selection":
                named.update(select(os.path.join(os.path.dirname(path), value)))
            elif kind == "module":
                modules.append(value)
            elif kind == "include":
                include.append(re.compile(value))
            elif kind == "exclude":
                exclude.append(re.compile(value))
            else:
                raise SystemExit(f"{path}: unknown line {raw.strip()!r} "
                                 "(selection/module/include/exclude)")
    loader = unittest.TestLoader()
    ids: list[str] = []
    for module in modules:
        stack: list = [loader.loadTestsFromName(module)]
        while stack:
            item = stack.pop()
            if isinstance(item, unittest.TestSuite):
                stack.extend(item)
            elif isinstance(item, unittest.TestCase):
                tid = item.id()
                if any(p.search(tid) for p in include) and not any(p.search(tid) for p in exclude):
                    ids.append(tid)
    ids += [tid for tid in named if not any(p.search(tid) for p in exclude)]
    return sorted(set(ids))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", help="print the test ids of this selection file and exit")
    parser.add_argument("--side", choices=("nova", "shared"))
    parser.add_argument("--ids", help="file with one test id per line")
    parser.add_argument("--out", help="JSON lines, one per test")
    args = parser.parse_args()
    if args.list:
        print("\n".join(select(args.list)))
        return 0
    with open(args.ids) as f:
        ids = [line.strip() for line in f if line.strip()]
    probe = None
    if args.side == "shared":
        probe = _Probe()
    tests = _load(ids)
    with open(args.out, "w") as out:
        result = _Result(out, probe)
        for test in tests:
            test(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
