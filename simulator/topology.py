"""The simulated cloud's shape: N compute nodes with capacities, aggregates and availability zones.

:func:`build_cloud` draws, from a seed, every compute node's first document
(capacities from a host mix, hypervisor facts, service state) and places the
nodes in host aggregates: ``--azs`` availability zones, plus one aggregate of
SSD hosts (``ssd=true`` in its metadata, which flavors can ask for through
aggregate_instance_extra_specs).  Aggregate membership travels in each host's
``aggregates`` namespace (docs/design.md §2).

The same seed gives the same cloud, which is what lets ``--host-manager all``
compare three host managers on one workload.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from compute_reporter.tracker import DEFAULT_HOST_MIX, simulated_document
from protocol.document import Document


@dataclass(frozen=True)
class Cloud:
    documents: dict[str, Document]  # source id -> first document
    aggregates: dict[str, dict]  # aggregate uuid -> {"name", "metadata", "hosts"}
    cell_uuid: str


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def build_cloud(nodes: int, seed: int, *, azs: int = 3, ssd_fraction: float = 0.2) -> Cloud:
    rng = random.Random(f"cloud-{seed}")
    cell = _uuid(rng)
    aggregates: dict[str, dict] = {}
    az_ids = []
    for i in range(azs):
        agg = _uuid(rng)
        az_ids.append(agg)
        aggregates[agg] = {"name": f"az{i + 1}", "metadata": {"availability_zone": f"az{i + 1}"},
                           "hosts": []}
    ssd = _uuid(rng)
    aggregates[ssd] = {"name": "ssd", "metadata": {"ssd": "true"}, "hosts": []}
    documents: dict[str, Document] = {}
    for i in range(nodes):
        source = _uuid(rng)
        doc = simulated_document(source, i, rng, DEFAULT_HOST_MIX)
        doc["compute"]["cell_uuid"] = cell
        members = [az_ids[i % azs]] if azs else []
        if rng.random() < ssd_fraction:
            members.append(ssd)
        doc["aggregates"] = {}
        for agg in members:
            aggregates[agg]["hosts"].append(doc["compute"]["host"])
            doc["aggregates"][agg] = {"name": aggregates[agg]["name"],
                                      "metadata": dict(aggregates[agg]["metadata"])}
        documents[source] = doc
    return Cloud(documents, aggregates, cell)
