"""The aggregate request filters from the stream (shared_host_manager/nova/request_filters.py)
against nova's own on a real database.

Differential: for generated aggregates (zones, ``filter_tenant_id`` / ``filter_tenant_id_N``
keys, other keys holding a project's id, ``trait:...=required`` keys in several spellings,
several aggregates per host, aggregates without hosts) written through nova's objects into
nova's API database (SQLite), nova's ``require_tenant_aggregate``,
``map_az_to_placement_aggregate`` and ``isolate_aggregates`` on that database and the
drop-in's on the catalogue an API-side source preloads from it (through the scheduler's cache
and SharedHostManager, as in a deployment) make the same RequestSpec changes, return the same
and raise the same, and the drop-in's run no SQL.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("nova.scheduler")

from nova import context as nova_context  # noqa: E402
from nova import exception, objects  # noqa: E402
from nova.scheduler import request_filter  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

from shared_host_manager.nova import host_manager, request_filters  # noqa: E402
from shared_host_manager.nova.api_source import ApiStateSource  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402

pytestmark = pytest.mark.nova

NAMES = ("require_tenant_aggregate", "map_az_to_placement_aggregate", "isolate_aggregates")
HOSTS = [f"host{i}" for i in range(6)]
PROJECTS = [f"project-{i}" for i in range(4)]
ZONES = ["az0", "az1", "az2"]
TRAITS = ["HW_CPU_X86_AVX", "CUSTOM_GOLD", "CUSTOM_SILVER"]


class _Sql:
    n = 0

    def __call__(self, *_args):
        self.n += 1


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    fx.setup_nova()
    database = fx.NovaDatabase(str(tmp_path_factory.mktemp("novadb-request-filters")))
    database.configure()
    return database


@pytest.fixture
def sql():
    counter = _Sql()
    event.listen(Engine, "before_cursor_execute", counter)
    yield counter
    event.remove(Engine, "before_cursor_execute", counter)


@pytest.fixture
def installed():
    host_manager.install()
    yield
    host_manager.uninstall()


def _ctxt():
    return nova_context.get_admin_context()


def _clear():
    ctxt = _ctxt()
    for agg in objects.AggregateList.get_all(ctxt):
        for host in list(agg.hosts or ()):
            agg.delete_host(host)
        agg.destroy()


def _metadata(rng: random.Random) -> dict[str, str]:
    meta: dict[str, str] = {}
    if rng.random() < 0.5:
        meta["availability_zone"] = rng.choice(ZONES)
    for n in range(rng.choice((0, 0, 1, 2))):
        key = "filter_tenant_id" if n == 0 and rng.random() < 0.6 else f"filter_tenant_id_{n}"
        meta[key] = rng.choice(PROJECTS)
    if rng.random() < 0.3:  # a project's id under another key (nova's query matches the value)
        meta[rng.choice(("owner", "xfilter_tenant_id", "note"))] = rng.choice(PROJECTS)
    if rng.random() < 0.2:  # a zone's name under another key
        meta["zone_hint"] = rng.choice(ZONES)
    for _ in range(rng.choice((0, 0, 1, 2))):
        prefix = rng.choice(("trait:", "trait:", "TRAIT:", "Trait:", "traits:", "xtrait:"))
        meta[prefix + rng.choice(TRAITS)] = rng.choice(("required", "required", "Required",
                                                        "forbidden"))
    if rng.random() < 0.3:
        meta["ram_weight_multiplier"] = str(rng.choice((0.5, 2.0)))
    return meta


def _world(rng: random.Random, n: int) -> list[objects.Aggregate]:
    """``n`` aggregates in nova's API database, created as nova's aggregate API creates them."""
    _clear()
    ctxt = _ctxt()
    made = []
    for k in range(n):
        agg = objects.Aggregate(ctxt, name=f"agg-{k}", uuid=fx.uuid_for(f"rf-agg-{rng.random()}", k),
                                metadata=_metadata(rng))
        agg.create()
        for host in rng.sample(HOSTS, rng.choice((0, 1, 2, 3))):
            agg.add_host(host)
        made.append(agg)
    return made


def _manager(with_api_source: bool = True):
    """A SharedHostManager whose cache holds what an API-side source preloads from the
    database (its first snapshot), or nothing."""
    docs = {}
    if with_api_source:
        source = ApiStateSource("api-test")
        source.preload([], objects.AggregateList.get_all(_ctxt()))
        docs["api-test"] = source.document("api-test")
    return host_manager.SharedHostManager(fx.cache_from_documents(docs),
                                          default_cell_uuid=fx.CELL1)


def _spec(rng: random.Random):
    traits = rng.sample(TRAITS, rng.choice((0, 0, 1, 2)))
    spec = fx.request_spec(extra_specs={f"trait:{t}": "required" for t in traits})
    spec.project_id = rng.choice(PROJECTS + ["project-none"])
    spec.availability_zone = rng.choice([None, None, ""] + ZONES + ["az-none"])
    if rng.random() < 0.2:
        spec.requested_destination = objects.Destination(aggregates=["preset"])
    return spec


def _ours(name: str):
    index = [f.__name__ for f in request_filter.ALL_REQUEST_FILTERS].index(name)
    entry = request_filter.ALL_REQUEST_FILTERS[index]
    assert entry is not getattr(request_filter, name)
    return entry


def _outcome(fn, spec):
    """(returned or raised, requested_destination's aggregates as sets, forbidden aggregates)."""
    try:
        result = ("returned", fn(_ctxt(), spec))
    except Exception as exc:  # the same class and message
        result = ("raised", type(exc).__name__, str(exc))
    dest = spec.requested_destination if "requested_destination" in spec else None
    if dest is None:
        return result, None, None
    aggregates = dest.aggregates if "aggregates" in dest else None
    forbidden = dest.forbidden_aggregates if "forbidden_aggregates" in dest else None
    return (result,
            None if aggregates is None else [frozenset(a.split(",")) for a in aggregates],
            None if forbidden is None else set(forbidden))


CONFS = [
    {"scheduler.limit_tenants_to_placement_aggregate": tenants,
     "scheduler.placement_aggregate_required_for_tenants": required,
     "scheduler.enable_isolated_aggregate_filtering": isolate}
    for tenants in (False, True) for required in (False, True) for isolate in (False, True)]


def test_the_filters_answer_as_nova_on_its_database(db, sql, nova_conf, installed):
    rng = random.Random(3434)
    compared = {"changed": 0, "raised": 0, "ran": 0}
    for world in range(8):
        _world(rng, rng.choice((0, 1, 3, 6, 10)))
        manager = _manager()
        for _ in range(18):
            nova_conf.set(**rng.choice(CONFS))
            spec = _spec(rng)
            for name in NAMES:
                nova_spec, our_spec = spec.obj_clone(), spec.obj_clone()
                theirs = _outcome(getattr(request_filter, name), nova_spec)
                before = sql.n
                ours = _outcome(_ours(name), our_spec)
                assert sql.n == before, f"{name} ran SQL"
                assert ours == theirs, (world, name, spec.project_id, spec.availability_zone)
                compared["ran"] += theirs[0] == ("returned", True)
                compared["raised"] += theirs[0][0] == "raised"
                compared["changed"] += theirs[1:] != _outcome(lambda c, s: None, spec.obj_clone())[1:]
        del manager
    # the generator reaches every branch
    assert compared["raised"] and compared["changed"] > 20 and compared["ran"] > 100, compared
    assert request_filters.figures()["from_catalogue"] > 0


def test_the_zone_aggregates_keep_nova_order_and_include_hostless_ones(db, installed):
    _clear()
    ctxt = _ctxt()
    made = []
    for k in range(4):
        agg = objects.Aggregate(ctxt, name=f"z{k}", uuid=fx.uuid_for("rf-zone", k),
                                metadata={"availability_zone": "az9"})
        agg.create()
        if k % 2:
            agg.add_host(HOSTS[k])
        made.append(agg)
    _manager()
    spec = fx.request_spec()
    spec.availability_zone = "az9"
    nova_spec = spec.obj_clone()
    request_filter.map_az_to_placement_aggregate(_ctxt(), nova_spec)
    _ours("map_az_to_placement_aggregate")(_ctxt(), spec)
    assert spec.requested_destination.aggregates == nova_spec.requested_destination.aggregates
    assert spec.requested_destination.aggregates == [",".join(a.uuid for a in made)]


@pytest.mark.parametrize("metadata, project, traits, tenant, isolated", [
    # nova's query loads only the metadata holding the project: another key's tenant is not it
    ({"filter_tenant_id": "A", "owner": "B"}, "B", [], False, False),
    ({"filter_tenant_id_7": "B"}, "B", [], True, False),
    ({"xfilter_tenant_id": "B"}, "B", [], False, False),
    # LIKE 'trait:%' ignores ASCII case, NOT IN does not
    ({"TRAIT:CUSTOM_GOLD": "required"}, "B", ["CUSTOM_GOLD"], False, True),
    ({"trait:CUSTOM_GOLD": "required"}, "B", ["CUSTOM_GOLD"], False, False),
    ({"trait:CUSTOM_GOLD": "Required"}, "B", [], False, False),
])
def test_the_edges_of_nova_queries(db, nova_conf, installed, metadata, project, traits, tenant,
                                   isolated):
    _clear()
    agg = objects.Aggregate(_ctxt(), name="edge", uuid=fx.uuid_for("rf-edge", 1), metadata=metadata)
    agg.create()
    _manager()
    nova_conf.set(**{"scheduler.limit_tenants_to_placement_aggregate": True,
                     "scheduler.enable_isolated_aggregate_filtering": True})
    spec = fx.request_spec(extra_specs={f"trait:{t}": "required" for t in traits})
    spec.project_id = project
    for name in ("require_tenant_aggregate", "isolate_aggregates"):
        theirs = _outcome(getattr(request_filter, name), spec.obj_clone())
        assert _outcome(_ours(name), spec.obj_clone()) == theirs
    assert _outcome(request_filter.require_tenant_aggregate, spec.obj_clone())[1] == (
        [frozenset([agg.uuid])] if tenant else None)
    assert _outcome(request_filter.isolate_aggregates, spec.obj_clone())[2] == (
        {agg.uuid} if isolated else None)


def test_without_an_api_source_nova_reads_its_database_counted(db, sql, nova_conf, installed):
    rng = random.Random(7)
    _world(rng, 5)
    _manager(with_api_source=False)
    nova_conf.set(**{"scheduler.limit_tenants_to_placement_aggregate": True,
                     "scheduler.placement_aggregate_required_for_tenants": True})
    before = request_filters.figures()
    spec = fx.request_spec()
    spec.project_id = "nobody"
    spec.availability_zone = "az1"
    statements = sql.n
    with pytest.raises(exception.RequestFilterFailed):
        _ours("require_tenant_aggregate")(_ctxt(), spec)
    assert _ours("map_az_to_placement_aggregate")(_ctxt(), spec) is True
    assert sql.n > statements
    after = request_filters.figures()
    assert after["db_fallbacks"] - before["db_fallbacks"] == 2
    assert after["db_fallbacks.require_tenant_aggregate"] \
        - before.get("db_fallbacks.require_tenant_aggregate", 0) == 1
    # a filter that does not apply asks for nothing
    spec.availability_zone = None
    assert _ours("map_az_to_placement_aggregate")(_ctxt(), spec) is False
    assert request_filters.figures()["db_fallbacks"] == after["db_fallbacks"]



def _runs() -> dict[tuple[str, str], float]:
    [family] = request_filters.RequestFilterCollector().collect()
    return {(s.labels["filter"], s.labels["source"]): s.value for s in family.samples}


def test_the_runs_by_source_are_on_metrics(db, sql, nova_conf, installed):
    """``shm_request_filter_runs_total{filter,source}``: a run answered from the stream's
    catalogue and one by nova's database read are told apart, per filter."""
    rng = random.Random(3)
    _world(rng, 5)
    spec = fx.request_spec()
    spec.availability_zone = "az1"
    before = _runs()
    assert set(before) == {(name, source) for name in (
        "map_az_to_placement_aggregate", "require_tenant_aggregate", "isolate_aggregates")
        for source in ("catalogue", "database")}
    _manager(with_api_source=False)
    _ours("map_az_to_placement_aggregate")(_ctxt(), spec)
    _manager(with_api_source=True)
    _ours("map_az_to_placement_aggregate")(_ctxt(), spec)
    after = _runs()
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {
        ("map_az_to_placement_aggregate", "database"): 1.0,
        ("map_az_to_placement_aggregate", "catalogue"): 1.0}


def test_the_catalogue_is_the_host_aggregates_one(db, installed):
    """Deleted aggregates leave it, nova's fanout adds what the API side has not published."""
    _clear()
    ctxt = _ctxt()
    kept = objects.Aggregate(ctxt, name="kept", uuid=fx.uuid_for("rf-cat", 1),
                             metadata={"availability_zone": "az1"})
    kept.create()
    gone = objects.Aggregate(ctxt, name="gone", uuid=fx.uuid_for("rf-cat", 2),
                             metadata={"availability_zone": "az1"})
    gone.create()
    source = ApiStateSource("api-test")
    source.preload([], [kept, gone])
    source.aggregate_changed(gone, deleted=True)
    manager = host_manager.SharedHostManager(
        fx.cache_from_documents({"api-test": source.document("api-test")}),
        default_cell_uuid=fx.CELL1)
    assert [a.uuid for a in manager.aggregate_catalogue()] == [kept.uuid]
    fanned = objects.Aggregate(uuid=fx.uuid_for("rf-cat", 3), name="new", id=99, hosts=[],
                               metadata={"availability_zone": "az1"})
    manager.update_aggregates([fanned])
    spec = fx.request_spec()
    spec.availability_zone = "az1"
    _ours("map_az_to_placement_aggregate")(_ctxt(), spec)
    assert spec.requested_destination.aggregates == [f"{kept.uuid},{fanned.uuid}"]
    manager.delete_aggregate(fanned)
    assert [a.uuid for a in manager.aggregate_catalogue()] == [kept.uuid]


def test_install_and_uninstall_put_the_chain_back():
    fx.setup_nova()
    nova_chain = list(request_filter.ALL_REQUEST_FILTERS)
    host_manager.install()
    try:
        host_manager.install()  # idempotent
        chain = request_filter.ALL_REQUEST_FILTERS
        assert len(chain) == len(nova_chain)
        assert [f.__name__ for f in chain] == [f.__name__ for f in nova_chain]
        assert sum(a is not b for a, b in zip(chain, nova_chain, strict=True)) == 3
        assert request_filters.installed()
    finally:
        host_manager.uninstall()
    assert request_filter.ALL_REQUEST_FILTERS == nova_chain
    assert not request_filters.installed()
    host_manager.install(request_filters_from_stream=False)
    try:
        assert request_filter.ALL_REQUEST_FILTERS == nova_chain
    finally:
        host_manager.uninstall()
