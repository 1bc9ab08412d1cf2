"""The fuzzing corpus (tests/fuzz_corpus/, grown by ``shm fuzz``) replays without a crash.

Every input goes through the door its first byte picks (simulator.fuzzing): the decoder
may only raise typed protocol errors, the cache (stream, control plane and peer topic),
the reporter's control door and the update-log reader nothing at all, and the cache's
claim ledgers must add up after each.  A crash found by fuzzing is added to the corpus
with its fix, so it stays fixed.
"""

from __future__ import annotations

import os

import pytest

from protocol.messages import Claim
from simulator.fuzzing import PEER, TARGETS, FuzzTargets, LedgerError, check_ledgers, seed_inputs

CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fuzz_corpus")


def _corpus() -> list[str]:
    return sorted(os.listdir(CORPUS))


def test_the_corpus_is_kept_and_covers_every_door():
    names = _corpus()
    assert len(names) >= len(seed_inputs())
    doors = set()
    for name in names:
        with open(os.path.join(CORPUS, name), "rb") as f:
            data = f.read()
        if data:
            doors.add(TARGETS[data[0] % len(TARGETS)])
    assert doors == set(TARGETS)


def test_every_seed_is_in_the_corpus_and_goes_through_the_door_it_is_named_after():
    names = set(_corpus())
    for name, data in seed_inputs().items():
        assert name in names, f"{name}: run shm fuzz --write-corpus tests/fuzz_corpus"
        assert TARGETS[data[0] % len(TARGETS)] == name.split("-")[0]


def test_the_corpus_replays_without_a_crash():
    targets = FuzzTargets()
    try:
        for name in _corpus():
            with open(os.path.join(CORPUS, name), "rb") as f:
                targets.one(f.read())
        assert targets.inputs == len(_corpus())
        # the peer topic's door was reached: announcements held, rejections forwarded
        assert targets.by_target["peer"] >= 14
        received = targets.cache.control_received
        assert received["peer_claim"] and received["peer_rejection"] and received["peer_echo"]
    finally:
        targets.close()


def test_the_peer_seeds_hold_and_reject_a_peer_claim():
    targets = FuzzTargets()
    try:
        stats = targets.cache.receiver.stats
        held = stats["peer_claims"]
        for name, data in sorted(seed_inputs().items()):
            if name.startswith("peer-"):
                targets.one(data)
        # the announcement is held, its forwarded rejection ends it, the rest is ignored
        assert stats["peer_claims"] == held + 1 and stats["peer_claims_rejected"] == 1
        assert stats["peer_claims_ignored"] >= 1 and targets.cache.control_received["peer_echo"]
        assert "sch-1:3" not in targets.cache.receiver.sources["cn-0"].peer
    finally:
        targets.close()


def test_the_peer_door_meets_held_peer_claims_and_a_broken_ledger_is_a_crash():
    targets = FuzzTargets()
    try:
        receiver = targets.cache.receiver
        assert all(receiver.sources[s].peer for s in receiver.sources)
        check_ledgers(receiver)
        view = receiver.sources["cn-0"]
        claim = Claim(f"{PEER}:7", PEER, "cn-0", view.epoch, view.seq, {"vcpus": 3}, "vm-p7")
        view.peer_usage["vcpus"] += 3  # counted, not held: what a lost release would leave
        with pytest.raises(LedgerError):
            check_ledgers(receiver)
        view.peer_usage["vcpus"] -= 3
        assert receiver.restore_claim(claim, 5.0, peer=True)
        check_ledgers(receiver)
        view.pending_usage["vcpus"] = -1
        with pytest.raises(LedgerError):
            check_ledgers(receiver)
    finally:
        targets.close()

