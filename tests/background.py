"""Test modules that run in a pytest process of their own, beside the rest of the suite.

The modules marked ``background`` (tests/deployment: a real nova deployment, minutes of
waiting on its processes; the simulator's longest modules) run one after another in one
child ``python -m pytest`` started once collection has selected their tests, while the
parent runs everything else; both cores work instead of one.
In the parent each of its tests is a :class:`BackgroundTest` with the same node id, markers
and place in the report: put after the other tests, it waits for the child's report of that
test and ends as it did there (passed, failed with the child's traceback, skipped).

The module is a pytest plugin (tests/conftest.py registers it). Life cycle: :func:`start`
once collection is final (only when other tests are selected too: alone, the module runs in
the parent as any other), :func:`wait` before a test that must have the broker to itself
(marked ``restarts_broker``), :func:`stop` at the end of the session (an interrupted child is
asked to stop, so that its fixtures tear down what they started), :func:`summary` for the
terminal (the child's log, its summary sections).  Where the stand-ins run among the other
tests is the conftest's order.

In the child, ``SHM_BACKGROUND_REPORT`` names the JSON-lines file :func:`record` appends each
test phase's report to; the parent reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

#: set in the child: the file its reports go to
REPORT_ENV = "SHM_BACKGROUND_REPORT"
#: seconds a background test may wait for the child (the deployment module: minutes)
WAIT = 3600.0
#: seconds an interrupted child has to tear its fixtures down before it is killed
STOP_GRACE = 120.0


class _Child:
    """One child pytest run: its process, its log and the reports it wrote so far."""

    def __init__(self, nodeids: list[str], rootdir: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shm-background-"))
        self.log = self.dir / "pytest.log"
        self.reports_file = self.dir / "reports.jsonl"
        self.nodeids = nodeids
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}
        self._read = 0
        env = dict(os.environ, **{REPORT_ENV: str(self.reports_file)})
        with open(self.log, "wb") as log:
            # its own process group: an interrupt of the parent's terminal is not the child's
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "--disable-warnings", *nodeids],
                cwd=str(rootdir), env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def poll(self) -> None:
        """Read the reports written since the last call."""
        if not self.reports_file.exists():
            return
        with open(self.reports_file, "rb") as f:
            f.seek(self._read)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._read += end
        for line in data[:end].splitlines():
            report = json.loads(line)
            self.reports[(report["nodeid"], report["when"])] = report

    def report(self, nodeid: str, timeout: float) -> dict[str, dict[str, Any]]:
        """The phases of ``nodeid`` once the child ended it (its teardown came, or the child
        ended); raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if (nodeid, "teardown") in self.reports or self.proc.poll() is not None:
                self.poll()
                return {when: r for (nid, when), r in self.reports.items() if nid == nodeid}
            if time.monotonic() > deadline:
                raise TimeoutError(f"no report of {nodeid} from the background run in "
                                   f"{timeout:.0f} s (its log: {self.log})")
            time.sleep(0.5)

    def finish(self) -> None:
        """Once all its tests ended: let it write its summary and exit (at most STOP_GRACE)."""
        self.poll()
        if all((nodeid, "teardown") in self.reports for nodeid in self.nodeids):
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


_CHILDREN: list[_Child] = []


class BackgroundFailure(Exception):
    """A test that failed in the child: its report's text is the failure."""


class BackgroundTest(pytest.Item):
    """The parent's stand-in for a test the child runs: same node id, markers and location."""

    def __init__(self, *, child: _Child, location: tuple[Any, int | None, str],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.child = child
        self.location_info = location

    def runtest(self) -> None:
        phases = self.child.report(self.nodeid, WAIT)
        if not phases:
            raise BackgroundFailure(f"the background run ended (exit {self.child.proc.returncode}) "
                                    f"without running this test; its log ({self.child.log}) "
                                    f"ends with:\n{self.child.tail()}")
        for when in ("setup", "call", "teardown"):
            report = phases.get(when)
            if report is None:
                continue
            if report["outcome"] == "skipped":  # reported where the test is, as in the child
                raise pytest.skip.Exception(report["skip_reason"] or "skipped in the background "
                                            "run", _use_item_location=True)
            if report["outcome"] == "failed":
                raise BackgroundFailure(f"{when} failed in the background run "
                                        f"({report['duration']:.1f} s):\n{report['longrepr']}")
        if "teardown" not in phases:  # the child died during it (a crash, a kill)
            raise BackgroundFailure(f"the background run ended (exit {self.child.proc.returncode}) "
                                    f"during this test; its log ({self.child.log}) ends "
                                    f"with:\n{self.child.tail()}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, BackgroundFailure | TimeoutError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.location_info


def start(session: pytest.Session) -> None:
    """Move the selected tests of ``background`` modules into one child run, when other
    tests are selected as well; stand-ins take their places in ``session.items``."""
    items = session.items
    moved = [item for item in items if item.get_closest_marker("background") is not None]
    if not moved or len(moved) == len(items) or os.environ.get(REPORT_ENV):
        return
    child = _Child([item.nodeid for item in moved], Path(str(session.config.rootpath)))
    _CHILDREN.append(child)
    for i, item in enumerate(items):
        if item.get_closest_marker("background") is None:
            continue
        assert item.parent is not None
        stand_in = BackgroundTest.from_parent(item.parent, name=item.name, child=child,
                                              location=item.reportinfo())
        # the module's markers are the parent's, shared already; the test's own are copied
        stand_in.own_markers.extend(item.own_markers)
        # before the module's own: the closest timeout marker is the one that counts
        stand_in.add_marker(pytest.mark.timeout(WAIT + 60), append=False)
        items[i] = stand_in


def wait(timeout: float = WAIT) -> None:
    """Return once every child run has ended (a test that must have the broker alone)."""
    deadline = time.monotonic() + timeout
    for child in _CHILDREN:
        try:
            child.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the background run still runs after {timeout:.0f} s "
                               f"(its log: {child.log})") from None


def stop() -> None:
    """End every child still running: one whose tests all ended is left to finish its
    summary; the others are interrupted (their fixtures tear down), then killed."""
    for child in _CHILDREN:
        child.finish()
        if child.proc.poll() is None:
            os.killpg(child.proc.pid, signal.SIGINT)
            try:
                child.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()


def summary(terminalreporter: Any) -> None:
    """The child's own summary sections (figures, slowest durations, its result line)."""
    for child in _CHILDREN:
        child.finish()
        terminalreporter.section("background run")
        terminalreporter.write_line(f"log: {child.log}")
        text = child.log.read_text(errors="replace").splitlines()
        at = next((i for i, line in enumerate(text) if line.startswith("====")), len(text))
        for line in text[at:]:
            terminalreporter.write_line(line)


def record(report: pytest.TestReport) -> None:
    """In the child: append one phase's report to the parent's file."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    skip_reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        skip_reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    line = json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                       "duration": report.duration, "skip_reason": skip_reason,
                       "longrepr": "" if report.passed else report.longreprtext})
    with open(path, "a") as f:
        f.write(line + "\n")


# the plugin's hooks


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    start(session)
    session.config.add_cleanup(stop)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that stops the broker waits until the background run, which uses it, ended."""
    if item.get_closest_marker("restarts_broker") is not None:
        wait()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    summary(terminalreporter)
