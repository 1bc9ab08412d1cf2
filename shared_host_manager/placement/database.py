"""placement's database, read: the providers in the dict form of :mod:`.state`, and their generations.

Role: the SQL side of the placement feed (:mod:`.feed_service`).  It reads
placement's own tables with explicit SQLAlchemy core queries -- never
placement's code, never its REST API -- so one process can follow every
provider however many WSGI workers placement runs over that database:

* :meth:`PlacementDatabase.fingerprint` -- ``(COUNT(*), SUM(generation),
  MAX(id))`` of ``resource_providers``, one row: placement increments a
  provider's generation on every inventory, trait, aggregate and allocation
  change, creation raises ``MAX(id)`` and deletion lowers the count, so any
  change between two calls changes it (the feed lists only then);
  placement does not increment a provider's generation when an allocation on it is
  deleted (``DELETE /allocations/{consumer}``, or a consumer's allocations moved
  elsewhere), so the allocation rows' count and sum are part of it;
* :meth:`listing` -- ``uuid -> (generation, created_at, provider id, allocation
  rows, sum of their amounts)`` of every provider;
* :meth:`read` -- the providers named, each in the dict form of
  :mod:`.state` plus ``created_at`` (an ISO string, or None) and placement's
  row ``id`` (together they tell a provider deleted and created again under
  the same uuid from the one it replaced), all of them read in one
  transaction, so each provider's rows are of one moment;
* :meth:`names` -- every trait and resource class placement defines.

Standard resource classes: placement keeps them in ``resource_classes`` too,
under the id of their index in ``os_resource_classes.STANDARDS``
(``_resource_classes_sync`` at its start); custom ones from id 10000.  Reading
the table therefore names both.  Traits likewise (``traits``, synced from
os-traits).

Allocation ratios: on MySQL and MariaDB the column is a FLOAT; it is read as
``CAST(... AS DOUBLE)`` (the value placement's SQL filter computes with) and
the feed says ``allocation_ratio_storage = "single"`` (see :mod:`.state`).

Life cycle: ``PlacementDatabase(url)`` makes an engine (no connection yet);
every call takes a pooled connection for one transaction; ``close()``
disposes of the engine.  Thread-safe as SQLAlchemy's engine is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

_META = sa.MetaData()
RP = sa.Table("resource_providers", _META,
              sa.Column("id", sa.Integer), sa.Column("uuid", sa.String(36)),
              sa.Column("name", sa.String(200)), sa.Column("generation", sa.Integer),
              sa.Column("root_provider_id", sa.Integer), sa.Column("parent_provider_id", sa.Integer),
              sa.Column("created_at", sa.DateTime))
INVENTORIES = sa.Table("inventories", _META,
                       sa.Column("resource_provider_id", sa.Integer),
                       sa.Column("resource_class_id", sa.Integer), sa.Column("total", sa.Integer),
                       sa.Column("reserved", sa.Integer), sa.Column("min_unit", sa.Integer),
                       sa.Column("max_unit", sa.Integer), sa.Column("step_size", sa.Integer),
                       sa.Column("allocation_ratio", sa.Float))
ALLOCATIONS = sa.Table("allocations", _META,
                       sa.Column("resource_provider_id", sa.Integer),
                       sa.Column("resource_class_id", sa.Integer), sa.Column("used", sa.Integer))
RESOURCE_CLASSES = sa.Table("resource_classes", _META,
                            sa.Column("id", sa.Integer), sa.Column("name", sa.String(255)))
TRAITS = sa.Table("traits", _META, sa.Column("id", sa.Integer), sa.Column("name", sa.String(255)))
RP_TRAITS = sa.Table("resource_provider_traits", _META,
                     sa.Column("resource_provider_id", sa.Integer), sa.Column("trait_id", sa.Integer))
AGGREGATES = sa.Table("placement_aggregates", _META,
                      sa.Column("id", sa.Integer), sa.Column("uuid", sa.String(36)))
RP_AGGREGATES = sa.Table("resource_provider_aggregates", _META,
                         sa.Column("resource_provider_id", sa.Integer),
                         sa.Column("aggregate_id", sa.Integer))

#: providers read per statement (the IN list's length)
CHUNK = 500

Fingerprint = tuple[int, int, int, int, int]
#: uuid -> (generation, created_at, provider id, allocation rows, sum of their amounts)
Listing = dict[str, tuple[Any, ...]]


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class PlacementDatabase:
    """Reads placement's tables (see the module docstring)."""

    def __init__(self, url: str, *, engine: sa.engine.Engine | None = None) -> None:
        self.url = url
        self.engine = engine if engine is not None else sa.create_engine(url, pool_pre_ping=True)
        self.backend = self.engine.dialect.name
        #: how placement's column holds an allocation ratio (see :mod:`.state`)
        self.allocation_ratio_storage = "single" if self.backend == "mysql" else "double"
        if self.allocation_ratio_storage == "single":
            self._ratio: Any = sa.literal_column("CAST(inventories.allocation_ratio AS DOUBLE)")
        else:
            self._ratio = INVENTORIES.c.allocation_ratio

    def close(self) -> None:
        self.engine.dispose()

    # -- change detection ------------------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        """(providers, sum of their generations, highest provider id, allocation rows, sum of
        their amounts): changes with any provider.  The allocations count apart: placement
        does not increment a provider's generation when an allocation on it is deleted."""
        q = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(RP.c.generation), 0),
                      sa.func.coalesce(sa.func.max(RP.c.id), 0))
        qa = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ALLOCATIONS.c.used), 0))
        with self.engine.connect() as conn, conn.begin():
            row = conn.execute(q).one()
            arow = conn.execute(qa).one()
        return int(row[0]), int(row[1]), int(row[2]), int(arow[0]), int(arow[1])

    def listing(self) -> Listing:
        """uuid -> (generation, created_at, provider id, allocation rows, sum of their amounts) of
        every provider.  The id tells a provider deleted and created again within ``created_at``'s
        resolution (a second on MySQL) from the one it replaced."""
        allocs = (sa.select(ALLOCATIONS.c.resource_provider_id.label("rp"), sa.func.count().label("n"),
                            sa.func.sum(ALLOCATIONS.c.used).label("used"))
                  .group_by(ALLOCATIONS.c.resource_provider_id).subquery())
        q = (sa.select(RP.c.uuid, RP.c.generation, RP.c.created_at, RP.c.id, allocs.c.n, allocs.c.used)
             .select_from(RP.outerjoin(allocs, allocs.c.rp == RP.c.id)))
        with self.engine.connect() as conn:
            return {r.uuid: (int(r.generation), _iso(r.created_at), int(r.id), int(r.n or 0),
                             int(r.used or 0))
                    for r in conn.execute(q)}

    # -- reading ---------------------------------------------------------------------

    def names(self) -> tuple[list[str], list[str]]:
        """(every trait, every resource class) placement defines, sorted."""
        with self.engine.connect() as conn:
            traits = sorted(r[0] for r in conn.execute(sa.select(TRAITS.c.name)))
            rcs = sorted(r[0] for r in conn.execute(sa.select(RESOURCE_CLASSES.c.name)))
        return traits, rcs

    def read_all(self) -> dict[str, dict[str, Any]]:
        """Every provider, uuid -> dict form (one transaction)."""
        return self._read(None)

    def read(self, uuids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The providers named that exist, uuid -> dict form (one transaction); a uuid
        placement no longer holds is absent from the result."""
        wanted = sorted(set(uuids))
        if not wanted:
            return {}
        return self._read(wanted)

    def _read(self, uuids: Sequence[str] | None) -> dict[str, dict[str, Any]]:
        parent = RP.alias("parent")
        root = RP.alias("root")
        base = (sa.select(RP.c.id, RP.c.uuid, RP.c.name, RP.c.generation, RP.c.created_at,
                          parent.c.uuid.label("parent_uuid"), root.c.uuid.label("root_uuid"))
                .select_from(RP.outerjoin(parent, RP.c.parent_provider_id == parent.c.id)
                             .outerjoin(root, RP.c.root_provider_id == root.c.id)))
        by_id: dict[int, dict[str, Any]] = {}
        with self.engine.connect() as conn, conn.begin():
            rcs = {r.id: r.name for r in conn.execute(
                sa.select(RESOURCE_CLASSES.c.id, RESOURCE_CLASSES.c.name))}
            rows: list[Any] = []
            if uuids is None:
                rows = list(conn.execute(base))
            else:
                for chunk in _chunks(uuids):
                    rows.extend(conn.execute(base.where(RP.c.uuid.in_(chunk))))
            for r in rows:
                by_id[r.id] = {
                    "uuid": r.uuid, "name": r.name, "generation": int(r.generation),
                    "parent_provider_uuid": r.parent_uuid,
                    "root_provider_uuid": r.root_uuid or r.uuid,
                    "created_at": _iso(r.created_at), "id": int(r.id),
                    "inventories": {}, "usages": {}, "traits": [], "aggregates": []}
            ids = sorted(by_id)
            for where in self._id_filters(ids, uuids is None):
                inv_q = sa.select(INVENTORIES.c.resource_provider_id, INVENTORIES.c.resource_class_id,
                                  INVENTORIES.c.total, INVENTORIES.c.reserved, INVENTORIES.c.min_unit,
                                  INVENTORIES.c.max_unit, INVENTORIES.c.step_size,
                                  self._ratio.label("ratio"))
                for r in conn.execute(where(inv_q, INVENTORIES.c.resource_provider_id)):
                    p = by_id.get(r.resource_provider_id)
                    if p is not None:
                        p["inventories"][rcs[r.resource_class_id]] = {
                            "total": int(r.total), "reserved": int(r.reserved),
                            "min_unit": int(r.min_unit), "max_unit": int(r.max_unit),
                            "step_size": int(r.step_size), "allocation_ratio": float(r.ratio)}
                use_q = (sa.select(ALLOCATIONS.c.resource_provider_id, ALLOCATIONS.c.resource_class_id,
                                   sa.func.sum(ALLOCATIONS.c.used).label("used"))
                         .group_by(ALLOCATIONS.c.resource_provider_id, ALLOCATIONS.c.resource_class_id))
                for r in conn.execute(where(use_q, ALLOCATIONS.c.resource_provider_id)):
                    p = by_id.get(r.resource_provider_id)
                    if p is not None:
                        p["usages"][rcs[r.resource_class_id]] = int(r.used)
                trait_q = (sa.select(RP_TRAITS.c.resource_provider_id, TRAITS.c.name)
                           .select_from(RP_TRAITS.join(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id)))
                for r in conn.execute(where(trait_q, RP_TRAITS.c.resource_provider_id)):
                    p = by_id.get(r.resource_provider_id)
                    if p is not None:
                        p["traits"].append(r.name)
                agg_q = (sa.select(RP_AGGREGATES.c.resource_provider_id, AGGREGATES.c.uuid)
                         .select_from(RP_AGGREGATES.join(
                             AGGREGATES, AGGREGATES.c.id == RP_AGGREGATES.c.aggregate_id)))
                for r in conn.execute(where(agg_q, RP_AGGREGATES.c.resource_provider_id)):
                    p = by_id.get(r.resource_provider_id)
                    if p is not None:
                        p["aggregates"].append(r.uuid)
        out = {}
        for p in by_id.values():
            p["traits"].sort()
            p["aggregates"].sort()
            out[p["uuid"]] = p
        return out

    @staticmethod
    def _id_filters(ids: list[int], everything: bool) -> Iterator[Any]:
        """Callables restricting a select to the providers read: none when every one is read,
        else one IN list per chunk of ids."""
        if everything:
            yield lambda q, _col: q
            return
        for chunk in _chunks(ids):
            yield lambda q, col, chunk=chunk: q.where(col.in_(chunk))


__all__ = ["CHUNK", "Fingerprint", "Listing", "PlacementDatabase"]
