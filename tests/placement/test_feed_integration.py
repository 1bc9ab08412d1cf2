"""The placement feed running, over the real broker, into a scheduler's PlacementView.

placement's API runs as operators run it, under uWSGI (a master and two
workers: :class:`PlacementApi`), on a fresh MariaDB database per test whose
schema :class:`simulator.placement_real.RealPlacement` creates; ``shm
placement-feed``'s parts (:class:`~shared_host_manager.placement.feed_service.PlacementFeed`
served by a ``ReporterService``) publish its providers on a kombu stream of
the real RabbitMQ; a ``SchedulerService`` follows the stream.  The check, after
every change made through placement's REST API: the scheduler's
``placement_view.answer(qs, "1.36")`` equals placement's own
``GET /allocation_candidates?qs`` body (allocation requests as a multiset,
provider summaries with traits as sets), polled until equal within a generous
bound (a wait, not a timing assertion).  placement answers from processes of
its own, as deployed: its app inside a long test process has been seen
answering allocation candidates for 2 of its 4 providers after earlier tests,
all four present (cause not found; placement's own processes never did).

Faults go through explicit interfaces: the feed's ``confirm`` seam (a publish
the broker did not confirm, or a confirm that raises), stopping and starting
the services, and SIGKILL of placement's uWSGI workers while claims are in
flight.  Needs RabbitMQ
at 127.0.0.1:5672 and MariaDB at 127.0.0.1:3306 (skipped without them;
SHM_REQUIRE_RABBITMQ=1 / SHM_REQUIRE_DATABASES=1 make a missing one fail).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("placement.deploy")

from integration.conftest import (  # noqa: E402
    KOMBU_URL,
    OSLO_URL,
    _probe,
    _unavailable,
    delete_queues,
    wait_for_broker,
)
from oslo_config import cfg  # noqa: E402
from svc_harness import wait_for  # noqa: E402

from compute_reporter.service import ReporterService  # noqa: E402
from protocol.hostdoc import is_host  # noqa: E402
from shared_host_manager import metrics as scheduler_metrics  # noqa: E402
from shared_host_manager.membership import live_peers  # noqa: E402
from shared_host_manager.placement.database import PlacementDatabase  # noqa: E402
from shared_host_manager.placement.feed_service import PlacementFeed  # noqa: E402
from shared_host_manager.placement.query import Unanswered  # noqa: E402
from shared_host_manager.service import SchedulerService  # noqa: E402
from simulator.placement_real import RealPlacement, server_available, server_url  # noqa: E402
from transport import no_eventlet  # noqa: E402,F401  (before oslo_messaging)
from transport.kombu_stream import KombuStreamDataPlane, StreamSettings  # noqa: E402
from transport.oslo_rpc import OsloRpcControlPlane  # noqa: E402

pytestmark = [pytest.mark.rabbit, pytest.mark.databases, pytest.mark.slow]

MV = "1.36"
#: generous: the machine running the tests may be loaded; every wait polls for a condition
CONVERGE = 60.0

CN = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(1, 5)]
AGG = ["aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"]
QUERIES = [
    urlencode({"resources": "VCPU:1,MEMORY_MB:512"}),
    urlencode({"resources": "VCPU:4"}),
    urlencode({"resources": "VCPU:2,DISK_GB:20", "root_required": "!COMPUTE_STATUS_DISABLED"}),
    urlencode({"resources": "VCPU:1", "member_of": AGG[0]}),
    urlencode({"resources": "VCPU:1", "required": "CUSTOM_FAST"}),
    urlencode({"resources": "MEMORY_MB:6000"}),
]


def _inv(vcpu: int = 8, mem: int = 8192, disk: int = 100) -> dict[str, Any]:
    return {"VCPU": {"total": vcpu, "allocation_ratio": 1.0},
            "MEMORY_MB": {"total": mem, "reserved": 512, "allocation_ratio": 1.5},
            "DISK_GB": {"total": disk, "step_size": 1}}


# -- the services ----------------------------------------------------------------------------


class PlacementApi:
    """placement's API as operators run it: ``placement.wsgi.api`` under uWSGI (a master, two
    workers) on the database ``db_url``, asked over HTTP.  Its own processes: nothing an
    earlier test left in this process reaches its answers."""

    def __init__(self, db_url: str, directory: Path) -> None:
        import requests

        self.db_url = db_url
        self._session = requests.Session()
        uwsgi = Path(sys.prefix) / "bin" / "uwsgi"
        if not uwsgi.exists():
            pytest.skip("uWSGI is not installed in this environment")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (directory / "placement.conf").write_text(
            f"[placement_database]\nconnection = {db_url}\n[api]\nauth_strategy = noauth2\n")
        self._log = open(directory / "placement-api.log", "wb")  # noqa: SIM115 (closed in close)
        self.server = subprocess.Popen(
            [str(uwsgi), "--master", "--die-on-term", "--need-app", "--lazy-apps",
             "--http-socket", f"127.0.0.1:{port}", "--processes", "2", "--threads", "1",
             "--virtualenv", sys.prefix, "--module", "placement.wsgi.api:application",
             "--add-header", "Connection: close"],
            env={**os.environ, "OS_PLACEMENT_CONFIG_DIR": str(directory)}, stdout=self._log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"

        def answering() -> bool:
            try:
                return self.request("GET", "/")[0] == 200
            except requests.RequestException:
                return False

        try:
            wait_for(answering, CONVERGE, "placement under uWSGI answering")
        except BaseException:
            self.close()
            raise

    def request(self, method: str, path: str, body: Any = None,
                version: str = "1.39") -> tuple[int, Any]:
        """(status, decoded JSON body or None)."""
        headers = {"OpenStack-API-Version": f"placement {version}", "x-auth-token": "admin",
                   "Accept": "application/json"}
        resp = self._session.request(method, self.url + path, json=body, headers=headers,
                                     timeout=30)
        return resp.status_code, (resp.json() if resp.content else None)

    def ok(self, method: str, path: str, body: Any = None, version: str = "1.39") -> Any:
        status, data = self.request(method, path, body, version)
        if status >= 400:
            raise RuntimeError(f"placement {method} {path}: {status} {data}")
        return data

    def workers(self) -> list[int]:
        return _children(self.server.pid)

    def close(self) -> None:
        try:
            os.killpg(self.server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.server.wait(30)
        self._log.close()
        self._session.close()


@pytest.fixture
def placement(tmp_path: Path) -> Iterator[PlacementApi]:
    """placement's API on a MariaDB database of its own, with four compute nodes."""
    if not server_available():
        from servers import database_unavailable

        database_unavailable("MariaDB at 127.0.0.1:3306 is not reachable")
    # placement's schema on a fresh database (dropped at the end)
    schema = RealPlacement(server_url(f"shm_feed_it_{uuid_mod.uuid4().hex[:12]}"))
    try:
        p = PlacementApi(schema.db_url, tmp_path)
    except BaseException:
        schema.close()
        raise
    try:
        p.ok("PUT", "/traits/CUSTOM_FAST")
        for i, u in enumerate(CN):
            p.ok("POST", "/resource_providers", {"uuid": u, "name": f"cn{i + 1}"})
            gen = p.ok("PUT", f"/resource_providers/{u}/inventories",
                       {"resource_provider_generation": 0,
                        "inventories": _inv(vcpu=8 + 4 * i)})["resource_provider_generation"]
            gen = p.ok("PUT", f"/resource_providers/{u}/traits",
                       {"resource_provider_generation": gen,
                        "traits": ["HW_CPU_X86_AVX2"] + (["CUSTOM_FAST"] if i % 2 else [])}
                       )["resource_provider_generation"]
            p.ok("PUT", f"/resource_providers/{u}/aggregates",
                 {"resource_provider_generation": gen, "aggregates": [AGG[i % 2]]})
        yield p
    finally:
        p.close()
        schema.close()


class Bus:
    """A kombu stream and oslo.messaging topics of this test's own, removed at the end."""

    def __init__(self) -> None:
        problem = _probe()
        if problem:
            _unavailable(problem)
        suffix = uuid_mod.uuid4().hex[:10]
        self.stream = f"shm-test-feed-{suffix}"
        self.topics = (f"shm-it-feed-reporter-{suffix}", f"shm-it-feed-scheduler-{suffix}")
        conf = cfg.ConfigOpts()
        conf([])
        self.data = KombuStreamDataPlane(StreamSettings(url=KOMBU_URL, name=self.stream))
        self.control = OsloRpcControlPlane(conf, OSLO_URL)
        self.running: list[Any] = []

    def feed(self, database: PlacementDatabase, confirm: Callable[[ReporterService], Callable[[], bool]]
             | None = None, **kw: Any) -> tuple[ReporterService, PlacementFeed]:
        """The feed (``shm placement-feed``'s parts): polling every 0.05 s, heartbeats every
        0.3 s, confirmed by the reporter's publish_now unless ``confirm`` wraps it."""
        feed = PlacementFeed(database, poll_interval=0.05, **kw)
        reporter = ReporterService("placement-feed", feed, self.data, self.control,
                                   reporter_topic=self.topics[0], scheduler_topic=self.topics[1],
                                   heartbeat_interval=0.3, coalesce_window=0.01)
        feed.confirm = (confirm or (lambda r: lambda: r.publish_now(5.0)))(reporter)
        return reporter, feed

    def scheduler(self, name: str, **kw: Any) -> SchedulerService:
        params: dict[str, Any] = dict(down_interval=3.0, reorder_timeout=0.1, resync_timeout=0.5,
                                      claim_deadline=5.0)
        params.update(kw)
        return SchedulerService(name, self.data, self.control, reporter_topic=self.topics[0],
                                scheduler_topic=self.topics[1], **params)

    def start(self, *services: Any) -> None:
        for s in services:
            s.start()
            self.running.append(s)

    def stop(self, service: Any) -> None:
        service.stop()
        self.running.remove(service)

    def close(self) -> None:
        for s in reversed(self.running):
            s.stop()
        self.control.close()
        self.data.close()
        if wait_for_broker(30):
            delete_queues(KOMBU_URL, [self.stream, *self.topics] + [
                f"{t}.{s}" for t in self.topics for s in ("placement-feed", "s", "late")])


@pytest.fixture
def bus() -> Iterator[Bus]:
    b = Bus()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def database(placement: PlacementApi) -> Iterator[PlacementDatabase]:
    db = PlacementDatabase(placement.db_url)
    yield db
    db.close()


# -- comparing ---------------------------------------------------------------------------------


def _canonical(areq: Mapping[str, Any]) -> str:
    return json.dumps({"allocations": areq["allocations"],
                       "mappings": {k: sorted(v) for k, v in areq.get("mappings", {}).items()}},
                      sort_keys=True)


def _comparable(body: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Allocation requests as a multiset, provider summaries with traits as sets."""
    return (sorted(map(_canonical, body["allocation_requests"])),
            {u: {**s, "traits": sorted(s["traits"])} for u, s in body["provider_summaries"].items()})


def differences(p: PlacementApi, sched: SchedulerService) -> list[str]:
    """The queries whose answer from memory is not placement's own (empty: all equal)."""
    out = []
    for qs in QUERIES:
        mine = sched.placement_view.answer(qs, MV)
        status, theirs = p.request("GET", "/allocation_candidates?" + qs, version=MV)
        assert status == 200, (qs, theirs)
        if isinstance(mine, Unanswered) or _comparable(mine) != _comparable(theirs):
            out.append(f"{qs}: memory {mine if isinstance(mine, Unanswered) else _comparable(mine)}"
                       f" placement {_comparable(theirs)}")
    return out


def converge(p: PlacementApi, *schedulers: SchedulerService, what: str) -> None:
    last: dict[str, list[str]] = {}

    def equal() -> bool:
        for s in schedulers:
            last[s.name] = differences(p, s)
        return not any(last.values())

    try:
        wait_for(equal, CONVERGE, what)
    except AssertionError as exc:
        # what placement itself holds, to tell a wrong view from a placement that lost state
        held = {r["uuid"]: r["generation"] for r in p.ok("GET", "/resource_providers")["resource_providers"]}
        raise AssertionError(f"{exc}: {last}; placement on {p.db_url} holds {held}") from None


def generation(p: PlacementApi, u: str) -> int:
    return int(p.ok("GET", f"/resource_providers/{u}")["generation"])


def allocate(p: PlacementApi, consumer: str, rp: str, resources: dict[str, int]) -> None:
    p.ok("PUT", f"/allocations/{consumer}",
         {"allocations": {rp: {"resources": resources}}, "project_id": "p", "user_id": "u",
          "consumer_generation": None, "consumer_type": "INSTANCE"})


def answer_of(sched: SchedulerService, qs: str = QUERIES[0]) -> Any:
    return sched.placement_view.answer(qs, MV)


# -- the tests -------------------------------------------------------------------------------


def test_every_change_through_placement_reaches_the_view(placement: PlacementApi,
                                                         database: PlacementDatabase,
                                                         bus: Bus) -> None:
    p = placement
    sched = bus.scheduler("s")
    reporter, feed = bus.feed(database)
    bus.start(sched, reporter)
    converge(p, sched, what="the view after the feed's start")
    assert sched.placement_view.status()["providers"] == 4
    # the feed's source is neither a host nor a scheduler
    with sched.cache.lock:
        view = sched.receiver.sources[feed.source]
        assert not is_host(view.doc)
        assert live_peers(sched.receiver, sched.clock()) == []

    # an allocation: usage up (cn1 has 8 VCPU: VCPU:4 no longer fits there)
    consumer = str(uuid_mod.uuid4())
    allocate(p, consumer, CN[0], {"VCPU": 6, "MEMORY_MB": 1024})
    converge(p, sched, what="usage up after an allocation")
    held = sched.placement_view.provider(CN[0])
    assert held is not None and held["usages"]["VCPU"] == 6

    # the allocation deleted: usage down, while the generation does not move
    before = generation(p, CN[0])
    p.ok("DELETE", f"/allocations/{consumer}")
    assert generation(p, CN[0]) == before
    converge(p, sched, what="usage down after the allocation's deletion")
    held = sched.placement_view.provider(CN[0])
    assert held is not None and not held["usages"].get("VCPU")

    # an inventory change
    p.ok("PUT", f"/resource_providers/{CN[1]}/inventories",
         {"resource_provider_generation": generation(p, CN[1]), "inventories": _inv(vcpu=2, mem=4096)})
    converge(p, sched, what="an inventory change")

    # a compute disabled: COMPUTE_STATUS_DISABLED, forbidden by root_required
    p.ok("PUT", f"/resource_providers/{CN[2]}/traits",
         {"resource_provider_generation": generation(p, CN[2]),
          "traits": ["HW_CPU_X86_AVX2", "COMPUTE_STATUS_DISABLED"]})
    converge(p, sched, what="a trait change")
    disabled = answer_of(sched, QUERIES[2])
    assert not isinstance(disabled, Unanswered) and CN[2] not in disabled["provider_summaries"]

    # a provider deleted
    p.ok("DELETE", f"/resource_providers/{CN[3]}")
    converge(p, sched, what="a provider deleted")
    assert sched.placement_view.provider(CN[3]) is None
    assert sched.placement_view.status()["providers"] == 3
    assert scheduler_metrics.health(sched)[0]


def test_a_request_made_after_a_write_returned_is_answered_with_it(placement: PlacementApi,
                                                                  database: PlacementDatabase,
                                                                  bus: Bus) -> None:
    """Read-your-writes, single shot: right after each write through placement's REST API
    returns, every query asked with that moment as its arrival (nova's request context's
    timestamp) is answered from memory as placement answers it -- no polling until equal.
    The view waits for a poll of the feed begun after that moment."""
    p = placement
    sched = bus.scheduler("s")
    reporter, feed = bus.feed(database)
    bus.start(sched, reporter)
    converge(p, sched, what="the view after the feed's start")

    def aggregates(u: str, aggs: list[str]) -> None:
        p.ok("PUT", f"/resource_providers/{u}/aggregates",
             {"resource_provider_generation": generation(p, u), "aggregates": aggs})

    writes: list[tuple[str, Callable[[], None]]] = [
        ("cn1 moved from the first aggregate to the second", lambda: aggregates(CN[0], [AGG[1]])),
        ("cn2 joins the first aggregate", lambda: aggregates(CN[1], [AGG[0], AGG[1]])),
        ("cn1 back in the first", lambda: aggregates(CN[0], [AGG[0]])),
        ("cn3 disabled", lambda: p.ok("PUT", f"/resource_providers/{CN[2]}/traits", {
            "resource_provider_generation": generation(p, CN[2]),
            "traits": ["HW_CPU_X86_AVX2", "COMPUTE_STATUS_DISABLED"]})),
        ("cn4's inventory down", lambda: p.ok("PUT", f"/resource_providers/{CN[3]}/inventories", {
            "resource_provider_generation": generation(p, CN[3]),
            "inventories": _inv(vcpu=2, mem=4096)})),
        ("an allocation on cn2", lambda: allocate(p, str(uuid_mod.uuid4()), CN[1],
                                                  {"VCPU": 10, "MEMORY_MB": 1024})),
    ]
    waits = sched.placement_view.counters["waits"]
    for what, write in writes:
        write()
        asked = time.time()
        for qs in QUERIES:
            mine = sched.placement_view.answer(qs, MV, asked_at=asked, wait=CONVERGE)
            status, theirs = p.request("GET", "/allocation_candidates?" + qs, version=MV)
            assert status == 200, (qs, theirs)
            assert not isinstance(mine, Unanswered), (what, qs, mine)
            assert _comparable(mine) == _comparable(theirs), \
                f"after {what}: {qs}: memory {_comparable(mine)} placement {_comparable(theirs)}"
    # the first query after each write waited for the next poll (the feed polls every 0.05 s)
    assert sched.placement_view.counters["waits"] > waits


class FlakyConfirm:
    """The feed's ``confirm`` seam: the reporter's publish_now, except for the calls told to
    fail -- answering False (not confirmed) or raising -- among those that confirm providers
    read (``reading()``; not a poll's marker alone)."""

    def __init__(self, reporter: ReporterService) -> None:
        self.reporter = reporter
        self.lock = threading.Lock()
        self.fail: list[str] = []
        self.failed = 0
        self.reading: Callable[[], bool] = lambda: True

    def __call__(self) -> bool:
        with self.lock:
            how = self.fail.pop(0) if self.fail and self.reading() else None
        ok = self.reporter.publish_now(5.0)
        if how is None:
            return ok
        with self.lock:
            self.failed += 1
        if how == "raise":
            raise ConnectionError("injected: the broker's confirm was lost")
        return False


@pytest.mark.parametrize("how", ["false", "raise"])
def test_an_unconfirmed_publish_is_read_and_published_again(placement: PlacementApi,
                                                            database: PlacementDatabase,
                                                            bus: Bus, how: str) -> None:
    p = placement
    sched = bus.scheduler("s")
    confirms: list[FlakyConfirm] = []

    def flaky(reporter: ReporterService) -> FlakyConfirm:
        confirms.append(FlakyConfirm(reporter))
        return confirms[0]

    # no full check meanwhile: what is read again is read because it stayed dirty
    reporter, feed = bus.feed(database, flaky, full_check_interval=1e6)
    # the providers of a poll's publish are listed until its confirm: a marker alone has none
    confirms[0].reading = lambda: bool(feed.machine.listed)
    confirm = confirms[0]
    bus.start(sched, reporter)
    converge(p, sched, what="the view after the feed's start")
    published = feed.machine.stats.published
    confirm.fail.append(how)
    allocate(p, str(uuid_mod.uuid4()), CN[1], {"VCPU": 3})
    wait_for(lambda: confirm.failed == 1, CONVERGE, "the injected unconfirmed publish")
    converge(p, sched, what="the view after an unconfirmed publish")
    # the provider was published once unconfirmed, then read and published again
    wait_for(lambda: feed.machine.stats.published >= published + 1 and not feed.machine.dirty,
             CONVERGE, "the provider published again and confirmed")
    assert feed.machine.stats.unconfirmed >= 1
    assert feed.confirm_errors == (1 if how == "raise" else 0)
    assert feed.errors == 0


def test_feed_restarted_new_epoch_nothing_lost(placement: PlacementApi, database: PlacementDatabase,
                                               bus: Bus) -> None:
    p = placement
    sched = bus.scheduler("s")
    reporter, feed = bus.feed(database)
    bus.start(sched, reporter)
    converge(p, sched, what="the view after the feed's start")
    with sched.cache.lock:
        epoch = sched.receiver.sources[feed.source].epoch
    bus.stop(reporter)
    # placement changes while no feed runs
    allocate(p, str(uuid_mod.uuid4()), CN[0], {"VCPU": 5})
    p.ok("PUT", f"/resource_providers/{CN[1]}/inventories",
         {"resource_provider_generation": generation(p, CN[1]), "inventories": _inv(vcpu=3)})
    p.ok("DELETE", f"/resource_providers/{CN[3]}")
    p.ok("POST", "/resource_providers", {"uuid": CN[3], "name": "cn4-again"})
    p.ok("PUT", f"/resource_providers/{CN[3]}/inventories",
         {"resource_provider_generation": 0, "inventories": _inv(vcpu=16)})
    reporter, feed = bus.feed(database)
    bus.start(reporter)
    converge(p, sched, what="the view after the feed's restart")
    with sched.cache.lock:
        assert sched.receiver.sources[feed.source].epoch > epoch
    assert sched.placement_view.provider(CN[3])["name"] == "cn4-again"  # type: ignore[index]


def test_feed_stopped_past_max_staleness_the_view_is_stale(placement: PlacementApi,
                                                          database: PlacementDatabase,
                                                          bus: Bus) -> None:
    p = placement
    sched = bus.scheduler("s", placement_max_staleness=1.0)
    # before any feed: no_feed, and healthy all the same (deployments without a feed)
    bus.start(sched)
    assert answer_of(sched).reason == "no_feed"
    assert sched.placement_view.status()["reason"] == "no_feed"
    wait_for(lambda: scheduler_metrics.health(sched)[0], CONVERGE, "a healthy scheduler without feed")
    reporter, _feed = bus.feed(database)
    bus.start(reporter)
    converge(p, sched, what="the view after the feed's start")
    bus.stop(reporter)

    def stale() -> bool:
        st = sched.placement_view.status()
        return st["reason"] == "stale" and st["last_heard"] is not None and st["last_heard"] > 1.0

    wait_for(stale, CONVERGE, "the view stale once the feed is silent past max_staleness")
    got = answer_of(sched)
    assert isinstance(got, Unanswered) and got.reason == "stale"
    st = sched.placement_view.status()
    assert not st["fresh"] and st["providers"] == 4
    ok, line = scheduler_metrics.health(sched)
    assert ok and "degraded: placement view stale: " in line
    assert scheduler_metrics.status(sched)["placement"]["reason"] == "stale"


def test_a_scheduler_started_after_the_feed_gets_the_whole_state(placement: PlacementApi,
                                                                 database: PlacementDatabase,
                                                                 bus: Bus) -> None:
    p = placement
    reporter, _feed = bus.feed(database)
    bus.start(reporter)
    # changes published before any scheduler listens
    allocate(p, str(uuid_mod.uuid4()), CN[2], {"VCPU": 2, "DISK_GB": 30})
    p.ok("DELETE", f"/resource_providers/{CN[3]}")
    wait_for(lambda: len(_feed.machine.document) == 3 and not _feed.machine.dirty, CONVERGE,
             "the feed publishing the changes")
    late = bus.scheduler("late")
    bus.start(late)
    converge(p, late, what="a cold scheduler's view")
    assert late.placement_view.status()["providers"] == 3


# -- placement's own processes -------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (uWSGI's workers of its master)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # the command may hold spaces and parentheses: the fields follow the last ')'
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def test_a_placement_worker_killed_mid_request_loses_nothing(placement: PlacementApi,
                                                             database: PlacementDatabase,
                                                             bus: Bus) -> None:
    """Claims sent to placement's API from four threads while its uWSGI workers are killed
    (SIGKILL) one after another: the view converges to what placement committed, and every
    claim placement accepted is in it.  A request cut by the kill may or may not have
    committed; the feed reads the database, so either way the view follows what is there."""
    import requests

    wait_for(lambda: len(placement.workers()) == 2, CONVERGE, "two uWSGI workers")
    sched = bus.scheduler("s")
    reporter, _feed = bus.feed(database)
    bus.start(sched, reporter)
    converge(placement, sched, what="the view before the claims")

    accepted: list[str] = []
    outcomes: dict[str, int] = {}
    stop = threading.Event()

    def claims(seed: int) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        headers = {"OpenStack-API-Version": "placement 1.39", "x-auth-token": "admin"}
        while not stop.is_set():
            consumer = str(uuid_mod.uuid4())
            body = {"allocations": {rng.choice(CN): {"resources": {"VCPU": 1, "MEMORY_MB": 64}}},
                    "project_id": "p", "user_id": "u", "consumer_generation": None,
                    "consumer_type": "INSTANCE"}
            try:
                status = session.put(f"{placement.url}/allocations/{consumer}", json=body,
                                     headers=headers, timeout=30).status_code
                key = str(status)
            except requests.RequestException:
                key = "cut"
                status = 0
            if status == 204:
                accepted.append(consumer)
            outcomes[key] = outcomes.get(key, 0) + 1

    clients = [threading.Thread(target=claims, args=(i,), daemon=True) for i in range(4)]
    for t in clients:
        t.start()
    killed = 0
    try:
        for _ in range(3):
            wait_for(lambda n=3 * (killed + 1): len(accepted) > n, CONVERGE, "claims accepted")
            workers = placement.workers()
            assert workers, "uWSGI has no worker"
            os.kill(workers[0], signal.SIGKILL)
            killed += 1
            # the master forks a new worker in its place
            wait_for(lambda w=workers[0]: w not in placement.workers()
                     and len(placement.workers()) == 2, CONVERGE, "the worker respawned")
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    assert accepted, outcomes
    converge(placement, sched, what=f"the view after {killed} workers were killed ({outcomes})")
    for consumer in accepted:
        assert placement.ok("GET", f"/allocations/{consumer}")["allocations"], consumer
    used = {u: sched.placement_view.provider(u)["usages"].get("VCPU", 0)  # type: ignore[index]
            for u in CN}
    held = {u: placement.ok("GET", f"/resource_providers/{u}/usages")["usages"].get("VCPU", 0)
            for u in CN}
    assert used == held and sum(held.values()) >= len(accepted), (used, held, outcomes)
