"""The fuzzing corpus (tests/fuzz_corpus/, grown by ``shm fuzz``) replays without a crash.

Every input goes through the door its first byte picks (simulator.fuzzing): the decoder
may only raise typed protocol errors, the cache, the reporter's control door and the
update-log reader nothing at all.  A crash found by fuzzing is added to the corpus with
its fix, so it stays fixed.
"""

from __future__ import annotations

import os

from simulator.fuzzing import TARGETS, FuzzTargets, seed_inputs

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


def test_the_corpus_replays_without_a_crash():
    targets = FuzzTargets()
    try:
        for name in _corpus():
            with open(os.path.join(CORPUS, name), "rb") as f:
                targets.one(f.read())
        assert targets.inputs == len(_corpus())
    finally:
        targets.close()

