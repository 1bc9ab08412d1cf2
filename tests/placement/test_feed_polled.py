"""The placement feed polled by its owner (``poll_interval=None``), as nova's functional tests run it.

placement's own WSGI app on SQLite (:class:`simulator.placement_real.RealPlacement`); the
feed reads placement's database through placement's own engine, has no thread of its own,
and its reporter and one scheduler share a synchronous in-process bus: after
``poll_once()``, the reporter's flush and the bus's pump -- all in the test's thread -- the
scheduler's placement view answers as placement does, for a request made before the poll
too (its marker; a request made after a write is not answered before the next poll).  No
waiting anywhere.

The scenario runs in a spawned process: placement's engine facade, its trait and
resource-class sync flags and its policy enforcer are process-global, so placement's
own answer (the reference here) must not depend on what earlier tests of the run
left in the test process.  A mismatch reports what placement holds per provider.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("placement.deploy")

from svc_harness import REPORTER_TOPIC, SCHEDULER_TOPIC  # noqa: E402

from compute_reporter.service import ReporterService  # noqa: E402
from shared_host_manager.placement.database import PlacementDatabase  # noqa: E402
from shared_host_manager.placement.feed_service import PlacementFeed  # noqa: E402
from shared_host_manager.placement.query import Unanswered  # noqa: E402
from shared_host_manager.service import SchedulerService  # noqa: E402
from simulator.placement_real import RealPlacement  # noqa: E402
from transport.inprocess import InProcessBus  # noqa: E402

UUIDS = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(1, 3)]
QS = "resources=VCPU:2"


@contextlib.contextmanager
def polled() -> Iterator[tuple[Any, ...]]:
    p = RealPlacement()
    for u in UUIDS:
        p.ok("POST", "/resource_providers", {"uuid": u, "name": "cn-" + u[:8]})
        p.ok("PUT", f"/resource_providers/{u}/inventories",
             {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}})
    # placement's own engine, as the functional fixture gives it
    db = PlacementDatabase(p.db_url, engine=p.engine)
    bus = InProcessBus(threaded=False)
    feed = PlacementFeed(db, poll_interval=None)
    reporter = ReporterService("placement-feed", feed, bus, bus, reporter_topic=REPORTER_TOPIC,
                               scheduler_topic=SCHEDULER_TOPIC, coalesce_window=0.0)
    confirms: list[bool] = []

    def confirm() -> bool:
        reporter.flush()
        confirms.append(True)
        return True

    feed.confirm = confirm
    sched = SchedulerService("s0", bus, bus, reporter_topic=REPORTER_TOPIC,
                             scheduler_topic=SCHEDULER_TOPIC)
    sched.start()
    threads = set(threading.enumerate())
    reporter.start()
    try:
        yield p, feed, reporter, sched, bus, confirms, set(threading.enumerate()) - threads
    finally:
        reporter.stop()
        sched.stop()
        bus.close()
        p.close()


def _placement(p: RealPlacement) -> dict[str, int]:
    body = p.ok("GET", f"/allocation_candidates?{QS}", version="1.36")
    return {rp: s["resources"]["VCPU"]["used"] for rp, s in body["provider_summaries"].items()}


def _view(sched: SchedulerService, asked_at: float | None = None) -> dict[str, int]:
    body = sched.placement_view.answer(QS, "1.36", asked_at=asked_at)
    assert not isinstance(body, Unanswered), body
    return {rp: s["resources"]["VCPU"]["used"] for rp, s in body["provider_summaries"].items()}


def _same(view: dict[str, int], p: RealPlacement, expected: dict[str, int] | None = None
          ) -> None:
    """The view answers as placement does (and as ``expected``, if given)."""
    held = _placement(p)
    if view == held and (expected is None or held == expected):
        return
    detail = {u: (p.ok("GET", f"/resource_providers/{u}/inventories")["inventories"],
                  p.ok("GET", f"/resource_providers/{u}/usages")["usages"]) for u in UUIDS}
    raise AssertionError(f"view {view} != placement {held} (expected {expected}); "
                         f"placement's inventories and usages: {detail}")


def _scenario() -> None:
    """In the spawned process: the whole case (see the module docstring)."""
    with polled() as (p, feed, reporter, sched, bus, confirms, started):
        # the reporter's loop is its only thread: none polls placement's database
        assert not [t for t in started if t.name.startswith("placement-feed")]
        assert confirms == [True]  # the first document confirmed by start
        bus.pump()
        _same(_view(sched), p, dict.fromkeys(UUIDS, 0))

        p.ok("PUT", "/allocations/" + "c0000000-0000-4000-8000-000000000001",
             {"allocations": {UUIDS[0]: {"resources": {"VCPU": 3}}}, "project_id": "p",
              "user_id": "u", "consumer_generation": None}, version="1.28")
        # a request made after the write returned is not answered from before the next poll
        asked = time.time()
        behind = sched.placement_view.answer(QS, "1.36", asked_at=asked, wait=0.0)
        assert isinstance(behind, Unanswered) and behind.reason == "behind", behind
        changes = feed.poll_once()
        assert UUIDS[0] in changes
        bus.pump()
        _same(_view(sched, asked), p, {UUIDS[0]: 3, UUIDS[1]: 0})

        # nothing changed: the poll publishes its marker alone, the view stays as placement is
        published = reporter.stats["published"]
        asked = time.time()
        assert feed.poll_once() == {}
        bus.pump()
        assert reporter.stats["published"] == published + 1
        _same(_view(sched, asked), p, {UUIDS[0]: 3, UUIDS[1]: 0})


def test_a_polled_feed_has_no_thread_and_is_current_after_poll_and_pump() -> None:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        pool.submit(_scenario).result(timeout=240)
