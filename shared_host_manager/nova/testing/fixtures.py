"""Test and benchmark fixtures: nova objects, a cache fed from documents, a fake placement.

Shared by ``tests/nova`` and :mod:`simulator.bench_nova` so the benchmark
measures the same setup the tests prove correct (:class:`SchedulerPair` is
the benchmark's whole nova side: the simulator times it, it never imports
nova).  Nothing here touches a network; the database pieces
(:class:`NovaDatabase`) write only the SQLite files they are given.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import uuid as uuid_mod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from oslo_utils import timeutils

from shared_host_manager.nova.core import nova_setup

NOW = timeutils.utcnow(with_timezone=True)

_setup_lock = threading.Lock()
_done = False


def setup_nova(**overrides: Any) -> Any:
    """Register nova's objects and parse an empty nova configuration (once per process).

    Also initialises nova's RPC layer on the ``fake://`` transport with the
    notification driver ``noop`` (SchedulerManager builds notifiers).  Returns
    nova's CONF.  ``overrides``: ``{"group.option": value}`` set each call.
    """
    global _done
    from nova import rpc

    conf = nova_setup.setup_nova_objects()
    with _setup_lock:
        if not _done:
            from oslo_messaging import transport as om_transport
            from oslo_messaging.notify import notifier as om_notifier

            conf.register_opts(om_transport._transport_opts)
            conf.register_opts(om_notifier._notifier_opts, group="oslo_messaging_notifications")
            conf.set_override("transport_url", "fake:/")
            conf.set_override("driver", ["noop"], group="oslo_messaging_notifications")
            rpc.init(conf)
            _done = True
    for key, value in overrides.items():
        group, _, name = key.rpartition(".")
        conf.set_override(name, value, group=group or None)
    return conf


def uuid_for(kind: str, i: int) -> str:
    """Stable uuids, so a run can be repeated and compared."""
    return str(uuid_mod.uuid5(uuid_mod.NAMESPACE_URL, f"shm-nova-{kind}-{i}"))


CELL1 = uuid_for("cell", 1)


def numa_topology(cells: int = 2, cpus: int = 8, memory: int = 32768, pinned: Iterable[int] = ()) -> Any:
    from nova import objects

    pinned = set(pinned)
    return objects.NUMATopology(cells=[objects.NUMACell(
        id=i, cpuset=set(range(i * cpus, i * cpus + cpus // 2)),
        pcpuset=set(range(i * cpus + cpus // 2, (i + 1) * cpus)),
        memory=memory, cpu_usage=0, memory_usage=0,
        pinned_cpus={c for c in pinned if i * cpus <= c < (i + 1) * cpus}, socket=0,
        mempages=[objects.NUMAPagesTopology(size_kb=4, total=memory * 256, used=0)],
        siblings=[{c} for c in range(i * cpus, (i + 1) * cpus)]) for i in range(cells)])


def pci_pools(count: int = 4, numa_node: int = 0) -> Any:
    from nova import objects

    if not count:
        return objects.PciDevicePoolList()
    return objects.PciDevicePoolList(objects=[objects.PciDevicePool(
        vendor_id="8086", product_id="1520", numa_node=numa_node,
        tags={"dev_type": "type-PCI"}, count=count)])


def pci_request(count: int = 1) -> Any:
    """A request for ``count`` devices of the kind :func:`pci_pools` offers."""
    from nova import objects

    return objects.InstancePCIRequests(requests=[objects.InstancePCIRequest(
        count=count, spec=[{"vendor_id": "8086", "product_id": "1520"}], request_id=None)])


def dedicated_cpus(n: int = 2) -> Any:
    """An instance NUMA topology of one cell pinning ``n`` dedicated CPUs (2 GiB)."""
    from nova import objects
    from nova.objects import fields

    return objects.InstanceNUMATopology(cells=[objects.InstanceNUMACell(
        id=0, cpuset=set(), pcpuset=set(range(n)), memory=2048,
        cpu_policy=fields.CPUAllocationPolicy.DEDICATED)])


def compute_node(i: int, *, free_ram_mb: int | None = None, vcpus_used: int = 2,
                 num_instances: int = 3, io_workload: int = 1, failed_builds: int = 0,
                 numa: Any = True, pci: int = 0, hypervisor_version: int = 8002000,
                 cpu_allocation_ratio: float = 4.0, ram_allocation_ratio: float = 1.0,
                 metrics: list[dict[str, Any]] | None = None, extra_stats: Mapping[str, str] | None = None,
                 host: str | None = None, memory_mb: int = 65536, reserved_memory_mb: int = 512,
                 ) -> Any:
    """A ComputeNode as nova-compute's ResourceTracker writes it (reserved amounts in ``*_used``)."""
    from nova import objects

    memory_used = memory_mb - (free_ram_mb if free_ram_mb is not None else memory_mb // 2)
    memory_used = max(memory_used, reserved_memory_mb)
    stats = {"num_instances": str(num_instances), "io_workload": str(io_workload),
             "failed_builds": str(failed_builds), "num_vm_active": str(num_instances),
             "num_task_None": str(num_instances)}
    stats.update(extra_stats or {})
    if numa is True:
        numa = numa_topology()
    if metrics is None:
        metrics = [{"name": "cpu.percent", "value": 0.1 * (i % 7), "timestamp": NOW.isoformat(),
                    "source": "libvirt.LibvirtDriver"},
                   {"name": "cpu.frequency", "value": 2000 + i, "timestamp": NOW.isoformat(),
                    "source": "libvirt.LibvirtDriver"}]
    from oslo_serialization import jsonutils

    return objects.ComputeNode(
        id=i, uuid=uuid_for("cn", i), host=host or f"host{i}", hypervisor_hostname=f"node{i}",
        memory_mb=memory_mb, memory_mb_used=memory_used, free_ram_mb=memory_mb - memory_used,
        local_gb=1000, local_gb_used=100 + i % 50, free_disk_gb=900 - i % 50,
        disk_available_least=895 - i % 50 - i % 3, vcpus=16, vcpus_used=vcpus_used,
        hypervisor_type="QEMU", hypervisor_version=hypervisor_version,
        cpu_info=jsonutils.dumps({"arch": "x86_64", "model": "Skylake", "vendor": "Intel",
                                  "topology": {"cells": 2, "sockets": 1, "cores": 8, "threads": 1},
                                  "features": ["avx", "sse4.2"]}),
        host_ip=f"10.0.{i >> 8 & 255}.{i & 255}",
        supported_hv_specs=[objects.HVSpec(arch="x86_64", hv_type="qemu", vm_mode="hvm")],
        numa_topology=numa._to_json() if numa else None,
        pci_device_pools=pci_pools(pci), stats=stats, metrics=jsonutils.dumps(metrics),
        cpu_allocation_ratio=cpu_allocation_ratio, ram_allocation_ratio=ram_allocation_ratio,
        disk_allocation_ratio=1.0, running_vms=num_instances, current_workload=io_workload,
        service_id=i, mapped=1, updated_at=NOW)


def service_dict(host: str, *, disabled: bool = False, forced_down: bool = False,
                 version: int = 74) -> dict[str, Any]:
    """The dict(Service) nova's HostManager hands to HostState.update."""
    return {"id": 1, "host": host, "binary": "nova-compute", "topic": "compute", "report_count": 5,
            "disabled": disabled, "disabled_reason": "maintenance" if disabled else None,
            "forced_down": forced_down, "last_seen_up": timeutils.utcnow(with_timezone=True),
            "created_at": NOW, "updated_at": NOW, "version": version}


# -- the shared cache, fed with documents ----------------------------------------------

def cache_from_documents(documents: Mapping[str, Mapping[str, Any]], *, name: str = "scheduler-test",
                         epoch: int = 1, claim_deadline: float = 30.0, down_interval: float = 3600.0,
                         clock: Any = None) -> Any:
    """A HostStateCache whose receiver holds ``documents`` (source -> document) as snapshots."""
    from protocol.messages import Snapshot
    from protocol.receiver import ReceiverMachine
    from shared_host_manager.cache import HostStateCache

    receiver = ReceiverMachine(name, claim_deadline=claim_deadline, down_interval=down_interval)
    kw = {"clock": clock} if clock is not None else {}
    cache = HostStateCache(receiver, lambda endpoint, message: None, **kw)
    now = cache.clock()
    with cache.lock:
        for source, doc in documents.items():
            receiver.receive(Snapshot(source, epoch, 0, {ns: dict(v) for ns, v in doc.items()}), now)
        receiver.drain_changed()
    return cache


# -- placement --------------------------------------------------------------------------

class FakePlacement:
    """The two placement calls select_destinations makes: GET /allocation_candidates, claim.

    Every provider in ``providers`` is a candidate with the request's RAM, CPU and
    disk.  A request context with an ``shm_marker`` attribute gets it copied into
    each of its allocation requests, so tests can tell which request one belongs to.
    Claims on providers in ``refuse`` fail (as a placement conflict would).
    """

    def __init__(self, providers: Iterable[str]) -> None:
        self.providers = list(providers)
        self.claims: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self._lock = threading.Lock()
        self.refuse: set[str] = set()

    def get_allocation_candidates(self, context: Any, resources: Any) -> Any:
        amounts = {rc: amount for rc, amount in resources.merged_resources().items()}
        marker = getattr(context, "shm_marker", None)
        alloc_reqs = []
        summaries = {}
        for rp in self.providers:
            req = {"allocations": {rp: {"resources": dict(amounts)}}, "mappings": {"": [rp]}}
            if marker is not None:
                req["shm_marker"] = marker
            alloc_reqs.append(req)
            summaries[rp] = {"resources": {rc: {"capacity": 1 << 20, "used": 0} for rc in amounts},
                             "traits": []}
        return alloc_reqs, summaries, "1.36"

    def claim_resources(self, context: Any, consumer_uuid: str, alloc_request: Any, project_id: str,
                        user_id: str, allocation_request_version: str | None = None,
                        consumer_generation: Any = None) -> bool:
        rp = next(iter(alloc_request["allocations"]))
        with self._lock:
            if rp in self.refuse:
                return False
            self.claims.append((consumer_uuid, rp))
        return True

    def delete_allocation_for_instance(self, context: Any, uuid: str, force: bool = False) -> None:
        with self._lock:
            self.deleted.append(uuid)


@contextlib.contextmanager
def patched_scheduler(placement: FakePlacement, *, shared: bool = True,
                      stub_request_filters: bool = False) -> Iterator[None]:
    """nova's module attributes patched for a DB-less SchedulerManager.

    ``shared``: nova's HostManager is our SharedHostManager (via
    :func:`host_manager.install`).  ``stub_request_filters``: skip
    ``request_filter.process_reqspec`` entirely (the DB-fed baseline keeps it).
    """
    from nova.scheduler import request_filter
    from nova.scheduler.client import report

    from shared_host_manager.nova import host_manager

    saved_client = report.report_client_singleton
    saved_process = request_filter.process_reqspec
    report.report_client_singleton = lambda: placement
    if stub_request_filters:
        request_filter.process_reqspec = lambda ctxt, spec: None
    if shared:
        host_manager.install()
    try:
        yield
    finally:
        report.report_client_singleton = saved_client
        request_filter.process_reqspec = saved_process
        if shared:
            host_manager.uninstall()


def zones(hosts: list[str], n: int) -> list[Any]:
    """``n`` aggregates, availability zones with a RAM weight multiplier in their metadata,
    host ``i`` in zone ``i % n``."""
    from nova import objects

    return [objects.Aggregate(uuid=uuid_for("aggregate", k), name=f"az{k}", id=k + 1,
                              hosts=list(hosts[k::n]),
                              metadata={"availability_zone": f"az{k}",
                                        "ram_weight_multiplier": str(1.0 + k % 3)})
            for k in range(n)]


def request_spec(*, instance_uuid: str | None = None, memory_mb: int = 2048, vcpus: int = 2,
                 root_gb: int = 20, extra_specs: Mapping[str, str] | None = None,
                 image_props: Mapping[str, Any] | None = None, numa: Any = None, pci: Any = None,
                 group: Any = None, num_instances: int = 1, hints: Mapping[str, Any] | None = None,
                 ) -> Any:
    from nova import objects

    spec = objects.RequestSpec(
        instance_uuid=instance_uuid or str(uuid_mod.uuid4()), project_id="p", user_id="u",
        num_instances=num_instances, is_bfv=False,
        flavor=objects.Flavor(flavorid="f1", name="f1", memory_mb=memory_mb, vcpus=vcpus,
                              root_gb=root_gb, ephemeral_gb=0, swap=0,
                              extra_specs=dict(extra_specs or {})),
        image=objects.ImageMeta.from_dict({"properties": dict(image_props or {})}),
        numa_topology=numa, pci_requests=pci or objects.InstancePCIRequests(requests=[]),
        instance_group=group, scheduler_hints=dict(hints or {}), ignore_hosts=[], force_hosts=[],
        force_nodes=[], requested_resources=[], availability_zone=None,
        request_level_params=objects.RequestLevelParams(), security_groups=objects.SecurityGroupList())
    return spec


# -- a nova database in SQLite (the baseline nova's own HostManager reads) ---------------------

class NovaDatabase:
    """nova's API and cell schemas in two SQLite files, created from nova's own models.

    ``populate`` writes the cell mapping, one Service per host, the
    ComputeNodes and their host mappings and instances through nova's own DB API,
    i.e. the rows nova-compute and nova-manage would write.
    """

    def __init__(self, directory: str, *, api_url: str | None = None,
                 cell_url: str | None = None) -> None:
        self.directory = directory
        self.api_url = api_url or "sqlite:///" + os.path.join(directory, "nova_api.sqlite")
        self.cell_url = cell_url or "sqlite:///" + os.path.join(directory, "nova_cell1.sqlite")

    def configure(self) -> None:
        """Point nova's [database] and [api_database] at the files and create the schemas."""
        import nova.conf
        import sqlalchemy as sa
        from nova.db.api import models as api_models
        from nova.db.main import models as main_models

        conf = nova.conf.CONF
        conf.set_override("connection", self.api_url, group="api_database")
        conf.set_override("connection", self.cell_url, group="database")
        _configure_context_managers()  # nova's migrations reach the databases through them
        for url, metadata, database in ((self.api_url, api_models.BASE.metadata, "api"),
                                        (self.cell_url, main_models.BASE.metadata, "main")):
            if not url.startswith("sqlite"):
                # a server: a fresh database, and nova's own migrations (nova-manage db sync),
                # which shorten the MySQL index keys the models alone would make too long
                from nova.db import migration

                recreate_database(url)
                migration.db_sync(database=database)
                continue
            engine = sa.create_engine(url)
            if url.startswith("sqlite:///"):
                # concurrent readers beside one writer (the journal mode stays with the file),
                # as a database server would allow; else writers fail with "database is locked"
                with engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            metadata.create_all(engine)
            engine.dispose()
        _configure_context_managers()

    def populate(self, compute_nodes: list[Any], *, instances_per_host: int = 0,
                 cell_uuid: str = CELL1, aggregates: Iterable[tuple[str, dict[str, str], list[str]]] = (),
                 instances: Mapping[str, Iterable[str]] | None = None) -> list[Any]:
        """``instances``: host -> instance uuids (default: ``instances_per_host`` made-up ones);
        ``aggregates``: (name, metadata, host names) of the host aggregates to create, returned as
        nova Aggregate objects."""
        import sqlalchemy as sa
        from nova import context as nova_context
        from nova import objects

        ctxt = nova_context.get_admin_context()
        objects.CellMapping(ctxt, uuid=objects.CellMapping.CELL0_UUID, name="cell0",
                            transport_url="fake:/", database_connection=self.cell_url).create()
        cell = objects.CellMapping(ctxt, uuid=cell_uuid, name="cell1", transport_url="fake:/",
                                   database_connection=self.cell_url)
        cell.create()
        engine = sa.create_engine(self.cell_url)
        api_engine = sa.create_engine(self.api_url)
        ids = itertools.count(1)
        with engine.begin() as conn, api_engine.begin() as api:
            services = sa.Table("services", sa.MetaData(), autoload_with=conn)
            nodes = sa.Table("compute_nodes", sa.MetaData(), autoload_with=conn)
            insts = sa.Table("instances", sa.MetaData(), autoload_with=conn)
            host_mappings = sa.Table("host_mappings", sa.MetaData(), autoload_with=api)
            seen_hosts: dict[str, int] = {}
            for cn in compute_nodes:
                if cn.host not in seen_hosts:
                    sid = next(ids)
                    seen_hosts[cn.host] = sid
                    conn.execute(services.insert().values(
                        id=sid, uuid=str(uuid_mod.uuid4()), host=cn.host, binary="nova-compute",
                        topic="compute", report_count=1, disabled=False, forced_down=False,
                        version=74, last_seen_up=timeutils.utcnow(), created_at=timeutils.utcnow(),
                        updated_at=timeutils.utcnow(), deleted=0))
                    api.execute(host_mappings.insert().values(host=cn.host, cell_id=cell.id))
                    uuids = list(instances.get(cn.host, ())) if instances is not None else [
                        uuid_for(f"inst-{cn.host}", k) for k in range(instances_per_host)]
                    for inst_uuid in uuids:
                        conn.execute(insts.insert().values(
                            uuid=inst_uuid, host=cn.host, node=cn.hypervisor_hostname,
                            vm_state="active", deleted=0, project_id="p", user_id="u",
                            created_at=timeutils.utcnow()))
                values = _compute_node_row(cn)
                values["service_id"] = seen_hosts[cn.host]
                conn.execute(nodes.insert().values(**values))
        created = []
        for name, metadata, hosts in aggregates:
            agg = objects.Aggregate(ctxt, name=name, metadata=metadata)
            agg.create()
            for host in hosts:
                agg.add_host(host)
            created.append(agg)
        engine.dispose()
        api_engine.dispose()
        return created


def recreate_database(url: str) -> None:
    """Drop and create the database ``url`` names on its server (MariaDB / PostgreSQL)."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    target = make_url(url)
    name = target.database
    assert name, url
    admin_db = "postgres" if target.get_backend_name() == "postgresql" else "mysql"
    engine = sa.create_engine(target.set(database=admin_db), isolation_level="AUTOCOMMIT")
    quote = engine.dialect.identifier_preparer.quote
    with engine.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {quote(name)}"))
        # MySQL: utf8 (3 bytes a character), as nova's and placement's migrations create their
        # tables; with utf8mb4 some of nova's indexes exceed the 3 072-byte key limit
        charset = " CHARACTER SET utf8" if admin_db == "mysql" else ""
        conn.execute(sa.text(f"CREATE DATABASE {quote(name)}{charset}"))
    engine.dispose()


def _compute_node_row(cn: Any) -> dict[str, Any]:
    from oslo_serialization import jsonutils

    row = {}
    for field in ("uuid", "host", "vcpus", "memory_mb", "local_gb", "vcpus_used", "memory_mb_used",
                  "local_gb_used", "hypervisor_type", "hypervisor_version", "hypervisor_hostname",
                  "free_ram_mb", "free_disk_gb", "current_workload", "running_vms", "cpu_info",
                  "disk_available_least", "metrics", "numa_topology", "cpu_allocation_ratio",
                  "ram_allocation_ratio", "disk_allocation_ratio", "mapped"):
        row[field] = getattr(cn, field)
    row["host_ip"] = str(cn.host_ip)
    row["stats"] = jsonutils.dumps(cn.stats)
    row["supported_instances"] = jsonutils.dumps([s.to_list() for s in cn.supported_hv_specs])
    row["pci_stats"] = jsonutils.dumps(cn.pci_device_pools.obj_to_primitive()) \
        if cn.pci_device_pools else None
    row["created_at"] = timeutils.utcnow()
    row["updated_at"] = timeutils.utcnow()
    row["deleted"] = 0
    return row


def _configure_context_managers() -> None:
    """(Re)bind nova's DB context managers to the [database]/[api_database] overrides."""
    import nova.conf
    from nova import context as nova_context
    from nova.db.api import api as api_db
    from nova.db.main import api as main_db

    conf = nova.conf.CONF
    if not main_db.context_manager.is_started:
        main_db.configure(conf)
    if not api_db.context_manager.is_started:
        api_db.configure(conf)
    nova_context.CELL_CACHE = {}


# -- nova's scheduler twice over the same hosts (shm bench nova) ---------------------------------

class SchedulerPair:
    """nova's real SchedulerManager over the same compute nodes, built two ways.

    * ``"nova"``: nova's own HostManager reading the nova schema in SQLite files
      under ``directory`` (:class:`NovaDatabase`), instance info synced first
      unless ``sync_instance_info`` is False;
    * ``"shared"``: SharedHostManager over a cache holding the documents the
      compute hook makes of the same nodes.

    Both sides share one :class:`FakePlacement` (every host a candidate, every
    claim accepted).  :meth:`select` runs one ``select_destinations``.
    """

    SIDES = ("nova", "shared")

    def __init__(self, directory: str, *, hosts: int, filters: list[str],
                 instances_per_host: int = 2, sync_instance_info: bool = True) -> None:
        # The Service rows' heartbeats are written once, at setup; a long run must not see
        # them age past service_down_time (nova-compute would refresh them every 10 s).
        setup_nova(**{"filter_scheduler.enabled_filters": filters, "service_down_time": 86400})
        import time

        from nova import context as nova_context
        from nova.scheduler import manager as nova_manager

        from shared_host_manager.nova import host_manager as shm
        from shared_host_manager.nova.core import document as ndoc

        nodes = [compute_node(i, free_ram_mb=16384 + (i * 7919) % 40000) for i in range(hosts)]
        instances = {cn.host: [uuid_for(f"inst-{cn.host}", k) for k in range(instances_per_host)]
                     for cn in nodes}
        db = NovaDatabase(directory)
        db.configure()
        db.populate(nodes, instances_per_host=instances_per_host)
        docs = {cn.uuid: ndoc.document_from_compute_node(cn, service=service_dict(cn.host),
                                                           instances=instances[cn.host], cell_uuid=CELL1)
                for cn in nodes}
        self.cache = cache_from_documents(docs)
        self.placement = FakePlacement([cn.uuid for cn in nodes])
        self._context = nova_context.get_admin_context()
        self._shm = shm
        self.managers: dict[str, Any] = {}
        with patched_scheduler(self.placement, shared=False):
            self.managers["nova"] = nova_manager.SchedulerManager()
        hm = self.managers["nova"].host_manager
        if sync_instance_info:
            deadline = time.monotonic() + 60
            while instances_per_host and len(hm._instance_info) < len(instances) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)  # nova's asynchronous _init_instance_info
            for host, uuids in instances.items():
                hm.sync_instance_info(self._context, host, list(uuids))
                hm.sync_instance_info(self._context, host, list(uuids))
        shm.set_cache_provider(lambda: self.cache)
        with patched_scheduler(self.placement, shared=True):
            self.managers["shared"] = nova_manager.SchedulerManager()

    @contextlib.contextmanager
    def side(self, side: str) -> Iterator[None]:
        """nova's module attributes as that side runs them (shared: the drop-in installed)."""
        with patched_scheduler(self.placement, shared=side == "shared"):
            yield

    def select(self, side: str, instance_uuid: str) -> int:
        """One select_destinations with alternates on ``side`` (inside :meth:`side`);
        returns the number of selections of the instance."""
        spec = request_spec(instance_uuid=instance_uuid)
        sel = self.managers[side].select_destinations(
            self._context, spec_obj=spec, instance_uuids=[instance_uuid],
            return_objects=True, return_alternates=True)
        return len(sel[0])

    def close(self) -> None:
        self._shm.set_cache_provider(None)
