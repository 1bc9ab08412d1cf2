"""nova's aggregate request filters, answered from the aggregate catalogue on the stream.

Role
----
nova 34 runs ``request_filter.process_reqspec`` in ``select_destinations``
before it asks placement; three of its filters read the API database on every
request they apply to (``objects.AggregateList.get_by_metadata`` and
``get_non_matching_by_metadata_keys``):

* ``require_tenant_aggregate`` (``[scheduler] limit_tenants_to_placement_aggregate``):
  the aggregates with a ``filter_tenant_id*`` key whose value is the project;
* ``map_az_to_placement_aggregate`` (whenever the request names a zone; nova 34
  has no option for it any more): the aggregates whose ``availability_zone`` is it;
* ``isolate_aggregates`` (``[scheduler] enable_isolated_aggregate_filtering``):
  the aggregates with a ``trait:*=required`` key for a trait the request does not
  require.

The versions here ask the same questions of the aggregate catalogue the API-side
sources publish (:mod:`.api_source`, merged by the SharedHostManager with nova's
own ``update_aggregates`` fanout: :meth:`SharedHostManager.aggregate_catalogue`)
and make the same RequestSpec changes, under the same conditions, with the same
log lines (nova's logger, nova's ``trace_request_filter``), the same exception
(``RequestFilterFailed`` for a tenant without aggregates when
``placement_aggregate_required_for_tenants``) and the same names.  What each
question means is spelled out once, in :func:`zone_aggregates`,
:func:`tenant_aggregates` and :func:`isolated_aggregates`: the SQL of nova's
queries as the database evaluates it (on SQLite, which the differential tests
run: ``=`` compares exactly, ``LIKE 'trait:%'`` ignores ASCII case; a MySQL
database with a case-insensitive collation also matches values that differ in
case or trailing spaces).  The aggregates of a zone are listed in the order of
their database ids (nova's query has no ORDER BY; placement reads the list as a
set).

Falling back: while no API-side source was heard (the catalogue would hold only
the aggregates nova's fanout told of since start) the filter is nova's own,
reading the database, counted in :func:`figures` (``db_fallbacks``), with one
warning per process; :class:`RequestFilterCollector` shows the counts on the
scheduler's ``/metrics`` as ``shm_request_filter_runs_total{filter,source}``.

Life cycle: :func:`install` (called by :func:`.host_manager.install`) replaces
nova's three functions in ``request_filter.ALL_REQUEST_FILTERS``, the list
``process_reqspec`` iterates, where they are nova's own (an entry someone else
replaced stays theirs); :func:`uninstall` puts nova's back.  The catalogue comes
from a provider (the host manager's :func:`~.host_manager.current`), asked once
per filter run, in the request's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

LOG = logging.getLogger(__name__)

#: nova's metadata key of an availability zone
AZ_KEY = "availability_zone"
#: nova's prefix of the isolation keys (``trait:<TRAIT>=required``) and their value
TRAIT_PREFIX = "trait:"
REQUIRED = "required"

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: the catalogue's aggregates (nova Aggregate objects); None while no API-side source was heard
CatalogueProvider = Callable[[], list[Any] | None]

_provider: CatalogueProvider | None = None
_originals: dict[str, Any] = {}
_lock = threading.Lock()
_counters: Counter[str] = Counter()
_warned = False
#: nova's request filters answered from the catalogue, by their names in nova
_NAMES = ("map_az_to_placement_aggregate", "require_tenant_aggregate", "isolate_aggregates")


# -- the questions, on a catalogue of nova Aggregate objects -------------------------------

def _ordered(aggregates: Iterable[Any]) -> list[Any]:
    """By database id (those without one last, by uuid)."""
    def key(agg: Any) -> tuple[bool, int, str]:
        has_id = agg.obj_attr_is_set("id") and agg.id is not None
        return (not has_id, agg.id if has_id else 0, agg.uuid)
    return sorted(aggregates, key=key)


def zone_aggregates(aggregates: Iterable[Any], zone: str) -> list[str]:
    """``AggregateList.get_by_metadata(key='availability_zone', value=zone)``, as uuids."""
    return [agg.uuid for agg in _ordered(aggregates)
            if (agg.metadata or {}).get(AZ_KEY) == zone]


def tenant_aggregates(aggregates: Iterable[Any], project_id: str, key_prefix: str) -> set[str]:
    """The aggregates ``require_tenant_aggregate`` keeps of ``get_by_metadata(value=project)``:
    nova's query loads only the metadata whose value is the project (``contains_eager`` on
    the filtered join), of which a key must start with ``key_prefix``."""
    return {agg.uuid for agg in aggregates
            if any(value == project_id and key.startswith(key_prefix)
                   for key, value in (agg.metadata or {}).items())}


def _like_prefix(key: str, prefix: str) -> bool:
    """``key LIKE '<prefix>%'`` (SQLite: ASCII letters in any case; ``prefix`` has no
    wildcard)."""
    return key[:len(prefix)].translate(_ASCII_LOWER) == prefix.translate(_ASCII_LOWER)


def isolated_aggregates(aggregates: Iterable[Any], ignored_keys: Iterable[str]) -> set[str]:
    """``get_non_matching_by_metadata_keys(ignored_keys, 'trait:', value='required')``, as
    uuids: an aggregate with any ``trait:*`` key set to ``required`` that is not ignored."""
    ignored = set(ignored_keys)
    return {agg.uuid for agg in aggregates
            if any(value == REQUIRED and _like_prefix(key, TRAIT_PREFIX) and key not in ignored
                   for key, value in (agg.metadata or {}).items())}


# -- the filters ----------------------------------------------------------------------------

def _catalogue(name: str) -> list[Any] | None:
    """The catalogue to answer ``name`` from, or None (then nova's own reads the database:
    counted, and said once)."""
    global _warned
    provider = _provider
    catalogue = provider() if provider is not None else None
    with _lock:
        if catalogue is None:
            _counters["db_fallbacks"] += 1
            _counters[f"db_fallbacks.{name}"] += 1
            warn, _warned = not _warned, True
        else:
            _counters["from_catalogue"] += 1
            _counters[f"from_catalogue.{name}"] += 1
            warn = False
    if warn:
        LOG.warning("request filter %s: no API-side source heard yet, so nova's own filter reads "
                    "the API database (counted as db_fallbacks); said once", name)
    return catalogue


def _destination(request_spec: Any) -> Any:
    """``request_spec.requested_destination``, created as nova's filters create it."""
    from nova import objects

    if ('requested_destination' not in request_spec
            or request_spec.requested_destination is None):
        request_spec.requested_destination = objects.Destination()
    return request_spec.requested_destination


def _build_filters() -> dict[str, Any]:
    """The three filters, decorated with nova's ``trace_request_filter`` (its debug line
    names the function: they keep nova's names)."""
    from nova import exception
    from nova.i18n import _
    from nova.scheduler import request_filter as rf
    from nova.scheduler import utils

    conf = rf.CONF
    nova_log = rf.LOG

    @rf.trace_request_filter
    def require_tenant_aggregate(ctxt: Any, request_spec: Any) -> bool:
        enabled = conf.scheduler.limit_tenants_to_placement_aggregate
        agg_required = conf.scheduler.placement_aggregate_required_for_tenants
        if not enabled:
            return False
        project_id = request_spec.project_id
        catalogue = _catalogue("require_tenant_aggregate") if project_id is not None else None
        if catalogue is None:
            # nova's own (a project of None fails its query's assertion, as in nova)
            return bool(_originals["require_tenant_aggregate"].__wrapped__(ctxt, request_spec))
        aggregate_uuids_for_tenant = tenant_aggregates(catalogue, project_id, rf.TENANT_METADATA_KEY)
        if aggregate_uuids_for_tenant:
            destination = _destination(request_spec)
            destination.require_aggregates(aggregate_uuids_for_tenant)
            nova_log.debug('require_tenant_aggregate request filter added '
                           'aggregates %s for tenant %r',
                           ','.join(aggregate_uuids_for_tenant), project_id)
        elif agg_required:
            nova_log.warning('Tenant %(tenant)s has no available aggregates',
                             {'tenant': project_id})
            raise exception.RequestFilterFailed(reason=_('No hosts available for tenant'))
        return True

    @rf.trace_request_filter
    def map_az_to_placement_aggregate(ctxt: Any, request_spec: Any) -> bool:
        az_hint = request_spec.availability_zone
        if not az_hint:
            return False
        catalogue = _catalogue("map_az_to_placement_aggregate")
        if catalogue is None:
            return bool(_originals["map_az_to_placement_aggregate"].__wrapped__(ctxt, request_spec))
        agg_uuids = zone_aggregates(catalogue, az_hint)
        if agg_uuids:
            _destination(request_spec).require_aggregates(agg_uuids)
            nova_log.debug('map_az_to_placement_aggregate request filter added '
                           'aggregates %s for az %r', ','.join(agg_uuids), az_hint)
        return True

    @rf.trace_request_filter
    def isolate_aggregates(ctxt: Any, request_spec: Any) -> bool:
        if not conf.scheduler.enable_isolated_aggregate_filtering:
            return False
        catalogue = _catalogue("isolate_aggregates")
        if catalogue is None:
            return bool(_originals["isolate_aggregates"].__wrapped__(ctxt, request_spec))
        res_req = utils.ResourceRequest.from_request_spec(request_spec)
        keys = [TRAIT_PREFIX + trait for trait in res_req.all_required_traits]
        isolated = isolated_aggregates(catalogue, keys)
        if isolated:
            _destination(request_spec).append_forbidden_aggregates(isolated)
        return True

    return {f.__name__: f for f in (require_tenant_aggregate, map_az_to_placement_aggregate,
                                    isolate_aggregates)}


# -- installing into nova's chain -------------------------------------------------------------

_ours: dict[str, Any] = {}


def install(provider: CatalogueProvider) -> None:
    """Put the three filters in nova's ``ALL_REQUEST_FILTERS`` where nova's own are; their
    catalogue comes from ``provider``.  Idempotent; :func:`uninstall` undoes it."""
    global _provider
    from nova.scheduler import request_filter as rf

    _provider = provider
    if not _ours:
        _ours.update(_build_filters())
    chain = rf.ALL_REQUEST_FILTERS
    for name, ours in _ours.items():
        original = _originals.setdefault(name, getattr(rf, name))
        for i, entry in enumerate(chain):
            if entry is original:
                chain[i] = ours


def uninstall() -> None:
    """nova's own filters back in ``ALL_REQUEST_FILTERS`` (where ours are)."""
    global _provider
    from nova.scheduler import request_filter as rf

    chain = rf.ALL_REQUEST_FILTERS
    for name, ours in _ours.items():
        original = _originals.get(name)
        if original is None:
            continue
        for i, entry in enumerate(chain):
            if entry is ours:
                chain[i] = original
    _provider = None


def installed() -> bool:
    """Whether any of the three in nova's chain is ours."""
    from nova.scheduler import request_filter as rf

    return any(entry is ours for entry in rf.ALL_REQUEST_FILTERS for ours in _ours.values())


def figures() -> dict[str, int]:
    """How many filter runs answered from the catalogue and how many read nova's database
    (``from_catalogue``, ``db_fallbacks``, and per filter ``<count>.<filter>``), since start."""
    with _lock:
        return {"from_catalogue": 0, "db_fallbacks": 0, **_counters}


class RequestFilterCollector:
    """``shm_request_filter_runs_total{filter,source}``: each of the three filters' runs since
    start, answered from the stream's aggregate catalogue (``catalogue``) or by nova's own
    filter reading the API database (``database``, while no API-side source was heard); read
    on scrape, registered on the scheduler's ``[metrics]`` endpoint by :mod:`.cmd`."""

    def describe(self) -> list[Any]:
        return []  # collected on scrape only (the registry's auto_describe is off)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        counts = figures()
        runs = CounterMetricFamily(
            "shm_request_filter_runs", "Runs of nova's aggregate request filters by who "
            "answered: catalogue (the stream's aggregates, no database read) or database (nova's "
            "own filter, while no API-side source was heard).", labels=["filter", "source"])
        for name in _NAMES:
            runs.add_metric([name, "catalogue"], counts.get(f"from_catalogue.{name}", 0))
            runs.add_metric([name, "database"], counts.get(f"db_fallbacks.{name}", 0))
        yield runs


__all__ = ["RequestFilterCollector", "figures", "install", "installed", "isolated_aggregates",
           "tenant_aggregates", "uninstall", "zone_aggregates"]
