"""The placement view's peers' claims against a model of their rules (design §11).

Random sequences of what reaches a scheduler -- the placement feed's copies of
two providers (the same generation read again, or a newer one), peers'
intents and acceptances of claims (on either provider, of any size, repeated),
hosts' rejections, and time passing -- are applied to a PlacementView and to
the few lines below that state the rules; after each step every provider's
usage must be the feed's plus the claims the rules hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared_host_manager.placement.view import PlacementView

TTL = 1.0
PROVIDERS = ("00000001-0000-4000-8000-000000000001", "00000002-0000-4000-8000-000000000002")


def provider(uuid: str, gen: int, used: int) -> dict[str, Any]:
    return {"uuid": uuid, "name": uuid[:8], "generation": gen,
            "inventories": {"VCPU": {"total": 64}}, "usages": {"VCPU": used},
            "traits": [], "aggregates": []}


@dataclass
class Held:
    rp: str
    amount: int
    until: float
    accepted_at: int | None = None  # the provider's generation when the acceptance came
    retired: bool = False


class Model:
    """The rules, as design §11 states them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.base = {u: (1, 0) for u in PROVIDERS}  # uuid -> (generation, used)
        self.claims: dict[str, Held] = {}

    def expire(self) -> None:
        self.claims = {c: h for c, h in self.claims.items() if h.until > self.now}

    def note(self, claim: str, rp: str, amount: int, accepted: bool) -> None:
        self.expire()
        held = self.claims.get(claim)
        if held is not None and (held.retired or not accepted):
            return  # announced again
        if held is not None and (held.rp, held.amount) != (rp, amount):
            held = None  # accepted on another provider than intended: moved
        if held is None:
            held = self.claims[claim] = Held(rp, amount, 0.0)
        if accepted:
            held.accepted_at = self.base[rp][0]
        held.until = self.now + TTL

    def feed(self, rp: str, gen: int, used: int) -> None:
        if gen > self.base[rp][0]:
            for held in self.claims.values():
                if held.rp == rp and not held.retired and held.accepted_at is not None \
                        and gen > held.accepted_at:
                    held.retired = True
        self.base[rp] = (gen, used)

    def reject(self, claim: str) -> None:
        held = self.claims.get(claim)
        if held is not None and not held.retired:
            del self.claims[claim]

    def usage(self, rp: str) -> int:
        self.expire()
        return self.base[rp][1] + sum(h.amount for h in self.claims.values()
                                      if h.rp == rp and not h.retired)


CLAIMS = st.sampled_from(["a", "b", "c", "d"])
RPS = st.sampled_from(PROVIDERS)
STEPS = st.one_of(
    st.tuples(st.just("intent"), CLAIMS, RPS, st.integers(1, 3)),
    st.tuples(st.just("accept"), CLAIMS, RPS, st.integers(1, 3)),
    st.tuples(st.just("feed"), RPS, st.booleans(), st.integers(0, 20)),
    st.tuples(st.just("reject"), CLAIMS),
    st.tuples(st.just("tick"), st.sampled_from([0.1, 0.4, 0.9, 1.5])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEPS, max_size=40))
def test_every_provider_counts_the_feed_and_the_claims_the_rules_hold(steps: list[tuple[Any, ...]]) -> None:
    model = Model()
    view = PlacementView(clock=lambda: model.now, peer_claim_ttl=TTL, max_staleness=1e9)
    view.apply_providers({u: provider(u, 1, 0) for u in PROVIDERS}, model.now)
    for step in steps:
        kind = step[0]
        if kind in ("intent", "accept"):
            _, claim, rp, amount = step
            view.note_peer_claim(claim, {rp: {"VCPU": amount}}, accepted=kind == "accept")
            model.note(claim, rp, amount, kind == "accept")
        elif kind == "feed":
            _, rp, newer, used = step
            gen = model.base[rp][0] + (1 if newer else 0)
            view.apply_providers({rp: provider(rp, gen, used)}, model.now)
            model.feed(rp, gen, used)
        elif kind == "reject":
            view.drop_peer_claim(step[1])
            model.reject(step[1])
        else:
            model.now += step[1]
        for rp in PROVIDERS:
            held = view.provider(rp)
            assert held is not None
            assert held["usages"]["VCPU"] == model.usage(rp), (step, rp)
        assert view.status()["peer_claims_held"] == sum(
            1 for h in model.claims.values() if not h.retired)
