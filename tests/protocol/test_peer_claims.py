"""The receiver's peer-claim ledger (protocol/receiver.py module docstring, design §5.2).

A live peer announces each claim it sends to its host; this scheduler deducts it until
the host's delta or snapshot lists it, the host's rejection (forwarded by the peer)
arrives, its epoch changes, or ``peer_claim_ttl`` passes.  The property test drives a
real arbiter (``SourceMachine``) with claims of two peers and of this scheduler, and
delivers to the receiver, in any interleaving, the host's stream (in order, late), its
rejections (late, or lost), the announcements (late, duplicated, after their inclusion, of
another epoch, reusing the id of one of our claims), restarts of the host (a new epoch)
and ticks; after every step both ledgers add up (:func:`_check`).
"""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.messages import Claim, ClaimResult, Delta, Snapshot
from protocol.receiver import ReceiverMachine
from protocol.source import SourceMachine
from simulator.synthetic_hosts import host_doc

HOST = "cn0"
EPOCH = 7
TTL = 1.0


def _host() -> SourceMachine:
    return SourceMachine(HOST, EPOCH, host_doc("h0", vcpus=8, cpu_ratio=1.0, memory_mb=8192,
                                                 disk_gb=100), coalesce_window=0.0)


def _me() -> ReceiverMachine:
    return ReceiverMachine("me", peer_claim_ttl=TTL, claim_deadline=30.0, down_interval=1e9)


def _sum(ledger) -> dict[str, int]:
    usage: dict[str, int] = {}
    for held in ledger.values():
        for r, a in held.claim.resources.items():
            usage[r] = usage.get(r, 0) + a
    return {r: a for r, a in usage.items() if a}


def _check(me: ReceiverMachine, announced: dict[str, Claim], included: set[str],
           rejected: set[str]) -> None:
    view = me.sources[HOST]
    for claim_id, held in view.peer.items():
        # only what a peer announced, never what the document already includes, never ours
        assert claim_id in announced and claim_id not in included
        assert held.claim.scheduler != me.name and claim_id not in view.pending
        assert held.claim.instance not in (view.doc or {}).get("instances", {})
        assert claim_id not in rejected
        # of the epoch held: a restart of the host dropped the older epoch's
        assert held.claim.epoch == view.epoch
    # each ledger's usage is the sum of the claims it holds, and never negative
    assert _sum(view.peer) == view.peer_usage and all(a > 0 for a in view.peer_usage.values())
    assert _sum(view.pending) == view.pending_usage
    assert all(a > 0 for a in view.pending_usage.values())
    assert all(held.claim.scheduler == me.name for held in view.pending.values())
    # a peer's claim is not ours: it never yields an outcome
    assert all(claim_id.startswith(f"{me.name}:") for claim_id, _, _ in me.drain_outcomes())


steps = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(["p1", "p2", "me"]), st.integers(1, 5)),
    st.tuples(st.just("judge")),
    st.tuples(st.just("stream")),
    st.tuples(st.just("announce"), st.booleans(), st.integers(0, 7)),
    st.tuples(st.just("tick"), st.floats(0.0, 0.6)),
    st.tuples(st.just("verdict"), st.booleans()),
    st.tuples(st.just("stale")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("spoof")),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_peer_claims_are_held_until_their_host_lists_them_or_their_ttl(ops):
    host, me = _host(), _me()
    now = 0.0
    me.receive(host.snapshot(), now)
    to_judge: deque[Claim] = deque()
    to_announce: deque[Claim] = deque()
    stream: deque[Delta | Snapshot] = deque()
    verdicts: deque[ClaimResult] = deque()
    rejected: set[str] = set()
    announced: dict[str, Claim] = {}
    included: set[str] = set()
    n = 0
    epoch = EPOCH
    for op in ops:
        kind = op[0]
        if kind == "claim":
            n += 1
            view = me.sources[HOST]
            claim = Claim(f"{op[1]}:{n}", op[1], HOST, view.epoch, view.seq,
                          {"vcpus": op[2], "memory_mb": 512 * op[2]}, f"inst-{n}")
            to_judge.append(claim)
            if op[1] == me.name:  # ours: pending here, and echoed back by the fanout
                me.add_claim(claim, now)
                me.receive(claim, now)
                assert claim.claim_id not in view.peer
            else:
                to_announce.append(claim)
        elif kind == "judge" and to_judge:
            for send in host.handle_claim(to_judge.popleft(), now):
                if send.to is None:
                    stream.append(send.message)
                elif not send.message.accepted:
                    verdicts.append(send.message)
        elif kind == "verdict" and verdicts:  # False: the forwarded rejection is lost
            result = verdicts.popleft()
            if op[1] and result.scheduler == me.name:  # our own rejection: retires, corrects
                me.receive(result, now)
                assert result.claim_id not in me.sources[HOST].pending
            elif op[1]:
                version = me.sources[HOST].version
                me.receive(result, now)
                rejected.add(result.claim_id)
                assert result.claim_id not in me.sources[HOST].peer
                assert me.sources[HOST].version == version  # its correction is not ours
        elif kind == "stream" and stream:
            item = stream.popleft()
            me.receive(item, now)
            included.update(item.claims)
        elif kind == "announce" and to_announce:  # any one in flight; True: delivered twice
            i = op[2] % len(to_announce)
            claim = to_announce[i]
            if not op[1]:
                del to_announce[i]
            announced[claim.claim_id] = claim
            me.receive(claim, now)
        elif kind == "tick":
            now += op[1]
            me.tick(now)
            assert all(h.deadline > now for h in me.sources[HOST].peer.values())
        elif kind == "stale":  # a peer decided on an epoch this view does not hold
            me.receive(Claim(f"old:{n}", "p1", HOST, me.sources[HOST].epoch - 1, 0, {"vcpus": 1},
                             "x"), now)
            assert f"old:{n}" not in me.sources[HOST].peer
        elif kind == "restart":  # the host restarts: a new epoch, its snapshot after its stream
            epoch += 1
            host = SourceMachine(HOST, epoch, host.document, coalesce_window=0.0)
            stream.append(host.snapshot())
        elif kind == "spoof":  # a peer's announcement reusing the id of a claim of ours
            view = me.sources[HOST]
            for claim_id in list(view.pending)[:1]:
                me.receive(Claim(claim_id, "p2", HOST, view.epoch, view.seq, {"vcpus": 1},
                                 "inst-spoof"), now)
                assert claim_id not in view.peer
        _check(me, announced, included, rejected)
    # once the host has said everything and the ttl has passed, nothing is held
    while to_judge:
        for send in host.handle_claim(to_judge.popleft(), now):
            if send.to is None:
                stream.append(send.message)
    for item in stream:
        me.receive(item, now)
        included.update(item.claims)
    for claim in to_announce:
        announced[claim.claim_id] = claim
        me.receive(claim, now)
    _check(me, announced, included, rejected)
    me.tick(now + TTL)
    view = me.sources[HOST]
    assert not view.peer and not view.peer_usage
    assert me.stats["peer_claims"] == (me.stats["peer_claims_included"]
                                       + me.stats["peer_claims_rejected"]
                                       + me.stats["peer_claims_expired"])


def test_a_peer_claim_counts_in_the_usable_view_until_its_delta_and_an_echo_is_ignored():
    host, me = _host(), _me()
    me.receive(host.snapshot(), 0.0)
    claim = Claim("p1:1", "p1", HOST, EPOCH, 0, {"vcpus": 6}, "inst-1")
    me.receive(claim, 0.0)
    view = me.sources[HOST]
    assert view.peer_usage == {"vcpus": 6}
    assert HOST in me.drain_changed()  # the index refreshes the row
    me.receive(Claim("me:1", "me", HOST, EPOCH, 0, {"vcpus": 1}, "inst-2"), 0.0)  # our own, echoed
    assert view.peer_usage == {"vcpus": 6} and me.stats["peer_claims_ignored"] == 1
    (delta,) = [s.message for s in host.handle_claim(claim, 0.01) if s.to is None]
    me.receive(delta, 0.02)
    assert not view.peer and not view.peer_usage
    assert me.stats["peer_claims_included"] == 1
    # announced again after its inclusion (a slow cast): the instance is in the document
    me.receive(claim, 0.03)
    assert not view.peer and me.stats["peer_claims_ignored"] == 2


def test_a_new_epoch_drops_the_peer_claims_of_the_old_one():
    host, me = _host(), _me()
    me.receive(host.snapshot(), 0.0)
    me.receive(Claim("p1:1", "p1", HOST, EPOCH, 0, {"vcpus": 2}, "inst-1"), 0.0)
    restarted = SourceMachine(HOST, EPOCH + 1, host.document, coalesce_window=0.0)
    me.receive(restarted.snapshot(), 0.1)
    view = me.sources[HOST]
    assert not view.peer and not view.peer_usage and me.stats["peer_claims_expired"] == 1


def test_the_hosts_rejection_forwarded_ends_a_peer_claim_and_nothing_else_of_it_applies():
    host, me = _host(), _me()
    me.receive(host.snapshot(), 0.0)
    me.receive(Claim("p1:1", "p1", HOST, EPOCH, 0, {"vcpus": 2}, "inst-1"), 0.0)
    too_big = Claim("p1:2", "p1", HOST, EPOCH, 0, {"vcpus": 64}, "inst-2")
    me.receive(too_big, 0.0)
    view = me.sources[HOST]
    assert view.peer_usage == {"vcpus": 66}
    (result,) = [s.message for s in host.handle_claim(too_big, 0.01) if s.to == "p1"]
    assert not result.accepted
    me.receive(result, 0.02)
    assert sorted(view.peer) == ["p1:1"] and view.peer_usage == {"vcpus": 2}
    assert me.stats["peer_claims_rejected"] == 1 and me.stats["claim_results_foreign"] == 0
    # an acceptance of a peer's claim, or a rejection of one we do not hold, is foreign
    accepted = ClaimResult("p1:1", "p1", HOST, True, EPOCH, 1)
    me.receive(accepted, 0.03)
    me.receive(result, 0.03)
    assert sorted(view.peer) == ["p1:1"] and me.stats["claim_results_foreign"] == 2
    assert me.drain_outcomes() == []
