"""Allocation candidates from memory: the body of placement's ``GET /allocation_candidates``.

Role: given a :class:`~.state.ProviderState` and a :class:`~.query.CandidateQuery`,
return exactly the JSON object placement returns (parsed: lists and dicts),
or an :class:`~.query.Unanswered` when the state or the query is outside the
covered set (see :mod:`.query` for the reasons).

The covered set: every request of microversion 1.36 to 1.39, but one asking
a class in several groups under a ``group_policy`` other than ``none``, one
with suffixed groups whose unsuffixed candidate several trees borrow from
sharing providers alone, and any while a sharing provider is a tree member
(see :mod:`.query`).  placement's code paths are
reproduced:

* **roots** -- a request without suffixed groups: without provider trees
  placement takes ``get_provider_ids_matching`` and
  ``_alloc_candidates_single_provider``; with trees but a request whose
  classes only roots hold, its tree path (below) offers each tree's root
  alone, filtered as on a root, so the same vector answer serves both, its
  summaries extended to every provider of each candidate's tree.  A
  provider is a candidate when it has, for every requested class, an
  inventory with ``min_unit <= amount <= max_unit``, ``amount % step_size ==
  0`` and ``used + amount <= (total - reserved) * allocation_ratio`` (SQL, in
  doubles: ``_capacity_check_clause``); every required any-of trait set
  meets its traits, no forbidden trait, every ``member_of`` any-of set meets
  its aggregates, no forbidden aggregate, ``in_tree``'s root is the
  provider, and the ``root_required`` traits hold on it (it is its own
  root); then the merge step's capacity check on the Python side
  (``RequestWideSearchContext.exceeds_capacity``: ``used + amount >
  int((total - reserved) * ratio)``, or, with ``[workarounds]
  optimize_for_wide_provider_trees``, ``amount > capacity``), which differs
  from the SQL one only where the database keeps the ratio in single
  precision (``allocation_ratio_storage = "single"``).  One allocation
  request per candidate, ``{"allocations": {rp: {"resources": {rc:
  amount}}}, "mappings": {"": [rp]}}``;
* **trees** -- a requested class some tree member holds (a flavor's VGPU):
  ``get_trees_matching_all`` and ``_alloc_candidates_multiple_providers``
  (:func:`tree_combinations`).  Per class, the providers of each tree that
  pass the same capacity tests, are in every ``member_of`` set themselves or
  through their root, are in no forbidden aggregate and have no root in one,
  carry no forbidden trait, and have an anchor root (``root_required``) in
  ``in_tree``'s tree; each product of one such provider per class whose
  providers together carry every required any-of set is an allocation
  request, ``{"allocations": {rp: {"resources": {...}}, ...}, "mappings":
  {"": [rp, ...]}}``;
* **suffixed groups** (nova's PCI devices in placement, ports' bandwidth, a
  flavor's numbered groups): each suffixed group on one provider that
  passes every test of the group on itself (:func:`group_slots`), the
  unsuffixed group as above; within each tree every product of one
  candidate per group (placement's ``_merge_candidates``), under
  ``group_policy=isolate`` with the suffixed groups on distinct providers,
  the amounts one provider gives several groups summed and checked again,
  each ``same_subtree`` set's providers under one of them (:func:`_merged`);
  a resourceless group (``same_subtree`` only) takes a provider its traits
  or aggregates select, wherever it is in the tree (placement's tree filter
  is in its capacity query); mappings per group suffix;
* **sharing providers** (``MISC_SHARES_VIA_AGGREGATE``: a storage pool's
  DISK_GB, say): while one is held placement takes the tree path for the
  unsuffixed group, where a sharing provider also serves a class in the tree
  of every provider in one of its aggregates (``anchors_for_sharing_providers``),
  and a suffixed group's sharing provider is offered to each of those trees
  too (``_alloc_candidates_single_provider``); one allocation request lent to
  several trees is one candidate (placement's sets).  A request whose classes
  no sharing provider holds keeps the vector answer.

Then, on every path: one provider summary per provider of the tree of each
provider a candidate claims from (every inventory's capacity and usage, its
traits, its parent and root: microversion >= 1.29, so all of them here;
``_build_provider_summaries`` over the trees, ``_merge_candidates``,
``limit_results``); ``[placement]
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from shared_host_manager.placement.query import (
    CandidateQuery,
    GroupQuery,
    Unanswered,
    parse_querystring,
)
from shared_host_manager.placement.state import BoolArray, IntArray, ProviderState


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
    for u in state.sharing:
        p = state.get(u)
        if p is not None and p.nested:
            # placement summarises the trees of the roots it nominated, so a request that
            # nominates a tree member's sharing provider but not its root fails with a 500
            # (KeyError in _alloc_candidates_multiple_providers)
            return Unanswered("sharing_provider", f"sharing provider {u} is a tree member")
    if state.noncanonical:
        return Unanswered("noncanonical_uuid", f"provider or aggregate uuid of {min(state.noncanonical)}")
    return None


def _any_of(masks: list[BoolArray | None], n: int) -> BoolArray:
    out = np.zeros(n, dtype=np.bool_)
    for m in masks:
        if m is not None:
            out |= m
    return out


def _fits(state: ProviderState, rc: str, amount: int, config: PlacementConfig) -> BoolArray | None:
    """The providers with room for ``amount`` of ``rc`` alone (None: no provider has the class):
    placement's SQL capacity filter (``_capacity_check_clause``), then its merge step's check
    of one group's amount (``exceeds_capacity``; with several groups on one provider the
    merge checks their sum again, see :func:`_merged`)."""
    cols = state.columns(rc)
    if cols is None:
        return None
    want = cols.used + amount
    ok = cols.has & (cols.min_unit <= amount) & (cols.max_unit >= amount)
    ok &= np.remainder(amount, cols.step) == 0
    ok &= want <= cols.avail
    ok &= (amount <= cols.cap) if config.optimize_for_wide_provider_trees else (want <= cols.cap)
    return ok


def _carrying_any(state: ProviderState, traits: frozenset[str]) -> BoolArray:
    """The providers carrying any of ``traits`` (none when no provider carries one)."""
    return _any_of([state.trait_mask(t) for t in traits], state.capacity)


def _tree_of(state: ProviderState, in_tree: str) -> int | None:
    """The root slot of ``in_tree``'s tree, or None when the provider or its root is not held."""
    p = state.get(in_tree)
    return None if p is None else state.slot_of(p.root_provider_uuid)


def _lent_to(state: ProviderState, slot: int) -> BoolArray:
    """The roots a sharing provider lends its inventory to (placement's
    ``anchors_for_sharing_providers``): the root of every provider in one of its aggregates,
    its own among them; none when it is in no aggregate."""
    near = _any_of([state.aggregate_mask(a) for a in state.provider_at(slot).aggregates],
                   state.capacity) & state.alive
    roots = state.root_slot[near]
    to = np.zeros(state.capacity, dtype=np.bool_)
    to[roots[roots >= 0]] = True
    return to


def _anchors(state: ProviderState, query: CandidateQuery) -> BoolArray | None:
    """The root providers ``root_required`` admits (placement's anchor roots), or None when
    the request names no root trait."""
    if not (query.root_required or query.root_forbidden):
        return None
    anchors = state.alive & ~state.member if state.has_trees else state.alive.copy()
    for t in query.root_required:
        m = state.trait_mask(t)
        if m is None:
            return np.zeros(state.capacity, dtype=np.bool_)
        anchors = anchors & m
    if query.root_forbidden:
        anchors = anchors & ~_carrying_any(state, query.root_forbidden)
    return anchors


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
    for rc in query.resource_classes:
        if not state.resource_class_known(rc):
            return Unanswered("unknown_resource_class", rc)
    for t in sorted(query.trait_names):
        if not state.trait_known(t):
            return Unanswered("unknown_trait", t)
    if config.randomize_allocation_candidates and rng is None:
        raise ValueError("randomize_allocation_candidates needs a random source")

    mappings = query.microversion >= (1, 34)
    if query.groups:
        merged = _merged(state, query, config)
        if isinstance(merged, Unanswered):
            return merged
        found = _distinct(merged, _claim_key)
    elif any(state.member_holds(rc) or state.sharing_holds(rc) for rc, _ in query.main.resources):
        # a product's providers, class by class, say all placement compares of its request
        found = (_single(query, root, combo) for root, combo in
                 _distinct(tree_combinations(state, query, config), lambda c: c[1]))
    else:
        # roots alone: one vector answer (see the module docstring)
        slots: Any = _limited(group_slots(state, query.main, _anchors(state, query), config),
                              query, config, rng)
        return state.body(slots, query.main.resources, mappings)
    entries = list(itertools.islice(found, _needed(query, config)))
    return _body(state, cast(Sequence[Candidate], _limited(entries, query, config, rng)), mappings)


def _needed(query: CandidateQuery, config: PlacementConfig) -> int | None:
    """How many candidates the answer can use (None: all): ``max_allocation_candidates``, and
    without randomize a smaller ``limit`` (the first ones are kept; placement's order is that
    of its sets, so any of them are placement's first)."""
    cap = config.max_allocation_candidates if config.max_allocation_candidates >= 0 else None
    if query.limit and not config.randomize_allocation_candidates:
        cap = query.limit if cap is None else min(cap, query.limit)
    return cap


_T = TypeVar("_T")


def _distinct(candidates: Iterable[_T], key: Callable[[_T], Any]) -> Iterator[_T]:
    """The candidates, each allocation request once (the first): placement keeps them in sets,
    where a sharing provider's request lent to several roots is one (``AllocationRequest.__eq__``
    compares claims and mappings, not the anchor)."""
    seen: set[Any] = set()
    for c in candidates:
        k = key(c)
        if k not in seen:
            seen.add(k)
            yield c


def _claim_key(c: Candidate) -> Any:
    """What placement compares of an allocation request: its claims and its mappings."""
    return frozenset(c[1]), tuple((suffix, frozenset(providers)) for suffix, providers in c[2])


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
    root is an anchor (``root_required``) and, with ``in_tree``, in that tree.  A sharing
    provider that passes the same tests, and is itself in every ``member_of`` set, serves
    the class in each tree it lends to (:func:`_lent_to`) whose root is an anchor and in no
    forbidden aggregate -- not under ``in_tree``.  Each product of one such provider per
    class is a candidate, its tree's root its anchor, when the providers in it together
    carry every required any-of set.  placement's tree-wide trait prefilter
    (``_get_trees_with_traits``) keeps every tree that has such a product, so it changes
    nothing here.
    """
    group = query.main
    n = state.capacity
    roots = state.root_slot
    held = roots >= 0
    at = np.where(held, roots, 0)
    common = state.alive & held
    # a sharing provider's tests on itself alone, for the trees it lends to
    lending = state.alive.copy()
    anchors = _anchors(state, query)
    if anchors is not None:
        common &= anchors[at]
    if group.member_of:
        inside = np.ones(n, dtype=np.bool_)
        for any_aggs in group.member_of:
            inside &= _any_of([state.aggregate_mask(a) for a in any_aggs], n)
        common &= inside | inside[at]
        lending &= inside
    bad = None
    if group.forbidden_aggregates:
        bad = _any_of([state.aggregate_mask(a) for a in group.forbidden_aggregates], n)
        common &= ~bad & ~bad[at]
        lending &= ~bad
    if group.forbidden:
        unwanted = _carrying_any(state, group.forbidden)
        common &= ~unwanted
        lending &= ~unwanted
    lenders = state.sharing_slots()
    if group.in_tree is not None:
        root = _tree_of(state, group.in_tree)
        if root is None:
            return
        common &= roots == root
        lenders = []
    lenders = [s for s in lenders if lending[s]]
    serving: list[BoolArray] = []
    # per class, the sharing providers serving it and the roots each lends it to
    lent: list[list[tuple[int, BoolArray]]] = []
    for rc, amount in group.resources:
        fits = _fits(state, rc, amount, config)
        if fits is None:
            return
        serving.append(common & fits)
        lent.append([])
        for s in lenders:
            if fits[s]:
                to = _lent_to(state, s)
                if anchors is not None:
                    to &= anchors
                if bad is not None:
                    to &= ~bad
                lent[-1].append((s, to))
    # the trees with a provider for every class (placement's merge_common_trees)
    trees = np.ones(n, dtype=np.bool_)
    for ok, lenders_of_class in zip(serving, lent, strict=True):
        has = np.zeros(n, dtype=np.bool_)
        has[roots[ok]] = True
        for _, to in lenders_of_class:
            has |= to
        trees &= has
    # each tree's providers per class, tree by tree (a limit reads only the first trees)
    for root in np.flatnonzero(trees).tolist():
        tree = state.tree_slots(root)
        choices = []
        for ok, lenders_of_class in zip(serving, lent, strict=True):
            mine = [slot for slot in tree if ok[slot]]
            mine += [s for s, to in lenders_of_class if to[root] and s not in mine]
            choices.append(mine)
        for combo in itertools.product(*choices):
            if group.required:
                carried = frozenset().union(*(state.provider_at(slot).traits for slot in set(combo)))
                if not all(any_of & carried for any_of in group.required):
                    continue
            yield root, combo


#: one allocation request: its tree's root slot, the amounts it claims per (provider slot,
#: class), and each group's providers ("" the unsuffixed group's) for its mappings
Candidate = tuple[int, tuple[tuple[int, str, int], ...], tuple[tuple[str, tuple[int, ...]], ...]]
#: one group's share of a candidate: what it claims, and its providers
_Part = tuple[tuple[tuple[int, str, int], ...], tuple[int, ...]]


def _single(query: CandidateQuery, root: int, combo: tuple[int, ...]) -> Candidate:
    """The candidate of one product of the unsuffixed group alone."""
    claimed = tuple((slot, rc, amount) for slot, (rc, amount) in zip(combo, query.main.resources,
                                                                       strict=True))
    return root, claimed, (("", tuple(dict.fromkeys(combo))),)


def group_slots(state: ProviderState, group: GroupQuery, anchors: BoolArray | None,
                config: PlacementConfig = PlacementConfig()) -> IntArray:
    """The providers one group can take, each alone, in slot order (placement's
    ``get_provider_ids_matching`` and ``_alloc_candidates_single_provider``, which serve a
    suffixed group, and the unsuffixed one where it is answered on roots): room for every
    class of the group, its required traits, no forbidden trait, in every ``member_of`` set
    and in no forbidden aggregate -- all on the provider itself --, in ``in_tree``'s tree (a
    group with resources; a resourceless one only needs ``in_tree`` to exist), and an anchor
    root."""
    n = state.capacity
    roots = state.root_slot
    # without trees every provider is its own root (the hot path: spare the indexing)
    trees = state.has_trees
    ok = state.alive & (roots >= 0) if trees else state.alive.copy()
    if not group.resources and not (group.required or group.member_of):
        # placement keeps the providers its trait and aggregate filters found, and a
        # resourceless group with neither found none (get_provider_ids_matching)
        return np.zeros(0, dtype=np.int64)
    for rc, amount in group.resources:
        fits = _fits(state, rc, amount, config)
        if fits is None:
            return np.zeros(0, dtype=np.int64)
        ok &= fits
    for any_of in group.required:
        ok &= _carrying_any(state, any_of)
    if group.forbidden:
        ok &= ~_carrying_any(state, group.forbidden)
    for any_aggs in group.member_of:
        ok &= _any_of([state.aggregate_mask(a) for a in any_aggs], n)
    if group.forbidden_aggregates:
        ok &= ~_any_of([state.aggregate_mask(a) for a in group.forbidden_aggregates], n)
    if group.in_tree is not None:
        root = _tree_of(state, group.in_tree)
        if root is None:
            return np.zeros(0, dtype=np.int64)
        if group.resources:  # placement's tree filter is in its capacity query alone
            ok &= roots == root
    if anchors is not None:
        ok &= anchors[np.where(roots >= 0, roots, 0)] if trees else anchors
    return np.flatnonzero(ok)


def _merged(state: ProviderState, query: CandidateQuery,
            config: PlacementConfig) -> Iterator[Candidate] | Unanswered:
    """A request with suffixed groups (placement's ``_merge_candidates``): within each tree,
    every product of one candidate per group; under ``group_policy=isolate`` the suffixed
    groups on distinct providers; each ``same_subtree`` set's providers under one of them; the
    amounts on one provider and class summed, and checked again against its capacity and
    max_unit (with ``optimize_for_wide_provider_trees``, against its capacity alone, usage
    left out).

    A suffixed group's sharing provider also serves every other tree it lends to whose root
    is an anchor (placement's ``_alloc_candidates_single_provider``).  An unsuffixed
    candidate of sharing providers alone that several trees borrow is left to placement
    (``sharing_provider``): placement keeps it once, under whichever tree its set iteration
    meets first, and merges it with that tree's groups only."""
    per_group: list[tuple[str, dict[int, list[_Part]]]] = []
    anchors = _anchors(state, query)
    if query.main.resources:
        unsuffixed: dict[int, list[_Part]] = {}
        if state.has_trees or state.sharing:
            singles = (_single(query, root, combo) for root, combo in tree_combinations(state, query, config))
        else:  # no tree: placement's single-provider path for the unsuffixed group too
            singles = (_single(query, slot, (slot,) * len(query.main.resources))
                       for slot in group_slots(state, query.main, anchors, config).tolist())
        borrowed_by: dict[Any, int] = {}
        for root, claimed, ((_, providers),) in singles:
            if state.sharing and borrowed_by.setdefault(frozenset(claimed), root) != root:
                return Unanswered("sharing_provider", "an unsuffixed candidate of sharing providers "
                                  "alone, lent to several trees, with suffixed groups")
            unsuffixed.setdefault(root, []).append((claimed, providers))
        per_group.append(("", unsuffixed))
    roots = state.root_slot
    lenders = state.sharing_slots()
    for group in query.groups:
        by_root: dict[int, list[_Part]] = {}
        for slot in group_slots(state, group, anchors, config).tolist():
            claimed = tuple((slot, rc, amount) for rc, amount in group.resources)
            by_root.setdefault(int(roots[slot]), []).append((claimed, (slot,)))
        if lenders:
            for slot in np.intersect1d(group_slots(state, group, None, config), lenders).tolist():
                claimed = tuple((slot, rc, amount) for rc, amount in group.resources)
                to = _lent_to(state, slot)
                if anchors is not None:
                    to &= anchors
                to[roots[slot]] = False  # its own tree's entry is the one above
                for a in np.flatnonzero(to).tolist():
                    by_root.setdefault(a, []).append((claimed, (slot,)))
        per_group.append((group.suffix, by_root))
    return _merge_products(state, query, config, per_group)


def _merge_products(state: ProviderState, query: CandidateQuery, config: PlacementConfig,
                    per_group: list[tuple[str, dict[int, list[_Part]]]]) -> Iterator[Candidate]:
    """:func:`_merged`'s products, tree by tree."""
    trees = set(per_group[0][1]).intersection(*(set(by_root) for _, by_root in per_group[1:]))
    isolate = query.group_policy == "isolate"
    granular = len(query.groups)
    for root in sorted(trees):
        for parts in itertools.product(*(by_root[root] for _, by_root in per_group)):
            if isolate and len({part[1][0] for (suffix, _), part in zip(per_group, parts, strict=True)
                                if suffix}) != granular:
                continue
            if query.same_subtrees and not _same_subtrees(state, query, per_group, parts):
                continue
            amounts: dict[tuple[int, str], int] = {}
            for claimed, _ in parts:
                for slot, rc, amount in claimed:
                    amounts[slot, rc] = amounts.get((slot, rc), 0) + amount
            if any(_exceeds(state, slot, rc, amount, config) for (slot, rc), amount in amounts.items()):
                continue
            yield (root, tuple((slot, rc, amount) for (slot, rc), amount in amounts.items()),
                   tuple((suffix, providers) for (suffix, _), (_, providers) in zip(per_group, parts,
                                                                                    strict=True)))


def _same_subtrees(state: ProviderState, query: CandidateQuery,
                   per_group: list[tuple[str, dict[int, list[_Part]]]], parts: tuple[_Part, ...]) -> bool:
    """Every ``same_subtree`` set's providers under one of them (placement's
    ``_satisfies_same_subtree``)."""
    chosen = {suffix: providers for (suffix, _), (_, providers) in zip(per_group, parts, strict=True)}
    for suffixes in query.same_subtrees:
        slots = {slot for suffix in suffixes for slot in chosen[suffix]}
        if len(slots) > 1 and not set.intersection(*(_ancestors(state, s) for s in slots)) & slots:
            return False
    return True


def _ancestors(state: ProviderState, slot: int) -> set[int]:
    """``slot`` and the slots of every provider above it."""
    lineage = {slot}
    parent = state.provider_at(slot).parent_provider_uuid
    while parent is not None:
        up = state.slot_of(parent)
        if up is None:
            break
        lineage.add(up)
        parent = state.provider_at(up).parent_provider_uuid
    return lineage


def _exceeds(state: ProviderState, slot: int, rc: str, amount: int, config: PlacementConfig) -> bool:
    """placement's merge check of the amounts the groups of one candidate claim together."""
    cols = state.columns(rc)
    assert cols is not None
    if amount > cols.max_unit[slot]:
        return True
    used = 0 if config.optimize_for_wide_provider_trees else int(cols.used[slot])
    return bool(used + amount > cols.cap[slot])


def _body(state: ProviderState, candidates: Sequence[Candidate], mappings: bool) -> dict[str, Any]:
    """The response body of candidates across providers: an allocation request each, and the
    summaries of every provider of the trees of the providers they claim from (a borrowing
    tree whose own providers claim nothing is not summarised: ``_merge_candidates``)."""
    requests = []
    for _, claimed, groups in candidates:
        allocations: dict[str, Any] = {}
        for slot, rc, amount in claimed:
            u = state.provider_at(slot).uuid
            allocations.setdefault(u, {"resources": {}})["resources"][rc] = amount
        ar: dict[str, Any] = {"allocations": allocations}
        if mappings:
            ar["mappings"] = {suffix: list(dict.fromkeys(state.provider_at(slot).uuid for slot in providers))
                              for suffix, providers in groups}
        requests.append(ar)
    trees = dict.fromkeys(state.provider_at(slot).root_provider_uuid
                          for _, claimed, _ in candidates for slot, _, _ in claimed)
    return {"allocation_requests": requests, "provider_summaries": state.tree_summaries(trees)}


def answer(state: ProviderState, querystring: str, microversion: str = "1.36",
           config: PlacementConfig = PlacementConfig(),
           rng: random.Random | None = None) -> dict[str, Any] | Unanswered:
    """:func:`allocation_candidates` of a querystring as nova sends it."""
    return allocation_candidates(state, parse_querystring(querystring, microversion), config, rng)


__all__ = ["Candidate", "Combination", "PlacementConfig", "RandomSource", "allocation_candidates",
           "answer", "group_slots", "state_reason", "tree_combinations"]
