"""The per-source life cycle as data (protocol.source_state): the table, its drawings, and
the receiver moving through it.

* the transition list in the module docstring is the table, entry for entry; the figure
  names every state and event, its "stays" line is the table's self-loops and its forget
  line the table's forget entries; docs/design.md §4.1 and docs/protocol.md §12 draw
  the same figure;
* random walks of a receiver over adversarial input (duplicates, gaps, other epochs,
  goodbyes, silences, resyncs, claim corrections, forget) reach every (state, event)
  pair of the table and no other (a pair missing from the table raises), and after every
  step each view's state agrees with what it holds.
"""

from __future__ import annotations

import os
import random
import re
import textwrap

import protocol.source_state as source_state
from protocol.document import SET
from protocol.hostdoc import said_goodbye
from protocol.messages import (
    Batch,
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    ResyncAnswer,
    Snapshot,
)
from protocol.receiver import ReceiverMachine, ReceiverObserver, SourceView, Status
from protocol.source_state import TRANSITIONS, Event, SourceState

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = source_state.__doc__ or ""


def _figure(text: str) -> list[str]:
    """The life-cycle figure's lines, dedented: from the line drawing UNKNOWN's first edge
    to the "stays:" line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "first_word" in line and "in_order" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("stays:"))
    return textwrap.dedent("\n".join(lines[start:end + 1])).splitlines()


def test_the_listed_transitions_are_the_table():
    listed = set(re.findall(r"^\s+([A-Z]+) --([a-z_]+)--> ([A-Z]+)$", DOC, re.M))
    table = {(s.name, e.value, n.name) for (s, e), n in TRANSITIONS.items()}
    assert listed == table, f"listed, not in the table: {listed - table}; " \
                            f"in the table, not listed: {table - listed}"


def test_the_figure_draws_every_state_and_event_and_lists_the_self_loops():
    figure = "\n".join(_figure(DOC))
    words = set(re.findall(r"[A-Za-z_]+", figure))
    assert {s.name for s in SourceState} <= words
    assert {e.value for e in Event} <= words
    stays = figure.split("stays:", 1)[1]
    drawn = {(state, event.strip()) for state, events in re.findall(r"([A-Z]+) on ([a-z_, ]+)", stays)
             for event in events.split(",")}
    assert drawn == {(s.name, e.value) for (s, e), n in TRANSITIONS.items() if s is n}
    # forget: from every state that is a view, to no view
    assert {s for (s, e) in TRANSITIONS if e is Event.FORGET} == set(SourceState) - {SourceState.UNKNOWN}
    assert {n for (s, e), n in TRANSITIONS.items() if e is Event.FORGET} == {SourceState.UNKNOWN}


def test_the_docs_draw_the_same_figure():
    figure = _figure(DOC)
    for page in ("docs/design.md", "docs/protocol.md"):
        with open(os.path.join(TOP, page), encoding="utf-8") as f:
            assert _figure(f.read()) == figure, f"{page} draws another life cycle than protocol.source_state"


# -- random walks ---------------------------------------------------------------------

A, B = "compute-a", "compute-b"


class _Moves(ReceiverObserver):
    def __init__(self) -> None:
        self.seen: set[tuple[SourceState, Event]] = set()

    def source_moved(self, view: SourceView, event: Event, previous: SourceState) -> None:
        assert TRANSITIONS[previous, event] is view.state
        self.seen.add((previous, event))


def _doc(rng: random.Random, goodbye: bool) -> dict:
    return {"compute": {"memory_mb_used": rng.randrange(4)}, "service": {"stopped": goodbye}}


def _item(rng: random.Random, r: ReceiverMachine, source: str) -> Snapshot | Delta:
    """A snapshot or delta near what ``r`` holds of ``source``: in order, duplicate, past a gap,
    of another epoch; sometimes a goodbye, sometimes taking it back."""
    view = r.view(source)
    epoch = (view.epoch if view is not None and view.epoch > 0 else 1) + rng.choice((0, 0, 0, 1, -1))
    held = view.seq if view is not None else 0
    seq = max(0, held + rng.choice((1, 1, 1, 0, -1, 2, 3)))
    goodbye = rng.random() < 0.15
    if rng.random() < 0.3:
        return Snapshot(source, epoch, seq, _doc(rng, goodbye), claims=[f"c{rng.randrange(4)}"])
    ops = [[SET, "compute", "memory_mb_used", rng.randrange(4)], [SET, "service", "stopped", goodbye]]
    return Delta(source, epoch, seq, ops, claims=[f"c{rng.randrange(4)}"])


def _step(rng: random.Random, r: ReceiverMachine, now: float) -> None:
    source = rng.choice((A, A, B))
    view = r.view(source)
    kind = rng.randrange(13)
    if kind <= 3:
        r.receive(_item(rng, r, source), now)
    elif kind == 4:
        r.receive(Batch([_item(rng, r, source), _item(rng, r, source)]), now)
    elif kind == 5:
        epoch = view.epoch if view is not None and view.epoch > 0 else 1
        seq = (view.seq if view is not None else 0) + rng.choice((0, 0, 1, -1))
        held = view.digest() if view is not None else None
        r.receive(Heartbeat(source, epoch + rng.choice((0, 0, 0, 1)), max(seq, 0),
                            held if held is not None and rng.random() < 0.7 else b"\x00" * 32), now)
    elif kind == 6:
        items = [_item(rng, r, source) for _ in range(rng.randrange(3))]
        r.receive(ResyncAnswer(source, r.name, items), now)
    elif kind == 7:
        if view is not None and view.doc is not None and rng.random() < 0.5:
            claim_id = f"c{rng.randrange(4)}"
            if claim_id not in view.pending:
                r.add_claim(Claim(claim_id, r.name, source, view.epoch, view.seq, {"vcpus": 1}), now)
        else:
            correction = [_item(rng, r, source)] if rng.random() < 0.7 else []
            r.receive(ClaimResult(f"c{rng.randrange(4)}", r.name, source, rng.random() < 0.3,
                                  view.epoch if view is not None else 1,
                                  view.seq if view is not None else 0, correction=correction), now)
    elif kind == 8:
        r.request_resync(source, now, full=rng.random() < 0.3)
    elif kind == 9:
        r.add_source_hint(source, now)
    elif kind == 10 and rng.random() < 0.3:
        r.forget(source)
    else:
        r.tick(now)


def _check(r: ReceiverMachine) -> None:
    """Each view's state agrees with what it holds (the table moved it, never a field)."""
    for view in r.sources.values():
        state = view.state
        assert state is not SourceState.UNKNOWN
        assert view.down is (state is SourceState.DOWN)
        if state is SourceState.SYNCING:
            assert view.doc is None and view.status is Status.SYNCING
        elif state is SourceState.ACTIVE:
            assert view.doc is not None and view.status is Status.ACTIVE
            assert not view.buffer and view.gap_since is None and view.resync_sent_at is None
            assert not view.want_full and not said_goodbye(view.doc)
        elif state is SourceState.BEHIND:
            assert view.doc is not None and view.status is Status.ACTIVE
            assert view.buffer or view.resync_sent_at is not None or view.want_full
        else:
            assert view.status is (Status.SYNCING if view.doc is None else Status.DOWN)


def test_walks_reach_every_pair_of_the_table_and_no_other():
    moves = _Moves()
    for walk in range(400):
        rng = random.Random(walk)
        r = ReceiverMachine("sched", reorder_window=2, reorder_timeout=0.2, resync_timeout=0.5,
                            resync_backoff_max=2.0, down_interval=5.0, claim_deadline=3.0)
        r.set_observer(moves)
        now = 0.0
        for _ in range(60):
            now += rng.choice((0.0, 0.05, 0.3, 1.0, 6.0))
            _step(rng, r, now)  # a pair missing from the table raises LocalProtocolError
            _check(r)
    missing = set(TRANSITIONS) - moves.seen
    assert not missing, f"entries of the table no walk reached: {sorted(missing)}"

