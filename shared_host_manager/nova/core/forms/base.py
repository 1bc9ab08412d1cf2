"""What the vector forms of nova's filters and weighers share: their signatures, the record
each form module declares, and the ways of asking nova's own code once per group of hosts.

Role
----
A form module (``filters/<name>.py``, ``weights/<name>.py``) declares, per nova class,
a :class:`FilterForm` or a :class:`WeigherForm`; the forms read their hosts through
:class:`~shared_host_manager.decision.host_table.HostTable` only.  What depends only on
what few hosts differ in runs nova's own code once per *distinct* input, on one host (or
a :class:`Probe`) of each group, and the answer is spread to the group
(:func:`grouped`, :func:`per_group`, :func:`once_per_group`): the semantics stay nova's.

Imports nothing of the forms or of :mod:`..vector` (they import this).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nova import conf as nova_conf
from nova.scheduler import utils as nova_utils

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.decision.index import PASS_ALL, PassAll

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

#: a vector filter, asked only for a request that engages its filter (``vector.engaged``):
#: (filter, rows, row numbers (lazy rows only), spec) -> pass mask, PASS_ALL when it knows
#: that no row is removed (every kept group answer passes), or None when this request needs
#: nova's per-host class (then the filter runs per host)
FilterAnswer = BoolArray | PassAll | None
VectorFilter = Callable[[Any, HostTable, IntArray, Any], FilterAnswer]
#: a vector weigher: (weigher, rows, lazy row numbers, spec) -> raw weights (before the clamp)
VectorWeigher = Callable[[Any, HostTable, IntArray, Any], "FloatArray | None"]
#: (filter, spec) -> whether the request engages the filter
Engaged = Callable[[Any, Any], bool]


@dataclass(frozen=True, slots=True)
class FilterForm:
    """One nova filter class (exactly that class: subclasses run as themselves) and its
    vector form."""

    cls: type
    answer: VectorFilter
    #: whether a request engages the class: when not, nova's class passes every host
    #: whatever the hosts hold (the request alone decides); None: every request does
    engaged: Engaged | None = None
    #: what the engagement reads of the filter object besides its class (an option it
    #: parsed), for ``vector.engaged_key``
    engaged_by: Callable[[Any], Hashable] | None = None
    #: the engagement reads what is set per instance (the group's hosts): requests alike
    #: may not share it
    engaged_per_instance: bool = False
    #: the engagement or the form reads what is set per instance of a request (its uuid,
    #: its group's hosts and members): ``vector.PER_INSTANCE``
    per_instance: bool = False


@dataclass(frozen=True, slots=True)
class WeigherForm:
    """One nova weigher class (exactly that class) and its vector form."""

    cls: type
    raw: VectorWeigher
    #: the option nova's class reads for its multiplier, (group, name): all its answer
    #: depends on besides the host's aggregates
    multiplier_option: tuple[str, str]
    #: the form reads what is set per instance of a request: ``vector.PER_INSTANCE``
    per_instance: bool = False


class Probe:
    """What a group-wise filter or multiplier reads (aggregates), for nova's own code."""

    __slots__ = ("aggregates", "host", "nodename")

    def __init__(self, aggregates: Sequence[Any], host: str, nodename: str) -> None:
        self.aggregates = aggregates
        self.host = host
        self.nodename = nodename

    def __repr__(self) -> str:
        return f"({self.host}, {self.nodename})"


def option(group: str | None, name: str) -> Any:
    """nova's option ``[group] name``, as nova's ``CONF.group.name`` reads it now.

    By item: the same oslo.config look-up without first failing an ordinary attribute
    look-up on the ConfigOpts and on its group (half the cost, and the forms read a few
    options on every decision).  Not kept here: oslo.config keeps the values and drops
    them on every change (an override, a reload, SIGHUP's mutate_config_files), so a change
    takes effect on the next read, as it does for nova."""
    conf = nova_conf.CONF
    return conf[name] if group is None else conf[group][name]


# -- engagement ------------------------------------------------------------------------------

def rebuild_skips(f: Any, spec: Any) -> bool:
    return not f.RUN_ON_REBUILD and nova_utils.request_is_rebuild(spec)


def runs(f: Any, spec: Any) -> bool:
    """nova's class runs for this request (a rebuild skips the classes not RUN_ON_REBUILD)."""
    return not rebuild_skips(f, spec)


def hint(name: str) -> Engaged:
    """Engaged by the scheduler hint ``name``."""
    return lambda f, spec: runs(f, spec) and bool(spec.get_scheduler_hint(name))


# -- answers ---------------------------------------------------------------------------------

def per_host(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
    return None  # rare (a CIDR or JSON query hint): nova's class per host


def holding(rows: HostTable, idx: IntArray, uuids: Collection[str]) -> BoolArray:
    """Per row of ``idx``: does it hold any of ``uuids``."""
    holders = rows.rows_with_instances(uuids, idx)
    if not holders:
        return np.zeros(len(idx), dtype=bool)
    return np.isin(idx, np.fromiter(holders, dtype=np.int64, count=len(holders)))


def column(name: str) -> VectorWeigher:
    """The weigher whose raw weight is the host's number ``name``, as nova's reads it."""
    return lambda w, rows, idx, spec: rows.col(name)[idx]


def grouped(f: Any, rows: HostTable, idx: IntArray, spec: Any, name: str,
            value: Callable[[Any], Any], key: Hashable) -> BoolArray | PassAll:
    """nova's own ``f._filter_one`` once per distinct ``value`` of the rows' templates, on
    one host of the group; kept across decisions under ``key`` (what ``f`` reads of the
    request) where the holder keeps such answers.  PASS_ALL: every value has its kept
    answer, and each passes."""
    ids = rows.value_ids(name, value)
    kept = rows.value_answers(name, (type(f), key))
    if kept is not None and len(kept) == rows.value_count(name) and all(kept.values()):
        return PASS_ALL  # whichever rows the filters before left
    return once_per_group(idx, ids, lambda row: f._filter_one(rows.host(row), spec),
                          kept=kept)


def once_per_group(idx: IntArray, gids: IntArray, decide: Callable[[int], Any],
                   dtype: Any = bool, kept: dict[int, Any] | None = None
                   ) -> npt.NDArray[Any]:
    """``decide(row)`` for one row per distinct ``gids[row]`` (small numbers), spread to the
    rows sharing it (no sort: the groups are few, the rows many); with ``kept``, the
    answers of earlier decisions by group number, taken from and added to it."""
    if not len(idx):
        return np.empty(0, dtype=dtype)
    g = gids[idx]
    first = np.full(int(g.max()) + 1, -1, dtype=np.int64)
    first[g[::-1]] = idx[::-1]  # the last write wins: each group's first row in idx
    present = np.flatnonzero(first >= 0)
    answers = np.zeros(len(first), dtype=dtype)
    if kept is None:
        answers[present] = np.fromiter((decide(row) for row in first[present].tolist()),
                                       dtype=dtype, count=len(present))
    else:
        for gid, row in zip(present.tolist(), first[present].tolist(), strict=True):
            answer = kept.get(gid, kept)
            if answer is kept:
                answer = kept[gid] = decide(row)
            answers[gid] = answer
    return answers[g]


def agg_probe(rows: HostTable) -> Callable[[int], Any]:
    return lambda row: Probe(rows.aggregates(row), rows.name(row), rows.nodename(row))


def per_group(rows: HostTable, idx: IntArray, key: Any, answer: Callable[[Any], Any],
              dtype: Any = bool) -> npt.NDArray[Any] | PassAll:
    """``answer(host)`` for the rows of ``idx``, asked once per aggregate group on a probe
    holding the group's aggregates; kept across decisions under ``key`` where the holder
    keeps such answers (``key``: what ``answer`` reads besides the aggregates; None: not
    known, asked again).  PASS_ALL: every kept bool answer is True."""
    kept = None
    if key is not None and rows.keeps_group_answers:
        try:
            kept = rows.group_answers(key, lambda aggregates: answer(Probe(aggregates, "", "")))
        except Exception:  # noqa: BLE001 - nova's code raised for some group: ask the groups
            kept = None    # of these rows only, as nova's handler would (and raise if it does)
    if kept is not None:
        if dtype is bool and all(kept.tolist()):  # a few groups: cheaper than numpy's all
            return PASS_ALL
        return kept[rows.group_ids()[idx]].astype(dtype, copy=False)
    probe = agg_probe(rows)
    return once_per_group(idx, rows.group_ids(), lambda row: answer(probe(row)), dtype=dtype)


def limit(name: str, getter: str, setting: str) -> VectorFilter:
    """NumInstances/IoOps (and their aggregate forms) over the number ``name``: the limit per
    aggregate group, by nova."""
    def vf(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
        get_max = getattr(f, getter)
        # nova's getters read the option and the aggregates, not the request
        key = (type(f), option("filter_scheduler", setting))
        lim = per_group(rows, idx, key, lambda host: get_max(host, spec), dtype=np.float64)
        assert lim is not PASS_ALL  # numbers, not answers
        return rows.col(name)[idx] < lim
    return vf


def by_aggregates(request_key: Callable[[Any], Hashable] | None = None) -> VectorFilter:
    """An aggregate filter: nova's class once per aggregate group.  ``request_key``: what
    the class reads of a request besides the hosts' aggregates; its per-group answers are
    kept across decisions under it (None: asked every request)."""
    def vf(f: Any, rows: HostTable, idx: IntArray, spec: Any) -> FilterAnswer:
        cls: type = type(f)  # as type: mypy does not take type[X] for Hashable
        key = rows.derived(cls, lambda: None if request_key is None or rebuild_skips(f, spec)
                           else (cls, request_key(spec)))
        return per_group(rows, idx, key, lambda host: bool(f._filter_one(host, spec)))
    return vf
