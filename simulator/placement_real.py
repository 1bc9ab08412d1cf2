"""openstack-placement itself, in this process, for the differential test and the benchmark.

Role: run placement's own WSGI application (``placement.deploy.loadapp``) on a
database of its own (a SQLite file, or a MariaDB/MySQL database created for
the run and dropped at the end) and call it directly with WSGI requests (no
socket), so the memory path's answers can be compared with, and timed
against, placement's on the same providers.  It also reads placement's
tables back into the dict form of :mod:`shared_host_manager.placement.state`
(what a publisher of placement's state would send) and, for the benchmark,
loads many providers with bulk inserts (the REST API would take minutes).

Life cycle::

    RealPlacement(db_url)  schema created, standard traits and resource classes synced,
                           placement's engine facade pointed at this database
    request(...) ...       REST calls
    reset()                every provider, allocation and aggregate deleted (traits and
                           resource classes stay)
    close()                engine facade restored, database dropped (server) / file removed

One at a time per process: placement's engine facade is process-global.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid as uuid_mod
from collections.abc import Iterable, Mapping
from typing import Any

# tables holding providers and what hangs off them, children first
_PROVIDER_TABLES = ("allocations", "consumers", "projects", "users", "inventories",
                    "resource_provider_traits", "resource_provider_aggregates",
                    "placement_aggregates", "resource_providers")


def server_url(name: str) -> str:
    return f"mysql+pymysql://root@127.0.0.1:3306/{name}"


def server_available(url: str = "mysql+pymysql://root@127.0.0.1:3306/mysql") -> bool:
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 2})
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return False


class RealPlacement:
    """placement's WSGI app on its own database; see the module docstring."""

    def __init__(self, db_url: str | None = None) -> None:
        import sqlalchemy as sa
        from oslo_config import cfg
        from oslo_db.sqlalchemy import engines
        from placement import conf as placement_conf
        from placement import db_api, deploy
        from placement.db.sqlalchemy import migration
        from placement.objects import resource_class, trait
        from sqlalchemy.engine import make_url

        self._tmpdir: str | None = None
        self._drop: str | None = None
        self._overrides: set[tuple[str, str]] = set()
        if db_url is None:
            self._tmpdir = tempfile.mkdtemp(prefix="shm-placement-")
            db_url = "sqlite:///" + os.path.join(self._tmpdir, "placement.sqlite")
        else:
            url = make_url(db_url)
            admin = sa.create_engine(url.set(database="mysql"), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{url.database}`"))
                conn.execute(sa.text(f"CREATE DATABASE `{url.database}` CHARACTER SET utf8"))
            admin.dispose()
            self._drop = db_url
        self.db_url = db_url
        self.backend = make_url(db_url).get_backend_name()

        conf = cfg.ConfigOpts()
        placement_conf.register_opts(conf)
        conf.set_override("connection", db_url, group="placement_database")
        conf.set_override("sync_on_startup", False, group="placement_database")
        conf.set_override("auth_strategy", "noauth2", group="api")
        conf([], project="placement", default_config_files=[], default_config_dirs=[])
        self.conf = conf
        # the facade is configured once per process; patch_engine points it at this database
        # whatever configured it first
        db_api.configure(conf)
        self.engine = engines.create_engine(db_url)
        if self.backend == "sqlite":
            # a scratch database: no fsync per commit (the REST calls commit one by one)
            @sa.event.listens_for(self.engine, "connect")
            def _fast(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA synchronous = OFF")
                cur.execute("PRAGMA journal_mode = MEMORY")
                cur.close()
        migration.create_schema(self.engine)
        self._unpatch = db_api.placement_context_manager.patch_engine(self.engine)
        trait._TRAITS_SYNCED = False
        resource_class._RESOURCE_CLASSES_SYNCED = False
        self.app = deploy.loadapp(conf)

    # -- REST ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None,
                version: str = "1.39") -> tuple[int, Any]:
        """(status, decoded JSON body or None)."""
        import webob

        headers = {"OpenStack-API-Version": f"placement {version}", "x-auth-token": "admin",
                   "Accept": "application/json"}
        req = webob.Request.blank(path, method=method, headers=headers)
        if body is not None:
            req.body = json.dumps(body).encode()
            req.content_type = "application/json"
        resp = req.get_response(self.app)
        data = json.loads(resp.body) if resp.body else None
        return resp.status_int, data

    def ok(self, method: str, path: str, body: Any = None, version: str = "1.39") -> Any:
        status, data = self.request(method, path, body, version)
        if status >= 400:
            raise RuntimeError(f"placement {method} {path}: {status} {data}")
        return data

    def set_options(self, **options: Any) -> None:
        """``group__option=value``: e.g. ``placement__randomize_allocation_candidates=True``.

        Cleared by :meth:`close`: placement registers its option groups as module-level
        objects, which hold the overrides, so every later placement of the process would
        see them.
        """
        for key, value in options.items():
            group, name = key.split("__", 1)
            self.conf.set_override(name, value, group=group)
            self._overrides.add((group, name))

    # -- state -----------------------------------------------------------------------------

    def reset(self) -> None:
        import sqlalchemy as sa

        with self.engine.begin() as conn:
            if self.backend == "mysql":
                # a root provider references itself: MySQL checks the key row by row
                conn.execute(sa.text("SET FOREIGN_KEY_CHECKS = 0"))
            for table in _PROVIDER_TABLES:
                conn.execute(sa.text(f"DELETE FROM {table}"))
            if self.backend == "mysql":
                conn.execute(sa.text("SET FOREIGN_KEY_CHECKS = 1"))

    def export_state(self) -> dict[str, Any]:
        """Placement's providers in the state's dict form, read from its tables.

        The allocation ratio is read widened to double (MySQL: the stored FLOAT,
        not its six-digit text form), as the state's ``single`` storage wants it.
        """
        import sqlalchemy as sa

        single = self.backend == "mysql"
        ratio = "CAST(i.allocation_ratio AS DOUBLE)" if single else "i.allocation_ratio"
        with self.engine.connect() as conn:
            rcs = {r.id: r.name for r in conn.execute(sa.text("SELECT id, name FROM resource_classes"))}
            rows = conn.execute(sa.text(
                "SELECT p.id, p.uuid, p.name, p.generation, pp.uuid AS parent, rp.uuid AS root "
                "FROM resource_providers p LEFT JOIN resource_providers pp "
                "ON p.parent_provider_id = pp.id JOIN resource_providers rp "
                "ON p.root_provider_id = rp.id ORDER BY p.id")).fetchall()
            provs: dict[int, dict[str, Any]] = {
                r.id: {"uuid": r.uuid, "name": r.name, "generation": r.generation,
                       "parent_provider_uuid": r.parent, "root_provider_uuid": r.root,
                       "inventories": {}, "usages": {}, "traits": [], "aggregates": []}
                for r in rows}
            for r in conn.execute(sa.text(
                    f"SELECT i.resource_provider_id AS rp, i.resource_class_id AS rc, i.total, "
                    f"i.reserved, i.min_unit, i.max_unit, i.step_size, {ratio} AS ratio "
                    f"FROM inventories i")):
                provs[r.rp]["inventories"][rcs[r.rc]] = {
                    "total": r.total, "reserved": r.reserved, "min_unit": r.min_unit,
                    "max_unit": r.max_unit, "step_size": r.step_size, "allocation_ratio": float(r.ratio)}
            for r in conn.execute(sa.text(
                    "SELECT resource_provider_id AS rp, resource_class_id AS rc, SUM(used) AS used "
                    "FROM allocations GROUP BY resource_provider_id, resource_class_id")):
                provs[r.rp]["usages"][rcs[r.rc]] = int(r.used)
            for r in conn.execute(sa.text(
                    "SELECT rpt.resource_provider_id AS rp, t.name FROM resource_provider_traits rpt "
                    "JOIN traits t ON t.id = rpt.trait_id")):
                provs[r.rp]["traits"].append(r.name)
            for r in conn.execute(sa.text(
                    "SELECT rpa.resource_provider_id AS rp, a.uuid FROM resource_provider_aggregates rpa "
                    "JOIN placement_aggregates a ON a.id = rpa.aggregate_id")):
                provs[r.rp]["aggregates"].append(r.uuid)
            traits = [r.name for r in conn.execute(sa.text("SELECT name FROM traits"))]
        return {"providers": list(provs.values()), "traits": traits,
                "resource_classes": sorted(set(rcs.values())),
                "allocation_ratio_storage": "single" if single else "double"}

    def bulk_load(self, providers: Iterable[Mapping[str, Any]]) -> None:
        """Insert providers in the state's dict form straight into placement's tables.

        Usages become one allocation per provider and class, of one consumer per
        provider.  A tree member (``parent_provider_uuid``, ``root_provider_uuid``)
        comes after its parent and its root.  Traits and resource classes must
        exist already (custom ones: create them through the API first).  For benchmarks: the REST API checks
        nothing more that matters to the candidate queries, but takes minutes
        for thousands of providers.
        """
        import sqlalchemy as sa

        provs = list(providers)
        with self.engine.begin() as conn:
            rc_ids = {r.name: r.id for r in conn.execute(sa.text("SELECT id, name FROM resource_classes"))}
            trait_ids = {r.name: r.id for r in conn.execute(sa.text("SELECT id, name FROM traits"))}
            conn.execute(sa.text("INSERT INTO projects (external_id) VALUES ('bench')"))
            conn.execute(sa.text("INSERT INTO users (external_id) VALUES ('bench')"))
            project = conn.execute(sa.text("SELECT id FROM projects WHERE external_id='bench'")).scalar()
            user = conn.execute(sa.text("SELECT id FROM users WHERE external_id='bench'")).scalar()
            base = conn.execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM resource_providers")).scalar()
            agg_ids: dict[str, int] = {}
            for a in sorted({a for p in provs for a in p.get("aggregates", ())}):
                conn.execute(sa.text("INSERT INTO placement_aggregates (uuid) VALUES (:u)"), {"u": a})
                agg_ids[a] = conn.execute(sa.text("SELECT id FROM placement_aggregates WHERE uuid=:u"),
                                          {"u": a}).scalar()
            rp_rows, inv_rows, trait_rows, agg_rows, cons_rows, alloc_rows = [], [], [], [], [], []
            ids: dict[str, int] = {}
            for i, p in enumerate(provs, start=base + 1):
                ids[p["uuid"]] = i
                parent = p.get("parent_provider_uuid")
                rp_rows.append({"id": i, "uuid": p["uuid"], "name": p.get("name", p["uuid"]),
                                "generation": p.get("generation", 1),
                                "root": ids[p.get("root_provider_uuid") or p["uuid"]],
                                "parent": ids[parent] if parent else None})
                for rc, inv in p.get("inventories", {}).items():
                    f = {"reserved": 0, "min_unit": 1, "max_unit": 2147483647, "step_size": 1,
                         "allocation_ratio": 1.0, **inv}
                    inv_rows.append({"rp": i, "rc": rc_ids[rc], **{k: f[k] for k in (
                        "total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")}})
                trait_rows += [{"rp": i, "t": trait_ids[t]} for t in p.get("traits", ())]
                agg_rows += [{"rp": i, "a": agg_ids[a]} for a in p.get("aggregates", ())]
                usages = {rc: u for rc, u in p.get("usages", {}).items() if u}
                if usages:
                    consumer = str(uuid_mod.uuid4())
                    cons_rows.append({"u": consumer, "p": project, "us": user})
                    alloc_rows += [{"rp": i, "c": consumer, "rc": rc_ids[rc], "used": u}
                                   for rc, u in usages.items()]
            conn.execute(sa.text(
                "INSERT INTO resource_providers (id, uuid, name, generation, root_provider_id, "
                "parent_provider_id) VALUES (:id, :uuid, :name, :generation, :root, :parent)"), rp_rows)
            if inv_rows:
                conn.execute(sa.text(
                    "INSERT INTO inventories (resource_provider_id, resource_class_id, total, reserved, "
                    "min_unit, max_unit, step_size, allocation_ratio) VALUES (:rp, :rc, :total, "
                    ":reserved, :min_unit, :max_unit, :step_size, :allocation_ratio)"), inv_rows)
            if trait_rows:
                conn.execute(sa.text("INSERT INTO resource_provider_traits (resource_provider_id, "
                                     "trait_id) VALUES (:rp, :t)"), trait_rows)
            if agg_rows:
                conn.execute(sa.text("INSERT INTO resource_provider_aggregates (resource_provider_id, "
                                     "aggregate_id) VALUES (:rp, :a)"), agg_rows)
            if cons_rows:
                conn.execute(sa.text(
                    "INSERT INTO consumers (uuid, project_id, user_id, generation) "
                    "VALUES (:u, :p, :us, 1)"), cons_rows)
                conn.execute(sa.text(
                    "INSERT INTO allocations (resource_provider_id, consumer_id, resource_class_id, used) "
                    "VALUES (:rp, :c, :rc, :used)"), alloc_rows)

    def close(self) -> None:
        import sqlalchemy as sa
        from placement.objects import resource_class, trait
        from sqlalchemy.engine import make_url

        self._unpatch()
        for group, name in self._overrides:
            self.conf.clear_override(name, group=group)
        self._overrides.clear()
        trait._TRAITS_SYNCED = False
        resource_class._RESOURCE_CLASSES_SYNCED = False
        self.engine.dispose()
        if self._drop is not None:
            url = make_url(self._drop)
            admin = sa.create_engine(url.set(database="mysql"), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{url.database}`"))
            admin.dispose()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


__all__ = ["RealPlacement", "server_available", "server_url"]
