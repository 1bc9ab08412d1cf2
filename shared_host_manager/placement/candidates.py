"""Allocation candidates from memory: the body of placement's ``GET /allocation_candidates``.

Role: given a :class:`~.state.ProviderState` and a :class:`~.query.CandidateQuery`,
return exactly the JSON object placement returns (parsed: lists and dicts),
or an :class:`~.query.Unanswered` when the state or the query is outside the
covered set (see :mod:`.query` for the reasons).

The covered set: no sharing provider and the unsuffixed group alone (a
flavor's classes, a vGPU among them; nova asks for PCI devices in placement
and for ports' bandwidth in granular groups).  Two code paths of placement's
are reproduced:

* **roots** -- without provider trees placement takes
  ``get_provider_ids_matching`` and ``_alloc_candidates_single_provider``;
  with trees but a request whose classes only roots hold, its tree path
  (below) offers each tree's root alone, filtered as on a root, so the same
  vector answer serves both, its summaries extended to every provider of
  each candidate's tree.  A provider is a candidate when it has, for every
  requested class, an inventory with ``min_unit <= amount <= max_unit``,
  ``amount % step_size == 0`` and ``used + amount <= (total - reserved) *
  allocation_ratio`` (SQL, in doubles: ``_capacity_check_clause``); every
  required any-of trait set meets its traits, no forbidden trait, every
  ``member_of`` any-of set meets its aggregates, no forbidden aggregate,
  ``in_tree``'s root is the provider, and the ``root_required`` traits hold
  on it (it is its own root); then the merge step's capacity check on the
  Python side (``RequestWideSearchContext.exceeds_capacity``: ``used + amount
  > int((total - reserved) * ratio)``, or, with ``[workarounds]
  optimize_for_wide_provider_trees``, ``amount > capacity``), which differs
  from the SQL one only where the database keeps the ratio in single
  precision (``allocation_ratio_storage = "single"``).  One allocation
  request per candidate, ``{"allocations": {rp: {"resources": {rc:
  amount}}}, "mappings": {"": [rp]}}``;
* **trees** -- a requested class some tree member holds (a vGPU):
  ``get_trees_matching_all`` and ``_alloc_candidates_multiple_providers``
  (:func:`tree_combinations`).  Per class, the providers of each tree that
  pass the same capacity tests, are in every ``member_of`` set themselves or
  through their root, are in no forbidden aggregate and have no root in one,
  carry no forbidden trait, and have an anchor root (``root_required``) in
  ``in_tree``'s tree; each product of one such provider per class whose
  providers together carry every required any-of set is an allocation
  request, ``{"allocations": {rp: {"resources": {...}}, ...}, "mappings":
  {"": [rp, ...]}}``.

Then, on both paths: one provider summary per provider of every answered
tree (every inventory's capacity and usage, its traits, its parent and root:
microversion >= 1.29, so all of them here; ``_build_provider_summaries``
over the trees, ``_merge_candidates``, ``limit_results``); ``[placement]
max_allocation_candidates`` stops the generation after that many, then
``limit`` keeps ``limit`` of them -- a random sample when
``randomize_allocation_candidates`` is set, the first ones otherwise -- and
without a limit (or a larger one) randomize shuffles them
(``RequestWideSearchContext.limit_results``).

Order: placement's candidates come out of Python sets keyed by string hashes,
so their order (and which ones the first ``limit`` are) is unspecified; here
they follow the state's slot order, and the random choices come from the
``rng`` the caller passes (sans-IO: nothing here reads a clock or a global
random source).

Life cycle: none; :func:`allocation_candidates` is a pure function of its
arguments (the state's summaries are cached in the state, per provider).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from shared_host_manager.placement.query import (
    CandidateQuery,
    Unanswered,
    parse_querystring,
)
from shared_host_manager.placement.state import BoolArray, ProviderState


class RandomSource(Protocol):
    """What placement's limit_results uses of the random module."""

    def sample(self, population: Sequence[Any], k: int) -> list[Any]: ...

    def shuffle(self, x: list[Any]) -> None: ...


@dataclass(frozen=True)
class PlacementConfig:
    """The placement options that change the answer (names as in placement.conf)."""

    #: [placement] randomize_allocation_candidates
    randomize_allocation_candidates: bool = False
    #: [placement] max_allocation_candidates (-1: no limit)
    max_allocation_candidates: int = -1
    #: [workarounds] optimize_for_wide_provider_trees
    optimize_for_wide_provider_trees: bool = False


def state_reason(state: ProviderState) -> Unanswered | None:
    """Why no request can be answered from this state, or None."""
    if state.sharing:
        return Unanswered("sharing_provider", f"{len(state.sharing)} sharing provider(s), e.g. "
                          f"{min(state.sharing)}")
    if state.noncanonical:
        return Unanswered("noncanonical_uuid", f"provider or aggregate uuid of {min(state.noncanonical)}")
    return None


def _any_of(masks: list[BoolArray | None], n: int) -> BoolArray:
    out = np.zeros(n, dtype=np.bool_)
    for m in masks:
        if m is not None:
            out |= m
    return out


def matching_slots(state: ProviderState, query: CandidateQuery,
                   config: PlacementConfig = PlacementConfig()) -> np.ndarray:
    """Slots of the providers placement returns a candidate for, in slot order."""
    n = state.capacity
    ok = state.alive.copy()
    for rc, amount in query.resources:
        cols = state.columns(rc)
        if cols is None:
            return np.zeros(0, dtype=np.int64)
        want = cols.used + amount
        ok &= cols.has
        ok &= cols.min_unit <= amount
        ok &= cols.max_unit >= amount
        ok &= np.remainder(amount, cols.step) == 0
        ok &= want <= cols.avail
        if config.optimize_for_wide_provider_trees:
            ok &= amount <= cols.cap
        else:
            ok &= want <= cols.cap
    # a trait no provider carries has no mask: any-of over nothing matches nothing
    for any_of in query.required:
        ok &= _any_of([state.trait_mask(t) for t in any_of], n)
    for t in query.forbidden | query.root_forbidden:
        m = state.trait_mask(t)
        if m is not None:
            ok &= ~m
    for t in query.root_required:
        m = state.trait_mask(t)
        if m is None:
            return np.zeros(0, dtype=np.int64)
        ok &= m
    for any_aggs in query.member_of:
        ok &= _any_of([state.aggregate_mask(a) for a in any_aggs], n)
    if query.forbidden_aggregates:
        ok &= ~_any_of([state.aggregate_mask(a) for a in query.forbidden_aggregates], n)
    if query.in_tree is not None:
        p = state.get(query.in_tree)
        if p is None:
            return np.zeros(0, dtype=np.int64)
        root = state.slot_of(p.root_provider_uuid)
        if root is None:
            return np.zeros(0, dtype=np.int64)
        only = np.zeros(n, dtype=np.bool_)
        only[root] = True
        ok &= only
    return np.flatnonzero(ok)


def allocation_candidates(state: ProviderState, query: CandidateQuery | Unanswered,
                          config: PlacementConfig = PlacementConfig(),
                          rng: RandomSource | None = None) -> dict[str, Any] | Unanswered:
    """Placement's ``GET /allocation_candidates`` body for ``query`` on ``state``, or why not.

    ``rng`` is used only with ``randomize_allocation_candidates`` (required then).
    The allocation requests and provider summaries are the state's cached
    ones (shared, read-only: see :meth:`ProviderState.body`).
    """
    if isinstance(query, Unanswered):
        return query
    why = state_reason(state)
    if why is not None:
        return why
    for rc, _ in query.resources:
        if not state.resource_class_known(rc):
            return Unanswered("unknown_resource_class", rc)
    for t in sorted(query.trait_names):
        if not state.trait_known(t):
            return Unanswered("unknown_trait", t)
    if config.randomize_allocation_candidates and rng is None:
        raise ValueError("randomize_allocation_candidates needs a random source")

    mappings = query.microversion >= (1, 34)
    if any(state.member_holds(rc) for rc, _ in query.resources):
        combos = cast(Sequence[Combination],
                      _limited(list(tree_combinations(state, query, config)), query, config, rng))
        return _tree_body(state, combos, query.resources, mappings)
    slots: Any = _limited(matching_slots(state, query, config), query, config, rng)
    return state.body(slots, query.resources, mappings)


_T = TypeVar("_T")


def _limited(candidates: Sequence[_T] | npt.NDArray[Any], query: CandidateQuery,
             config: PlacementConfig, rng: RandomSource | None) -> Sequence[_T] | npt.NDArray[Any]:
    """``[placement] max_allocation_candidates``, then ``limit`` (a sample when randomized), or
    the whole list shuffled when randomized (placement's _merge_candidates, limit_results)."""
    if config.max_allocation_candidates >= 0:
        candidates = candidates[:config.max_allocation_candidates]
    limit = query.limit
    if limit and limit < len(candidates):
        if config.randomize_allocation_candidates:
            assert rng is not None
            return rng.sample(list(candidates), limit)
        return candidates[:limit]
    if config.randomize_allocation_candidates:
        assert rng is not None
        shuffled = list(candidates)
        rng.shuffle(shuffled)
        return shuffled
    return candidates


#: one allocation request of the tree path: its tree's root slot, and the provider slot of each
#: requested class, in the query's order of classes
Combination = tuple[int, tuple[int, ...]]


def tree_combinations(state: ProviderState, query: CandidateQuery,
                      config: PlacementConfig = PlacementConfig()) -> Iterator[Combination]:
    """Every allocation request placement's tree path offers (``get_trees_matching_all``,
    ``_alloc_candidates_multiple_providers``), trees in slot order.

    Per requested class, a provider of a tree can serve it when it passes the capacity
    filter (SQL) and the merge step's check, it or its root is in every ``member_of`` set,
    neither it nor its root is in a forbidden aggregate, it has no forbidden trait, its
    root is an anchor (``root_required``) and, with ``in_tree``, in that tree.  Each
    product of one such provider per class is a candidate when the providers in it
    together carry every required any-of set.  placement's tree-wide trait prefilter
    (``_get_trees_with_traits``) keeps every tree that has such a product, so it changes
    nothing here.
    """
    n = state.capacity
    roots = state.root_slot
    held = roots >= 0
    at = np.where(held, roots, 0)
    common = state.alive & held
    if query.root_required or query.root_forbidden:
        anchors = state.alive & ~state.member
        for t in query.root_required:
            m = state.trait_mask(t)
            if m is None:
                return
            anchors = anchors & m
        for t in query.root_forbidden:
            m = state.trait_mask(t)
            if m is not None:
                anchors = anchors & ~m
        common &= anchors[at]
    if query.member_of:
        inside = np.ones(n, dtype=np.bool_)
        for any_aggs in query.member_of:
            inside &= _any_of([state.aggregate_mask(a) for a in any_aggs], n)
        common &= inside | inside[at]
    if query.forbidden_aggregates:
        bad = _any_of([state.aggregate_mask(a) for a in query.forbidden_aggregates], n)
        common &= ~bad & ~bad[at]
    for t in query.forbidden:
        m = state.trait_mask(t)
        if m is not None:
            common &= ~m
    if query.in_tree is not None:
        p = state.get(query.in_tree)
        root = None if p is None else state.slot_of(p.root_provider_uuid)
        if root is None:
            return
        common &= roots == root
    serving: list[BoolArray] = []
    for rc, amount in query.resources:
        cols = state.columns(rc)
        if cols is None:
            return
        want = cols.used + amount
        ok = common & cols.has & (cols.min_unit <= amount) & (cols.max_unit >= amount)
        ok &= np.remainder(amount, cols.step) == 0
        ok &= want <= cols.avail
        ok &= (amount <= cols.cap) if config.optimize_for_wide_provider_trees else (want <= cols.cap)
        serving.append(ok)
    # the trees with a provider for every class (placement's merge_common_trees)
    trees = np.ones(n, dtype=np.bool_)
    for ok in serving:
        has = np.zeros(n, dtype=np.bool_)
        has[roots[ok]] = True
        trees &= has
    if not trees.any():
        return
    by_class: list[dict[int, list[int]]] = []
    for ok in serving:
        ok = ok & trees[at]
        servers: dict[int, list[int]] = {}
        for slot, root in zip(np.flatnonzero(ok).tolist(), roots[ok].tolist(), strict=True):
            servers.setdefault(root, []).append(slot)
        by_class.append(servers)
    for root in np.flatnonzero(trees).tolist():
        for combo in itertools.product(*(servers[root] for servers in by_class)):
            if query.required:
                carried = frozenset().union(*(state.provider_at(slot).traits for slot in set(combo)))
                if not all(any_of & carried for any_of in query.required):
                    continue
            yield root, combo


def _tree_body(state: ProviderState, combos: Sequence[Combination],
               resources: tuple[tuple[str, int], ...], mappings: bool) -> dict[str, Any]:
    """The response body of the tree path: an allocation request per combination, and the
    summaries of every provider of their trees."""
    requests = []
    for _, combo in combos:
        allocations: dict[str, Any] = {}
        for slot, (rc, amount) in zip(combo, resources, strict=True):
            u = state.provider_at(slot).uuid
            allocations.setdefault(u, {"resources": {}})["resources"][rc] = amount
        ar: dict[str, Any] = {"allocations": allocations}
        if mappings:
            ar["mappings"] = {"": list(allocations)}
        requests.append(ar)
    trees = dict.fromkeys(state.provider_at(root).uuid for root, _ in combos)
    return {"allocation_requests": requests, "provider_summaries": state.tree_summaries(trees)}


def answer(state: ProviderState, querystring: str, microversion: str = "1.36",
           config: PlacementConfig = PlacementConfig(),
           rng: random.Random | None = None) -> dict[str, Any] | Unanswered:
    """:func:`allocation_candidates` of a querystring as nova sends it."""
    return allocation_candidates(state, parse_querystring(querystring, microversion), config, rng)


__all__ = ["Combination", "PlacementConfig", "RandomSource", "allocation_candidates", "answer",
           "matching_slots", "state_reason", "tree_combinations"]
