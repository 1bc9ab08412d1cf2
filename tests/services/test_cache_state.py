"""The cache's state file (design §4.4): restored exactly, or not at all.

``shm faults`` found that a damaged state file (torn by a crash on a filesystem
that reorders writes, or a bad disk) could restore a view that its source never
had, or one ahead of it, which nothing repairs.  The file is checksummed now: any
damage means a cold start.
"""

from __future__ import annotations

import msgpack
import pytest

from protocol.messages import Snapshot
from protocol.receiver import ReceiverMachine
from shared_host_manager.cache import HostStateCache


def _cache() -> HostStateCache:
    return HostStateCache(ReceiverMachine("s0"), lambda endpoint, msg: None, clock=lambda: 1.0)


def _saved(tmp_path) -> tuple[HostStateCache, str]:
    cache = _cache()
    cache.receiver.receive(Snapshot("cn-1", 5, 7, {"compute": {"vcpus": 8, "vcpus_used": 3}}), 0.0)
    cache.offset = 41
    cache.origins["cn-1"] = "rep-0"
    path = str(tmp_path / "cache-s0.msgpack")
    cache.save(path)
    return cache, path


def test_an_intact_file_restores_every_view(tmp_path):
    _, path = _saved(tmp_path)
    fresh = _cache()
    assert fresh.load(path) == 41
    view = fresh.receiver.sources["cn-1"]
    assert view.version == (5, 7) and view.doc == {"compute": {"vcpus": 8, "vcpus_used": 3}}
    assert fresh.endpoint_of("cn-1") == "rep-0"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_any_damage_means_a_cold_start(tmp_path, damage):
    _, path = _saved(tmp_path)
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[: len(data) - 3]
    else:
        # a flip inside the saved document: still valid msgpack, a different vcpus_used
        i = data.index(b"vcpus_used") + len(b"vcpus_used")
        data[i] ^= 0x01
    with open(path, "wb") as f:
        f.write(bytes(data))
    fresh = _cache()
    assert fresh.load(path) is None
    assert fresh.receiver.sources == {}


def test_a_file_of_the_previous_format_still_loads(tmp_path):
    path = tmp_path / "old.msgpack"
    path.write_bytes(msgpack.packb({"format": 1, "offset": 3, "origins": {},
                                    "sources": [["cn-2", 1, 2, {"compute": {"vcpus": 4}}]]}))
    fresh = _cache()
    assert fresh.load(str(path)) == 3
    assert fresh.receiver.sources["cn-2"].version == (1, 2)


def test_a_state_packed_a_view_at_a_time_is_the_bytes_of_one_pack():
    """StateCut.pack packs view by view (other threads run between views); the state's bytes
    are those one msgpack.packb of the whole map makes, so every reader keeps reading them."""
    cache = _cache()
    for i in range(3):
        cache.receiver.receive(Snapshot(f"cn-{i}", 2, i, {"compute": {"vcpus": i}}), 0.0)
    cache.offset, cache.cell_offsets = 9, {"cell1": 4}
    cache.origins["cn-1"], cache.source_cells["cn-2"] = "rep-0", "cell1"
    whole = msgpack.packb({
        "offset": 9, "cells": {"cell1": 4},
        "sources": [[f"cn-{i}", 2, i, {"compute": {"vcpus": i}}] for i in range(3)],
        "origins": {"cn-1": "rep-0"}, "source_cells": {"cn-2": "cell1"}}, use_bin_type=True)
    assert msgpack.unpackb(cache.dump_state())["state"] == whole
