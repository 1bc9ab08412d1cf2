"""The ``GET /allocation_candidates`` querystring, parsed and validated as placement does it.

Role: turn the querystring nova's report client sends (nova 34:
``ResourceRequest.to_querystring()`` at microversion 1.36) into a
:class:`CandidateQuery`, or into an :class:`Unanswered` with the reason the
request is left to placement.  Every check placement makes before its
database is reached is made here the same way (placement's ``lib`` and
``util``: ``RequestGroup.dict_from_request``,
``RequestWideParams.from_request``, ``normalize_*_qs_param``, the JSON schema
of the microversion), so a request placement refuses with 400 is never
answered from memory: it gets ``invalid_request`` or ``unknown_parameter``.

Reasons (:data:`REASONS`), each one a kind of request or state the memory
answer does not cover:

``microversion``
    outside 1.36 .. 1.39 (the versions whose parameters and body are reproduced)
``unknown_parameter``
    a key placement's schema refuses at that microversion (its answer: 400)
``invalid_request``
    a value placement refuses (400)
``duplicate_parameter``
    ``limit``, ``group_policy`` or ``root_required`` given more than once
    (placement validates the last and uses the first, or refuses)
``noncanonical_uuid``
    an aggregate or provider uuid not in lowercase 8-4-4-4-12 form (MariaDB
    compares uuids case-insensitively, SQLite does not), or such a uuid held
    in the state
``repeated_class``
    a resource class asked for by more than one group, with a ``group_policy``
    other than ``none``: placement 16 then adds one group's amount into the
    object of another candidate's (``copy_arr_if_needed`` copies only under
    ``none``), so its answer depends on the order it builds candidates in
``unknown_resource_class`` / ``unknown_trait``
    a name placement may not define (its answer: 400)
``sharing_provider``
    a request with suffixed groups whose unsuffixed candidate is made of
    sharing providers alone and lent to several trees (placement keeps it
    once, under whichever tree its set iteration meets first), or any request
    while a sharing provider is a tree member (placement may fail with 500)
``no_feed`` / ``stale``
    a scheduler's :class:`~.view.PlacementView` has received nothing from the
    placement feed yet, or the feed's source has been silent or down longer
    than the view's ``max_staleness``
``behind``
    the view holds no poll marker of the feed from after the request arrived
    at nova's API, within the wait allowed (read-your-writes)

Life cycle: none; :func:`parse_querystring` is a pure function of the
querystring and the microversion.
"""

from __future__ import annotations

import functools
import re
import uuid as uuid_mod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl

from shared_host_manager.placement.state import is_canonical_uuid

MICROVERSION_MIN = (1, 36)
MICROVERSION_MAX = (1, 39)
#: what nova 34's report client asks for (SAME_SUBTREE_VERSION)
NOVA_MICROVERSION = "1.36"

REASONS = (
    "microversion", "unknown_parameter", "invalid_request", "duplicate_parameter",
    "noncanonical_uuid", "repeated_class", "unknown_resource_class",
    "unknown_trait", "sharing_provider", "no_feed", "stale", "behind",
)

# placement's schemas.common.GROUP_PAT_1_33 and lib._QS_KEY_PATTERN_1_33
_GROUP_KEY = re.compile(r"^(resources|required|member_of|in_tree)([a-zA-Z0-9_-]{1,64})?$")
_REQUEST_WIDE = frozenset({"limit", "group_policy", "root_required", "same_subtree"})
# placement's GET_SCHEMA_1_16 limit pattern (jsonschema matches it with re.search)
_LIMIT = re.compile(r"^[1-9][0-9]*$")


@dataclass(frozen=True)
class Unanswered:
    """The request is left to placement; ``reason`` is one of :data:`REASONS`."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class GroupQuery:
    """One request group: a suffixed (granular) one takes its resources from one provider
    (none: a resourceless group, named in ``same_subtree``); the unsuffixed one (suffix "")
    from one tree."""

    suffix: str
    #: (resource class, amount) in the querystring's order
    resources: tuple[tuple[str, int], ...]
    #: each set is any-of; the sets are all-of
    required: tuple[frozenset[str], ...] = ()
    forbidden: frozenset[str] = frozenset()
    #: each set is any-of; the sets are all-of
    member_of: tuple[frozenset[str], ...] = ()
    forbidden_aggregates: frozenset[str] = frozenset()
    in_tree: str | None = None


@dataclass(frozen=True)
class CandidateQuery:
    """One request, as placement's RequestGroups and RequestWideParams hold it: the unsuffixed
    group (no resources: there is none), the suffixed groups, the request-wide parameters."""

    microversion: tuple[int, int]
    #: the unsuffixed group (suffix ""): its resources from one tree, not one provider
    main: GroupQuery
    root_required: frozenset[str] = frozenset()
    root_forbidden: frozenset[str] = frozenset()
    limit: int | None = None
    group_policy: str | None = None
    #: every trait and resource class name the request names (placement looks each one up)
    trait_names: frozenset[str] = field(default=frozenset(), compare=False)
    #: the suffixed groups, by suffix
    groups: tuple[GroupQuery, ...] = ()
    #: each set of suffixes: their providers all under one of them
    same_subtrees: tuple[frozenset[str], ...] = ()

    @property
    def resource_classes(self) -> list[str]:
        """Every class any group asks for, in the order asked."""
        return [rc for g in (self.main, *self.groups) for rc, _ in g.resources]


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse_microversion(value: str | tuple[int, int]) -> tuple[int, int] | None:
    if isinstance(value, tuple):
        return value
    text = value.strip()
    if text.startswith("placement "):
        text = text[len("placement "):].strip()
    m = re.fullmatch(r"([1-9][0-9]*)\.(0|[1-9][0-9]*)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _uuid_like(value: str) -> bool:
    # oslo_utils.uuidutils.is_uuid_like, which placement's parsers call
    try:
        stripped = value.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "").lower()
        return str(uuid_mod.UUID(value)).replace("-", "") == stripped
    except (TypeError, ValueError, AttributeError):
        return False


def _check_uuid(value: str, what: str) -> None:
    if not _uuid_like(value):
        raise _Refused("invalid_request", f"{what}: not a uuid: {value!r}")
    if not is_canonical_uuid(value):
        raise _Refused("noncanonical_uuid", f"{what}: {value!r}")


def _resources(qs: str) -> dict[str, int]:
    # placement.util.normalize_resources_qs_param, line for line
    if qs.strip() == "":
        raise _Refused("invalid_request", "resources: empty")
    result: dict[str, int] = {}
    for rt in qs.split(","):
        try:
            rc_name, amount_s = rt.split(":")
        except ValueError:
            raise _Refused("invalid_request", f"resources: badly formed {rt!r}") from None
        try:
            amount = int(amount_s)
        except ValueError:
            raise _Refused("invalid_request", f"resources: amount {amount_s!r}") from None
        if amount < 1:
            raise _Refused("invalid_request", f"resources: amount {amount} < 1")
        result[rc_name] = amount
    return result


def _traits(val: str, allow_any_traits: bool) -> tuple[list[frozenset[str]], set[str]]:
    # placement.util.normalize_traits_qs_param with forbidden traits allowed (>= 1.22)
    if val.startswith("in:"):
        if not allow_any_traits:
            raise _Refused("invalid_request", f"'in:' traits need microversion 1.39: {val!r}")
        any_traits = frozenset(s.strip() for s in val[3:].split(","))
        if not all(any_traits):
            raise _Refused("invalid_request", f"empty trait in {val!r}")
        if any(t.startswith("!") for t in any_traits):
            raise _Refused("invalid_request", f"'in:' with a forbidden trait: {val!r}")
        return [any_traits], set()
    all_traits = [s.strip() for s in val.split(",")]
    # '!!FOO' is FOO forbidden: placement strips every leading '!'
    forbidden = {t.lstrip("!") for t in all_traits if t.startswith("!")}
    if not all(t for t in (*forbidden, *all_traits)):
        raise _Refused("invalid_request", f"empty trait in {val!r}")
    return [frozenset({t}) for t in all_traits if not t.startswith("!")], forbidden


def _member_of(value: str) -> tuple[frozenset[str], frozenset[str]]:
    # placement.util.normalize_member_of_qs_param
    if "," in value and not (value.startswith("in:") or value.startswith("!in:")):
        raise _Refused("invalid_request", f"member_of: several values need 'in:': {value!r}")
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()
    if value.startswith("!in:"):
        forbidden = frozenset(value[4:].split(","))
    elif value.startswith("!"):
        forbidden = frozenset([value[1:]])
    elif value.startswith("in:"):
        required = frozenset(value[3:].split(","))
    else:
        required = frozenset([value])
    for agg in sorted(required | forbidden):
        _check_uuid(agg, "member_of")
    return required, forbidden


def _group(suffix: str, keys: Mapping[str, list[str]], version: tuple[int, int],
           subtree: frozenset[str]) -> tuple[GroupQuery, set[str]]:
    """One request group's parameters (placement's RequestGroup._parse_request_items and its
    checks), and the trait names it uses."""
    if "resources" not in keys and suffix not in subtree:
        # resourceless: only a group named in same_subtree may be (placement's 400)
        raise _Refused("invalid_request", f"group {suffix!r} without resources{suffix}")
    resources: dict[str, int] = {}
    for value in keys.get("resources", ()):
        # every occurrence is parsed; the last one wins (placement's loop over the items)
        resources = _resources(value)

    names: set[str] = set()
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    if "required" in keys:
        any_traits = version >= (1, 39)
        # before 1.39 only the last required parameter counts
        values = keys["required"] if any_traits else keys["required"][-1:]
        for value in values:
            rts, fts = _traits(value, allow_any_traits=any_traits)
            required += rts
            forbidden |= fts
        for any_of in required:
            if all(t in forbidden for t in any_of):
                raise _Refused("invalid_request", f"required{suffix} and forbidden: {sorted(any_of)}")
        names |= forbidden | {t for s in required for t in s}

    member_of: list[frozenset[str]] = []
    forbidden_aggs: set[str] = set()
    for value in keys.get("member_of", ()):
        req_aggs, forb_aggs = _member_of(value)
        if req_aggs:
            member_of.append(req_aggs)
        forbidden_aggs |= forb_aggs

    in_tree = None
    for value in keys.get("in_tree", ()):
        in_tree = value.strip()
        _check_uuid(in_tree, "in_tree")
    return GroupQuery(suffix, tuple(resources.items()), tuple(required), frozenset(forbidden),
                      tuple(member_of), frozenset(forbidden_aggs), in_tree), names


def _parse(pairs: list[tuple[str, str]], version: tuple[int, int]) -> CandidateQuery:
    keys: dict[str, list[str]] = {}
    for k, v in pairs:
        keys.setdefault(k, []).append(v)
    by_suffix: dict[str, dict[str, list[str]]] = {}
    for k, values in keys.items():
        m = _GROUP_KEY.match(k)
        if k in _REQUEST_WIDE:
            continue
        if not m:
            raise _Refused("unknown_parameter", f"{k!r} is not a parameter at {version[0]}.{version[1]}")
        by_suffix.setdefault(m.group(2) or "", {})[m.group(1)] = values
    same_subtrees: list[frozenset[str]] = []
    for value in keys.get("same_subtree", ()):
        suffixes = frozenset(part.strip() for part in value.split(","))
        if "" in suffixes:
            raise _Refused("invalid_request", "same_subtree: the unsuffixed group")
        same_subtrees.append(suffixes)
    subtree = frozenset().union(*same_subtrees)
    for k in ("limit", "group_policy", "root_required"):
        if len(keys.get(k, ())) > 1:
            raise _Refused("duplicate_parameter", f"{k} given {len(keys[k])} times")

    limit = None
    if "limit" in keys:
        text = keys["limit"][0]
        if not _LIMIT.search(text):
            raise _Refused("invalid_request", f"limit: {text!r}")
        limit = int(text)
    group_policy = None
    if "group_policy" in keys:
        group_policy = keys["group_policy"][0]
        if group_policy not in ("none", "isolate"):
            raise _Refused("invalid_request", f"group_policy: {group_policy!r}")

    names: set[str] = set()
    root_required: set[str] = set()
    root_forbidden: set[str] = set()
    if "root_required" in keys:
        req, forb = _traits(keys["root_required"][0], allow_any_traits=False)
        root_required = {next(iter(s)) for s in req}
        root_forbidden = forb
        conflicts = root_required & root_forbidden
        if conflicts:
            raise _Refused("invalid_request", f"root_required conflicts: {sorted(conflicts)}")
        names |= root_required | root_forbidden

    if not any("resources" in group for group in by_suffix.values()):
        # at >= 1.36 no request group, or none with resources, is a 400
        raise _Refused("invalid_request", "no resources parameter")
    unknown = sorted(subtree - set(by_suffix))
    if unknown:
        raise _Refused("invalid_request", f"same_subtree names no group: {unknown}")
    groups: dict[str, GroupQuery] = {}
    for suffix in sorted(by_suffix):
        groups[suffix], group_names = _group(suffix, by_suffix[suffix], version, subtree)
        names |= group_names
    if group_policy is None and len(groups) - ("" in groups) > 1:
        raise _Refused("invalid_request", "group_policy is required with more than one suffixed group")

    if group_policy != "none" and len(groups) > 1:
        asked = [rc for g in groups.values() for rc, _ in g.resources]
        repeated = sorted({rc for rc in asked if asked.count(rc) > 1})
        if repeated:
            raise _Refused("repeated_class", f"{', '.join(repeated)} in more than one group")
    main = groups.pop("", None) or GroupQuery("", ())
    return CandidateQuery(
        microversion=version, main=main,
        root_required=frozenset(root_required), root_forbidden=frozenset(root_forbidden),
        limit=limit, group_policy=group_policy, trait_names=frozenset(names),
        groups=tuple(groups.values()), same_subtrees=tuple(same_subtrees))


def parse_querystring(querystring: str, microversion: str | tuple[int, int] = NOVA_MICROVERSION
                      ) -> CandidateQuery | Unanswered:
    """The query of ``GET /allocation_candidates?<querystring>`` at ``microversion``, or why not.

    Pure, and both results are immutable: a scheduler sends the same few
    querystrings (one per flavor and filter combination) over and over, so
    the last parses are kept.
    """
    return _parse_cached(querystring, microversion)


@functools.lru_cache(maxsize=1024)
def _parse_cached(querystring: str, microversion: str | tuple[int, int]) -> CandidateQuery | Unanswered:
    version = parse_microversion(microversion)
    if version is None or not MICROVERSION_MIN <= version <= MICROVERSION_MAX:
        return Unanswered("microversion", f"microversion {microversion!r}")
    if querystring.startswith("?"):
        querystring = querystring[1:]
    try:
        # webob's request.GET: blank values kept, '+' is a space
        pairs = parse_qsl(querystring, keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        return Unanswered("invalid_request", f"querystring: {exc}")
    try:
        return _parse(pairs, version)
    except _Refused as exc:
        return Unanswered(exc.reason, exc.detail)


class _HasQuerystring(Protocol):
    def to_querystring(self) -> str: ...


def query_of_resource_request(resource_request: _HasQuerystring) -> CandidateQuery | Unanswered:
    """The query nova's report client sends for a ``nova.scheduler.utils.ResourceRequest``."""
    return parse_querystring(resource_request.to_querystring(), NOVA_MICROVERSION)


def querystring_of(params: Mapping[str, str | list[str]]) -> str:
    """A querystring from parameters (a list value repeats its key), as nova's urlencode writes it."""
    from urllib.parse import urlencode

    pairs: list[tuple[str, str]] = []
    for k, v in params.items():
        pairs += [(k, x) for x in v] if isinstance(v, list) else [(k, v)]
    return urlencode(sorted(pairs))


__all__ = ["MICROVERSION_MAX", "MICROVERSION_MIN", "NOVA_MICROVERSION", "REASONS", "CandidateQuery",
           "GroupQuery", "Unanswered", "parse_microversion", "parse_querystring",
           "query_of_resource_request", "querystring_of"]
