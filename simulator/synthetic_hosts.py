"""Synthetic host documents and loaded receivers, for the decision tests and benchmark.

Role: build documents in exactly the namespace layout
:mod:`shared_host_manager.decision.hostview` documents, and load them into a
:class:`~protocol.receiver.ReceiverMachine` the way the stream would (one
Snapshot per source), so tests and the benchmark exercise the real receiver.
Nothing here is used on the decision path itself.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Any

from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine


def host_doc(
    name: str,
    *,
    vcpus: int = 32,
    vcpus_used: int = 0,
    memory_mb: int = 131072,
    memory_mb_used: int = 0,
    disk_gb: int = 2000,
    disk_gb_used: int = 0,
    cpu_ratio: float = 4.0,
    ram_ratio: float = 1.0,
    disk_ratio: float = 1.0,
    reserved: Mapping[str, int] | None = None,
    num_instances: int | None = None,
    num_io_ops: int = 0,
    instances: Mapping[str, Mapping[str, Any]] | None = None,
    aggregates: Mapping[str, Mapping[str, Any]] | None = None,
    disabled: bool = False,
    forced_down: bool = False,
    supported_instances: list[list[str]] | None = None,
    hypervisor_type: str = "QEMU",
    hypervisor_version: int = 8002000,
    cell_uuid: str = "cell1",
    nodename: str | None = None,
) -> dict[str, dict[str, Any]]:
    instances = dict(instances or {})
    compute: dict[str, Any] = {
        "vcpus": vcpus, "vcpus_used": vcpus_used, "memory_mb": memory_mb,
        "memory_mb_used": memory_mb_used, "disk_gb": disk_gb, "disk_gb_used": disk_gb_used,
        "cpu_allocation_ratio": cpu_ratio, "ram_allocation_ratio": ram_ratio,
        "disk_allocation_ratio": disk_ratio,
        "num_instances": len(instances) if num_instances is None else num_instances,
        "num_io_ops": num_io_ops, "hypervisor_type": hypervisor_type,
        "hypervisor_version": hypervisor_version, "cpu_info": {"arch": "x86_64"},
        "supported_instances": supported_instances if supported_instances is not None
        else [["x86_64", "qemu", "hvm"]],
        "host": name, "nodename": nodename or name, "host_ip": "10.0.0.1", "cell_uuid": cell_uuid,
    }
    for resource, amount in (reserved or {}).items():
        compute[f"reserved_{resource}"] = amount
    doc: dict[str, dict[str, Any]] = {
        "compute": compute,
        "service": {"disabled": disabled, "forced_down": forced_down},
    }
    if instances:
        doc["instances"] = instances
    if aggregates:
        doc["aggregates"] = {k: dict(v) for k, v in aggregates.items()}
    return doc


def load_receiver(
    docs: Mapping[str, Mapping[str, Any]], name: str = "scheduler-0", now: float = 0.0,
    epoch: int = 1, **params: Any,
) -> ReceiverMachine:
    """A receiver holding ``docs`` (source id -> document), each established by a Snapshot."""
    receiver = ReceiverMachine(name, **params)
    for source, doc in docs.items():
        receiver.receive(Snapshot(source, epoch, 0, {ns: dict(v) for ns, v in doc.items()}), now)
    return receiver


def cloud(n: int, seed: int = 0, *, instances_per_host: int = 8) -> dict[str, dict[str, Any]]:
    """A plausible cloud of ``n`` hosts: mixed sizes and usage, some aggregates, instances."""
    rng = random.Random(seed)
    aggs = {
        "agg-ssd": {"name": "ssd", "metadata": {"ssd": "true"}},
        "agg-gpu": {"name": "gpu", "metadata": {"gpu": "true", "ram_weight_multiplier": "2.0"}},
        "agg-az1": {"name": "az1", "metadata": {"availability_zone": "az1"}},
        "agg-az2": {"name": "az2", "metadata": {"availability_zone": "az2"}},
        "agg-tenant": {"name": "private", "metadata": {"filter_tenant_id": "p-private"}},
    }
    docs = {}
    for i in range(n):
        name = f"host{i:05d}"
        vcpus = rng.choice((32, 48, 64, 96))
        memory = vcpus * rng.choice((4096, 8192))
        member = {"agg-az1" if i % 2 else "agg-az2": aggs["agg-az1" if i % 2 else "agg-az2"]}
        if i % 5 == 0:
            member["agg-ssd"] = aggs["agg-ssd"]
        if i % 17 == 0:
            member["agg-gpu"] = aggs["agg-gpu"]
        if i % 50 == 0:
            member["agg-tenant"] = aggs["agg-tenant"]
        k = rng.randrange(instances_per_host + 1)
        # instance ids are UUIDs, as nova's are (nova's objects warn about any other)
        insts = {str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}-vm{j}")): {
            "claim": "", "resources": {"vcpus": 2, "memory_mb": 4096, "disk_gb": 20}}
            for j in range(k)}
        docs[f"cn-{i:05d}"] = host_doc(
            name, vcpus=vcpus, vcpus_used=2 * k, memory_mb=memory, memory_mb_used=4096 * k,
            disk_gb=rng.choice((1000, 2000, 4000)), disk_gb_used=20 * k,
            num_io_ops=rng.randrange(4), instances=insts, aggregates=member,
            disabled=(i % 97 == 13), cell_uuid="cell1")
    return docs


__all__ = ["cloud", "host_doc", "load_receiver"]
