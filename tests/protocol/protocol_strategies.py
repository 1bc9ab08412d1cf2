"""Hypothesis strategies and small helpers shared by the protocol tests.

Everything generated here is *valid* by the wire rules of protocol.codec
(names 1..256 characters, JSON-like values within the depth limit, range-checked
compute entries), so an encode/decode round trip must give back an equal object.
"""

from __future__ import annotations

import string
from typing import Any

import msgpack
from hypothesis import strategies as st

from protocol.document import DEL, DROP, MAX_INT, MIN_INT, SET
from protocol.messages import (
    NO_EPOCH,
    Batch,
    CheckpointAsk,
    Claim,
    ClaimResult,
    Delta,
    Fence,
    Heartbeat,
    ResyncAnswer,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
    Snapshot,
)
from protocol.resources import MAX_AMOUNT, MAX_RATIO

MAX_VERSION = 2**63 - 1

# no surrogates: msgpack (and any real peer) cannot encode them as UTF-8
chars = st.characters(blacklist_categories=("Cs",))
names = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=16)
keys = st.text(chars, min_size=1, max_size=12)
epochs = st.integers(0, MAX_VERSION)
seqs = st.integers(0, MAX_VERSION)
digests = st.binary(min_size=16, max_size=16)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(chars, max_size=20)
)


def container_depth(value: Any) -> int:
    """Number of nested containers: 0 for a scalar, 1 for [1], 2 for [[1]]..."""
    if type(value) is list:
        return 1 + max((container_depth(v) for v in value), default=0)
    if type(value) is dict:
        return 1 + max((container_depth(v) for v in value.values()), default=0)
    return 0


json_values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4)
                   | st.dictionaries(st.text(chars, max_size=8), inner, max_size=4)),
    max_leaves=10,
).filter(lambda v: container_depth(v) <= 6)

amounts = st.integers(0, MAX_AMOUNT)
ratios = st.floats(min_value=0.01, max_value=MAX_RATIO, allow_nan=False)

compute_entries = st.fixed_dictionaries(
    {},
    optional={
        "vcpus": amounts,
        "memory_mb": amounts,
        "disk_gb": amounts,
        "vcpus_used": amounts,
        "memory_mb_used": amounts,
        "disk_gb_used": amounts,
        "reserved_memory_mb": amounts,
        "cpu_allocation_ratio": ratios,
        "ram_allocation_ratio": ratios | st.integers(1, 16),
        "disk_allocation_ratio": ratios,
        "num_instances": amounts,
        "num_io_ops": amounts,
        "hypervisor_version": amounts,
        "hypervisor_type": st.sampled_from(["QEMU", "ironic", "fake"]),
        "cpu_info": json_values,
        "supported_instances": st.lists(st.lists(st.sampled_from(["x86_64", "kvm", "hvm"]), max_size=3),
                                        max_size=3),
    },
)
generic_entries = st.dictionaries(keys, json_values, min_size=1, max_size=4)
namespaces = st.sampled_from(["service", "instances", "numa", "pci", "metrics", "aggregates"]) | names


@st.composite
def documents(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    doc: dict[str, dict[str, Any]] = {}
    compute = draw(compute_entries)
    if compute:
        doc["compute"] = compute
    for ns in draw(st.lists(namespaces.filter(lambda n: n != "compute"), max_size=3, unique=True)):
        doc[ns] = draw(generic_entries)
    return doc


compute_set_ops = st.one_of(
    st.tuples(st.sampled_from(["vcpus", "memory_mb", "disk_gb", "vcpus_used", "reserved_disk_gb",
                               "num_instances"]), amounts),
    st.tuples(st.sampled_from(["cpu_allocation_ratio", "ram_allocation_ratio", "gpu_allocation_ratio"]),
              ratios),
    st.tuples(st.sampled_from(["hypervisor_type", "cpu_info"]), json_values),
).map(lambda kv: [SET, "compute", kv[0], kv[1]])

ops = st.one_of(
    st.tuples(namespaces, keys, json_values).map(lambda t: [SET, t[0], t[1], t[2]]),
    compute_set_ops,
    st.tuples(namespaces | st.just("compute"), keys).map(lambda t: [DEL, t[0], t[1]]),
    (namespaces | st.just("compute")).map(lambda ns: [DROP, ns]),
)
op_lists = st.lists(ops, max_size=6)
claim_ids = st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=36)
claim_lists = st.lists(claim_ids, max_size=4)


def snapshots(source: st.SearchStrategy[str] = names) -> st.SearchStrategy[Snapshot]:
    return st.builds(Snapshot, source, epochs, seqs, documents(), claim_lists)


def deltas(source: st.SearchStrategy[str] = names) -> st.SearchStrategy[Delta]:
    return st.builds(Delta, source, epochs, st.integers(1, MAX_VERSION), op_lists, claim_lists)


def heartbeats(source: st.SearchStrategy[str] = names) -> st.SearchStrategy[Heartbeat]:
    return st.builds(Heartbeat, source, epochs, seqs, digests)


data_items = st.one_of(snapshots(), deltas(), heartbeats())
if "origin" in Batch.__dataclass_fields__:  # the control-plane address of the publisher
    batches = st.builds(Batch, st.lists(data_items, max_size=6), st.just("") | names)
else:  # pragma: no cover
    batches = st.builds(Batch, st.lists(data_items, max_size=6))
resync_requests = st.builds(ResyncRequest, names, names, st.integers(NO_EPOCH, MAX_VERSION), seqs,
                            st.booleans())


@st.composite
def resync_answers(draw: st.DrawFn) -> ResyncAnswer:
    source = draw(names)
    items = draw(st.lists(snapshots(st.just(source)) | deltas(st.just(source)), max_size=4))
    return ResyncAnswer(source, draw(names), items)


resources = st.dictionaries(st.sampled_from(["vcpus", "memory_mb", "disk_gb"]) | names, amounts, max_size=4)
claims = st.builds(
    Claim, claim_ids, names, names, st.integers(NO_EPOCH, MAX_VERSION), seqs, resources,
    st.text(string.hexdigits + "-", max_size=36),
    st.dictionaries(st.text(chars, max_size=8), json_values, max_size=3),
)


@st.composite
def claim_results(draw: st.DrawFn) -> ClaimResult:
    source = draw(names)
    accepted = draw(st.booleans())
    correction = [] if accepted else draw(
        st.lists(snapshots(st.just(source)) | deltas(st.just(source)), max_size=3))
    return ClaimResult(draw(claim_ids), draw(names), source, accepted, draw(epochs), draw(seqs),
                       draw(st.text(chars, max_size=40)), correction)


scarce_requests = st.builds(
    ScarceRequest, claim_ids, names, names,
    st.dictionaries(st.text(chars, max_size=8), json_values, max_size=3))
instance_tables = st.dictionaries(names, st.text(chars, max_size=40), max_size=3)
scarce_answers = st.builds(ScarceAnswer, claim_ids, names, names, instance_tables, instance_tables,
                           st.integers(0, 100), st.integers(0, 100))

fences = st.builds(Fence, names, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
checkpoint_asks = st.builds(CheckpointAsk, names, names)

messages = st.one_of(
    snapshots(), deltas(), heartbeats(), batches, resync_requests, resync_answers(), claims,
    claim_results(), scarce_requests, scarce_answers, fences, checkpoint_asks,
)


def speakers(msg: Any) -> set[str]:
    """Every name whose key signs some part of ``msg``."""
    if isinstance(msg, Batch):
        return set().union(*(speakers(i) for i in msg.items)) if msg.items else set()
    if isinstance(msg, (Claim, ScarceRequest, ScarceAnswer, CheckpointAsk)):
        return {msg.scheduler}
    if isinstance(msg, ResyncRequest):
        return {msg.requester}
    return {msg.source}


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)
