"""Allocation candidates from memory: the body of placement's ``GET /allocation_candidates``.

Role: given a :class:`~.state.ProviderState` and a :class:`~.query.CandidateQuery`,
return exactly the JSON object placement returns (parsed: lists and dicts),
or an :class:`~.query.Unanswered` when the state or the query is outside the
covered set (see :mod:`.query` for the reasons).

The covered set: no sharing provider, the unsuffixed group alone, and
every requested resource class held by root providers only.  Without
provider trees placement takes ``get_provider_ids_matching`` and
``_alloc_candidates_single_provider``.  With trees (a vGPU, a PCI device or
a network device under some compute node) it takes ``get_trees_matching_all``
and ``_alloc_candidates_multiple_providers``; when only roots hold the
requested classes, every tree offers one combination, its root, and the
tree-wide filters -- aggregates of the provider or its root
(``filter_by_rp_or_tree``), traits the tree's matching providers carry
together (``_get_trees_with_traits``, ``_check_traits_for_alloc_request``),
``in_tree``'s root -- reduce to the same tests on the root.  The one
difference is the summaries: placement summarises every provider of each
candidate's tree (``_build_provider_summaries`` over the trees,
``_merge_candidates``, ``limit_results``).  A request for a class a tree
member holds is left to placement (``nested_provider``).  What placement
does for the covered set, and how it is reproduced here:

* a provider is a candidate when it has, for every requested class, an
  inventory with ``min_unit <= amount <= max_unit``, ``amount % step_size == 0``
  and ``used + amount <= (total - reserved) * allocation_ratio`` (SQL,
  in doubles: ``_capacity_check_clause``); every required any-of trait set
  meets its traits, no forbidden trait, every ``member_of`` any-of set meets
  its aggregates, no forbidden aggregate, ``in_tree``'s root is the
  provider, and the ``root_required`` traits hold on it (it is its own root);
* then the merge step's capacity check on the Python side
  (``RequestWideSearchContext.exceeds_capacity``: ``used + amount >
  int((total - reserved) * ratio)``, or, with ``[workarounds]
  optimize_for_wide_provider_trees``, ``amount > capacity``), which differs
  from the SQL one only where the database keeps the ratio in single
  precision (``allocation_ratio_storage = "single"``);
* one allocation request per candidate, ``{"allocations": {rp: {"resources":
  {rc: amount}}}, "mappings": {"": [rp]}}``, and one provider summary per
  provider of the candidate's tree: every inventory's capacity and usage,
  its traits, its parent and root (microversion >= 1.29, so all of them
  here);
* ``[placement] max_allocation_candidates`` stops the generation after that
  many, then ``limit`` keeps ``limit`` of them -- a random sample when
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

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

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
    for rc, _ in query.resources:
        member = state.member_holding(rc)
        if member is not None:
            return Unanswered("nested_provider", f"{rc} is held by tree member(s), e.g. {member}")
    if config.randomize_allocation_candidates and rng is None:
        raise ValueError("randomize_allocation_candidates needs a random source")

    slots: Any = matching_slots(state, query, config)
    if config.max_allocation_candidates >= 0:
        slots = slots[:config.max_allocation_candidates]
    limit = query.limit
    if limit and limit < len(slots):
        if config.randomize_allocation_candidates:
            assert rng is not None
            slots = rng.sample(slots.tolist(), limit)
        else:
            slots = slots[:limit]
    elif config.randomize_allocation_candidates:
        assert rng is not None
        slots = slots.tolist()
        rng.shuffle(slots)

    return state.body(slots, query.resources, query.microversion >= (1, 34))


def answer(state: ProviderState, querystring: str, microversion: str = "1.36",
           config: PlacementConfig = PlacementConfig(),
           rng: random.Random | None = None) -> dict[str, Any] | Unanswered:
    """:func:`allocation_candidates` of a querystring as nova sends it."""
    return allocation_candidates(state, parse_querystring(querystring, microversion), config, rng)


__all__ = ["PlacementConfig", "RandomSource", "allocation_candidates", "answer", "matching_slots",
           "state_reason"]
