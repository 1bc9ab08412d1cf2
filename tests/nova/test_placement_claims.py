"""Concurrent claims on one provider of the nova simulator's in-process placement never exceed it.

The harness (:class:`shared_host_manager.nova.testing.placement_server.InProcessPlacement`) on
SQLite, MariaDB and PostgreSQL: 12 threads each claim 5 GB of a provider with
10 GB free (``PUT /allocations/{consumer}``, retried on 409
``placement.concurrent_update`` as nova's report client retries), and exactly
two are accepted.

Why the harness needs a setting for it (placement 16.0.0, proven here on its own
code path, the HTTP handler down to ``_set_allocations``): with placement's
default ``[placement] allocation_conflict_retry_count`` (10), a claim that loses
the provider generation race is retried by ``replace_all`` *inside the request's
transaction* (the handler's ``_update_consumers_and_create_allocations``
writer).  The failed attempt's allocation rows are still there, so the retry's
usage snapshot includes them and the capacity check's "no worse than before"
exemption passes (PostgreSQL, READ COMMITTED); on MariaDB (REPEATABLE READ)
the retry also reads the transaction's first snapshot, without the rival's
committed claim.  The interleaving is made deterministic: a rival claim runs to
completion right after the victim's capacity check.  With the harness's setting
(one attempt per request) the victim gets 409 ``placement.concurrent_update``.

Each case runs in a spawned process: placement configures its database engine
once per process.  The server cases are skipped when the server is not
reachable; their databases are named per test run and dropped afterwards.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import tempfile
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("placement.deploy")
pytest.importorskip("wsgi_intercept")

from servers import database_unavailable  # noqa: E402

pytestmark = pytest.mark.nova

CAPACITY_MB = 10240
CLAIM_MB = 5120
THREADS = 12
#: already allocated in the interleaved case: the filler and one claim fit, a second does not
FILLER_MB = 2048
SERVERS = {
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/{name}",
    "postgresql": "postgresql+psycopg2://postgres@127.0.0.1:5432/{name}",
}


# -- in the spawned process ---------------------------------------------------------------

def _placement(db_url: str | None, directory: str, processes: int = 0) -> tuple[Any, str]:
    """The harness's placement on ``db_url`` (None: SQLite) with one provider of CAPACITY_MB;
    ``processes``: served from that many processes of its own (``--placement-processes``)."""
    from shared_host_manager.nova.testing import simulation as sim
    from shared_host_manager.nova.testing.placement_server import InProcessPlacement

    url = sim._placement_url(directory, db_url)
    if processes:
        from shared_host_manager.nova.testing.placement_server import PlacementProcesses

        p: Any = PlacementProcesses(url, processes)
    else:
        p = InProcessPlacement(url)
    rp = str(uuid.uuid4())
    p.request("POST", "/resource_providers", {"uuid": rp, "name": "node-1"})
    p.request("PUT", f"/resource_providers/{rp}/inventories",
              {"resource_provider_generation": 0,
               "inventories": {"MEMORY_MB": {"total": CAPACITY_MB, "reserved": 0,
                                             "max_unit": CAPACITY_MB}}})
    return p, rp


def _claim(p: Any, rp: str, consumer: str, mb: int) -> tuple[int, str]:
    """One PUT /allocations/{consumer} as nova's claim_resources makes it: (status, error code)."""
    resp = p.adapter().request(
        f"/allocations/{consumer}", "PUT", microversion="1.36",
        json={"allocations": {rp: {"resources": {"MEMORY_MB": mb}}}, "project_id": "project",
              "user_id": "user", "consumer_generation": None})
    code = resp.json()["errors"][0]["code"] if resp.status_code >= 400 else ""
    return resp.status_code, code


def _used(p: Any, rp: str) -> int:
    return p.request("GET", f"/resource_providers/{rp}/usages")["usages"].get("MEMORY_MB", 0)


def concurrent_claims(db_url: str | None, processes: int = 0) -> dict[str, Any]:
    """THREADS claims at once; a generation conflict is retried (nova retries it, up to 4 times:
    here until it is something else, so that every claim ends accepted or refused)."""
    with tempfile.TemporaryDirectory() as directory:
        p, rp = _placement(db_url, directory, processes)
        outcomes: Counter[str] = Counter()
        counted = threading.Lock()
        start = threading.Barrier(THREADS)

        def client() -> None:
            consumer = str(uuid.uuid4())
            start.wait()
            retried = 0
            for _ in range(50):
                status, code = _claim(p, rp, consumer, CLAIM_MB)
                if code != "placement.concurrent_update":
                    break
                retried += 1
            with counted:
                outcomes[f"{status} {code}".strip()] += 1
                outcomes["retried"] += retried

        threads = [threading.Thread(target=client) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        used = _used(p, rp)
        cpu = p.cpu_seconds()
        p.close()
    retried = outcomes.pop("retried", 0)
    return {"outcomes": dict(outcomes), "retried": retried, "used": used, "cpu": cpu}


def interleaved_claims(db_url: str, placement_default: bool) -> dict[str, Any]:
    """A filler claim, then the victim's claim with a rival's committed between the victim's
    capacity check and its generation update: together more than the capacity.

    ``placement_default``: placement's own ``allocation_conflict_retry_count`` instead of the
    harness's."""
    from placement.objects import allocation as alloc_obj

    # consumer ids far apart: on MariaDB the victim's DELETE of its (absent) allocations
    # gap-locks the index up to the next consumer id, which must not be where the rival inserts
    victim, filler, rival = ("10000000-0000-4000-8000-000000000000",
                             "80000000-0000-4000-8000-000000000000",
                             "f0000000-0000-4000-8000-000000000000")
    with tempfile.TemporaryDirectory() as directory:
        p, rp = _placement(db_url, directory)
        if placement_default:
            p.conf.clear_override("allocation_conflict_retry_count", group="placement")
        retries = p.conf.placement.allocation_conflict_retry_count
        assert _claim(p, rp, filler, FILLER_MB) == (204, "")
        original = alloc_obj._check_capacity_exceeded
        rival_result: list[Any] = []

        def check(ctx: Any, allocs: Any, prev_usage: Any) -> Any:
            providers = original(ctx, allocs, prev_usage)
            if allocs[0].consumer.uuid == victim and not rival_result:
                rival_result.append(None)
                t = threading.Thread(target=lambda: rival_result.append(
                    _claim(p, rp, rival, CLAIM_MB)))
                t.start()
                t.join(30)
                if t.is_alive():
                    raise RuntimeError("the rival claim waited for the victim's transaction")
            return providers

        alloc_obj._check_capacity_exceeded = check
        try:
            victim_result = _claim(p, rp, victim, CLAIM_MB)
        finally:
            alloc_obj._check_capacity_exceeded = original
        used = _used(p, rp)
        p.close()
    return {"retries": retries, "rival": list(rival_result[1]), "victim": list(victim_result),
            "used": used}


# -- in the test process ------------------------------------------------------------------

def _in_process(func: Any, *args: Any) -> Any:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(func, *args).result(timeout=240)


def _server_url(backend: str) -> str:
    """A database of this test run on ``backend``'s server (skipped when it is not reachable)."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = SERVERS[backend].format(name=f"shmclaims{os.getpid()}")
    admin = make_url(url).set(database="postgres" if backend == "postgresql" else "mysql")
    timeout = {"connect_timeout": 3}
    try:
        engine = sa.create_engine(admin, connect_args=timeout)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # any failure to reach the server means: not available here
        database_unavailable(f"{backend} not reachable: {exc.__class__.__name__}")
    return url


@pytest.fixture
def server_url(request):
    """The URL for ``request.param``'s server; the placement database it makes is dropped."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = _server_url(request.param)
    yield url
    from shared_host_manager.nova.testing.simulation import _db_url

    target = make_url(_db_url(url, "placement"))
    admin = target.set(database="postgres" if request.param == "postgresql" else "mysql")
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        quote = engine.dialect.identifier_preparer.quote
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {quote(target.database)}"))
    engine.dispose()


def _assert_exactly_capacity(result: dict[str, Any]) -> None:
    assert result["used"] <= CAPACITY_MB, result
    # every claim ended accepted or refused for capacity, none lost to an error
    assert set(result["outcomes"]) <= {"204", "409 placement.undefined_code"}, result
    assert result["outcomes"].get("204", 0) == CAPACITY_MB // CLAIM_MB, result
    assert result["used"] == CAPACITY_MB, result


@pytest.mark.timeout(300)
def test_concurrent_claims_on_sqlite_never_exceed_capacity():
    _assert_exactly_capacity(_in_process(concurrent_claims, None))


@pytest.mark.databases
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server_url", list(SERVERS), indirect=True)
def test_concurrent_claims_on_a_server_never_exceed_capacity(server_url):
    _assert_exactly_capacity(_in_process(concurrent_claims, server_url))


@pytest.mark.databases
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server_url", list(SERVERS), indirect=True)
def test_placement_in_processes_of_its_own_never_exceeds_capacity(server_url):
    """shm sim --placement-processes: the claims reach two worker processes over HTTP, each
    with its own connections to the server, and still never exceed the capacity."""
    result = _in_process(concurrent_claims, server_url, 2)
    _assert_exactly_capacity(result)
    assert result["cpu"] > 0  # the workers served them, not this process


def test_placement_in_processes_needs_a_database_server(tmp_path):
    from shared_host_manager.nova.testing.placement_server import PlacementProcesses

    with pytest.raises(ValueError, match="database server"):
        PlacementProcesses(f"sqlite:///{tmp_path}/placement.sqlite", 2)


def test_the_simulator_refuses_placement_processes_on_sqlite():
    from simulator import nova_sim

    with pytest.raises(ValueError, match="--placement-processes needs a database server"):
        nova_sim.check_config(nova_sim.NovaSimConfig(placement_processes=2))


@pytest.mark.databases
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server_url", list(SERVERS), indirect=True)
def test_placement_retrying_inside_the_request_transaction_overcommits(server_url):
    """placement's own default: the victim's retry is accepted beyond capacity."""
    r = _in_process(interleaved_claims, server_url, True)
    assert r["retries"] > 1
    assert r["rival"] == [204, ""]
    assert r["victim"] == [204, ""]
    assert r["used"] > CAPACITY_MB


@pytest.mark.databases
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server_url", list(SERVERS), indirect=True)
def test_the_harness_returns_the_conflict_to_the_client(server_url):
    """The harness's setting: the same interleaving ends in 409 placement.concurrent_update,
    which nova's report client retries in a new request (then refused for capacity)."""
    r = _in_process(interleaved_claims, server_url, False)
    assert r["retries"] == 1
    assert r["rival"] == [204, ""]
    assert r["victim"] == [409, "placement.concurrent_update"]
    assert r["used"] == FILLER_MB + CLAIM_MB
