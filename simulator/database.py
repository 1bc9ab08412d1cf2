"""The legacy baseline's database: compute nodes and instances in SQL, written on every change.

This is where the ``legacy`` and ``caching`` host managers get host state
from, as nova's scheduler did before this project: every simulated compute
node writes its row whenever its state changes (as nova's resource tracker
does), and instances have their own table.  A scheduler then reads all
compute-node rows (and, when a request needs them, the instance lists).

SQLite file by default; ``--db-url`` takes any SQLAlchemy URL, e.g.
``mysql+pymysql://root@127.0.0.1:3306/test`` (MariaDB) or
``postgresql+psycopg2://postgres@127.0.0.1:5432/test``, which is what nova
deployments use.  Counts every statement it runs.

Life cycle: ``HostDatabase(url)`` creates the tables, ``reset(documents)``
loads the cloud's first state, ``write``/``read_*`` during the run,
``close()`` drops the tables it created and disposes of the engine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    insert,
    select,
    update,
)

from protocol.document import DEL, DROP, SET, Document, Op

metadata = MetaData()

compute_nodes = Table(
    "shm_sim_compute_nodes", metadata,
    Column("uuid", String(36), primary_key=True),
    Column("host", String(255)),
    Column("hypervisor_hostname", String(255)),
    Column("vcpus", Integer), Column("memory_mb", Integer), Column("local_gb", Integer),
    Column("vcpus_used", Integer), Column("memory_mb_used", Integer), Column("local_gb_used", Integer),
    Column("cpu_allocation_ratio", Float), Column("ram_allocation_ratio", Float),
    Column("disk_allocation_ratio", Float),
    Column("running_vms", Integer),
    Column("epoch", BigInteger), Column("seq", BigInteger),
    # everything else of the document (service, aggregates, metrics, ...) as nova keeps
    # stats and numa/pci topologies: serialised text
    Column("extra", Text),
)

instances = Table(
    "shm_sim_instances", metadata,
    Column("uuid", String(36), primary_key=True),
    Column("compute_uuid", String(36), index=True),
    Column("vcpus", Integer), Column("memory_mb", Integer), Column("root_gb", Integer),
)

_COLUMNS = {"vcpus": "vcpus", "memory_mb": "memory_mb", "disk_gb": "local_gb",
            "vcpus_used": "vcpus_used", "memory_mb_used": "memory_mb_used",
            "disk_gb_used": "local_gb_used", "cpu_allocation_ratio": "cpu_allocation_ratio",
            "ram_allocation_ratio": "ram_allocation_ratio",
            "disk_allocation_ratio": "disk_allocation_ratio", "num_instances": "running_vms"}


def _row(source: str, epoch: int, seq: int, doc: Document) -> dict[str, Any]:
    compute = doc.get("compute", {})
    row: dict[str, Any] = {"uuid": source, "host": compute.get("host"),
                           "hypervisor_hostname": compute.get("nodename"),
                           "epoch": epoch, "seq": seq}
    for key, column in _COLUMNS.items():
        row[column] = compute.get(key)
    rest = {ns: entries for ns, entries in doc.items() if ns != "instances"}
    rest["compute"] = {k: v for k, v in compute.items() if k not in _COLUMNS}
    row["extra"] = json.dumps(rest, separators=(",", ":"))
    return row


def _doc(row: Any) -> Document:
    doc: Document = json.loads(row.extra)
    compute = doc.setdefault("compute", {})
    for key, column in _COLUMNS.items():
        value = getattr(row, column)
        if value is not None:
            compute[key] = value
    return doc


def _instance_row(source: str, instance: str, record: dict) -> dict[str, Any]:
    resources = record.get("resources") or {}
    return {"uuid": instance, "compute_uuid": source, "vcpus": resources.get("vcpus", 0),
            "memory_mb": resources.get("memory_mb", 0), "root_gb": resources.get("disk_gb", 0)}


class HostDatabase:
    def __init__(self, url: str) -> None:
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = create_engine(url, pool_pre_ping=True, **kwargs)
        self.url = url
        self.statements = 0
        self._count_lock = threading.Lock()
        event.listen(self.engine, "before_cursor_execute", self._count)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        metadata.drop_all(self.engine)
        metadata.create_all(self.engine)

    def _count(self, *args: Any) -> None:
        with self._count_lock:
            self.statements += 1

    def reset(self, docs: dict[str, tuple[int, int, Document]]) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(instances))
            conn.execute(delete(compute_nodes))
            rows = [_row(s, e, q, d) for s, (e, q, d) in docs.items()]
            for i in range(0, len(rows), 500):
                conn.execute(insert(compute_nodes), rows[i:i + 500])
            inst = [_instance_row(s, i, r) for s, (_, _, d) in docs.items()
                    for i, r in (d.get("instances") or {}).items()]
            for i in range(0, len(inst), 1000):
                conn.execute(insert(instances), inst[i:i + 1000])

    def write(self, source: str, epoch: int, seq: int, doc: Document, ops: Iterable[Op]) -> None:
        """One compute node's change: its row, and the instance rows the ops touched."""
        with self.engine.begin() as conn:
            row = _row(source, epoch, seq, doc)
            del row["uuid"]
            conn.execute(update(compute_nodes).where(compute_nodes.c.uuid == source).values(**row))
            for op in ops:
                if op[1] != "instances":
                    continue
                if op[0] == SET:
                    conn.execute(delete(instances).where(instances.c.uuid == op[2]))
                    conn.execute(insert(instances).values(**_instance_row(source, op[2], op[3])))
                elif op[0] == DEL:
                    conn.execute(delete(instances).where(instances.c.uuid == op[2]))
                elif op[0] == DROP:
                    conn.execute(delete(instances).where(instances.c.compute_uuid == source))

    def read_hosts(self) -> list[tuple[str, int, int, Document]]:
        """Every compute node: (source, epoch, seq, document without its instances)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(compute_nodes)).all()
        return [(r.uuid, r.epoch, r.seq, _doc(r)) for r in rows]

    def read_instances(self) -> dict[str, dict[str, dict]]:
        """Instance lists per compute node (what the affinity filters need)."""
        out: dict[str, dict[str, dict]] = {}
        with self.engine.connect() as conn:
            for r in conn.execute(select(instances)):
                out.setdefault(r.compute_uuid, {})[r.uuid] = {
                    "resources": {"vcpus": r.vcpus, "memory_mb": r.memory_mb, "disk_gb": r.root_gb}}
        return out

    def close(self) -> None:
        try:
            metadata.drop_all(self.engine)
        finally:
            self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
