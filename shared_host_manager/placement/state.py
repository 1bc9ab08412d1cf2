"""Placement's resource providers in memory: what ``GET /allocation_candidates`` reads, kept per provider.

Role: the state side of allocation candidates from memory.  It holds, for
every resource provider, what placement's candidate queries read from its
database -- the provider's identity and tree, its inventories, its usages (the
sums of its allocations), its traits and its placement aggregates -- and keeps
the columns those queries filter on as numpy arrays, one slot per provider, so
a request is a handful of vector operations however many providers there are.

The dict form (one provider; the names are placement's own, so the bodies of
``GET /resource_providers/{uuid}``, ``.../inventories``, ``.../usages``,
``.../traits`` and ``.../aggregates`` fill it as they are)::

    {
      "uuid": "4e8e5957-...",              # canonical lowercase form
      "name": "compute-1",
      "generation": 7,                     # placement's resource provider generation
      "parent_provider_uuid": None,        # optional, default None
      "root_provider_uuid": "4e8e5957-...",# optional, default the provider itself
      "inventories": {                     # per resource class; fields default as
        "VCPU": {"total": 32,              # placement's PUT does (reserved 0,
                 "reserved": 0,            # min_unit 1, max_unit 2147483647,
                 "min_unit": 1,            # step_size 1, allocation_ratio 1.0)
                 "max_unit": 32,
                 "step_size": 1,
                 "allocation_ratio": 16.0},
      },
      "usages": {"VCPU": 6},               # sum of the allocations, per resource class
      "traits": ["HW_CPU_X86_AVX2", "COMPUTE_STATUS_DISABLED"],
      "aggregates": ["d9c5b3a4-..."],
    }

The whole state (``from_dict``/``to_dict``)::

    {
      "providers": [<provider>, ...],
      "traits": [...],            # optional: every trait placement defines
      "resource_classes": [...],  # optional: every resource class placement defines
      "allocation_ratio_storage": "double",   # optional: "double" or "single"
    }

``traits`` and ``resource_classes`` tell which names placement knows: a
request naming an unknown one gets placement's 400, so the candidates refuse
it (reason ``unknown_trait`` / ``unknown_resource_class``).  Without them a
name is known when a provider carries it or it is standard (os-traits,
os-resource-classes, when installed).

``allocation_ratio_storage`` is how placement's database holds an
allocation ratio: ``double`` on SQLite and PostgreSQL; ``single`` on MySQL and
MariaDB, whose FLOAT column keeps a 32-bit float: their SQL capacity filter
computes with that float, while placement's Python side reads it back as
the server prints it (six significant digits).  With ``single`` the dict's
``allocation_ratio`` is the stored value widened to double (``CAST(... AS
DOUBLE)``, or placement's reading of a ratio written with at most six
significant digits); both of placement's capacities are derived from it.

Not thread-safe: the caller serialises changes and answers (one lock).

Life cycle of one provider::

    apply(doc) ---> held (slot assigned, columns, masks and counters set)
    apply(doc) ---> replaced when doc's generation is newer than the held one;
                    an older or equal generation is ignored (returns False)
    delete(uuid) -> gone (slot freed for the next new provider)

Tree members (providers with a parent: a vGPU, a PCI device, a network
device's bandwidth) are held like any other (``has_trees``); each root knows
its members, so an answer summarises every provider of a
candidate's tree, as placement does, and each provider knows its root's
slot (``root_slot``), for a request of a class a member holds (see
:mod:`.candidates`).  Sharing providers (``MISC_SHARES_VIA_AGGREGATE``)
are held like any other and listed (``sharing``): placement lends their
inventory to the trees of their aggregates.  A provider with a
non-canonical uuid is held and counted too: while any is held, the
candidates refuse every request with that reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

#: placement's db_const.MAX_INT: the default max_unit of an inventory
MAX_INT = 2147483647
#: the fields an inventory of placement's PUT takes by default
INVENTORY_DEFAULTS: Mapping[str, Any] = {
    "reserved": 0, "min_unit": 1, "max_unit": MAX_INT, "step_size": 1, "allocation_ratio": 1.0,
}
RATIO_STORAGES = ("double", "single")
#: the trait marking a sharing provider (os_traits.MISC_SHARES_VIA_AGGREGATE)
SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
_CANONICAL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def is_canonical_uuid(value: str) -> bool:
    """The lowercase 8-4-4-4-12 form: compared as placement's SQL compares it on every backend."""
    return bool(_CANONICAL_UUID.match(value)) and len(value) == 36


def _standard_names() -> tuple[frozenset[str], frozenset[str]]:
    # os-traits and os-resource-classes come with nova and placement, not with this package:
    # without them the standard names are simply not known in advance
    try:
        import os_traits  # type: ignore[import-untyped]
        traits = frozenset(os_traits.get_traits())
    except ImportError:
        traits = frozenset()
    try:
        import os_resource_classes  # type: ignore[import-untyped]
        rcs = frozenset(os_resource_classes.STANDARDS)
    except ImportError:
        rcs = frozenset()
    return traits, rcs


@dataclass(frozen=True)
class Inventory:
    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Inventory:
        f = {**INVENTORY_DEFAULTS, **d}
        inv = cls(total=int(f["total"]), reserved=int(f["reserved"]), min_unit=int(f["min_unit"]),
                  max_unit=int(f["max_unit"]), step_size=int(f["step_size"]),
                  allocation_ratio=float(f["allocation_ratio"]))
        if inv.step_size < 1:
            # placement's schema refuses it; the capacity filter divides by it
            raise ValueError(f"step_size must be >= 1, got {inv.step_size}")
        return inv

    def capacity(self, storage: str = "double") -> float:
        """What placement's claim lets be allocated in all (``_check_capacity_exceeded``:
        ``(total - reserved) * allocation_ratio``, the ratio as its Python side reads it)."""
        return (self.total - self.reserved) * ratios(self.allocation_ratio, storage)[1]

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "reserved": self.reserved, "min_unit": self.min_unit,
                "max_unit": self.max_unit, "step_size": self.step_size,
                "allocation_ratio": self.allocation_ratio}


@dataclass(frozen=True)
class Provider:
    uuid: str
    name: str
    generation: int
    parent_provider_uuid: str | None
    root_provider_uuid: str
    inventories: Mapping[str, Inventory]
    usages: Mapping[str, int]
    traits: frozenset[str]
    aggregates: frozenset[str]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provider:
        uuid = str(d["uuid"])
        return cls(
            uuid=uuid, name=str(d.get("name", uuid)), generation=int(d["generation"]),
            parent_provider_uuid=d.get("parent_provider_uuid"),
            root_provider_uuid=str(d.get("root_provider_uuid") or uuid),
            inventories={rc: Inventory.from_dict(v) for rc, v in (d.get("inventories") or {}).items()},
            usages={rc: int(v) for rc, v in (d.get("usages") or {}).items()},
            traits=frozenset(d.get("traits") or ()),
            aggregates=frozenset(d.get("aggregates") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "name": self.name, "generation": self.generation,
                "parent_provider_uuid": self.parent_provider_uuid,
                "root_provider_uuid": self.root_provider_uuid,
                "inventories": {rc: inv.to_dict() for rc, inv in self.inventories.items()},
                "usages": dict(self.usages), "traits": sorted(self.traits),
                "aggregates": sorted(self.aggregates)}

    @property
    def nested(self) -> bool:
        return self.parent_provider_uuid is not None or self.root_provider_uuid != self.uuid

    def over_capacity(self, storage: str = "double") -> dict[str, tuple[int, float]]:
        """The resource classes this provider holds more of than placement's claim allows:
        rc -> (used, capacity).  Placement keeps allocations an inventory change leaves
        beyond capacity; any other excess is a claim it should have refused."""
        over: dict[str, tuple[int, float]] = {}
        for rc, inv in self.inventories.items():
            used, capacity = self.usages.get(rc, 0), inv.capacity(storage)
            if used > capacity:
                over[rc] = (used, capacity)
        return over

    @property
    def canonical(self) -> bool:
        return is_canonical_uuid(self.uuid) and all(is_canonical_uuid(a) for a in self.aggregates)


def ratios(allocation_ratio: float, storage: str) -> tuple[float, float]:
    """(ratio placement's SQL filter computes with, ratio its Python side reads back).

    ``single``: a MySQL/MariaDB FLOAT column holds the nearest 32-bit float; SQL
    widens it exactly to DOUBLE; the client receives it printed with six
    significant digits (FLT_DIG) and parses that.
    """
    if storage == "double":
        return allocation_ratio, allocation_ratio
    f32 = float(np.float32(allocation_ratio))
    return f32, float(f"{f32:.6g}")


class _Columns:
    """One resource class's inventory columns, one slot per provider (has=False: no inventory)."""

    __slots__ = ("has", "min_unit", "max_unit", "step", "used", "avail", "cap")

    def __init__(self, capacity: int) -> None:
        self.has: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self.min_unit: IntArray = np.zeros(capacity, dtype=np.int64)
        self.max_unit: IntArray = np.zeros(capacity, dtype=np.int64)
        # 1 where there is no inventory: the step test divides by it
        self.step: IntArray = np.ones(capacity, dtype=np.int64)
        self.used: IntArray = np.zeros(capacity, dtype=np.int64)
        # (total - reserved) * ratio as placement's SQL computes it (a double, not truncated)
        self.avail: FloatArray = np.zeros(capacity, dtype=np.float64)
        # int((total - reserved) * ratio) as placement's Python side computes it: the
        # provider summary's capacity and the merge step's capacity check
        self.cap: IntArray = np.zeros(capacity, dtype=np.int64)

    def grow(self, capacity: int) -> None:
        for name in self.__slots__:
            old = getattr(self, name)
            new = np.ones(capacity, dtype=old.dtype) if name == "step" else np.zeros(capacity, old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)

    def set(self, slot: int, inv: Inventory, used: int, storage: str) -> None:
        sql_ratio = ratios(inv.allocation_ratio, storage)[0]
        self.has[slot] = True
        self.min_unit[slot] = inv.min_unit
        self.max_unit[slot] = inv.max_unit
        self.step[slot] = inv.step_size
        self.used[slot] = used
        self.avail[slot] = (inv.total - inv.reserved) * sql_ratio
        self.cap[slot] = int(inv.capacity(storage))

    def clear(self, slot: int) -> None:
        self.has[slot] = False
        self.min_unit[slot] = self.max_unit[slot] = self.used[slot] = self.cap[slot] = 0
        self.step[slot] = 1
        self.avail[slot] = 0.0


class ProviderState:
    """Every resource provider placement holds, indexed for the candidate queries (see the module)."""

    def __init__(self, *, allocation_ratio_storage: str = "double",
                 traits: Iterable[str] | None = None,
                 resource_classes: Iterable[str] | None = None,
                 capacity: int = 64) -> None:
        if allocation_ratio_storage not in RATIO_STORAGES:
            raise ValueError(f"allocation_ratio_storage must be one of {RATIO_STORAGES}")
        self.allocation_ratio_storage = allocation_ratio_storage
        std_traits, std_rcs = _standard_names()
        self._explicit_traits = frozenset(traits) if traits is not None else None
        self._explicit_rcs = frozenset(resource_classes) if resource_classes is not None else None
        self._std_traits, self._std_rcs = std_traits, std_rcs
        self._capacity = max(1, capacity)
        self._slot: dict[str, int] = {}
        self._providers: list[Provider | None] = [None] * self._capacity
        self._free: list[int] = []
        self._next = 0
        self.alive: BoolArray = np.zeros(self._capacity, dtype=np.bool_)
        self._cols: dict[str, _Columns] = {}
        self._trait_masks: dict[str, BoolArray] = {}
        self._agg_masks: dict[str, BoolArray] = {}
        # providers carrying each trait / inventory of each class: a name on some provider is known
        self._trait_count: dict[str, int] = {}
        self._rc_count: dict[str, int] = {}
        # tree members (providers with a parent), the slots of each tree's members by root
        # uuid, and a mask of their slots: a request for a class no member holds is answered
        # as on root providers alone, with every member of a candidate's tree summarised;
        # another one product by product within each tree
        self._members: dict[str, set[int]] = {}
        self.member: BoolArray = np.zeros(self._capacity, dtype=np.bool_)
        #: the slot of each provider's root (its own for a root; -1: the root is not held)
        self.root_slot: IntArray = np.full(self._capacity, -1, dtype=np.int64)
        # providers outside the covered set
        self.sharing: set[str] = set()
        self.noncanonical: set[str] = set()
        # object columns, so an answer is gathered by fancy indexing instead of a Python loop
        # per candidate: the uuids, the provider summaries (built on first use after each
        # change of the provider; _summary_ok says which are current) and, per request shape
        # (requested resources, mappings or not), the allocation requests: a scheduler sees
        # few flavors, so most candidates of an answer are already built
        self._uuid_col: npt.NDArray[np.object_] = np.full(self._capacity, None, dtype=object)
        self._summary_col: npt.NDArray[np.object_] = np.full(self._capacity, None, dtype=object)
        self._summary_ok: BoolArray = np.zeros(self._capacity, dtype=np.bool_)
        self._shapes: dict[tuple[Any, ...], tuple[npt.NDArray[np.object_], BoolArray]] = {}

    # -- building ------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *,
                  allocation_ratio_storage: str | None = None) -> ProviderState:
        providers = list(doc.get("providers") or ())
        state = cls(allocation_ratio_storage=allocation_ratio_storage
                    or doc.get("allocation_ratio_storage") or "double",
                    traits=doc.get("traits"), resource_classes=doc.get("resource_classes"),
                    capacity=max(64, len(providers)))
        for p in providers:
            state.apply(p)
        return state

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"providers": [p.to_dict() for p in self],
                               "allocation_ratio_storage": self.allocation_ratio_storage}
        if self._explicit_traits is not None:
            doc["traits"] = sorted(self._explicit_traits)
        if self._explicit_rcs is not None:
            doc["resource_classes"] = sorted(self._explicit_rcs)
        return doc

    def set_known_names(self, *, traits: Iterable[str] | None = None,
                        resource_classes: Iterable[str] | None = None) -> None:
        """Replace the names placement defines (its ``GET /traits`` and ``GET /resource_classes``)."""
        if traits is not None:
            self._explicit_traits = frozenset(traits)
        if resource_classes is not None:
            self._explicit_rcs = frozenset(resource_classes)

    def apply(self, doc: Mapping[str, Any], *, replace: bool = False) -> bool:
        """Hold ``doc``'s provider unless the held one is as new; True when it was applied.

        ``replace``: hold it whatever the held generation (a caller that overlays
        its own usage on a provider, :class:`~.view.PlacementView`, re-applies
        the same generation with another usage).
        """
        new = Provider.from_dict(doc)
        slot = self._slot.get(new.uuid)
        if slot is not None:
            old = self._providers[slot]
            assert old is not None
            if new.generation <= old.generation and not replace:
                return False
            self._unindex(slot, old)
        else:
            slot = self._take_slot()
            self._slot[new.uuid] = slot
        self._index(slot, new)
        return True

    def delete(self, uuid: str) -> bool:
        """Forget the provider; False when it was not held."""
        slot = self._slot.pop(uuid, None)
        if slot is None:
            return False
        old = self._providers[slot]
        assert old is not None
        self._unindex(slot, old)
        self._providers[slot] = None
        self.root_slot[slot] = -1
        for m in self._members.get(uuid, ()):
            self.root_slot[m] = -1
        # an allocation request names its provider: the slot's next provider needs its own
        self._uuid_col[slot] = None
        for _, built in self._shapes.values():
            built[slot] = False
        self._free.append(slot)
        return True

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._slot

    def __iter__(self) -> Iterator[Provider]:
        for slot in sorted(self._slot.values()):
            p = self._providers[slot]
            assert p is not None
            yield p

    def get(self, uuid: str) -> Provider | None:
        slot = self._slot.get(uuid)
        return None if slot is None else self._providers[slot]

    def slot_of(self, uuid: str) -> int | None:
        return self._slot.get(uuid)

    def provider_at(self, slot: int) -> Provider:
        p = self._providers[slot]
        assert p is not None
        return p

    @property
    def capacity(self) -> int:
        """Length of every column (slots in use and free ones)."""
        return self._capacity

    def trait_known(self, name: str) -> bool:
        if self._trait_count.get(name):
            return True
        known = self._explicit_traits if self._explicit_traits is not None else self._std_traits
        return name in known

    def resource_class_known(self, name: str) -> bool:
        if self._rc_count.get(name):
            return True
        known = self._explicit_rcs if self._explicit_rcs is not None else self._std_rcs
        return name in known

    def columns(self, rc: str) -> _Columns | None:
        return self._cols.get(rc)

    @property
    def has_trees(self) -> bool:
        """Whether some provider has a parent (placement's ``_has_provider_trees``)."""
        return bool(self._members)

    def member_holds(self, rc: str) -> bool:
        """Whether some tree member has an inventory of ``rc``."""
        cols = self._cols.get(rc)
        return self.has_trees and cols is not None and bool((cols.has & self.member).any())

    def tree_slots(self, root: int) -> list[int]:
        """The slots of the providers of the tree of the root in slot ``root``, the root first."""
        members = self._members.get(self._uuid_col[root])
        return [root, *sorted(members)] if members else [root]

    def sharing_slots(self) -> list[int]:
        """The slots of the sharing providers held, in slot order."""
        return sorted(self._slot[u] for u in self.sharing)

    def sharing_holds(self, rc: str) -> bool:
        """Whether some sharing provider has an inventory of ``rc``."""
        cols = self._cols.get(rc)
        return cols is not None and any(bool(cols.has[s]) for s in self.sharing_slots())

    def trait_mask(self, name: str) -> BoolArray | None:
        return self._trait_masks.get(name)

    def aggregate_mask(self, agg: str) -> BoolArray | None:
        return self._agg_masks.get(agg)

    def tree_summaries(self, roots: Iterable[str]) -> dict[str, Any]:
        """The summaries of every held provider of the trees of ``roots`` (root uuids)."""
        out: dict[str, Any] = {}
        for root in roots:
            slot = self._slot.get(root)
            if slot is not None:
                out[root] = self.summary(slot)
            for m in self._members.get(root, ()):
                out[self._uuid_col[m]] = self.summary(m)
        return out

    def summary(self, slot: int) -> dict[str, Any]:
        """Placement's provider summary of the provider in ``slot`` (microversion >= 1.29).

        Built once per state of the provider and shared by every answer that
        names it: read-only for the caller.
        """
        if self._summary_ok[slot]:
            return self._summary_col[slot]
        p = self.provider_at(slot)
        resources = {}
        for rc in p.inventories:
            cols = self._cols[rc]
            resources[rc] = {"capacity": int(cols.cap[slot]), "used": int(cols.used[slot])}
        s = {"resources": resources, "traits": sorted(p.traits),
             "parent_provider_uuid": p.parent_provider_uuid,
             "root_provider_uuid": p.root_provider_uuid}
        self._summary_col[slot] = s
        self._summary_ok[slot] = True
        return s

    #: request shapes whose allocation requests are kept (the least recently used goes)
    SHAPES = 32

    def body(self, slots: Sequence[int] | IntArray, resources: tuple[tuple[str, int], ...],
             mappings: bool) -> dict[str, Any]:
        """The response body naming the providers in ``slots``, in that order.

        Its allocation requests and summaries are the state's cached ones,
        shared by every answer until the provider changes: read-only for the
        caller (nova's report client deep-copies an allocation request before
        it claims with it).
        """
        idx = np.asarray(slots, dtype=np.int64)
        shape = (resources, mappings)
        entry = self._shapes.pop(shape, None)
        if entry is None:
            if len(self._shapes) >= self.SHAPES:
                del self._shapes[next(iter(self._shapes))]
            entry = (np.full(self._capacity, None, dtype=object), np.zeros(self._capacity, dtype=np.bool_))
        # most recently used last
        self._shapes[shape] = entry
        areq_col, built = entry
        for slot in idx[~built[idx]].tolist():
            u = self._uuid_col[slot]
            ar: dict[str, Any] = {"allocations": {u: {"resources": dict(resources)}}}
            if mappings:
                ar["mappings"] = {"": [u]}
            areq_col[slot] = ar
            built[slot] = True
        if self._members:
            # placement summarises every provider of a candidate's tree (its summaries are
            # per tree: _merge_candidates, limit_results)
            members = [m for u in self._uuid_col[idx].tolist() for m in self._members.get(u, ())]
            summarised = np.concatenate([idx, np.asarray(members, dtype=np.int64)])
        else:
            summarised = idx
        for slot in summarised[~self._summary_ok[summarised]].tolist():
            self.summary(slot)
        return {"allocation_requests": areq_col[idx].tolist(),
                "provider_summaries": dict(zip(self._uuid_col[summarised].tolist(),
                                               self._summary_col[summarised].tolist(), strict=True))}

    # -- internals -----------------------------------------------------------------------

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._next == self._capacity:
            self._grow(self._capacity * 2)
        slot = self._next
        self._next += 1
        return slot

    def _grow(self, capacity: int) -> None:
        for cols in self._cols.values():
            cols.grow(capacity)
        for masks in (self._trait_masks, self._agg_masks):
            for name, mask in masks.items():
                new = np.zeros(capacity, dtype=np.bool_)
                new[:len(mask)] = mask
                masks[name] = new
        for name in ("alive", "member"):
            old_mask = getattr(self, name)
            new_mask = np.zeros(capacity, dtype=np.bool_)
            new_mask[:len(old_mask)] = old_mask
            setattr(self, name, new_mask)
        root_slot = np.full(capacity, -1, dtype=np.int64)
        root_slot[:len(self.root_slot)] = self.root_slot
        self.root_slot = root_slot
        self._providers.extend([None] * (capacity - self._capacity))
        for name in ("_uuid_col", "_summary_col", "_summary_ok"):
            old = getattr(self, name)
            new = np.full(capacity, None, dtype=object) if old.dtype == object else np.zeros(
                capacity, dtype=old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)
        # the shapes' columns are rebuilt on their next use
        self._shapes.clear()
        self._capacity = capacity

    def _mask(self, masks: dict[str, BoolArray], name: str) -> BoolArray:
        mask = masks.get(name)
        if mask is None:
            mask = masks[name] = np.zeros(self._capacity, dtype=np.bool_)
        return mask

    def _index(self, slot: int, p: Provider) -> None:
        self._providers[slot] = p
        self._uuid_col[slot] = p.uuid
        self._summary_ok[slot] = False
        self.alive[slot] = True
        for rc, inv in p.inventories.items():
            cols = self._cols.get(rc)
            if cols is None:
                cols = self._cols[rc] = _Columns(self._capacity)
            # placement sums allocations per provider and class; a class without inventory
            # has no usage row in the candidate queries
            cols.set(slot, inv, p.usages.get(rc, 0), self.allocation_ratio_storage)
            self._rc_count[rc] = self._rc_count.get(rc, 0) + 1
        for t in p.traits:
            self._mask(self._trait_masks, t)[slot] = True
            self._trait_count[t] = self._trait_count.get(t, 0) + 1
        for a in p.aggregates:
            self._mask(self._agg_masks, a)[slot] = True
        if p.nested:
            self._members.setdefault(p.root_provider_uuid, set()).add(slot)
            self.member[slot] = True
            self.root_slot[slot] = self._slot.get(p.root_provider_uuid, -1)
        else:
            self.root_slot[slot] = slot
            # members held before their root (the feed's order is the database's)
            for m in self._members.get(p.uuid, ()):
                self.root_slot[m] = slot
        if SHARING_TRAIT in p.traits:
            self.sharing.add(p.uuid)
        if not p.canonical:
            self.noncanonical.add(p.uuid)

    def _unindex(self, slot: int, p: Provider) -> None:
        self.alive[slot] = False
        self._summary_ok[slot] = False
        for rc in p.inventories:
            self._cols[rc].clear(slot)
            self._rc_count[rc] -= 1
        for t in p.traits:
            self._trait_masks[t][slot] = False
            self._trait_count[t] -= 1
        for a in p.aggregates:
            self._agg_masks[a][slot] = False
        if p.nested:
            members = self._members[p.root_provider_uuid]
            members.discard(slot)
            if not members:
                del self._members[p.root_provider_uuid]
            self.member[slot] = False
        self.sharing.discard(p.uuid)
        self.noncanonical.discard(p.uuid)


__all__ = ["INVENTORY_DEFAULTS", "MAX_INT", "RATIO_STORAGES", "SHARING_TRAIT", "Inventory", "Provider",
           "ProviderState", "is_canonical_uuid", "ratios"]
